"""SimpleEngine's seam table is the whole truth: every attribute of vllm-mlx's or mlx-lm's that its install replaces is a
row, wrapped in the table's order, and the install can be taken out again."""

from __future__ import annotations

import importlib
import inspect

import mlx_lm

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.vllm_mlx.seam_table import take_out
from stable_prefix.engine_patch.vllm_mlx.simple.admitted_generation import AdmittedGeneration
from stable_prefix.engine_patch.vllm_mlx.simple.cached_generation import CachedGeneration
from stable_prefix.engine_patch.vllm_mlx.simple.drafted_generation import DraftedGeneration
from stable_prefix.engine_patch.vllm_mlx.simple.seams import SimpleEngineSeams, seam_table
from tests.support.shipped_attributes import put_back_afterwards, wrapped_in_table_order

# The modules of SimpleEngine's path a server loads, each holding something the table names.
ENGINE_MODULES = ("mlx_lm.generate", "vllm_mlx.engine.simple", "vllm_mlx.engine.chat_template_safety", "vllm_mlx.models.llm")


def fresh_seams() -> SimpleEngineSeams:
    return SimpleEngineSeams(PrefixPlanner(RamTier(budget_bytes=2**20)), Drafting("on"))


def test_every_attribute_the_simple_install_replaces_is_a_row_of_the_seam_table():
    with put_back_afterwards(*ENGINE_MODULES) as snapshot:
        seams = fresh_seams()
        seams.install()
        replaced = snapshot.replaced()
        rows = {(seam.owner, seam.name) for seam in seam_table(seams) if seam.available()}
    assert replaced == rows, f"replaced outside the table: {replaced - rows}; in the table, not replaced: {rows - replaced}"


def test_on_the_pinned_vllm_mlx_every_row_names_a_method_it_has():
    # A row naming a method the release lacks is left out (`where_present`): none is, on the release the patch pins.
    with put_back_afterwards(*ENGINE_MODULES):
        labels = fresh_seams().install()
    assert labels == [
        "mlx_lm.stream_generate", "mlx_lm.generate.stream_generate", "mlx_lm.generate.generate_step",
        "MLXLanguageModel.stream_generate", "SimpleEngine._probe_system_kv_cache_support",
        "vllm_mlx.engine.simple.build_system_prompt_cache_prefix", "SimpleEngine._render_chat_prompt",
        "SimpleEngine._submit_to_generation_worker",
    ]


def test_each_attribute_is_wrapped_in_the_tables_order_the_later_row_outermost():
    with put_back_afterwards(*ENGINE_MODULES) as snapshot:
        seams = fresh_seams()
        seams.install()
        assert wrapped_in_table_order(seam_table(seams), seams.patches, snapshot) == []


def test_stream_generate_runs_admission_then_drafts_then_the_cache_then_mlx_lms_own():
    generation = importlib.import_module("mlx_lm.generate")  # the module, not the function `mlx_lm.generate`
    shipped = mlx_lm.stream_generate
    with put_back_afterwards(*ENGINE_MODULES):
        fresh_seams().install()
        layers, layer = [], mlx_lm.stream_generate
        while layer is not shipped:
            layers.append(type(layer))
            layer = layer.__wrapped__
        assert layers == [AdmittedGeneration, DraftedGeneration, CachedGeneration]
        assert inspect.getattr_static(generation, "stream_generate") is mlx_lm.stream_generate  # mlx_lm.generate() too


def test_taking_the_install_out_leaves_every_attribute_as_shipped():
    with put_back_afterwards(*ENGINE_MODULES) as snapshot:
        seams = fresh_seams()
        seams.install()
        take_out(seams.patches)
        assert snapshot.replaced() == set()
