"""A model vllm-mlx unloads (`--auto-unload-idle-seconds`, `--lazy-load-model`, a `--models-config` budget) is
freed with our cache installed: nothing of ours keeps it alive (the disk tier's identities, the planner's and
drafting's per-model decisions, the batched engine's record of the schedulers it serves), so loading, serving,
unloading and reloading a model three times holds one copy of its weights, not three."""

from __future__ import annotations

import gc
import weakref

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner, prompt_token_ids
from stable_prefix.engine_patch.disk.disk_tier import DiskTier
from stable_prefix.engine_patch.disk.tiered_cache import TieredCache
from stable_prefix.engine_patch.drafts.drafting import Drafting
from tests.support.batched_scheduler import Arrival, batched_seams, scheduler, serve
from tests.support.models import TEST_MODEL, require_model

RELOADS = 3
TEXT = "def add(a, b):\n    return a + b\n" * 8


def weight_bytes(model) -> int:
    return sum(array.nbytes for _, array in tree_flatten(model.parameters()))


def served_with_simple_engine_seams(planner: PrefixPlanner, tier: DiskTier, drafting: Drafting) -> tuple[weakref.ref, int]:
    """Load the model as a server does (the disk tier identifies it), serve one request through the cache, and
    let the server drop it; a weak reference to the model and its weights' bytes."""
    model, tokenizer = mlx_lm.load(str(require_model(TEST_MODEL)))
    tier.model_loaded(model, TEST_MODEL)
    assert tier.identity_for(model, wait=120) is not None
    drafting.prepare(model)
    tokens = prompt_token_ids(tokenizer, TEXT)
    plan = planner.plan(model, tokenizer, tokens)
    model(mx.array(tokens[plan.reused :])[None], cache=plan.prompt_cache)
    mx.eval([layer.state for layer in plan.prompt_cache])
    planner.finish(plan, tokens, plan.prompt_cache)
    assert tier.flush(timeout=60)
    return weakref.ref(model), weight_bytes(model)


def test_a_model_the_simple_engine_served_is_freed_when_unloaded_and_reloads_add_no_copy(tmp_path):
    tier = DiskTier(tmp_path / "kv")
    planner = PrefixPlanner(TieredCache(RamTier(budget_bytes=64 * 2**20), tier))
    drafting = Drafting("auto")
    try:
        gc.collect()
        before = mx.get_active_memory()
        for _ in range(RELOADS):
            model, weights = served_with_simple_engine_seams(planner, tier, drafting)
            gc.collect()
            assert model() is None, f"the unloaded model is still referenced by: {[type(r).__name__ for r in gc.get_referrers(model())]}"
        held = mx.get_active_memory() - before
        assert held < weights, f"{held} bytes still held after {RELOADS} loads of a {weights}-byte model"
    finally:
        tier.close(timeout=5)


def test_a_model_the_batched_engine_served_is_freed_with_its_scheduler():
    with batched_seams(drafting=Drafting("on")) as seams:
        for _ in range(RELOADS):
            model, tokenizer = mlx_lm.load(str(require_model(TEST_MODEL)))
            served = scheduler(model, tokenizer)
            serve(served, [Arrival(0, "r", TEXT, max_tokens=4)], seams)
            assert served in seams.served
            model_ref, scheduler_ref = weakref.ref(model), weakref.ref(served)
            del model, tokenizer, served
            gc.collect()
            assert scheduler_ref() is None and model_ref() is None
