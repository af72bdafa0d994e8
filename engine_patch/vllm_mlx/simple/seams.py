"""Every seam of SimpleEngine in one table (`seam_table`), and the one `install()` that puts them in.

vllm-mlx 0.6.0's SimpleEngine serves one request at a time: it renders a chat
request (`_render_chat_prompt`), runs the generation on its worker
(`_submit_to_generation_worker`), and every text generation, streamed or not,
ends in `mlx_lm.stream_generate`. Each row of the table wraps one of their
functions or methods, named by reference (as shipped), with what runs around
it and why: the narrowest seams that cover every request.

The order of wrappers is the table's (`seam_table.py`, the mechanics both
engines' tables share): rows are put in top to bottom, and a row on an
attribute an earlier row already wrapped wraps that wrapper, so it runs first
and calls the earlier one. `mlx_lm.stream_generate` is wrapped three times:
the cache (`cached_generation.py`), around it the draft session
(`drafted_generation.py`: outside the cache, so it sees the whole prompt),
around both the admission checks (`admitted_generation.py`: a prompt beyond
the context and an abandoned prefill stop before the cache). vllm-mlx's own
system-prefix cache (0.6.0) is switched off for a model ours serves: it
restores only the system+tools prefix, keeps whole copies per slot and would
take the prompt before ours sees it; for a model ours cannot serve it stays
on, so no model gets less reuse than shipped.
`tests/engine_patch/vllm_mlx/test_simple_seams.py` fails on any replaced
attribute not in the table, or wrapped in another order.

A release without a method a row names (vllm-mlx 0.3.0 has none of
SimpleEngine's three) keeps that part as shipped (`where_present`).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

from stable_prefix.engine_patch.cache.prompt_head import set_head_text
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.drafts.drafting import Drafting

from ..seam_table import Patch, Seam, labels, put_in, where_present
from .admitted_generation import AdmittedGeneration, refusing_far_too_long
from .cached_generation import CachedGeneration
from .drafted_generation import DraftedGeneration, drafts_dispatched

logger = logging.getLogger("engine_patch")


def seam_table(seams: SimpleEngineSeams) -> tuple[Seam, ...]:
    """SimpleEngine's seams, in the order they are put in (vllm-mlx imported here, at install)."""
    import mlx_lm

    generation = importlib.import_module("mlx_lm.generate")  # `mlx_lm.generate` is also a function's name
    planner = seams.planner
    return (
        Seam(mlx_lm, mlx_lm.stream_generate, functools.partial(CachedGeneration, cache=planner.cache, planner=planner),
             "restore the longest stored prefix, prefill to the checkpoints, keep the final state"),
        Seam(mlx_lm, mlx_lm.stream_generate, functools.partial(DraftedGeneration, drafting=seams.drafting),
             "the request's draft session, opened with the whole prompt (around the cache above)"),
        Seam(mlx_lm, mlx_lm.stream_generate, AdmittedGeneration,
             "a prompt beyond the context is refused, an abandoned prefill stopped, before the cache (outermost)"),
        Seam(generation, generation.stream_generate, seams.layered_as_mlx_lms,
             "the same layers: mlx_lm.generate(), vllm-mlx's non-streamed path, calls its module's global"),
        Seam(generation, generation.generate_step, drafts_dispatched,
             "a call carrying a draft session decodes with drafts, any other as shipped"),
        *where_present("vllm_mlx.models.llm", lambda llm: [
            Seam(llm.MLXLanguageModel, llm.MLXLanguageModel.stream_generate, refusing_far_too_long,
                 "a paste far beyond the context is refused before vllm-mlx tokenizes it whole to count it"),
        ]),
        *where_present("vllm_mlx.engine.simple", lambda simple: [  # releases before the system-prefix cache: neither
            Seam(simple.SimpleEngine, simple.SimpleEngine._probe_system_kv_cache_support, seams.decide_at_load,
                 "at model load: does ours serve the model (then vllm-mlx's system-prefix cache is off)? drafting measures"),
            Seam(simple, simple.build_system_prompt_cache_prefix, seams.system_prefix_unless_ours,
                 "no system prefix where ours serves: SimpleEngine takes its plain path, into the layers above"),
        ]),
        *where_present("vllm_mlx.engine.simple", lambda simple: [
            Seam(simple.SimpleEngine, simple.SimpleEngine._render_chat_prompt, note_chat_head,
                 "the chat head (system + tools, vllm-mlx's own probe), for models that checkpoint it",
                 needs="vllm_mlx.engine.chat_template_safety"),
        ]),
        *where_present("vllm_mlx.engine.simple", lambda simple: [  # older releases use asyncio.to_thread, which copies it
            Seam(simple.SimpleEngine, simple.SimpleEngine._submit_to_generation_worker, carry_request_context,
                 "the worker runs the generation in the request's context, which tells the HTTP layer what was reused"),
        ]),
    )


