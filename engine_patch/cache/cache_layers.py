"""Every place that touches an mlx-lm cache layer's internals.

mlx-lm keeps a model's state as a list of per-layer cache objects. This module
knows each kind and adapts both of mlx-lm's cache APIs (0.31: `state` +
`meta_state`, `from_state(state, meta_state)`; 0.32: `state` alone carries
offsets and padded buffers, `from_state(state)`), detected by behaviour:

- rewindable layers (`KVCache`): one snapshot serves every prefix of its
  tokens, by trimming;
- positional layers (`ArraysCache` recurrent/conv state, `RotatingKVCache`
  sliding windows, `ChunkedKVCache`, `CacheList`): a snapshot is valid at
  exactly one token position, so the prefix cache checkpoints them;
- anything else (a quantized KV cache, an unknown class) is unsupported.

Snapshots are frozen cache objects of the same classes, compacted to what they
hold (a sliding window to its window); `restore` turns them back into new live
objects that never alias a snapshot's arrays. Rewindable layers are also cut
into blocks of tokens (`copy_block`) and rebuilt from them
(`restore_from_blocks`, see kv_blocks.py). Nothing else in engine_patch reads
`state` or `meta_state`, or a KV cache's `keys`, `values` and `offset`.

A drafted decode step (engine_patch/drafts/) feeds a sequence's next token and
its draft in one forward, and a draft cut short must leave every layer as if
only the accepted tokens had been fed. The last section here does that, for
the live caches of one sequence (SimpleEngine) and for mlx-lm's batched ones
(one count per row): attention layers drop their last tokens (trimmed; a
sliding window right after that multi-token update still holds the tokens
before it, so it is cut back too), and recurrent state, which cannot be
rewound, is put back as it was before the step.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    ChunkedKVCache,
    ConcatenateKVCache,
    KVCache,
    RotatingKVCache,
    dynamic_roll,
)


class UnsupportedCache(Exception):
    """The model's cache has a layer kind that cannot be snapshotted exactly."""


REWINDABLE_KINDS = (KVCache, ConcatenateKVCache)
POSITIONAL_KINDS = (ArraysCache, RotatingKVCache, ChunkedKVCache, CacheList)

# mlx-lm 0.32 dropped `meta_state` (its `state` carries the integers itself).
HAS_META_STATE = hasattr(KVCache(), "meta_state")


def is_rewindable(layer: Any) -> bool:
    # Exact classes: a subclass may keep state that trimming does not rewind.
    return type(layer) in REWINDABLE_KINDS


def positional_indices(prompt_cache: list[Any]) -> list[int]:
    return [index for index, layer in enumerate(prompt_cache) if not is_rewindable(layer)]


def has_recurrent_state(prompt_cache: list[Any]) -> bool:
    """Whether any layer keeps recurrent or convolution state (`ArraysCache`, also inside a `CacheList`)."""
    return any(isinstance(layer, ArraysCache) or (isinstance(layer, CacheList) and has_recurrent_state(list(layer.caches)))
               for layer in prompt_cache)


def check_snapshot_support(prompt_cache: list[Any]) -> None:
    """Raise `UnsupportedCache` unless every layer is a kind this module knows."""
    if not prompt_cache:
        raise UnsupportedCache("the model makes an empty cache")
    for layer in prompt_cache:
        if is_rewindable(layer) or (isinstance(layer, POSITIONAL_KINDS) and _known_parts(layer)):
            continue
        kinds = sorted({type(layer).__name__ for layer in prompt_cache})
        raise UnsupportedCache(f"cache layers are {', '.join(kinds)}; {type(layer).__name__} cannot be snapshotted exactly")


def _known_parts(layer: Any) -> bool:
    if isinstance(layer, CacheList):
        return all(is_rewindable(part) or isinstance(part, POSITIONAL_KINDS) for part in layer.caches)
    return True


def cached_token_count(prompt_cache: list[Any]) -> int | None:
    """Tokens the cache has seen, from the first layer that counts them (None: none does)."""
    for layer in prompt_cache:
        offset = getattr(layer, "offset", None)
        if isinstance(offset, int):
            return offset
    return None


def trim(prompt_cache: list[Any], count: int) -> None:
    """Drop the last `count` tokens from every rewindable layer (positional ones are restored exactly instead)."""
    for layer in prompt_cache:
        if is_rewindable(layer):
            layer.trim(count)


