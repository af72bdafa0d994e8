"""Install the prefix cache into a running vllm-mlx (before its server starts).

Five seams, each the narrowest that covers every request:
- `mlx_lm.stream_generate`, which every SimpleEngine text generation ends in,
  is wrapped by `CachedGeneration` (see there for why this depth).
- vllm-mlx's own system-prefix cache (0.6.0) is switched off for a model our
  cache serves: it restores only the system+tools prefix, keeps whole copies
  per slot and would take the prompt before our cache sees it. For a model our
  cache cannot serve it stays on, so no model gets less reuse than shipped.
- Chat requests carry their stable head (system + tools, found by vllm-mlx's
  own probe) to the generation, where models with positional layers
  checkpoint it.
- The engine's worker submissions run in the submitting request's context, so
  the generation can tell the HTTP layer how much it reused.
- The HTTP app gets `/v1/cache/stats`, `DELETE /v1/cache[?tier=ram|disk]` and
  the usage fields.
- With a disk tier, `mlx_lm.utils.load_model` (every way vllm-mlx loads a text
  model) tells the disk tier which files the model came from, to identify it.

Work the request path repeats needlessly is removed by one module per fix
(`detokenizer_map`); see docs/request-path.md.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import inspect
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import detokenizer_map
from .admission import AdmissionMiddleware
from .admitted_generation import AdmittedGeneration
from .cached_generation import CachedGeneration
from .disk_tier import DiskTier
from .prefix_cache import PrefixCache
from .prompt_head import set_head_text
from .tiered_cache import TieredCache
from .usage_fields import ReuseUsageMiddleware

logger = logging.getLogger("engine_patch")

# Releases whose text path was read and found to end in mlx_lm.stream_generate.
# 0.6.0 is tested in CI; older ones in this range are accepted when the seams
# below are present, since they have no cache of their own to conflict with.
SUPPORTED_VERSIONS = ((0, 2, 0), (0, 7, 0))


# Seconds a clean shutdown waits for queued snapshot writes.
SHUTDOWN_WRITE_SECONDS = 30.0
CLEARABLE_TIERS = ("ram", "disk")


@dataclass(frozen=True)
class DiskOptions:
    directory: Path
    budget_bytes: int


@dataclass
class Installed:
    vllm_mlx_version: str
    cache: TieredCache
    generation: CachedGeneration
    patched: list[str]
    admission: AdmittedGeneration | None = None

    def stats(self) -> dict[str, Any]:
        return {
            **self.cache.stats(),
            **(self.admission.stats() if self.admission else {}),
            "vllm_mlx_version": self.vllm_mlx_version,
            "disabled_reasons": self.generation.unsupported_reasons(),
            "bypassed": dict(self.generation.bypassed),
        }


def parse_version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def why_unsupported(vllm_mlx: Any) -> str | None:
    """None when this vllm-mlx can be patched, else the reason it cannot."""
    version = getattr(vllm_mlx, "__version__", "unknown")
    low, high = SUPPORTED_VERSIONS
    if not (low <= parse_version(version) < high):
        return f"version {version} is outside the recognised range {'.'.join(map(str, low))} <= v < {'.'.join(map(str, high))}"
    try:
        from vllm_mlx.models.llm import MLXLanguageModel

        source = inspect.getsource(MLXLanguageModel.stream_generate)
    except Exception as error:
        return f"cannot read MLXLanguageModel.stream_generate ({error!r})"
    if "from mlx_lm import stream_generate" not in source:
        return "MLXLanguageModel.stream_generate no longer calls mlx_lm.stream_generate"
    return None


def install(budget_bytes: int, max_entries: int | None = None, disk: DiskOptions | None = None) -> Installed | None:
    import mlx_lm
    import vllm_mlx

    reason = why_unsupported(vllm_mlx)
    if reason:
        logger.warning("engine_patch: vllm-mlx left unpatched: %s", reason)
        return None

    disk_tier = DiskTier(disk.directory, disk.budget_bytes) if disk else None
    cache = TieredCache(PrefixCache(budget_bytes=budget_bytes, max_entries=max_entries), disk_tier)
    generation = CachedGeneration(mlx_lm.stream_generate, cache)
    patched = ["mlx_lm.stream_generate"]
    if disk_tier is not None:
        patched += _identify_loaded_models(disk_tier)
        atexit.register(disk_tier.close, SHUTDOWN_WRITE_SECONDS)
    # Outermost: prompts beyond the context and abandoned prefills stop before the cache (admission.py).
    admitted = AdmittedGeneration(generation)
    mlx_lm.stream_generate = admitted
    # mlx_lm.generate() (vllm-mlx's non-streamed path) calls its module's global.
    sys.modules["mlx_lm.generate"].stream_generate = admitted

    patched += _defer_builtin_prefix_cache(generation)
    patched += _carry_prompt_head()
    patched += detokenizer_map.install()
    patched += _carry_request_context_to_worker()
    installed = Installed(vllm_mlx.__version__, cache, generation, patched, admitted)
    patched += _add_http_endpoints(installed)

    limit = f", at most {max_entries} entries" if max_entries else ""
    on_disk = f"; disk {format_bytes(disk.budget_bytes)} in {disk.directory}" if disk else "; no disk tier"
    logger.info(
        "engine_patch: prefix cache installed on vllm-mlx %s (budget %s%s%s; patched %s)",
        vllm_mlx.__version__,
        format_bytes(budget_bytes),
        limit,
        on_disk,
        ", ".join(patched),
    )
    return installed


def _identify_loaded_models(disk_tier: DiskTier) -> list[str]:
    from mlx_lm import utils

    load_model = utils.load_model

    @functools.wraps(load_model)
    def load_model_and_identify(model_path, *args, **kwargs):
        loaded = load_model(model_path, *args, **kwargs)
        disk_tier.model_loaded(loaded[0], Path(model_path))
        return loaded

    utils.load_model = load_model_and_identify
    return ["mlx_lm.utils.load_model (model identity)"]


def _defer_builtin_prefix_cache(generation: CachedGeneration) -> list[str]:
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


def _add_http_endpoints(installed: Installed) -> list[str]:
    from fastapi import Depends, HTTPException
    from fastapi.routing import APIRoute
    from vllm_mlx import server

    dependencies = [Depends(server.verify_api_key)] if hasattr(server, "verify_api_key") else []
    app = server.app
    original_clear = _remove_route(app, "/v1/cache", "DELETE", APIRoute)
    _remove_route(app, "/v1/cache/stats", "GET", APIRoute)

    async def cache_stats():
        return installed.stats()

    async def clear_cache(tier: str | None = None):
        if tier is not None and tier not in CLEARABLE_TIERS:
            raise HTTPException(status_code=400, detail=f"tier={tier!r}: choose ram or disk (or leave it out to clear both)")
        dropped = installed.cache.clear((tier,) if tier else CLEARABLE_TIERS)
        result: dict[str, Any] = {"status": "cleared", **dropped}
        if original_clear is not None and tier in (None, "ram"):
            try:
                result["vllm_mlx"] = await original_clear()
            except Exception as error:
                result["vllm_mlx"] = {"error": repr(error)}
        return result

    app.add_api_route("/v1/cache/stats", cache_stats, methods=["GET"], dependencies=dependencies)
    app.add_api_route("/v1/cache", clear_cache, methods=["DELETE"], dependencies=dependencies)
    app.add_middleware(ReuseUsageMiddleware)
    app.add_middleware(AdmissionMiddleware)
    return ["GET /v1/cache/stats", "DELETE /v1/cache", "usage fields", "context check and abandoned prefills"]


def _remove_route(app, path: str, method: str, route_type):
    """Drop a route so ours answers instead; return its endpoint, if any."""
    endpoint = None
    kept = []
    for route in app.router.routes:
        if isinstance(route, route_type) and route.path == path and method in route.methods:
            endpoint = route.endpoint
        else:
            kept.append(route)
    app.router.routes[:] = kept
    return endpoint


def format_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"
