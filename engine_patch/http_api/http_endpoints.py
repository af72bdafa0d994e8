"""What the patched server adds to vllm-mlx's HTTP app: `GET /v1/cache/stats`,
`DELETE /v1/cache[?tier=ram|disk]` and the reuse in every response's usage.

Both cache endpoints walk the disk tier's directory (a clear waits for the
directory lock too, which a write holds until its last rename): they run in a
worker thread, never on the event loop, which streams every reply (on a big
network share a walk takes seconds)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from stable_prefix.engine_patch.disk.tiered_cache import TieredCache

from .admission import AdmissionMiddleware
from .usage_fields import ReuseUsageMiddleware

CLEARABLE_TIERS = ("ram", "disk")


def install(cache: TieredCache, stats: Callable[[], dict[str, Any]]) -> list[str]:
    from fastapi import Depends, HTTPException
    from fastapi.routing import APIRoute
    from vllm_mlx import server

    dependencies = [Depends(server.verify_api_key)] if hasattr(server, "verify_api_key") else []
    app = server.app
    original_clear = _remove_route(app, "/v1/cache", "DELETE", APIRoute)
    _remove_route(app, "/v1/cache/stats", "GET", APIRoute)

    def refuse(detail: str):
        raise HTTPException(status_code=400, detail=detail)

    cache_stats, clear_cache = cache_endpoints(cache, stats, original_clear, refuse)
    app.add_api_route("/v1/cache/stats", cache_stats, methods=["GET"], dependencies=dependencies)
    app.add_api_route("/v1/cache", clear_cache, methods=["DELETE"], dependencies=dependencies)
    app.add_middleware(ReuseUsageMiddleware)
    app.add_middleware(AdmissionMiddleware)
    return ["GET /v1/cache/stats", "DELETE /v1/cache", "usage fields", "context check and abandoned prefills"]


def cache_endpoints(cache: TieredCache, stats: Callable[[], dict[str, Any]], original_clear: Callable[[], Awaitable[Any]] | None,
                    refuse: Callable[[str], Any]):
    """The two endpoints' handlers; `refuse(detail)` raises the framework's 400."""

    async def cache_stats():
        return await asyncio.to_thread(stats)

    async def clear_cache(tier: str | None = None):
        if tier is not None and tier not in CLEARABLE_TIERS:
            refuse(f"tier={tier!r}: choose ram or disk (or leave it out to clear both)")
        dropped = await asyncio.to_thread(cache.clear, (tier,) if tier else CLEARABLE_TIERS)
        result: dict[str, Any] = {"status": "cleared", **dropped}
        if original_clear is not None and tier in (None, "ram"):
            try:
                result["vllm_mlx"] = await original_clear()
            except Exception as error:
                result["vllm_mlx"] = {"error": repr(error)}
        return result

    return cache_stats, clear_cache


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
