"""Two models in one server (`--models-config`) sharing a tokenizer and every shape (build/tiny-model-test and its
seed-1 twin: other weights) never restore, share or replace each other's state: a lane one stored is no match for
the other, in RAM and on disk; the other's answer through the cache is its own, cold; and a lane goes to the disk
folder of the model that computed it, whatever the last request's model was."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner, prompt_token_ids
from stable_prefix.engine_patch.disk.disk_tier import DiskTier
from stable_prefix.engine_patch.disk.tiered_cache import TieredCache
from tests.support.models import OTHER_SEED_MODEL, TEST_MODEL, require_model

TEXT = "def add(a, b):\n    return a + b\n" * 8
FOLLOW_UP = TEXT + "def sub(a, b):\n    return a - b\n"


@pytest.fixture(scope="module")
def models():
    first, tokenizer = mlx_lm.load(str(require_model(TEST_MODEL)))
    second, _ = mlx_lm.load(str(require_model(OTHER_SEED_MODEL)))
    return first, second, tokenizer


@pytest.fixture
def tier(tmp_path, models):
    first, second, _ = models
    disk = DiskTier(tmp_path / "kv")
    disk.model_loaded(first, TEST_MODEL)
    disk.model_loaded(second, OTHER_SEED_MODEL)
    assert disk.identity_for(first, wait=120) != disk.identity_for(second, wait=120)
    yield disk
    disk.close(timeout=5)


def last_logits(model, planner: PrefixPlanner, tokenizer, text: str) -> tuple[int, np.ndarray]:
    """One request through the cache: restore, prefill the rest, store. What it reused and its last logits."""
    tokens = prompt_token_ids(tokenizer, text)
    plan = planner.plan(model, tokenizer, tokens)
    logits = model(mx.array(tokens[plan.reused :])[None], cache=plan.prompt_cache)[0, -1]
    planner.finish(plan, tokens, plan.prompt_cache)
    return plan.reused, np.array(logits.astype(mx.float32))


def cold_logits(model, tokenizer, text: str) -> np.ndarray:
    return np.array(model(mx.array(prompt_token_ids(tokenizer, text))[None])[0, -1].astype(mx.float32))


def test_a_lane_one_model_stored_in_ram_is_no_match_for_the_other_and_its_answer_is_its_own(models):
    first, second, tokenizer = models
    planner = PrefixPlanner(RamTier(budget_bytes=64 * 2**20))
    last_logits(first, planner, tokenizer, TEXT)
    reused, logits = last_logits(second, planner, tokenizer, FOLLOW_UP)
    assert reused == 0
    assert np.array_equal(logits, cold_logits(second, tokenizer, FOLLOW_UP))
    assert last_logits(first, planner, tokenizer, FOLLOW_UP)[0] > 0  # the first model's own lane is still there


def test_the_same_tokens_of_two_models_are_two_lanes_and_two_sets_of_blocks(models):
    first, second, tokenizer = models
    cache = RamTier(budget_bytes=64 * 2**20, block_tokens=16)
    planner = PrefixPlanner(cache)
    last_logits(first, planner, tokenizer, TEXT)
    blocks = cache.stats()["blocks"]
    last_logits(second, planner, tokenizer, TEXT)  # would replace the first model's lane, or share its blocks
    assert cache.stats()["entries"] == 2 and cache.stats()["blocks"] == 2 * blocks


def test_each_model_s_lane_goes_to_its_own_disk_folder_whichever_model_the_last_request_used(models, tier):
    first, second, tokenizer = models
    planner = PrefixPlanner(TieredCache(RamTier(budget_bytes=64 * 2**20), tier))
    tokens = prompt_token_ids(tokenizer, TEXT)
    first_plan = planner.plan(first, tokenizer, tokens)  # two engines' requests in flight at once
    second_plan = planner.plan(second, tokenizer, prompt_token_ids(tokenizer, FOLLOW_UP))
    first(mx.array(tokens)[None], cache=first_plan.prompt_cache)
    planner.finish(first_plan, tokens, first_plan.prompt_cache)  # after the second model's fetch
    assert tier.flush(timeout=60)
    assert [len(lane.tokens) for lane in tier.lanes(first)] == [len(tokens)]
    assert tier.lanes(second) == []
    del second_plan


def test_a_lane_one_model_wrote_to_disk_is_no_match_for_the_other_after_a_restart(models, tier, tmp_path):
    first, second, tokenizer = models
    planner = PrefixPlanner(TieredCache(RamTier(budget_bytes=64 * 2**20), tier))
    last_logits(first, planner, tokenizer, TEXT)
    assert tier.flush(timeout=60)
    restarted = PrefixPlanner(TieredCache(RamTier(budget_bytes=64 * 2**20), tier))  # RAM empty, the disk as it was
    reused, logits = last_logits(second, restarted, tokenizer, FOLLOW_UP)
    assert reused == 0 and np.array_equal(logits, cold_logits(second, tokenizer, FOLLOW_UP))
    assert last_logits(first, restarted, tokenizer, FOLLOW_UP)[0] > 0
