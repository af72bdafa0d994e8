"""Tiny models with a real model's KV cache per token (`build_tiny_model.py --kv-shape`, the qwen3_next family): the
bytes bench's presets. Their cache must hold exactly the real model's bytes per token and per checkpoint."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm import generate
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load

from stable_prefix.bench.probes.kv_drive import model_with_layers, probed_shapes
from stable_prefix.bench.workload.kv_shapes import SHAPES, model_bytes
from stable_prefix.tools.build_tiny_model import REAL_KV_SHAPES, parse_kv_shape
from stable_prefix.tools.build_tiny_model import main as build_tiny_model
from stable_prefix.tools.tiny_families import FAMILIES, QWEN3_NEXT_80B_A3B

KiB = 1024


def test_a_kv_shape_is_layers_by_kv_heads_by_head_dim_or_a_real_models_name():
    assert parse_kv_shape("48x4x128") == (48, 4, 128)
    assert parse_kv_shape("qwen2.5-coder-32b") == (64, 8, 128)
    for bad in ("48x4", "a x b x c", "0x4x128"):
        with pytest.raises(ValueError, match="LAYERSxKV_HEADSxHEAD_DIM"):
            parse_kv_shape(bad)
    with pytest.raises(ValueError, match="even"):
        parse_kv_shape("48x4x127")


def test_the_real_shapes_hold_their_models_bytes_per_token():
    per_token = {name: layers * 2 * kv_heads * head_dim * 2 for name, (layers, kv_heads, head_dim) in REAL_KV_SHAPES.items()}
    assert per_token == {"qwen2.5-coder-32b": 256 * KiB, "qwen3-coder-30b-a3b": 96 * KiB}


@pytest.fixture(scope="module")
def small_kv_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("kv") / "model"
    build_tiny_model(["--out", str(out), "--preset", "test", "--kv-shape", "3x2x32"])
    return out


def test_a_head_dim_apart_from_the_hidden_size_builds_a_qwen3_model_with_that_cache(small_kv_model):
    config = json.loads((small_kv_model / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"], config["hidden_size"]) == (
        "qwen3", 3, 2, 32, 64)
    model, _ = load(str(small_kv_model))
    cache = make_prompt_cache(model)
    model(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    held = sum(layer.keys[..., : layer.offset, :].nbytes + layer.values[..., : layer.offset, :].nbytes for layer in cache)
    assert held / 5 == 3 * 2 * 2 * 32 * 2 == model_bytes(small_kv_model)[0]


def test_its_replies_end_by_themselves(small_kv_model):
    model, tokenizer = load(str(small_kv_model))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say something."}], add_generation_prompt=True)
    reply = generate(model, tokenizer, prompt, max_tokens=400)
    assert len(tokenizer.encode(reply)) < 400


def test_the_qwen3_next_family_has_the_real_models_cache_layout():
    config = FAMILIES["qwen3_next"].config(FAMILIES["qwen3_next"].default_shape)
    assert {key: config[key] for key in QWEN3_NEXT_80B_A3B} == QWEN3_NEXT_80B_A3B


def test_a_qwen3_next_checkpoint_and_token_are_what_its_layers_hold(tmp_path):
    """model_bytes reads the bytes from the config; a real forward pass through its architecture (4 of its
    layers, 1 of them attention as in 48) leaves exactly 1/12 of them."""
    (tmp_path / "config.json").write_text(json.dumps(FAMILIES["qwen3_next"].config(FAMILIES["qwen3_next"].default_shape) | {"torch_dtype": "float16"}))
    per_token, checkpoint = model_bytes(tmp_path)
    assert per_token == 24 * KiB
    assert checkpoint == 36 * (32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 2)  # ~74 MiB
    model, _ = model_with_layers(tmp_path, 4)
    shapes = probed_shapes(model)
    assert sum(shape.bytes_per_token for shape in shapes) * 12 == per_token
    assert sum(shape.fixed_bytes for shape in shapes) * 12 == checkpoint


@pytest.mark.parametrize("key", ["32b", "30b-a3b", "next"])
def test_the_bench_presets_hold_the_real_bytes(key):
    shape = SHAPES[key]
    if not (shape.model / "config.json").exists():
        pytest.skip(f"{shape.model} is not built (make tiny-kv-models)")
    assert model_bytes(shape.model)[0] == {"32b": 256 * KiB, "30b-a3b": 96 * KiB, "next": 24 * KiB}[key]
