"""A prefix-cache entry as the arrays and description of one snapshot file, and back.

An entry (`CachedPrefix`) is its end state plus up to six checkpoints of its
positional layers. Its end state's positional layers may be the very objects of
its last checkpoint: in a file each distinct layer object is stored once and the
end state and the checkpoints refer to it by index, so a loaded entry holds the
same sharing and the same bytes as the one written. A checkpoint shared by
several entries (a new conversation restored from another lane's head) is
written into each of their files, so every file stays whole on its own (eviction
and crash safety are per file); it keeps its key, by which the RAM cache makes
the loaded copies one object again (`PrefixCache.admit`).

Reading checks what the per-tensor CRCs cannot: that the description fits the
layers (positions inside the tokens and in order, a checkpoint's layers where
the model's positional layers are, each layer at its position's token count).
"""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx
import numpy as np

from stable_prefix.engine_patch.cache.cache_layers import cached_token_count, is_rewindable, layers_from_arrays, layers_to_arrays, snapshot_nbytes
from stable_prefix.engine_patch.cache.prefix_cache import CachedPrefix, Checkpoint, own_nbytes

ENTRY = "entry"


class EntryDescriptionError(ValueError):
    """A file's entry description does not fit its tokens or its layers."""


def entry_to_arrays(entry: CachedPrefix) -> tuple[dict[str, mx.array], dict[str, str]]:
    """Every array of `entry` (each distinct layer once) and the metadata that rebuilds it."""
    distinct: dict[int, int] = {}
    layers: list[Any] = []

    def reference(layer: Any) -> int | None:
        if layer is None:
            return None
        if id(layer) not in distinct:
            distinct[id(layer)] = len(layers)
            layers.append(layer)
        return distinct[id(layer)]

    description = {
        "end": [reference(layer) for layer in entry.layers],
        "checkpoints": [
            {"key": c.key, "position": c.position, "pinned": c.pinned, "layers": [reference(layer) for layer in c.layers]}
            for c in entry.checkpoints
        ],
    }
    arrays, metadata = layers_to_arrays(layers)
    return arrays, {**metadata, ENTRY: json.dumps(description)}


def checkpoint_positions(metadata: dict[str, str], token_count: int) -> list[int]:
    """The positions of a file's checkpoints, from its header alone (the disk index reads no KV bytes)."""
    return [checkpoint["position"] for checkpoint in _description(metadata, token_count)["checkpoints"]]


def entry_from_arrays(tokens: np.ndarray, prompt_length: int, arrays: dict[str, mx.array], metadata: dict[str, str]) -> CachedPrefix:
    """The entry `entry_to_arrays` described; EntryDescriptionError (or ValueError) if anything does not fit."""
    described = _description(metadata, len(tokens))
    layers = layers_from_arrays(arrays, metadata)

    def resolved(references: Any) -> list[Any]:
        if not isinstance(references, list):
            raise EntryDescriptionError("a layer list is not a list")
        for reference in references:
            if reference is not None and not (isinstance(reference, int) and 0 <= reference < len(layers)):
                raise EntryDescriptionError(f"layer reference {reference!r} is not one of the file's {len(layers)} layers")
        return [None if reference is None else layers[reference] for reference in references]

    end = resolved(described["end"])
    if not end or any(layer is None for layer in end):
        raise EntryDescriptionError("the end state lacks a layer")
    if cached_token_count(end) != len(tokens):
        raise EntryDescriptionError(f"the end state holds {cached_token_count(end)} tokens, the file names {len(tokens)}")
    checkpoints = []
    for checkpoint in described["checkpoints"]:
        checkpoint_layers = resolved(checkpoint["layers"])
        _check_checkpoint_layers(checkpoint_layers, end, checkpoint["position"])
        checkpoints.append(Checkpoint(checkpoint["position"], checkpoint_layers, snapshot_nbytes(checkpoint_layers),
                                      pinned=checkpoint["pinned"], key=checkpoint["key"]))
    return CachedPrefix(tokens, end, own_nbytes(end, checkpoints), prompt_length, checkpoints)


def _description(metadata: dict[str, str], token_count: int) -> dict[str, Any]:
    try:
        described = json.loads(metadata[ENTRY])
        checkpoints = described["checkpoints"]
        positions = [checkpoint["position"] for checkpoint in checkpoints]
        well_formed = (
            isinstance(described["end"], list)
            and all(isinstance(c["key"], str) and isinstance(c["pinned"], bool) for c in checkpoints)
            and all(type(position) is int for position in positions)
        )
    except (KeyError, TypeError, ValueError) as error:
        raise EntryDescriptionError(f"the entry description is malformed ({error!r})") from error
    if not well_formed:
        raise EntryDescriptionError("the entry description is malformed")
    if positions != sorted(set(positions)) or any(not 0 < position <= token_count for position in positions):
        raise EntryDescriptionError(f"checkpoint positions {positions} do not fit {token_count} tokens")
    return described


def _check_checkpoint_layers(checkpoint_layers: list[Any], end: list[Any], position: int) -> None:
    """A checkpoint holds the positional layers, of the end state's kinds, each at `position` tokens."""
    if len(checkpoint_layers) != len(end):
        raise EntryDescriptionError(f"the checkpoint at {position} has {len(checkpoint_layers)} layers, the model {len(end)}")
    for layer, end_layer in zip(checkpoint_layers, end):
        if (layer is None) != is_rewindable(end_layer) or (layer is not None and type(layer) is not type(end_layer)):
            raise EntryDescriptionError(f"the checkpoint at {position} does not hold the model's positional layers")
        counted = None if layer is None else cached_token_count([layer])
        if counted is not None and counted != position:
            raise EntryDescriptionError(f"the checkpoint at {position} holds a layer at {counted} tokens")