def install(planner: PrefixPlanner, drafting: Drafting) -> list[str]:
    """Every row of the table on vllm-mlx and mlx-lm: SimpleEngine serves our cache; what was patched."""
    return SimpleEngineSeams(planner, drafting).install()


class SimpleEngineSeams:
    """The wrappers of the table's rows that share the planner, drafting, and what the last model load decided."""

    def __init__(self, planner: PrefixPlanner, drafting: Drafting):
        self.planner = planner
        self.drafting = drafting
        self.serves_loaded_model = True  # decided again at each model load (`decide_at_load`)
        self.patches: list[Patch] = []  # what install() replaced: `seam_table.take_out` puts it back

    def install(self) -> list[str]:
        self.patches = put_in(seam_table(self))
        return labels(self.patches)

    @staticmethod
    def layered_as_mlx_lms(shipped: Callable[..., Any]) -> Callable[..., Any]:
        """`mlx_lm.generate.stream_generate` as `mlx_lm.stream_generate` is now (the package re-exports the module's)."""
        import mlx_lm

        return mlx_lm.stream_generate

    def decide_at_load(self, probe: classmethod) -> classmethod:
        seams, shipped = self, probe.__func__

        @functools.wraps(shipped)
        def _probe_system_kv_cache_support(cls, model, route):
            # Where SimpleEngine decides, at model load, whether its own cache can serve the model, decide whether ours does.
            seams.serves_loaded_model = seams.planner.supports(model)
            seams.drafting.prepare(model)  # at load, not on the first request: auto measures its verify-cost curve
            if not seams.serves_loaded_model:
                logger.warning("engine_patch: this model keeps vllm-mlx's own system-prefix cache")
            return shipped(cls, model, route)

        return classmethod(_probe_system_kv_cache_support)

    def system_prefix_unless_ours(self, build: Callable[..., Any]) -> Callable[..., Any]:
        seams = self

        @functools.wraps(build)
        def build_system_prompt_cache_prefix(*args, **kwargs):
            # With no system prefix found, SimpleEngine takes its plain path, which ends in the wrapped mlx_lm.stream_generate.
            return build(*args, **kwargs) if not seams.serves_loaded_model else None

        return build_system_prompt_cache_prefix


def note_chat_head(render: Callable[..., Any]) -> Callable[..., Any]:
    from vllm_mlx.engine.chat_template_safety import build_system_prompt_cache_prefix

    @functools.wraps(render)
    def render_and_note_head(engine, messages, *args, **kwargs):
        prompt, template_kwargs, safe_messages = render(engine, messages, *args, **kwargs)
        if template_kwargs is not None:
            tokenizer = engine._model.tokenizer
            set_head_text(lambda: build_system_prompt_cache_prefix(
                tokenizer, messages, template_kwargs=template_kwargs, normalized_messages=safe_messages))
        return prompt, template_kwargs, safe_messages

    return render_and_note_head


def carry_request_context(submit: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(submit)
    async def submit_in_callers_context(engine, worker, fn, /, *args, **kwargs):
        context = contextvars.copy_context()
        return await submit(engine, worker, functools.partial(context.run, fn), *args, **kwargs)

    return submit_in_callers_context
