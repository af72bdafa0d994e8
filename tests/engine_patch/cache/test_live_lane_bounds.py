"""What the RAM tier keeps live and for whom (engine_patch/cache/live_lane.py), on a stand-in model of plain
KV layers: bounded to the last lane(s), taken by one request of the same model, cut back exactly."""

import gc

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from stable_prefix.engine_patch.cache.ram_tier import RamTier

LAYERS, HEADS, HEAD_DIM = 2, 2, 8


class PlainKVModel:
    """What `make_prompt_cache` asks of a model: its layers' caches."""

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in range(LAYERS)]


def finished_request(tier: RamTier, model, tokens: list[int]) -> list[KVCache]:
    """A request's cache at its end (distinct values per token), stored and kept live as the planner does."""
    cache = model.make_cache()
    for index, layer in enumerate(cache):
        values = mx.array(np.asarray(tokens, dtype=np.float16)[None, None, :, None] * np.ones((1, HEADS, 1, HEAD_DIM), np.float16)) + index
        layer.update_and_fetch(values, -values)
    mx.eval([layer.keys for layer in cache])
    tier.store(tokens, cache, len(tokens), model=model)
    tier.keep_live(tokens, cache, model=model)
    return cache


def test_the_next_request_sharing_the_lane_gets_the_kept_cache_itself_cut_to_the_shared_prefix():
    tier, model = RamTier(budget_bytes=2**24, block_tokens=4), PlainKVModel()
    kept = finished_request(tier, model, list(range(1, 11)))
    fetched = tier.fetch(model, list(range(1, 7)) + [99, 98])
    assert fetched.reused == 6 and fetched.prompt_cache is kept
    assert np.array_equal(np.asarray(fetched.prompt_cache[1].state[0][0, 0, :, 0]), np.arange(1, 7) + 1)
    assert tier.stats()["live_lanes"] == 0  # the request's now, not the tier's


def test_a_request_of_another_lane_drops_the_kept_cache():
    tier, model = RamTier(budget_bytes=2**24, block_tokens=4), PlainKVModel()
    finished_request(tier, model, list(range(1, 11)))
    fetched = tier.fetch(model, [50, 51, 52])
    assert fetched.reused == 0 and tier.stats()["live_lanes"] == 0


def test_a_request_takes_only_its_own_models_kept_cache():
    tier, first, second = RamTier(budget_bytes=2**24, block_tokens=4, live_lane_limit=2), PlainKVModel(), PlainKVModel()
    firsts = finished_request(tier, first, list(range(1, 11)))
    seconds = finished_request(tier, second, list(range(1, 11)))  # the same tokens, newer, another model's state
    assert tier.fetch(first, list(range(1, 12))).prompt_cache is firsts
    assert [lane.prompt_cache for lane in tier.live.lanes] == [seconds]


def test_with_two_lanes_kept_a_request_of_a_third_keeps_the_newer_for_its_own_next_turn():
    tier, model = RamTier(budget_bytes=2**24, block_tokens=4, live_lane_limit=2), PlainKVModel()
    finished_request(tier, model, list(range(1, 11)))
    newer = finished_request(tier, model, list(range(100, 110)))
    tier.fetch(model, [50, 51, 52])
    assert [lane.prompt_cache for lane in tier.live.lanes] == [newer]
    assert tier.fetch(model, list(range(100, 112))).prompt_cache is newer


def test_an_unloaded_models_kept_cache_is_dropped_with_it():
    tier, model = RamTier(budget_bytes=2**24, block_tokens=4), PlainKVModel()
    finished_request(tier, model, list(range(1, 11)))
    assert tier.stats()["live_lanes"] == 1
    del model
    gc.collect()
    assert tier.live.lanes == []
