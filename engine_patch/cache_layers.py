"""Every place that touches an mlx-lm cache layer's internals.

mlx-lm keeps a model's KV state as a list of per-layer cache objects
(`KVCache`, `RotatingKVCache`, `ArraysCache`, ...) with `state`, `meta_state`,
`from_state` and `trim`. This module adapts that API for the prefix cache:
which layers can be snapshotted, taking a snapshot, restoring one into a live
cache, and what it costs in bytes. Nothing else in engine_patch reads `state`
or `meta_state`.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, can_trim_prompt_cache


class UnsupportedCache(Exception):
    """The model's cache cannot be snapshotted and trimmed exactly."""


def check_snapshot_support(prompt_cache: list[Any]) -> None:
    """Raise `UnsupportedCache` unless every layer is a plain, trimmable KVCache.

    Rotating (sliding-window) caches keep a write cursor that `state` does not
    capture, quantized caches cannot be trimmed exactly, and hybrid models mix
    in recurrent `ArraysCache` layers whose state cannot be rewound to an
    earlier token: restoring any of those to a shorter prefix would be wrong.
    """
    if not prompt_cache:
        raise UnsupportedCache("the model makes an empty cache")
    kinds = sorted({type(layer).__name__ for layer in prompt_cache})
    if any(type(layer) is not KVCache for layer in prompt_cache):
        raise UnsupportedCache(f"cache layers are {', '.join(kinds)}; only plain KVCache can be snapshotted and trimmed")
    if not can_trim_prompt_cache(prompt_cache):
        raise UnsupportedCache(f"cache layers ({', '.join(kinds)}) are not trimmable")


def cached_token_count(prompt_cache: list[Any]) -> int:
    return prompt_cache[0].offset


# A snapshot shares the finished request's buffers when they are barely larger
# than the tokens they hold (KVCache grows in 256-token steps, so that is the
# case for any long prompt): no copy, no second full-size allocation of what
# can be gigabytes on a large model. Short or trimmed states are copied down to
# their tokens instead, so padding never costs more than this share.
MAX_SHARED_PADDING = 0.10


def snapshot(prompt_cache: list[Any]) -> tuple[list[Any], int]:
    """Independent layers holding the live cache's tokens, and the bytes they keep alive.

    Called once the request's generation is over, when nothing writes to the
    live cache any more.
    """
    held_bytes = state_nbytes(prompt_cache)
    buffer_bytes = sum(layer.nbytes for layer in prompt_cache)
    share = buffer_bytes <= held_bytes * (1 + MAX_SHARED_PADDING)
    copy = (lambda array: array[...]) if share else mx.array
    layers = [type(layer).from_state(tuple(copy(array) for array in layer.state), layer.meta_state) for layer in prompt_cache]
    mx.eval([layer.state for layer in layers])
    return layers, buffer_bytes if share else held_bytes


def restore(layers: list[Any]) -> list[Any]:
    """A new live cache equal to a snapshot, safe to extend and trim.

    Each array is a new object: the generation's in-place slice writes rebind
    the live cache's arrays and never reach the snapshot's.
    """
    return [type(layer).from_state(tuple(array[...] for array in layer.state), layer.meta_state) for layer in layers]


def state_nbytes(prompt_cache: list[Any]) -> int:
    """Bytes of the cached tokens' state (not of any padding behind it)."""
    return sum(array.nbytes for layer in prompt_cache for array in layer.state)