def eval_state(prompt_cache: list[Any]) -> None:
    mx.eval(list(_arrays(layer.state for layer in prompt_cache)))


def snapshot(prompt_cache: list[Any], indices: list[int] | None = None) -> tuple[list[Any], int]:
    """Frozen copies of the layers at `indices` (all by default; None elsewhere), down to the
    tokens they hold, and their bytes.

    Called when nothing writes to the live cache: between prefill chunks or
    once the request's generation is over. The prefix cache snapshots only
    positional layers this way (checkpoints, an entry's end); rewindable layers
    are kept as blocks (`copy_block`).
    """
    wanted = range(len(prompt_cache)) if indices is None else indices
    layers: list[Any] = [None] * len(prompt_cache)
    total = 0
    for index in wanted:
        layers[index], nbytes = _freeze(prompt_cache[index])
        total += nbytes
    mx.eval(list(_arrays(layer.state for layer in layers if layer is not None)))
    return layers, total


def restore(layers: list[Any]) -> list[Any]:
    """New live layers equal to frozen ones, safe to extend and trim.

    Each array is a new object: the generation's in-place slice writes rebind
    the live cache's arrays and never reach the snapshot's.
    """
    return [None if layer is None else _rebuilt(layer, lambda array: array[...]) for layer in layers]


def copy_block(prompt_cache: list[Any], start: int, end: int) -> tuple[list[Any], int]:
    """Copies of every rewindable layer's keys and values for tokens [start, end) (None at
    positional layers), and their bytes. Lazy: evaluate them with the entry they belong to.

    A copy, never a slice: a slice would keep the whole live buffer alive.
    """
    arrays: list[Any] = []
    for layer in prompt_cache:
        if is_rewindable(layer):
            arrays.append((mx.array(layer.keys[..., start:end, :]), mx.array(layer.values[..., start:end, :])))
        else:
            arrays.append(None)
    return arrays, block_nbytes(arrays)


def block_prefix(arrays: list[Any], tokens: int) -> tuple[list[Any], int]:
    """A copy of the first `tokens` tokens of a block's arrays (from `copy_block`), evaluated, and their bytes."""
    copied = [None if pair is None else tuple(mx.array(part[..., :tokens, :]) for part in pair) for pair in arrays]
    mx.eval([part for pair in copied if pair is not None for part in pair])
    return copied, block_nbytes(copied)


def eval_blocks(blocks_arrays: list[list[Any]]) -> None:
    mx.eval([part for arrays in blocks_arrays for pair in arrays if pair is not None for part in pair])


def block_nbytes(arrays: list[Any]) -> int:
    return sum(part.nbytes for pair in arrays if pair is not None for part in pair)


def restore_from_blocks(live: list[Any], pieces: list[tuple[list[Any], int]], length: int, capacity: int,
                        positional_layers: list[Any]) -> list[Any]:
    """Fill a fresh cache (`make_prompt_cache`) with the first `length` tokens.

    `pieces` are (block arrays, tokens used) in order; they are copied into one
    buffer per rewindable layer with room for `capacity` tokens (rounded up to
    the layer's growth step), so that prefilling the rest of the prompt writes
    in place: a restore copies each byte once, and is done when it returns.
    `positional_layers` (None at rewindable layers) are restored as `restore` does.
    """
    copies: list[tuple[mx.array, list[mx.array]]] = []
    for index, layer in enumerate(live):
        if not is_rewindable(layer):
            live[index] = restore([positional_layers[index]])[0]
            continue
        # KVCache grows in steps; ConcatenateKVCache appends to all it holds, so it gets no room.
        tokens = -(-capacity // layer.step) * layer.step if type(layer) is KVCache else length
        for name, part in (("keys", 0), ("values", 1)):
            parts = [arrays[index][part][..., :used, :] for arrays, used in pieces]
            setattr(layer, name, _buffer_for(parts, max(tokens, length), copies))
        layer.offset = length
    _copy_into(copies)
    return live


class LiveCacheChanged(Exception):
    """A kept live cache no longer holds what it held when kept."""


def reuse_live(prompt_cache: list[Any], kept_offset: int, length: int, positional_layers: list[Any] | None) -> list[Any]:
    """A live cache (`live_lane.py`) cut back to its first `length` tokens, in place: no byte of them copied.

    Rewindable layers are trimmed (a `KVCache` writes its next tokens over
    what it held after `length`; a `ConcatenateKVCache` appends to all its
    arrays hold, so they are cut). Positional layers cannot be rewound: they
    are replaced by new objects restored from `positional_layers` (their state
    after `length` tokens), or kept as they are where that is None (they hold
    exactly `length` tokens). Raises `LiveCacheChanged` if the cache was fed
    since it was kept.
    """
    if cached_token_count(prompt_cache) != kept_offset:
        raise LiveCacheChanged(f"the live cache holds {cached_token_count(prompt_cache)} tokens, not the {kept_offset} it was kept with")
    rewindable = [layer for layer in prompt_cache if is_rewindable(layer)]
    if any(layer.offset < length for layer in rewindable):
        raise LiveCacheChanged(f"a layer of the live cache holds fewer than the {length} tokens to reuse")
    for layer in rewindable:
        if type(layer) is ConcatenateKVCache and layer.offset > length:
            layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]
        layer.trim(layer.offset - length)
    if positional_layers is not None:
        for index in positional_indices(prompt_cache):
            prompt_cache[index] = restore([positional_layers[index]])[0]
    return prompt_cache


