"""The prefix cache and drafted decoding inside vllm-mlx's SimpleEngine (one request at a time).

Five seams, each the narrowest that covers every request:
- `mlx_lm.stream_generate`, which every SimpleEngine text generation ends in,
  is wrapped by `CachedGeneration` (see there for why this depth), and that by
  `DraftedGeneration`, which hands each request's draft session to
  `mlx_lm.generate.generate_step`, replaced by its drafted decode
  (`drafted_generation.py`).
- vllm-mlx's own system-prefix cache (0.6.0) is switched off for a model our
  cache serves: it restores only the system+tools prefix, keeps whole copies
  per slot and would take the prompt before our cache sees it. For a model our
  cache cannot serve it stays on, so no model gets less reuse than shipped.
- Chat requests carry their stable head (system + tools, found by vllm-mlx's
  own probe) to the generation, where models with positional layers
  checkpoint it.
- The engine's worker submissions run in the submitting request's context, so
  the generation can tell the HTTP layer how much it reused.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import sys

from stable_prefix.engine_patch.cache.prompt_head import set_head_text
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.drafts.drafting import Drafting

from . import admitted_generation, drafted_generation
from .admitted_generation import AdmittedGeneration
from .cached_generation import CachedGeneration
from .drafted_generation import DraftedGeneration

logger = logging.getLogger("engine_patch")


def install(planner: PrefixPlanner, drafting: Drafting) -> list[str]:
    import mlx_lm

    generation = CachedGeneration(mlx_lm.stream_generate, planner.cache, planner)
    # Outside the cache, so the draft session sees the whole prompt (drafted_generation.py).
    drafted = DraftedGeneration(generation, drafting)
    # Outermost: prompts beyond the context and abandoned prefills stop before the cache (admission.py).
    admitted = AdmittedGeneration(drafted)
    mlx_lm.stream_generate = admitted
    # mlx_lm.generate() (vllm-mlx's non-streamed path) calls its module's global.
    sys.modules["mlx_lm.generate"].stream_generate = admitted
    patched = ["mlx_lm.stream_generate", *admitted_generation.install_early_check(), *drafted_generation.install(drafting)]
    patched += _defer_builtin_prefix_cache(generation, drafting)
    patched += _carry_prompt_head()
    patched += _carry_request_context_to_worker()
    return patched


def _defer_builtin_prefix_cache(generation: CachedGeneration, drafting: Drafting) -> list[str]:
    try:
        from vllm_mlx.engine import simple
    except ImportError:
        return []
    if not hasattr(simple, "build_system_prompt_cache_prefix"):
        return []  # releases before the system-prefix cache existed
    original_build = simple.build_system_prompt_cache_prefix
    original_probe = simple.SimpleEngine._probe_system_kv_cache_support.__func__
    engine_model = {"served_by_us": True}

    @functools.wraps(original_probe)
    def probe(cls, model, route):
        # Where SimpleEngine decides, at model load, whether its own cache can
        # serve the model, decide whether ours does.
        engine_model["served_by_us"] = generation.supports(model)
        drafting.prepare(model)  # at load, not on the first request: auto measures its verify-cost curve
        if not engine_model["served_by_us"]:
            logger.warning("engine_patch: this model keeps vllm-mlx's own system-prefix cache")
        return original_probe(cls, model, route)

    @functools.wraps(original_build)
    def system_prefix_unless_ours(*args, **kwargs):
        # With no system prefix found, SimpleEngine takes its plain path, which
        # ends in the wrapped mlx_lm.stream_generate.
        return None if engine_model["served_by_us"] else original_build(*args, **kwargs)

    simple.SimpleEngine._probe_system_kv_cache_support = classmethod(probe)
    simple.build_system_prompt_cache_prefix = system_prefix_unless_ours
    return ["SimpleEngine system-prefix cache (off for models we serve)"]


def _carry_prompt_head() -> list[str]:
    try:
        from vllm_mlx.engine import simple
        from vllm_mlx.engine.chat_template_safety import build_system_prompt_cache_prefix
    except ImportError:
        return []
    render = getattr(simple.SimpleEngine, "_render_chat_prompt", None)
    if render is None:
        return []

    @functools.wraps(render)
    def render_and_note_head(self, messages, *args, **kwargs):
        prompt, template_kwargs, safe_messages = render(self, messages, *args, **kwargs)
        if template_kwargs is not None:
            tokenizer = self._model.tokenizer
            set_head_text(lambda: build_system_prompt_cache_prefix(
                tokenizer, messages, template_kwargs=template_kwargs, normalized_messages=safe_messages))
        return prompt, template_kwargs, safe_messages

    simple.SimpleEngine._render_chat_prompt = render_and_note_head
    return ["SimpleEngine chat head"]


def _carry_request_context_to_worker() -> list[str]:
    try:
        from vllm_mlx.engine.simple import SimpleEngine
    except ImportError:
        return []
    submit = getattr(SimpleEngine, "_submit_to_generation_worker", None)
    if submit is None:
        return []  # older releases use asyncio.to_thread, which copies the context itself

    @functools.wraps(submit)
    async def submit_in_callers_context(self, worker, fn, /, *args, **kwargs):
        context = contextvars.copy_context()
        return await submit(self, worker, functools.partial(context.run, fn), *args, **kwargs)

    SimpleEngine._submit_to_generation_worker = submit_in_callers_context
    return ["SimpleEngine worker context"]
