"""A prefix-cache entry as files: a manifest naming its blocks and states, each block and state a file of its own.

A RAM entry (`CachedPrefix`) is a list of KV blocks (the rewindable layers),
its positional layers' state at its end and up to six checkpoints of them. On
disk:
- each block is one file, named by its key and written once, whatever number
  of lanes refer to it (`block_arrays` / `block_from_arrays`);
- each positional state (a checkpoint, or an end state no checkpoint holds) is
  one file named by its key, written once: a checkpoint several lanes share (a
  new conversation restored from another lane's head) is on disk once, and the
  lanes a restarted server loads share one object again (`RamTier.admit`);
- the lane itself is a small manifest: its block keys with the tokens each
  covers, how many tokens were prompt, its checkpoints' keys and positions,
  which state is its end (`lane_metadata` / `lane_record`). Its token ids are
  its blocks' (each block file holds its own first, before its KV), so a
  manifest grows by a block key per block, not by 4 bytes per token per turn.

Reading checks what the per-file CRCs cannot: that a manifest's blocks cover
its tokens back to back and its checkpoints lie inside them in order, that the
token ids its blocks hold give every block's key again (`with_tokens`: a block
file under another block's name is found out), that a block holds the model's
rewindable layers for exactly its tokens, and that a state holds the
positional layers, each at its position.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import numpy as np

from stable_prefix.engine_patch.cache.cache_layers import block_nbytes, cached_token_count, layers_from_arrays, layers_to_arrays
from stable_prefix.engine_patch.cache.kv_blocks import Block, KeyChain
from stable_prefix.engine_patch.cache.prefix_index import restorable_length
from stable_prefix.engine_patch.cache.ram_tier import CachedPrefix

from .snapshot_file import TOKENS

LANE = "lane"


class EntryDescriptionError(ValueError):
    """A file's description does not fit its tokens or its layers."""


@dataclass(frozen=True)
class BlockPiece:
    """A manifest's reference to the first `used` tokens of the block `key`, which holds tokens [start, end)."""

    key: str
    start: int
    end: int
    used: int


@dataclass(frozen=True)
class CheckpointRecord:
    key: str  # the state file holding it
    position: int
    pinned: bool


@dataclass
class LaneRecord:
    """What a manifest says about its lane: everything the index and a load need, no KV bytes."""

    name: str
    tokens: np.ndarray | None  # from its blocks' token ids (`with_tokens`); None until then
    prompt_length: int
    layer_count: int
    positional: list[int]  # the indices of the positional layers (the others are in the blocks)
    blocks: list[BlockPiece]
    checkpoints: list[CheckpointRecord]
    end_state: str | None  # the state file holding the positional layers at the lane's end (None: no such layers)
    turns: int
    written_at: float
    file_bytes: int

    @property
    def checkpoint_positions(self) -> list[int]:
        return [c.position for c in self.checkpoints]

    @property
    def token_count(self) -> int:
        return sum(piece.used for piece in self.blocks)


def record_of(entry: CachedPrefix) -> tuple[LaneRecord, bool]:
    """The manifest of `entry` (its name and write time are set when it is written), and whether its
    positional end state needs a state file of its own (False when it is a checkpoint's)."""
    end_state, own_end_state = _end_state_of(entry)
    record = LaneRecord(
        "", np.asarray(entry.tokens, dtype=np.int64), entry.prompt_length, len(entry.layers),
        [index for index, layer in enumerate(entry.layers) if layer is not None],
        [BlockPiece(ref.block.key, ref.block.start, ref.block.end, ref.used) for ref in entry.blocks],
        [CheckpointRecord(c.key, c.position, c.pinned) for c in entry.checkpoints], end_state, entry.turns, 0.0, 0,
    )
    return record, own_end_state


def _end_state_of(entry: CachedPrefix) -> tuple[str | None, bool]:
    if not entry.positional:
        return None, False
    for checkpoint in entry.checkpoints:
        if checkpoint.position == len(entry.tokens) and all(
            layer is None or layer is held for layer, held in zip(entry.layers, checkpoint.layers)
        ):
            return checkpoint.key, False
    return uuid.uuid4().hex, True


