"""cache_layers on every cache kind and both mlx-lm cache APIs: a restored
checkpoint continues bit for bit like the live cache it was taken from, a
second restore is unaffected by the first, and sliding windows are kept at
their window's size."""

import json
import os
import subprocess
import sys

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from stable_prefix.engine_patch.cache import cache_layers
from tests.support import cache_core_check
from tests.support.processes import REPO_ROOT

MLX_LM_032 = REPO_ROOT / "build" / "mlx-lm-0.32"
FAMILIES = ["qwen2", "qwen3_5", "gpt_oss", "gemma3_text", "nemotron_h"]


def assert_exact(checked: dict, family: str) -> None:
    assert checked["reused"] == cache_core_check.CHECKPOINT_AT, family
    assert checked["restored_equals_split"] and checked["second_restore_equals_first"], family
    # The same entry after a restart, from disk: same position, same bits, same bytes held.
    assert checked["disk_loads"] == 1 and checked["disk_errors"] == 0, family
    assert checked["whole_lane_after_restart"] and checked["reused_after_restart"] == cache_core_check.CHECKPOINT_AT, family
    assert checked["from_disk_equals_split"], family
    assert checked["bytes_after_restart"] == checked["bytes"], family


@pytest.mark.parametrize("family", FAMILIES)
def test_a_restored_checkpoint_continues_bit_for_bit_on_the_installed_mlx_lm(family, tmp_path):
    assert_exact(cache_core_check.check(family, tmp_path), family)


@pytest.mark.parametrize("kind", cache_core_check.LAYER_KINDS)
def test_a_layer_kind_no_tiny_model_has_comes_back_from_its_arrays_as_it_was(kind):
    assert cache_core_check.serialized_layer_continues_like_the_original(cache_core_check.LAYER_KINDS[kind])


@pytest.mark.slow  # a second mlx-lm in a subprocess, every family loaded there: 44 s, the fast loop's longest (make test runs it)
def test_a_restored_checkpoint_continues_bit_for_bit_on_mlx_lm_0_32():
    """mlx-lm 0.32 changed the cache API (no meta_state; state carries offsets and padded buffers):
    snapshots, checkpoints and the disk tier's files on it."""
    if not (MLX_LM_032 / "mlx_lm").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(MLX_LM_032), "mlx-lm==0.32.2"],
                       check=True)
    output = subprocess.run(
        [sys.executable, "-m", "tests.support.cache_core_check"],
        capture_output=True, text=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(MLX_LM_032)}, check=True,
    ).stdout
    result = json.loads(output.strip().splitlines()[-1])
    assert result["mlx_lm"].startswith("0.32") and result["meta_state_api"] is False
    for family in FAMILIES:
        assert_exact(result["families"][family], family)
    assert result["layer_kinds"] == {kind: True for kind in cache_core_check.LAYER_KINDS}


def filled_rotating(window: int, tokens: int) -> RotatingKVCache:
    layer = RotatingKVCache(max_size=window)
    layer.update_and_fetch(mx.ones((1, 1, tokens, 8)), mx.ones((1, 1, tokens, 8)))
    return layer


def test_a_sliding_window_snapshot_holds_only_its_window():
    live = filled_rotating(window=64, tokens=500)  # a prefill chunk leaves window + chunk - 1 tokens
    layers, nbytes = cache_layers.snapshot([live])
    assert layers[0].keys.shape[2] == 64
    assert nbytes == 2 * 64 * 8 * 4


def test_recurrent_state_is_counted_as_a_fixed_cost_and_attention_per_token():
    recurrent = ArraysCache(size=2)
    recurrent[0], recurrent[1] = mx.zeros((1, 3, 16)), mx.zeros((1, 2, 8, 8))
    attention = KVCache()
    attention.update_and_fetch(mx.zeros((1, 1, 10, 8)), mx.zeros((1, 1, 10, 8)))
    assert cache_layers.state_nbytes([recurrent]) == (3 * 16 + 2 * 8 * 8) * 4
    assert cache_layers.state_nbytes([attention]) == 2 * 10 * 8 * 4
    assert cache_layers.positional_indices([recurrent, attention]) == [0]


def test_a_restored_recurrent_layer_keeps_a_list_of_its_own():
    recurrent = ArraysCache(size=2)
    recurrent[0], recurrent[1] = mx.zeros((1, 3, 16)), mx.zeros((1, 2, 8, 8))
    layers, _ = cache_layers.snapshot([recurrent])
    restored = cache_layers.restore(layers)[0]
    restored[0] = mx.ones((1, 3, 16))  # what a gated-delta step does
    assert isinstance(restored.cache, list)
    assert float(layers[0][0].sum()) == 0.0
