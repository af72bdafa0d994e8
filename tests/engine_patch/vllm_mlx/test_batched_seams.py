"""The batched engine's seam table is the whole truth: every method of vllm-mlx's or mlx-lm's that its install replaces is
a row, wrapped in the table's order, and so is every method it replaces on the generators a served scheduler builds."""

from __future__ import annotations

import functools
import inspect

import mlx_lm

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.vllm_mlx.batched.seams import BatchedEngineSeams, seam_table
from tests.support.batched_scheduler import Arrival, batched_seams, scheduler, serve
from tests.support.models import TEST_MODEL, require_model
from tests.support.shipped_attributes import put_back_afterwards, wrapped_in_table_order

# The modules of the batched engine a server loads, each holding a class the table names.
ENGINE_MODULES = ("vllm_mlx.engine.batched", "vllm_mlx.engine.chat_template_safety", "vllm_mlx.engine_core", "vllm_mlx.scheduler")


def fresh_seams() -> BatchedEngineSeams:
    return BatchedEngineSeams(PrefixPlanner(RamTier(budget_bytes=2**20)), Drafting("on"))


def class_rows(seams: BatchedEngineSeams) -> list:
    return [seam for seam in seam_table(seams) if seam.run_by is None and seam.available()]


def test_every_attribute_the_batched_install_replaces_is_a_row_of_the_seam_table():
    with put_back_afterwards(*ENGINE_MODULES) as snapshot:
        seams = fresh_seams()
        seams.install()
        replaced = snapshot.replaced()
        rows = {(seam.owner, seam.name) for seam in class_rows(seams)}
    assert replaced == rows, f"replaced outside the table: {replaced - rows}; in the table, not replaced: {rows - replaced}"


def test_each_attribute_is_wrapped_in_the_tables_order_the_later_row_outermost():
    with put_back_afterwards(*ENGINE_MODULES) as snapshot:
        seams = fresh_seams()
        seams.install()
        assert wrapped_in_table_order(seam_table(seams), seams.patches, snapshot) == []


def test_the_queue_wait_count_runs_around_the_plan_of_the_requests_joining_the_batch():
    # The one class attribute wrapped twice, as the table states it.
    from vllm_mlx.scheduler import Scheduler

    with put_back_afterwards(*ENGINE_MODULES):
        shipped = Scheduler._schedule_waiting
        seams = fresh_seams()
        seams.install()
        plan, count = [patch for patch in seams.patches if patch.seam.label == "Scheduler._schedule_waiting"]
        assert count.seam.wrap.func.__name__ == "count_queue_waits"
        assert plan.seam.does.startswith("plan the requests")
        assert Scheduler._schedule_waiting.__wrapped__.__wrapped__ is shipped


def wrapped_by(method) -> list:
    """The rows' methods run around an object's method, outermost first: each a partial of a row's `wrap`, given its
    runner and the method it wraps."""
    functions = []
    while isinstance(method, functools.partial):
        functions.append(method.func)
        method = method.args[1]
    return functions


def test_a_served_schedulers_generator_is_wrapped_as_the_tables_generator_rows_say():
    model, tokenizer = mlx_lm.load(str(require_model(TEST_MODEL)))
    with batched_seams(drafting=Drafting("on")) as seams:
        served = scheduler(model, tokenizer)
        rows = [seam for seam in seam_table(seams) if seam.run_by is not None]
        generators = []
        create = served._create_batch_generator

        def create_and_keep(sampling_params):
            generators.append(create(sampling_params))
            return generators[-1]

        served._create_batch_generator = create_and_keep
        serve(served, [Arrival(0, "r", "Which files changed?", max_tokens=2)], seams)
    (generator,) = generators
    on_instances = {(type(target), name) for target in (generator, generator._generation_batch)
                    for name in vars(target) if inspect.isfunction(inspect.getattr_static(type(target), name, None))}
    assert on_instances == {(seam.owner, seam.name) for seam in rows}
    for owner, name in on_instances:
        target = generator if owner is type(generator) else generator._generation_batch
        in_order = [seam.wrap for seam in rows if (seam.owner, seam.name) == (owner, name)]
        assert wrapped_by(getattr(target, name)) == in_order[::-1], f"{owner.__name__}.{name}"
