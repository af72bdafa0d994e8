"""One load of a lane from disk: the blocks and states RAM does not hold, read and checked in order.

A block or state that is damaged (deleted, counted in `disk_errors`) or gone
(another server evicted it: counted in `disk_blocks_missing`) ends the entry at
the longest prefix before it that the lane restores: never a wrong answer.

Each file's bytes are read once (`mx.load`, into the arrays the block keeps);
its checksums are checked on another thread while the next file is read, and
every block's check has passed before the load returns.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stable_prefix.engine_patch.cache.cache_layers import snapshot_nbytes
from stable_prefix.engine_patch.cache.kv_blocks import Block, BlockRef, covering
from stable_prefix.engine_patch.cache.prefix_index import restorable_length
from stable_prefix.engine_patch.cache.ram_tier import CachedPrefix, Checkpoint, own_nbytes

from .persisted_entry import BlockPiece, LaneRecord, block_from_arrays, cut, state_from_arrays
from .snapshot_directory import BLOCK, STATE, SnapshotDirectory
from .snapshot_file import SnapshotHeader, load_unchecked, read_header


class Faults(Protocol):
    """Where a load reports what it found wrong (the disk tier)."""

    def block_gone(self, path: Path) -> None: ...

    def count_error(self, what: str, error: BaseException) -> None: ...

    def delete_bad_file(self, path: Path) -> None: ...


@dataclass(frozen=True)
class PendingCheck:
    """A file read and built whose checksums are still being checked."""

    kind: str
    path: Path
    header: SnapshotHeader
    checked: Future
    start: int = 0  # a block's first token


class LaneLoad:
    """One load: the blocks and states of a lane that RAM does not hold, read and checked in order."""

    def __init__(self, files: SnapshotDirectory, folder: Path, record: LaneRecord, manifest_bytes: int, faults: Faults):
        self.files, self.folder, self.record, self.faults = files, folder, record, faults
        self.positional = bool(record.positional)
        self.bytes_loaded, self.blocks_loaded = manifest_bytes, 0
        self.refs: list[BlockRef] = []

    def blocks_up_to(self, length: int, held_blocks: Callable[[list[str]], dict[str, Block]]) -> int:
        """Collect the blocks of the first `length` tokens; the length they restore (shorter if one is bad or gone)."""
        pieces: list[BlockPiece] = cut(self.record, length).blocks
        held = held_blocks([piece.key for piece in pieces])
        pending: list[PendingCheck] = []
        stop = None  # the first token of the first block that is bad or gone
        for piece in pieces:
            block = held.get(piece.key)
            if block is None:
                read = self._read(BLOCK, piece.key, lambda header, arrays, piece=piece:
                                  block_from_arrays(piece, header.tokens, arrays, header.metadata, self.record), piece.start)
                if read is None:
                    stop = piece.start
                    break
                block, check = read
                pending.append(check)
            self.refs.append(BlockRef(block, piece.used))
        for check in pending:  # in order: the first block failing its checksums ends the lane
            if not self._passed(check):
                stop = check.start
                break
        if stop is None:
            return length
        self.refs = [ref for ref in self.refs if ref.block.start < stop]
        return self._restorable(stop)

    def entry(self, length: int, held_checkpoints: dict[str, Checkpoint]) -> CachedPrefix | None:
        """The entry of the first `length` tokens, its positional states read (shorter if the state at its end is bad)."""
        states: dict[str, Checkpoint | None] = {}

        def state(key: str, position: int, pinned: bool = False) -> Checkpoint | None:
            if key not in states:
                held = held_checkpoints.get(key)
                layers = held.layers if held is not None and held.position == position else self._read_checked(
                    STATE, key, lambda header, arrays: state_from_arrays(key, position, arrays, header.metadata, self.record))
                states[key] = None if layers is None else Checkpoint(position, layers, snapshot_nbytes(layers), pinned, key)
            return states[key]

        while length > 0:
            lane = cut(self.record, length)
            end = state(lane.end_state, length) if self.positional else None
            if end is None and self.positional:
                length = self._restorable(length - 1)
                continue
            checkpoints = [found for c in lane.checkpoints if (found := state(c.key, c.position, c.pinned)) is not None]
            layers = list(end.layers) if end is not None else [None] * lane.layer_count
            return CachedPrefix(lane.tokens, covering(self.refs, length), layers, own_nbytes(layers, checkpoints), lane.prompt_length,
                                checkpoints, lane.turns)
        return None

    def _restorable(self, limit: int) -> int:
        return restorable_length(self.record.token_count, self.record.checkpoint_positions, limit, self.positional)

    def _read(self, kind: str, key: str, build: Callable[[SnapshotHeader, dict], Any], start: int = 0) -> tuple[Any, PendingCheck] | None:
        """A block or state file, read and built, and the check of its checksums (`_passed`); None if it is gone
        (counted) or bad (deleted, counted)."""
        path = self.files.place(self.folder, kind, key)
        try:
            header = read_header(path, self.folder.name, kind)
            arrays, checked = load_unchecked(path, header)
            built = build(header, arrays)
        except FileNotFoundError:
            self.faults.block_gone(path)
            return None
        except Exception as error:
            self._bad(path, error)
            return None
        return built, PendingCheck(kind, path, header, checked, start)

    def _read_checked(self, kind: str, key: str, build: Callable[[SnapshotHeader, dict], Any]) -> Any:
        read = self._read(kind, key, build)
        return None if read is None or not self._passed(read[1]) else read[0]

    def _passed(self, check: PendingCheck) -> bool:
        """Whether a file read passed its checksums (counted as loaded); if not, it is deleted and counted."""
        try:
            check.checked.result()
        except Exception as error:
            self._bad(check.path, error)
            return False
        self.bytes_loaded += check.header.file_bytes
        self.blocks_loaded += check.kind == BLOCK
        return True

    def _bad(self, path: Path, error: BaseException) -> None:
        self.faults.count_error(f"reading {path}; deleted it, its lanes restore the prefix before it", error)
        self.faults.delete_bad_file(path)
