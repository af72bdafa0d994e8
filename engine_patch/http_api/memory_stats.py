"""MLX's own memory figures for `/v1/cache/stats`: what a soak watches for growth.

The prefix cache's `bytes` counts the KV snapshots it holds; MLX's allocator
also holds the live request's arrays (`active`), freed buffers it keeps for
reuse (`cache`, which grows until Metal runs out if nothing bounds it: the
failure vllm-mlx #641/#642 and mlx-lm #1672 report) and its high-water mark
(`peak`). Reading them takes no lock and allocates nothing.
"""

from __future__ import annotations

from typing import Any


def stats() -> dict[str, Any]:
    import mlx.core as mx

    readers = {"mlx_active_bytes": "get_active_memory", "mlx_cache_bytes": "get_cache_memory", "mlx_peak_bytes": "get_peak_memory"}
    # mlx >= 0.24 has them at the top level; older releases under mx.metal (Apple GPUs only).
    sources = (mx, getattr(mx, "metal", None))
    figures = {}
    for name, function in readers.items():
        reader = next((getattr(source, function) for source in sources if source is not None and hasattr(source, function)), None)
        try:
            figures[name] = int(reader()) if reader else None
        except RuntimeError:  # no Metal device for the mx.metal readers
            figures[name] = None
    return figures
