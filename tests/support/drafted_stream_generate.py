"""SimpleEngine's drafted decode in process: mlx_lm.stream_generate with the prefix cache and drafts."""

from __future__ import annotations

import contextlib
import sys

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.vllm_mlx.simple import drafted_generation
from stable_prefix.engine_patch.vllm_mlx.simple.cached_generation import CachedGeneration
from stable_prefix.engine_patch.vllm_mlx.simple.drafted_generation import DraftedGeneration

from .family_chat import ORIGINAL_STREAM_GENERATE


@contextlib.contextmanager
def drafted_stream_generate(drafting: Drafting):
    """mlx_lm.stream_generate with the prefix cache and drafts, layered as simple_engine.install does;
    mlx-lm's generate_step as shipped again afterwards."""
    generate_module = sys.modules["mlx_lm.generate"]  # `mlx_lm.generate` is also a function's name
    shipped = generate_module.generate_step
    drafted_generation.install(drafting)
    try:
        yield DraftedGeneration(CachedGeneration(ORIGINAL_STREAM_GENERATE, RamTier(budget_bytes=256 * 2**20)), drafting)
    finally:
        generate_module.generate_step = shipped