def _buffer_for(parts: list[mx.array], tokens: int, copies: list[tuple[mx.array, list[mx.array]]]) -> mx.array:
    """A buffer of `tokens` tokens whose first ones will be `parts` back to back.

    On the GPU, one concatenation kernel fills it. On the CPU, MLX copies a
    strided slice element by element on one thread (2.6-3 GB/s here, a third of
    memcpy): the buffer is allocated empty and `_copy_into` copies the parts in
    with memcpy through numpy views of it (queued in `copies`).
    """
    shape = (*parts[0].shape[:2], tokens, parts[0].shape[3])
    if mx.default_device() != mx.cpu:
        room = tokens - sum(part.shape[2] for part in parts)
        padded = [*parts, mx.zeros((*shape[:2], room, shape[3]), parts[0].dtype)] if room else parts
        return mx.concatenate(padded, axis=2) if len(padded) > 1 else mx.array(padded[0])
    buffer = mx.zeros(shape, parts[0].dtype)
    copies.append((buffer, parts))
    return buffer


def _copy_into(copies: list[tuple[mx.array, list[mx.array]]]) -> None:
    """Copy each queued buffer's parts into it, back to back along the token axis (memcpy, no MLX kernel).

    The buffers are new, evaluated and referred to by nothing else, so writing
    them through numpy views is writing memory no one reads yet; the views are
    gone when this returns (a view left alive would keep MLX from updating the
    buffer in place).
    """
    if not copies:
        return
    mx.eval([buffer for buffer, _ in copies] + [part for _, parts in copies for part in parts])
    for buffer, parts in copies:
        target, start = host_memory(buffer), 0
        for part in parts:
            end = start + part.shape[2]
            np.copyto(target[:, :, start:end, :], host_memory(part))
            start = end
    del target


def host_memory(array: mx.array) -> np.ndarray:
    """A numpy view of an evaluated mlx array's memory, no copy (bfloat16 as its 16-bit patterns)."""
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
        mx.eval(array)
    return np.asarray(array)


def state_nbytes(prompt_cache: list[Any]) -> int:
    """Bytes of the cached tokens' state (not of any padding behind it)."""
    return sum(_freeze_view(layer)[1] for layer in prompt_cache)


def snapshot_nbytes(layers: list[Any]) -> int:
    return sum(array.nbytes for array in _arrays(layer.state for layer in layers if layer is not None))


# --- per-kind work ------------------------------------------------------------


def _freeze(layer: Any) -> tuple[Any, int]:
    view, held_bytes = _freeze_view(layer)
    # mx.array copies a view into a buffer of its own size.
    return _rebuilt(view, mx.array), held_bytes


