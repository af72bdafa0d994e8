"""The batched engine's seam table is the whole truth: every method of vllm-mlx's or mlx-lm's that its install replaces is
a row, wrapped in the table's order, and so is every method it replaces on the generators a served scheduler builds."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys

import mlx_lm

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.vllm_mlx.batched.seams import EACH_GENERATOR, ON_THE_CLASS, BatchedEngineSeams, seam_table
from tests.support.batched_scheduler import Arrival, batched_seams, scheduler, serve
from tests.support.models import TEST_MODEL, require_model

SHIPPED_PACKAGES = ("vllm_mlx", "mlx_lm")


def shipped_namespaces() -> list[object]:
    """Every module of vllm-mlx and mlx-lm loaded now, and every class defined in one."""
    import vllm_mlx.engine.batched  # noqa: F401  (the engine's modules loaded, as a server loads them)
    import vllm_mlx.engine.chat_template_safety  # noqa: F401
    import vllm_mlx.engine_core  # noqa: F401
    import vllm_mlx.scheduler  # noqa: F401

    modules = [module for name, module in list(sys.modules.items()) if name.split(".")[0] in SHIPPED_PACKAGES and module is not None]
    classes = [cls for module in modules for _, cls in inspect.getmembers(module, inspect.isclass) if cls.__module__ == module.__name__]
    return [*modules, *classes]


def methods(namespace: object) -> dict[str, object]:
    """A module's or class's attributes but its submodules (an import adds those, no install)."""
    return {name: value for name, value in vars(namespace).items() if not inspect.ismodule(value)}


@contextlib.contextmanager
def installed_on_a_snapshot():
    """The batched engine's install(), and what every shipped module and class held before it; all put back afterwards."""
    before = {id(namespace): (namespace, methods(namespace)) for namespace in shipped_namespaces()}
    seams = BatchedEngineSeams(PrefixPlanner(RamTier(budget_bytes=2**20)), Drafting("on"))
    try:
        yield seams, before
    finally:
        for namespace, attributes in before.values():
            for name in [name for name in methods(namespace) if name not in attributes]:
                delattr(namespace, name)
            for name, value in attributes.items():
                if vars(namespace).get(name) is not value:
                    setattr(namespace, name, value)


def class_rows(seams: BatchedEngineSeams) -> list:
    return [seam for seam in seam_table(seams) if seam.where == ON_THE_CLASS and seam.available()]


def test_every_attribute_the_batched_install_replaces_is_a_row_of_the_seam_table():
    with installed_on_a_snapshot() as (seams, before):
        seams.install()
        replaced = {(namespace, name) for namespace, attributes in before.values()
                    for name, value in methods(namespace).items() if name not in attributes or attributes[name] is not value}
        rows = {(seam.owner, seam.name) for seam in class_rows(seams)}
    assert replaced == rows, f"replaced outside the table: {replaced - rows}; in the table, not replaced: {rows - replaced}"


def test_each_attribute_is_wrapped_in_the_tables_order_the_later_row_outermost():
    with installed_on_a_snapshot() as (seams, _):
        rows = class_rows(seams)  # read before the install: each row's `shipped` is the method as shipped
        seams.install()
        for seam in rows:
            wrappers, method = [], getattr(seam.owner, seam.name)
            while method is not seam.shipped:
                wrappers.append(method.seam.does)
                method = method.__wrapped__
            in_order = [row.does for row in rows if (row.owner, row.name) == (seam.owner, seam.name)]
            assert wrappers == in_order[::-1], f"{seam.label}: wrapped by {wrappers}"


def test_the_queue_wait_count_runs_around_the_plan_of_the_requests_joining_the_batch():
    # The one class attribute wrapped twice, as the table states it.
    from vllm_mlx.scheduler import Scheduler

    with installed_on_a_snapshot() as (seams, _):
        shipped = Scheduler._schedule_waiting
        seams.install()
        outer = Scheduler._schedule_waiting
        assert outer.seam.wrap.func.__name__ == "count_queue_waits"
        assert outer.__wrapped__.seam.does.startswith("plan the requests")
        assert outer.__wrapped__.__wrapped__ is shipped


def wrapped_by(method) -> list:
    """The functions run around a generator's method, outermost first: each a partial whose first callable argument
    is the method it wraps."""
    functions = []
    while isinstance(method, functools.partial):
        functions.append(method.func.__func__)
        method = next(argument for argument in method.args if callable(argument))
    return functions


def test_a_served_schedulers_generator_is_wrapped_as_the_tables_generator_rows_say():
    model, tokenizer = mlx_lm.load(str(require_model(TEST_MODEL)))
    with batched_seams(drafting=Drafting("on")) as seams:
        served = scheduler(model, tokenizer)
        rows = [seam for seam in seam_table(seams) if seam.where == EACH_GENERATOR]
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
