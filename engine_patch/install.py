"""Install the prefix cache into vllm-mlx (before its server starts).

The cache core (`TieredCache`: RAM with the disk tier under it, served request
by request by a `PrefixPlanner`) knows no engine. Each engine attaches it at
its own seams, one table each (`seams.py` in its folder, `vllm_mlx/seam_table.py`
their mechanics):
- `vllm_mlx/simple/`: SimpleEngine (one request at a time), at
  `mlx_lm.stream_generate`;
- `vllm_mlx/batched/`: the continuous-batching scheduler (`--continuous-batching`),
  where a request joins mlx-lm's `BatchGenerator` and where it leaves it.
Both decode with drafts from the session's own tokens where verifying them
pays (`drafts/`, `--draft auto|on|off`), and add, through the same modules:
the model's identity for the disk tier
(`mlx_lm.utils.load_model`, every way vllm-mlx loads a text model), the HTTP
endpoints and usage fields (`http_api/`), and the per-request costs
vllm-mlx's path repeats needlessly removed (`vllm_mlx/detokenizer_map.py`; see
docs/profile.md).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.defaults import DEFAULT_DRAFT, DEFAULT_ENGINE, DRAFT_MODES, ENGINES, TESTED_VERSIONS  # noqa: F401
from stable_prefix.engine_patch.disk.disk_tier import DiskTier
from stable_prefix.engine_patch.disk.tiered_cache import TieredCache
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.http_api import admission, http_endpoints, memory_stats, tool_parser_stream
from stable_prefix.engine_patch.vllm_mlx import detokenizer_map
from stable_prefix.engine_patch.vllm_mlx.batched import seams as batched_seams
from stable_prefix.engine_patch.vllm_mlx.simple import seams as simple_seams

logger = logging.getLogger("engine_patch")


# Seconds a clean shutdown waits for queued snapshot writes.
SHUTDOWN_WRITE_SECONDS = 30.0


@dataclass(frozen=True)
class DiskOptions:
    directory: Path
    budget_bytes: int


@dataclass
class Installed:
    vllm_mlx_version: str
    engine: str
    cache: TieredCache
    planner: PrefixPlanner
    drafting: Drafting
    patched: list[str]

    def stats(self) -> dict[str, Any]:
        return {
            **self.cache.stats(),
            **admission.stats(),
            **memory_stats.stats(),
            **self.drafting.figures(),
            "engine": self.engine,
            "vllm_mlx_version": self.vllm_mlx_version,
            "disabled_reasons": self.planner.unsupported_reasons(),
            "bypassed": dict(self.planner.bypassed),
        }


def why_unsupported(vllm_mlx: Any) -> str | None:
    """None when this vllm-mlx can be patched, else the reason it cannot."""
    version = getattr(vllm_mlx, "__version__", "unknown")
    if version not in TESTED_VERSIONS:
        return f"version {version} is not one the patch is tested with ({', '.join(TESTED_VERSIONS)})"
    try:
        from vllm_mlx.models.llm import MLXLanguageModel

        source = inspect.getsource(MLXLanguageModel.stream_generate)
    except Exception as error:
        return f"cannot read MLXLanguageModel.stream_generate ({error!r})"
    if "from mlx_lm import stream_generate" not in source:
        return "MLXLanguageModel.stream_generate no longer calls mlx_lm.stream_generate"
    return None


def install(budget_bytes: int, max_entries: int | None = None, disk: DiskOptions | None = None, engine: str = DEFAULT_ENGINE,
            draft: str = DEFAULT_DRAFT) -> Installed | None:
    import vllm_mlx

    if engine not in ENGINES:
        raise ValueError(f"engine {engine!r}: choose {' or '.join(ENGINES)}")
    if draft not in DRAFT_MODES:
        raise ValueError(f"--draft {draft!r}: choose {', '.join(DRAFT_MODES)}")
    reason = why_unsupported(vllm_mlx)
    if reason:
        logger.warning("engine_patch: vllm-mlx left unpatched: %s", reason)
        return None

    disk_tier = DiskTier(disk.directory, disk.budget_bytes) if disk else None
    cache = TieredCache(RamTier(budget_bytes=budget_bytes, max_entries=max_entries), disk_tier)
    planner = PrefixPlanner(cache)
    drafting = Drafting(draft, functools.partial(lane_token_ids, cache))
    if engine == "simple":
        patched = simple_seams.install(planner, drafting)
    else:
        patched = batched_seams.install(planner, drafting)
    if disk_tier is not None:
        patched += _identify_loaded_models(disk_tier)
        atexit.register(disk_tier.close, SHUTDOWN_WRITE_SECONDS)
    patched += detokenizer_map.install()
    installed = Installed(vllm_mlx.__version__, engine, cache, planner, drafting, patched)
    patched += http_endpoints.install(cache, installed.stats)
    patched += tool_parser_stream.install()

    limit = f", at most {max_entries} entries" if max_entries else ""
    on_disk = f"; disk {format_bytes(disk.budget_bytes)} in {disk.directory}" if disk else "; no disk tier"
    logger.info(
        "engine_patch: prefix cache installed on vllm-mlx %s, %s engine (budget %s%s%s; drafts %s; patched %s)",
        vllm_mlx.__version__,
        engine,
        format_bytes(budget_bytes),
        limit,
        on_disk,
        draft,
        ", ".join(patched),
    )
    return installed


def lane_token_ids(cache: TieredCache) -> list[Any]:
    """The token ids of every lane the RAM cache holds, oldest first: what drafts may copy from.

    The one place drafting reads the prefix cache's entries (each an array of token ids).
    """
    return [entry.tokens for entry in list(cache.ram.entries.values())]


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


def format_bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"