def _freeze_view(layer: Any) -> tuple[Any, int]:
    """A shallow copy of `layer` whose arrays hold only its tokens, and their bytes."""
    view = copy.copy(layer)
    if isinstance(layer, (KVCache, ChunkedKVCache)) and layer.keys is not None:
        # 0.32's `state` returns the padded buffers; cut them to the tokens held.
        end = layer.offset - getattr(layer, "start_position", 0)
        view.keys, view.values = layer.keys[..., :end, :], layer.values[..., :end, :]
    elif isinstance(layer, RotatingKVCache) and layer.keys is not None:
        view.keys, view.values = _window(layer, layer.keys), _window(layer, layer.values)
        view._idx = view.keys.shape[2]
    elif isinstance(layer, ArraysCache):
        view.cache = list(layer.cache)
    elif isinstance(layer, CacheList):
        view.caches = tuple(_freeze_view(part)[0] for part in layer.caches)
    nbytes = sum(array.nbytes for array in _arrays([view.state]))
    return view, nbytes


def _window(layer: RotatingKVCache, array: mx.array) -> mx.array:
    """The tokens a sliding-window layer still attends to, in temporal order.

    After a prefill chunk the buffer holds max_size + chunk - 1 tokens; the
    next step keeps only the `keep` first and the max_size - keep last of
    them, so a snapshot of just those continues exactly the same way.
    """
    ordered = layer._temporal_order(array)
    if ordered.shape[2] <= layer.max_size:
        return ordered
    return mx.concatenate([ordered[..., : layer.keep, :], ordered[..., ordered.shape[2] - (layer.max_size - layer.keep) :, :]], axis=2)


def _rebuilt(layer: Any, copy_array) -> Any:
    meta_state = layer.meta_state if HAS_META_STATE else None
    return _from_state(type(layer), _copied(layer.state, copy_array), meta_state, _offsets(layer))


def _from_state(layer_class: type, state: Any, meta_state: Any, offsets: Any) -> Any:
    """A layer of `layer_class` from its state, on either cache API, at the token offsets given."""
    rebuilt = layer_class.from_state(state, meta_state) if HAS_META_STATE else layer_class.from_state(state)
    _set_offsets(rebuilt, offsets)
    return rebuilt


def _offsets(layer: Any) -> Any:
    """How many tokens a layer (each part of a CacheList) has seen; None where it does not count."""
    if isinstance(layer, CacheList):
        return [_offsets(part) for part in layer.caches]
    offset = getattr(layer, "offset", None)
    return offset if isinstance(offset, int) else None


def _set_offsets(layer: Any, offsets: Any) -> None:
    if isinstance(layer, CacheList) and isinstance(offsets, list):
        for part, offset in zip(layer.caches, offsets):
            _set_offsets(part, offset)
    elif isinstance(offsets, int) and getattr(layer, "offset", None) != offsets:
        # 0.31's ChunkedKVCache.from_state sets offset to the buffer length,
        # wrong once its front was trimmed.
        layer.offset = offsets


def _copied(value: Any, copy_array) -> Any:
    """`value` with every array copied; lists stay lists (ArraysCache assigns into its list)."""
    if isinstance(value, mx.array):
        return copy_array(value)
    if isinstance(value, list):
        return [_copied(item, copy_array) for item in value]
    if isinstance(value, tuple):
        return tuple(_copied(item, copy_array) for item in value)
    return value


def _arrays(value: Any):
    if isinstance(value, mx.array):
        yield value
    elif isinstance(value, (list, tuple)) or hasattr(value, "__next__"):
        for item in value:
            yield from _arrays(item)


# --- a snapshot as named arrays, for the disk tier --------------------------
#
# What is written is what `snapshot` keeps (`_freeze_view`: padding cut,
# windows compacted) and what is read is rebuilt as `restore` rebuilds
# (`_from_state`), on either cache API. A layer's `state` may hold arrays,
# empty slots, integers (0.32 keeps offsets there), class names (0.32's
# CacheList) and nested lists or tuples; it is kept as JSON beside the arrays:
# each array by name, a tuple marked as one (ArraysCache needs a list it can
# assign into, the rest do not care).


