"""The cached mlx_lm.stream_generate with the real tiny model, in process:
same tokens as without the cache, only new tokens prefilled, and any fault in
the cache path falls back to a correct, uncached answer."""

import logging

import mlx_lm
import pytest
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache
from mlx_lm.sample_utils import make_sampler

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_reuse import begin_request, end_request
from stable_prefix.engine_patch.vllm_mlx.simple.cached_generation import CachedGeneration
from tests.support.models import require_model

ORIGINAL_STREAM_GENERATE = mlx_lm.stream_generate


@pytest.fixture(scope="module")
def loaded():
    return mlx_lm.load(str(require_model()))


@pytest.fixture
def generation():
    return CachedGeneration(ORIGINAL_STREAM_GENERATE, RamTier(budget_bytes=256 * 2**20))


def chat(tokenizer, *turns: str, tools=None) -> str:
    messages = [{"role": "system", "content": "You are a careful coding agent. Use tools when needed."}]
    for index, text in enumerate(turns):
        messages.append({"role": "user" if index % 2 == 0 else "assistant", "content": text})
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def greedy(stream_generate, model, tokenizer, prompt: str, max_tokens: int = 12, **kwargs) -> list[int]:
    sampler = make_sampler(temp=0.0)
    return [response.token for response in stream_generate(model, tokenizer, prompt, max_tokens, sampler=sampler, **kwargs)]


READ_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file from the workspace.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


def conversation_turns(lane: str) -> list[tuple[str, ...]]:
    first = f"[{lane}] Please look at src/app.py and tell me what the handler does."
    return [
        (first,),
        (first, "It parses the request and calls the service.", "Now check tests/test_app.py too."),
        (first, "It parses the request and calls the service.", "Now check tests/test_app.py too.",
         "The tests cover the happy path only.", "Add a test for the error path."),
    ]


def test_greedy_tokens_with_the_cache_equal_tokens_without_it_across_interleaved_lanes(loaded, generation):
    model, tokenizer = loaded
    for main_turn, side_turn in zip(conversation_turns("main"), conversation_turns("subagent")):
        for turns, tools in ((main_turn, [READ_TOOL]), (side_turn, None)):
            prompt = chat(tokenizer, *turns, tools=tools)
            assert greedy(generation, model, tokenizer, prompt) == greedy(ORIGINAL_STREAM_GENERATE, model, tokenizer, prompt)
    stats = generation.cache.stats()
    # Every turn after each lane's first hits; the subagent's first turn may
    # also hit the opening of the system prompt it shares with the main lane.
    assert stats["hits"] >= 4
    assert stats["hits"] + stats["misses"] == 6


def test_a_follow_up_turn_prefills_only_what_is_new(loaded, generation):
    model, tokenizer = loaded
    turn1, turn2 = conversation_turns("main")[:2]
    prompt1 = chat(tokenizer, *turn1)
    greedy(generation, model, tokenizer, prompt1)
    before = generation.cache.stats()["tokens_prefilled"]

    reuse, token = begin_request()
    try:
        greedy(generation, model, tokenizer, chat(tokenizer, *turn2))
    finally:
        end_request(token)

    prompt1_tokens = len(tokenizer.encode(prompt1))
    assert reuse.reused >= prompt1_tokens - 1
    assert generation.cache.stats()["tokens_prefilled"] - before == reuse.prompt_tokens - reuse.reused


def test_a_failing_restore_gives_the_uncached_answer_a_warning_and_a_counted_fallback(loaded, monkeypatch, caplog):
    model, tokenizer = loaded
    # No live lane kept: the next turn restores from the blocks (a kept lane would be taken over without a restore).
    generation = CachedGeneration(ORIGINAL_STREAM_GENERATE, RamTier(budget_bytes=256 * 2**20, live_lane_limit=0))
    turn1, turn2 = conversation_turns("main")[:2]
    greedy(generation, model, tokenizer, chat(tokenizer, *turn1))

    def broken_restore(*args):
        raise RuntimeError("injected restore failure")

    monkeypatch.setattr("stable_prefix.engine_patch.cache.ram_tier.restore_from_blocks", broken_restore)
    prompt = chat(tokenizer, *turn2)
    with caplog.at_level(logging.WARNING, logger="engine_patch"):
        tokens = greedy(generation, model, tokenizer, prompt)
    assert tokens == greedy(ORIGINAL_STREAM_GENERATE, model, tokenizer, prompt)
    assert generation.cache.stats()["fallbacks"] == 1
    assert "injected restore failure" in caplog.text