def lane_metadata(record: LaneRecord) -> dict[str, str]:
    """The manifest's metadata (its token ids go beside, as the file's one tensor)."""
    described = {
        "prompt_length": record.prompt_length,
        "layer_count": record.layer_count,
        "positional": record.positional,
        "blocks": [[piece.key, piece.start, piece.end, piece.used] for piece in record.blocks],
        "checkpoints": [{"key": c.key, "position": c.position, "pinned": c.pinned} for c in record.checkpoints],
        "end_state": record.end_state,
        "turns": record.turns,
        "written_at": record.written_at,
    }
    return {LANE: json.dumps(described)}


def cut(record: LaneRecord, length: int) -> LaneRecord:
    """The first `length` tokens of a lane (a length it restores: its end or a checkpoint) as a lane of their own."""
    if length == record.token_count:
        return record
    pieces = []
    for piece in record.blocks:
        if piece.start >= length:
            break
        pieces.append(piece if piece.start + piece.used <= length else BlockPiece(piece.key, piece.start, piece.end, length - piece.start))
    checkpoints = [c for c in record.checkpoints if c.position <= length]
    end_state = next((c.key for c in checkpoints if c.position == length), None) if record.positional else None
    tokens = None if record.tokens is None else record.tokens[:length]
    return LaneRecord(record.name, tokens, min(record.prompt_length, length), record.layer_count, record.positional,
                      pieces, checkpoints, end_state, record.turns, record.written_at, record.file_bytes)


def state_keys(record: LaneRecord) -> list[str]:
    """Every state file the lane refers to (its checkpoints and its end state), each once."""
    return list(dict.fromkeys([*(c.key for c in record.checkpoints), *([record.end_state] if record.end_state else [])]))


def lane_record(name: str, metadata: dict[str, str], file_bytes: int) -> LaneRecord:
    """The lane a manifest describes (its token ids still to be read from its blocks: `with_tokens`);
    EntryDescriptionError if its description is malformed or does not hold together."""
    try:
        described = json.loads(metadata[LANE])
        blocks = [BlockPiece(str(key), int(start), int(end), int(used)) for key, start, end, used in described["blocks"]]
        checkpoints = [CheckpointRecord(str(c["key"]), c["position"], c["pinned"]) for c in described["checkpoints"]]
        record = LaneRecord(name, None, described["prompt_length"], described["layer_count"], list(described["positional"]),
                            blocks, checkpoints, described["end_state"], described["turns"], float(described["written_at"]), file_bytes)
    except (KeyError, TypeError, ValueError) as error:
        raise EntryDescriptionError(f"the lane description is malformed ({error!r})") from error
    _check_lane(record)
    return record


def with_tokens(record: LaneRecord, token_ids: dict[str, np.ndarray]) -> LaneRecord:
    """The lane with its token ids, taken from its blocks' (`token_ids` by block key) and checked against
    every block's key; cut at the longest prefix it restores before the first block that is missing or
    does not match (its tokens None if that leaves nothing)."""
    chain, tokens = KeyChain(), []
    for piece in record.blocks:
        ids = token_ids.get(piece.key)
        if ids is None or len(ids) != piece.end - piece.start or chain.key_of_next(ids) != piece.key:
            break
        chain.extend(ids[: piece.used])
        tokens.append(ids[: piece.used])
    length = restorable_length(record.token_count, record.checkpoint_positions, chain.length, bool(record.positional))
    if length == 0:
        return replace(record, tokens=None, blocks=[], checkpoints=[])
    assembled = np.concatenate(tokens).astype(np.int64)
    return cut(replace(record, tokens=assembled[: chain.length]), length)


def _check_lane(record: LaneRecord) -> None:
    count = record.token_count
    integers = [record.prompt_length, record.layer_count, record.turns, *record.positional, *record.checkpoint_positions]
    if not all(type(value) is int for value in integers) or not all(isinstance(c.pinned, bool) for c in record.checkpoints):
        raise EntryDescriptionError("the lane description is malformed")
    if not 0 < record.prompt_length <= count:
        raise EntryDescriptionError(f"prompt_length {record.prompt_length} for {count} tokens")
    if not all(0 <= index < record.layer_count for index in record.positional) or (record.end_state is None) != (not record.positional):
        raise EntryDescriptionError("the positional layers do not fit the lane's layers")
    position = 0
    for piece in record.blocks:
        if piece.start != position or not 0 < piece.used <= piece.end - piece.start:
            raise EntryDescriptionError(f"the blocks do not cover the tokens back to back (at {position})")
        position += piece.used
    if count == 0:
        raise EntryDescriptionError("the lane has no blocks")
    positions = record.checkpoint_positions
    if positions != sorted(set(positions)) or any(not 0 < p <= count for p in positions):
        raise EntryDescriptionError(f"checkpoint positions {positions} do not fit {count} tokens")


