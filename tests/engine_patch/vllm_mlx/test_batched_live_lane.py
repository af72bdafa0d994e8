"""The hot lane kept live in the batched engine: a finished sequence's extracted cache is kept as the
lane's own, the next turn of that lane takes it over instead of restoring the blocks, and its greedy
tokens equal those of the batched engine without our cache (dense, hybrid and sliding-window families),
with two lanes taking turns and with rows drafting (drafted_decode.py drops each row's rejected tokens before
the cache is extracted)."""

from __future__ import annotations

import pytest

from stable_prefix.engine_patch.drafts.drafting import Drafting
from tests.support.batched_scheduler import Arrival, batched_seams, scheduler, serve, served_without_our_cache
from tests.support.family_chat import chat_head, prompt
from tests.support.family_models import shared_family_model
from tests.support.scripted_drafts import by_prompt, noisy_reference

STEP = 64  # small prefill chunks: a prompt takes several steps


def reference(model, tokenizer, arrivals: list[Arrival]):
    return served_without_our_cache(model, tokenizer, arrivals, prefill_step_size=STEP)


def one_lane(tokenizer, max_tokens: int = 8) -> list[Arrival]:
    """A lane's turns one after another: each arrives after the previous one ended."""
    head = chat_head(tokenizer)
    return [Arrival(step, f"main-{turns}", prompt(tokenizer, "main", turns), max_tokens=max_tokens, head=head)
            for step, turns in ((0, 1), (40, 3), (80, 5))]


def two_lanes_interleaved(tokenizer) -> list[Arrival]:
    """Two lanes taking turns: each turn follows the other lane's, so the lane kept live is the other one."""
    head = chat_head(tokenizer)
    return [Arrival(step, f"{lane}-{turns}", prompt(tokenizer, lane, turns), head=head)
            for step, lane, turns in ((0, "main", 1), (40, "sub", 1), (80, "main", 3), (120, "sub", 3), (160, "main", 5))]


@pytest.mark.parametrize("family", ("qwen2", "qwen3_5", "gemma3_text"))
def test_the_next_turn_of_a_lane_takes_over_its_live_cache_and_answers_as_the_engine_without_our_cache(family):
    model, tokenizer = shared_family_model(family)
    arrivals = one_lane(tokenizer)
    expected = reference(model, tokenizer, arrivals)
    with batched_seams() as seams:
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
        stats = seams.planner.cache.stats()
    assert ours.tokens == expected.tokens
    assert stats["live_reuses"] == 2, stats
    assert stats["live_fallbacks"] == 0 and stats["fallbacks"] == 0
    assert stats["live_bytes_not_restored"] > 0


@pytest.mark.parametrize("family", ("qwen2", "qwen3_5"))
def test_two_lanes_interleaved_stay_exact(family):
    model, tokenizer = shared_family_model(family)
    arrivals = two_lanes_interleaved(tokenizer)
    expected = reference(model, tokenizer, arrivals)
    with batched_seams() as seams:
        seams.planner.cache.live.limit = 2  # a lane for each
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
        stats = seams.planner.cache.stats()
    assert ours.tokens == expected.tokens
    assert stats["live_reuses"] == 3, stats
    assert stats["fallbacks"] == 0


@pytest.mark.parametrize("family", ("qwen2", "qwen3_5"))
def test_a_drafted_turn_s_live_cache_serves_the_next_turn_exactly(family):
    model, tokenizer = shared_family_model(family)
    arrivals = one_lane(tokenizer, max_tokens=24)
    expected = reference(model, tokenizer, arrivals)
    drafts = {tuple(tokenizer.encode(arrival.prompt)): noisy_reference(expected.tokens[arrival.request_id], 0.7, seed=index)
              for index, arrival in enumerate(arrivals)}
    drafting = Drafting("on", proposer=by_prompt(drafts))
    with batched_seams(drafting=drafting) as seams:
        ours = serve(scheduler(model, tokenizer, prefill_step_size=STEP), arrivals, seams)
        stats = seams.planner.cache.stats()
    assert ours.tokens == expected.tokens
    assert 0 < drafting.stats.figures()["draft_accepted"]
    assert stats["live_reuses"] == 2 and stats["live_fallbacks"] == 0, stats
