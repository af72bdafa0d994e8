"""The tier interface (`cache/tier.py`): what the planner calls, declared once and implemented by both tiers."""

import inspect

import pytest

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.cache.tier import CacheTier
from stable_prefix.engine_patch.disk.tiered_cache import TieredCache

DECLARED = [name for name, member in vars(CacheTier).items() if inspect.isfunction(member) and not name.startswith("_")]


def mismatches(implemented, declared) -> list[str]:
    """What a call written against `declared` would get wrong on `implemented` (both unbound methods)."""
    wanted = list(inspect.signature(declared).parameters.values())[1:]
    offered = list(inspect.signature(implemented).parameters.values())[1:]
    by_name = {parameter.name: parameter for parameter in offered}
    wrong = []
    for position, parameter in enumerate(wanted):
        found = by_name.get(parameter.name)
        if found is None:
            wrong.append(f"no parameter {parameter.name}")
        elif parameter.kind is parameter.POSITIONAL_OR_KEYWORD and (offered.index(found) != position or found.kind is not found.POSITIONAL_OR_KEYWORD):
            wrong.append(f"{parameter.name} is not its positional parameter {position}")
        elif parameter.default is not parameter.empty and found.default is found.empty:
            wrong.append(f"{parameter.name} has no default")
    wrong += [f"{extra.name} is required but not declared" for extra in offered
              if extra.name not in {parameter.name for parameter in wanted} and extra.default is extra.empty]
    return wrong


def test_the_interface_declares_what_the_planner_calls():
    assert {"fetch", "store", "record_fallback"} <= set(DECLARED)
    assert inspect.signature(PrefixPlanner).parameters["cache"].annotation in (CacheTier, "CacheTier")


@pytest.mark.parametrize("tier", [RamTier, TieredCache], ids=lambda tier: tier.__name__)
@pytest.mark.parametrize("name", DECLARED)
def test_both_tiers_take_every_call_the_interface_declares(tier, name):
    assert mismatches(getattr(tier, name), getattr(CacheTier, name)) == []


def test_a_store_on_ram_over_disk_names_the_model_that_computed_the_state():
    with pytest.raises(TypeError, match="model"):
        TieredCache(RamTier(budget_bytes=2**20)).store([1, 2, 3], [])