# --- blocks -----------------------------------------------------------------------


def block_arrays(block: Block) -> tuple[dict[str, mx.array], dict[str, str]]:
    """A block's token ids and arrays by name (the token ids first: the index reads them, never the KV),
    and the metadata that places them."""
    arrays = {TOKENS: mx.array(block.token_ids)}
    for index, pair in enumerate(block.arrays):
        if pair is not None:
            arrays[f"layer.{index}.keys"], arrays[f"layer.{index}.values"] = pair
    return arrays, {"key": block.key, "start": str(block.start), "end": str(block.end)}


def block_from_arrays(piece: BlockPiece, token_ids: np.ndarray | None, arrays: dict[str, mx.array], metadata: dict[str, str],
                      record: LaneRecord) -> Block:
    """The block a manifest names, from its file (token ids and arrays); EntryDescriptionError if the file is
    another block or another shape."""
    if (metadata.get("key"), metadata.get("start"), metadata.get("end")) != (piece.key, str(piece.start), str(piece.end)):
        raise EntryDescriptionError(f"the file of block {piece.key} holds another block")
    if token_ids is None or len(token_ids) != piece.end - piece.start:
        raise EntryDescriptionError(f"the file of block {piece.key} lacks its token ids")
    pairs: list[Any] = []
    for index in range(record.layer_count):
        if index in record.positional:
            pairs.append(None)
            continue
        pair = arrays.get(f"layer.{index}.keys"), arrays.get(f"layer.{index}.values")
        if any(part is None or part.ndim != 4 or part.shape[2] != piece.end - piece.start for part in pair):
            raise EntryDescriptionError(f"block {piece.key} lacks layer {index} for its {piece.end - piece.start} tokens")
        pairs.append(pair)
    if len(arrays) != 2 * (record.layer_count - len(record.positional)):
        raise EntryDescriptionError(f"block {piece.key} holds other layers than the model's")
    return Block(piece.key, piece.start, piece.end, token_ids.astype(np.int32), pairs, block_nbytes(pairs))


# --- positional states ------------------------------------------------------------------


def state_arrays(layers: list[Any], key: str, position: int) -> tuple[dict[str, mx.array], dict[str, str]]:
    """The positional layers of `layers` (None elsewhere) as named arrays and the metadata that rebuilds them."""
    indices = [index for index, layer in enumerate(layers) if layer is not None]
    arrays, metadata = layers_to_arrays([layers[index] for index in indices])
    return arrays, {**metadata, "key": key, "position": str(position), "indices": json.dumps(indices)}


def state_from_arrays(key: str, position: int, arrays: dict[str, mx.array], metadata: dict[str, str], record: LaneRecord) -> list[Any]:
    """The positional layers a state file holds, at their indices (None elsewhere); EntryDescriptionError if
    they are not the lane's positional layers, each at `position` tokens."""
    if (metadata.get("key"), metadata.get("position")) != (key, str(position)):
        raise EntryDescriptionError(f"the file of state {key} holds another state")
    try:
        indices = json.loads(metadata["indices"])
    except (KeyError, ValueError) as error:
        raise EntryDescriptionError(f"state {key} does not say which layers it holds") from error
    if indices != record.positional:
        raise EntryDescriptionError(f"state {key} holds layers {indices}, the lane's positional layers are {record.positional}")
    loaded = layers_from_arrays(arrays, metadata)
    if len(loaded) != len(indices):
        raise EntryDescriptionError(f"state {key} holds {len(loaded)} layers for {len(indices)} indices")
    layers: list[Any] = [None] * record.layer_count
    for index, layer in zip(indices, loaded):
        counted = cached_token_count([layer])
        if counted is not None and counted != position:
            raise EntryDescriptionError(f"state {key} at {position} holds a layer at {counted} tokens")
        layers[index] = layer
    return layers
