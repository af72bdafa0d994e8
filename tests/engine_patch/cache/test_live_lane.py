"""The hot lane kept live (engine_patch/cache/live_lane.py): the next request sharing the last one's prefix
takes its cache over in place, and answers as a cold engine and as a restore from the blocks would.

A dense family (qwen2: every layer trimmed), a sliding-window one (Gemma 3: its windows restored from a
checkpoint, or kept as they are where the prefix ends at the lane's end) and a hybrid (Qwen3.5: recurrent
state likewise), each through the cached stream_generate over a RAM tier, in process.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx_lm
import pytest

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.vllm_mlx.simple.cached_generation import CachedGeneration
from tests.support.family_chat import FAMILY_MODELS, ORIGINAL_STREAM_GENERATE, chat_head, greedy, prompt, resume_position, served
from tests.support.models import require_model

BUDGET = 256 * 2**20


@dataclass
class Family:
    name: str
    model: object
    tokenizer: object
    head: str | None


@pytest.fixture(scope="module", params=["qwen2", "qwen3_5", pytest.param("gemma3_text", marks=pytest.mark.slow)])
def family(request) -> Family:
    model, tokenizer = mlx_lm.load(str(require_model(FAMILY_MODELS[request.param])))
    return Family(request.param, model, tokenizer, chat_head(tokenizer))


_cold: dict[tuple[str, str], list[int]] = {}


def cold(family: Family, text) -> list[int]:
    key = (family.name, str(text))
    if key not in _cold:
        _cold[key] = greedy(ORIGINAL_STREAM_GENERATE, family.model, family.tokenizer, text)
    return _cold[key]


def engine(live_lanes: int = 1) -> tuple[CachedGeneration, RamTier]:
    cache = RamTier(budget_bytes=BUDGET, live_lane_limit=live_lanes)
    return CachedGeneration(ORIGINAL_STREAM_GENERATE, cache), cache


def answer(generation: CachedGeneration, family: Family, text) -> tuple[list[int], int]:
    tokens, reuse = served(generation, family.model, family.tokenizer, text, family.head)
    return tokens, reuse.reused


def test_the_next_turn_of_the_lane_takes_its_live_cache_over_and_answers_as_cold(family):
    generation, cache = engine()
    answer(generation, family, prompt(family.tokenizer, "main", 1))
    text = prompt(family.tokenizer, "main", 3)
    tokens, reused = answer(generation, family, text)
    assert tokens == cold(family, text)
    assert reused >= resume_position(family.tokenizer, prompt(family.tokenizer, "main", 1))
    stats = cache.stats()
    assert (stats["live_reuses"], stats["live_tokens_reused"], stats["live_fallbacks"]) == (1, reused, 0)
    assert stats["live_bytes_not_restored"] > 0 and stats["live_lanes"] == 1


def test_a_turn_from_the_live_cache_answers_as_the_same_turn_restored_from_the_blocks(family):
    answers = []
    for live_lanes in (1, 0):
        generation, cache = engine(live_lanes)
        answer(generation, family, prompt(family.tokenizer, "main", 1))
        answers.append(answer(generation, family, prompt(family.tokenizer, "main", 3)))
        assert cache.stats()["live_reuses"] == live_lanes
    assert answers[0] == answers[1]


def test_a_request_continuing_the_whole_lane_reuses_its_state_as_it_is_and_answers_as_cold(family):
    generation, cache = engine()
    first = family.tokenizer.encode(prompt(family.tokenizer, "main", 1), add_special_tokens=False)
    reply, _ = answer(generation, family, first)
    kept = cache.live.lanes[-1].prompt_cache
    layers = list(kept)
    extended = first + reply + family.tokenizer.encode("\nGo on.", add_special_tokens=False)
    tokens, reused = answer(generation, family, extended)
    assert tokens == cold(family, extended)
    assert reused == len(first) + len(reply)
    assert cache.stats()["live_reuses"] == 1
    # The same cache, every layer the same object (positional ones too: nothing restored from a checkpoint).
    assert cache.live.lanes[-1].prompt_cache is kept and all(a is b for a, b in zip(kept, layers))


def test_another_lanes_request_between_two_turns_leaves_both_lanes_answering_as_cold(family):
    generation, cache = engine()
    for lane, turns in [("main", 1), ("subagent", 1), ("main", 3), ("subagent", 3)]:
        text = prompt(family.tokenizer, lane, turns)
        tokens, _ = answer(generation, family, text)
        assert tokens == cold(family, text), (lane, turns)
    # Each request after the first took the last one's cache over, at least for the head both lanes share.
    assert cache.stats()["live_reuses"] >= 1 and cache.stats()["live_fallbacks"] == 0


def test_a_kept_cache_fed_since_is_not_reused_and_the_turn_is_restored_from_the_blocks(family):
    generation, cache = engine()
    answer(generation, family, prompt(family.tokenizer, "main", 1))
    kept = cache.live.lanes[-1].prompt_cache
    family.model(mx.array([[1]]), cache=kept)  # someone fed it after its request ended
    text = prompt(family.tokenizer, "main", 3)
    tokens, reused = answer(generation, family, text)
    assert tokens == cold(family, text) and reused > 0
    stats = cache.stats()
    assert (stats["live_reuses"], stats["live_fallbacks"]) == (0, 1)
    assert "not the" in stats["last_live_fallback_reason"]


def test_clearing_the_cache_drops_the_live_lane_too(family):
    generation, cache = engine()
    answer(generation, family, prompt(family.tokenizer, "main", 1))
    assert cache.stats()["live_bytes"] > 0
    cache.clear()
    text = prompt(family.tokenizer, "main", 3)
    tokens, reused = answer(generation, family, text)
    assert (tokens, reused) == (cold(family, text), 0)
    assert cache.stats()["live_reuses"] == 0