def test_a_failing_snapshot_keeps_the_answer_and_counts_a_fallback(loaded, generation, monkeypatch, caplog):
    model, tokenizer = loaded

    def broken_snapshot(*args):
        raise RuntimeError("injected snapshot failure")

    monkeypatch.setattr("stable_prefix.engine_patch.cache.ram_tier.copy_block", broken_snapshot)
    prompt = chat(tokenizer, *conversation_turns("main")[0])
    with caplog.at_level(logging.WARNING, logger="engine_patch"):
        tokens = greedy(generation, model, tokenizer, prompt)
    assert tokens == greedy(ORIGINAL_STREAM_GENERATE, model, tokenizer, prompt)
    assert generation.cache.stats()["fallbacks"] == 1
    assert generation.cache.stats()["entries"] == 0
    assert "injected snapshot failure" in caplog.text


def test_requests_that_build_a_quantized_cache_bypass_the_prefix_cache(loaded, generation):
    model, tokenizer = loaded
    prompt = chat(tokenizer, *conversation_turns("main")[0])
    greedy(generation, model, tokenizer, prompt, kv_bits=8, kv_group_size=32)
    assert generation.cache.stats()["misses"] == 0
    assert generation.cache.stats()["entries"] == 0
    assert generation.bypassed == {"kv_bits": 1}


class ModelWithCache:
    """The tiny model with another kind of cache: sliding-window (as Gemma or gpt-oss) or quantized."""

    def __init__(self, model, make_layer):
        self.model = model
        self.layers = model.layers
        self.make_layer = make_layer

    def make_cache(self):
        return [self.make_layer() for _ in self.layers]

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def parameters(self):
        return self.model.parameters()


def test_a_model_with_a_sliding_window_cache_is_checkpointed_and_answers_as_uncached(loaded, generation):
    model, tokenizer = loaded
    sliding = ModelWithCache(model, lambda: RotatingKVCache(max_size=64, keep=4))
    for turns in conversation_turns("main"):
        prompt = chat(tokenizer, *turns)
        assert greedy(generation, sliding, tokenizer, prompt) == greedy(ORIGINAL_STREAM_GENERATE, sliding, tokenizer, prompt)
    stats = generation.cache.stats()
    assert stats["hits"] == 2 and stats["tokens_reused"] > 0
    assert all(checkpoints for checkpoints in stats["entry_checkpoints"])
    assert not generation.unsupported_reasons()


def test_a_model_whose_cache_cannot_be_snapshotted_runs_uncached_with_the_reason_logged(loaded, generation, caplog):
    model, tokenizer = loaded
    quantized = ModelWithCache(model, lambda: QuantizedKVCache(group_size=32, bits=8))
    prompt = chat(tokenizer, *conversation_turns("main")[0])
    with caplog.at_level(logging.WARNING, logger="engine_patch"):
        tokens = greedy(generation, quantized, tokenizer, prompt)
        greedy(generation, quantized, tokenizer, prompt)
    assert tokens == greedy(ORIGINAL_STREAM_GENERATE, quantized, tokenizer, prompt)
    assert generation.cache.stats()["entries"] == 0
    assert "prefix cache disabled for ModelWithCache: cache layers are QuantizedKVCache" in caplog.text
    assert generation.unsupported_reasons()


def test_a_failing_checkpoint_prefill_gives_the_uncached_answer_and_reports_no_reuse(loaded, generation, monkeypatch):
    model, tokenizer = loaded
    sliding = ModelWithCache(model, lambda: RotatingKVCache(max_size=64, keep=4))
    prompt = chat(tokenizer, *conversation_turns("main")[1])
    greedy(generation, sliding, tokenizer, chat(tokenizer, *conversation_turns("main")[0]))

    def broken_eval(prompt_cache):
        raise RuntimeError("injected prefill failure")

    monkeypatch.setattr("stable_prefix.engine_patch.vllm_mlx.simple.cached_generation.eval_state", broken_eval)
    reuse, token = begin_request()
    try:
        tokens = greedy(generation, sliding, tokenizer, prompt)
    finally:
        end_request(token)
    assert tokens == greedy(ORIGINAL_STREAM_GENERATE, sliding, tokenizer, prompt)
    assert reuse.reused == 0
    assert generation.cache.stats()["fallbacks"] == 1