def layers_to_arrays(layers: list[Any]) -> tuple[dict[str, mx.array], dict[str, str]]:
    """Every array of `layers` by a unique name, and the metadata that rebuilds them."""
    arrays: dict[str, mx.array] = {}

    def encode(value: Any, name: str) -> Any:
        if isinstance(value, mx.array):
            arrays[name] = value
            return {"array": name}
        if isinstance(value, list):
            return [encode(item, f"{name}.{index}") for index, item in enumerate(value)]
        if isinstance(value, tuple):
            return {"tuple": [encode(item, f"{name}.{index}") for index, item in enumerate(value)]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise UnsupportedCache(f"a cache layer's state holds a {type(value).__name__}, not arrays")

    description = []
    for index, layer in enumerate(layers):
        view, _ = _freeze_view(layer)
        described = {"class": type(view).__name__, "state": encode(view.state, f"layer.{index}"), "offset": _offsets(view)}
        if HAS_META_STATE:
            described["meta_state"] = encode(view.meta_state, f"layer.{index}.meta")
        description.append(described)
    return arrays, {"layers": json.dumps(description)}


def layers_from_arrays(arrays: dict[str, mx.array], metadata: dict[str, str]) -> list[Any]:
    """The frozen layers `layers_to_arrays` described; ValueError if the description does not fit `arrays`."""
    from mlx_lm.models import cache as cache_classes

    def decode(value: Any) -> Any:
        if isinstance(value, dict) and value.keys() == {"array"}:
            if value["array"] not in arrays:
                raise ValueError(f"the layer description names an array {value['array']!r} that is not there")
            return arrays[value["array"]]
        if isinstance(value, dict) and value.keys() == {"tuple"}:
            return tuple(decode(item) for item in value["tuple"])
        if isinstance(value, list):
            return [decode(item) for item in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise ValueError(f"the layer description holds {value!r}")

    description = json.loads(metadata["layers"])
    if not isinstance(description, list):
        raise ValueError("the layer description is not a list")
    layers = []
    for entry in description:
        layer_class = getattr(cache_classes, entry["class"], None)
        if not isinstance(layer_class, type) or not issubclass(layer_class, (*REWINDABLE_KINDS, *POSITIONAL_KINDS)):
            raise ValueError(f"unknown cache layer class {entry['class']!r}")
        layers.append(_from_state(layer_class, decode(entry["state"]), decode(entry.get("meta_state")), entry["offset"]))
    return layers


# --- a draft cut short: every layer back to the accepted tokens ---------------
#
# A drafted step feeds [next token, draft...] (per row of a batch, right-padded
# to one width) in one forward; the sampler then accepts a prefix of the draft.
# What the rest left in the caches is dropped here. Attention layers keep one
# key/value column per token: the last ones go (KVCache trimmed; a row of a
# batched cache rolled right and its left padding widened, the way mlx-lm's
# own `finalize` removes the right padding of a prompt batch). A sliding
# window (`RotatingKVCache`) after a multi-token update holds, in temporal
# order, the `max_size - 1` tokens before it and the new ones, so cutting its
# end leaves exactly what feeding only the accepted tokens would have left.
# Recurrent and convolution state (`ArraysCache`) cannot be rewound: its
# arrays are saved (by reference: a forward replaces them, never writes into
# them) before the step and put back for the rows whose draft was cut.

DRAFTABLE_KINDS = (KVCache, ConcatenateKVCache, RotatingKVCache, ArraysCache, CacheList, BatchKVCache, BatchRotatingKVCache)


def why_not_draftable(prompt_cache: list[Any]) -> str | None:
    """None if a draft cut short can be rolled back exactly in every layer, else why not."""
    for layer in prompt_cache:
        if type(layer) not in DRAFTABLE_KINDS:
            return f"a {type(layer).__name__} layer cannot be rolled back after a rejected draft"
        if isinstance(layer, CacheList):
            reason = why_not_draftable(list(layer.caches))
            if reason:
                return reason
    return None


def recurrent_state(prompt_cache: list[Any]) -> list[Any]:
    """The recurrent layers' arrays as they are now (None for other layers), for `restore_recurrent_state`."""
    saved = []
    for layer in prompt_cache:
        if isinstance(layer, ArraysCache):
            saved.append((list(layer.cache), layer.left_padding, layer.lengths))
        elif isinstance(layer, CacheList):
            saved.append(recurrent_state(list(layer.caches)))
        else:
            saved.append(None)
    return saved


def restore_recurrent_state(prompt_cache: list[Any], saved: list[Any], rows: list[int] | None = None) -> None:
    """Put the recurrent layers back as `recurrent_state` found them: all rows, or only `rows` of a batch."""
    for layer, state in zip(prompt_cache, saved):
        if isinstance(layer, CacheList):
            restore_recurrent_state(list(layer.caches), state, rows)
        elif isinstance(layer, ArraysCache):
            arrays, left_padding, lengths = state
            if rows is None:
                layer.cache, layer.left_padding, layer.lengths = list(arrays), left_padding, lengths
                continue
            chosen = mx.array([index in rows for index in range(layer.batch_size)])
            layer.cache = [_rows_from(chosen, old, new) for old, new in zip(arrays, layer.cache)]
            layer.left_padding = _rows_from(chosen, left_padding, layer.left_padding)
            layer.lengths = _rows_from(chosen, lengths, layer.lengths)


def _rows_from(chosen: mx.array, old: Any, new: Any) -> Any:
    """`new` with the chosen rows (first axis) taken from `old`."""
    if old is None or new is None:
        return new if old is None else old
    return mx.where(chosen.reshape(-1, *([1] * (new.ndim - 1))), old, new)


def drop_last_tokens(prompt_cache: list[Any], count: int) -> None:
    """Forget the last `count` tokens of a one-sequence cache's attention layers, right after the forward
    that fed them (recurrent layers are put back with `restore_recurrent_state`)."""
    if count <= 0:
        return
    for layer in prompt_cache:
        if isinstance(layer, CacheList):
            drop_last_tokens(list(layer.caches), count)
        elif isinstance(layer, RotatingKVCache):
            _drop_from_window(layer, count)
        elif is_rewindable(layer):
            layer.trim(count)


def _drop_from_window(layer: RotatingKVCache, count: int) -> None:
    if layer._idx != layer.keys.shape[2]:
        # Only a multi-token update leaves the window in temporal order with nothing after `_idx`.
        raise ValueError("a sliding window can only drop tokens right after the multi-token update that fed them")
    keep = layer._idx - count
    layer.keys, layer.values = layer.keys[..., :keep, :], layer.values[..., :keep, :]
    layer._idx = keep
    layer.offset -= count
    if keep < layer.max_size <= layer.offset:
        _give_back_the_next_slot(layer)


def _give_back_the_next_slot(layer: Any) -> None:
    """Every token an update fed dropped from a full window (a near tie on its first: verification.py) leaves
    max_size - 1, and mlx-lm's one-token update only grows a window that never dropped a token: the slot it
    writes next is given back at the end, where temporal order puts the next token."""
    layer.keys = mx.concatenate([layer.keys, mx.zeros_like(layer.keys[..., :1, :])], axis=2)
    layer.values = mx.concatenate([layer.values, mx.zeros_like(layer.values[..., :1, :])], axis=2)


def drop_last_tokens_per_row(prompt_cache: list[Any], counts: list[int]) -> None:
    """Forget the last `counts[i]` tokens of row i in a batched cache's attention layers, right after the
    forward that fed them (recurrent layers are put back with `restore_recurrent_state`)."""
    if not any(counts):
        return
    for layer in prompt_cache:
        if isinstance(layer, CacheList):
            drop_last_tokens_per_row(list(layer.caches), counts)
        elif isinstance(layer, (BatchKVCache, BatchRotatingKVCache)):
            _drop_per_row(layer, counts)


def _drop_per_row(layer: Any, counts: list[int]) -> None:
    if isinstance(layer, BatchRotatingKVCache) and (layer.rotated or layer._idx != layer.keys.shape[2]):
        raise ValueError("a sliding window can only drop tokens right after the multi-token update that fed them")
    shared = min(counts)
    if isinstance(layer, BatchRotatingKVCache) and shared:
        # The columns every row drops: the window's end goes (its next update reads the buffer's length).
        layer.keys, layer.values = layer.keys[..., : layer._idx - shared, :], layer.values[..., : layer._idx - shared, :]
        layer._offset -= shared
    if shared:
        layer._idx -= shared  # a BatchKVCache keeps its capacity: the next update writes over them
        layer.offset -= shared
    if isinstance(layer, BatchRotatingKVCache) and layer.keys.shape[2] < layer.max_size <= layer._offset:
        _give_back_the_next_slot(layer)  # every row dropped all it fed: as in _drop_from_window
    if shared == max(counts):
        return
    rest = mx.array([count - shared for count in counts])
    # Each row's own garbage rolled to its front, under its left padding (mlx-lm's `finalize`).
    layer.keys = dynamic_roll(layer.keys, rest[:, None], axis=2)
    layer.values = dynamic_roll(layer.values, rest[:, None], axis=2)
    layer.left_padding = layer.left_padding + rest
    layer.offset = layer.offset - rest
