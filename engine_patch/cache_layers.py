"""Every place that touches an mlx-lm cache layer's internals.

mlx-lm keeps a model's KV state as a list of per-layer cache objects
(`KVCache`, `RotatingKVCache`, `ArraysCache`, ...) with `state`, `meta_state`,
`from_state` and `trim`. This module adapts that API for the prefix cache:
which layers can be snapshotted, taking a snapshot, restoring one into a live
cache, and what it costs in bytes. Nothing else in engine_patch reads `state`
or `meta_state`.
"""

from __future__ import annotations

import json
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


# --- a snapshot as named arrays, for the disk tier --------------------------
#
# A layer's state may be a flat pair (KVCache), a list with empty slots
# (ArraysCache) or nested (CacheList, QuantizedKVCache). Its shape is kept as
# JSON beside the arrays: each array by name, an empty slot as null.


def layers_to_arrays(layers: list[Any]) -> tuple[dict[str, mx.array], dict[str, str]]:
    """Every array of `layers` by a unique name, and the metadata that rebuilds them."""
    arrays: dict[str, mx.array] = {}

    def encode(value: Any, name: str) -> Any:
        if value is None:
            return None
        if isinstance(value, mx.array):
            arrays[name] = value
            return name
        if isinstance(value, (list, tuple)):
            return [encode(item, f"{name}.{index}") for index, item in enumerate(value)]
        raise UnsupportedCache(f"a cache layer's state holds a {type(value).__name__}, not arrays")

    description = [
        {"class": type(layer).__name__, "state": encode(layer.state, f"layer.{index}"), "meta_state": layer.meta_state}
        for index, layer in enumerate(layers)
    ]
    return arrays, {"layers": json.dumps(description)}


def layers_from_arrays(arrays: dict[str, mx.array], metadata: dict[str, str]) -> list[Any]:
    """The layers `layers_to_arrays` described; ValueError if the description does not fit `arrays`."""
    from mlx_lm.models import cache as cache_classes

    def decode(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            if value not in arrays:
                raise ValueError(f"the layer description names an array {value!r} that is not there")
            return arrays[value]
        if isinstance(value, list):
            return [decode(item) for item in value]
        raise ValueError(f"the layer description holds a {type(value).__name__}")

    layers = []
    for entry in json.loads(metadata["layers"]):
        layer_class = getattr(cache_classes, entry["class"], None)
        if not isinstance(layer_class, type) or not hasattr(layer_class, "from_state"):
            raise ValueError(f"unknown cache layer class {entry['class']!r}")
        meta_state = entry["meta_state"]
        layers.append(layer_class.from_state(decode(entry["state"]), tuple(meta_state) if isinstance(meta_state, list) else meta_state))
    return layers
