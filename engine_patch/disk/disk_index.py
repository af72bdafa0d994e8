"""What the directory holds, as the disk tier knows it: the manifests, a lookup over them, a load, and the budget.

Lookups read no KV bytes: each manifest's token ids and checkpoint positions
are read from its header the first time it is seen (a directory listing per
lookup finds lanes other servers wrote or evicted), and `prefix_index.py` picks
the lane restoring the most, as in RAM. A load reads only the blocks and states
RAM does not hold (`lane_load.py`). A new manifest deletes those whose whole
prompt it repeats; blocks and states no manifest refers to any more go with
them. Eviction for the budget is by lane, one-shot lanes first, then the least
recently used (`snapshot_directory.py`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stable_prefix.engine_patch.cache.kv_blocks import Block
from stable_prefix.engine_patch.cache.prefix_index import best_match, placement, repeats_prompt_of
from stable_prefix.engine_patch.cache.ram_tier import CachedPrefix, Checkpoint

from .disk_faults import DiskFaults
from .lane_load import LaneLoad
from .lane_write_plan import WritePlan
from .model_identity import ModelIdentity
from .persisted_entry import LaneRecord, lane_record, state_keys, with_tokens
from .snapshot_directory import BLOCK, FOLDERS, LANE, STATE, LaneUnit, SnapshotDirectory
from .snapshot_file import FORMAT_VERSION, SnapshotFileError, format_version_of, read_header

logger = logging.getLogger("engine_patch")

# A manifest whose mtime is this much past its write time was loaded since (a load touches it).
LOADED_AFTER_SECONDS = 1.0


@dataclass(frozen=True)
class DiskMatch:
    identity: ModelIdentity
    name: str
    length: int  # prompt tokens the lane restores


@dataclass(frozen=True)
class LoadedSnapshot:
    entry: CachedPrefix
    file_bytes: int  # bytes read: the manifest and the blocks and states RAM did not hold
    seconds: float


class DiskIndex:
    def __init__(self, files: SnapshotDirectory, faults: DiskFaults, known_identities: Callable[[], list[ModelIdentity]]):
        self.files, self.faults, self.known_identities = files, faults, known_identities
        self._lock = faults.lock  # one lock for the tier's tables and counters
        # Every manifest read so far, by path (manifests are never rewritten); None: unreadable.
        self._records: dict[Path, LaneRecord | None] = {}
        # This server's lanes with their token ids, once whole; and as the latest lookup found them.
        self._indexed: dict[Path, LaneRecord] = {}
        self._lookup: dict[Path, LaneRecord] = {}
        # Every block's token ids read so far, by path (blocks are never rewritten).
        self._token_ids: dict[Path, Any] = {}
        # Per model folder: the block and state keys known to be on disk (a submit carries only the others).
        self._on_disk: dict[Path, tuple[set[str], set[str]]] = {}
        faults.on_deleted.append(self.forget)

    # --- lookups and loads (generation thread) ----------------------------------

    def longest_restorable_prefix(self, identity: ModelIdentity, prompt, positional: bool) -> DiskMatch | None:
        """The lane restoring the most of `prompt` (all but its last token, as in RAM), from the index alone.

        `positional`: the model has layers that restore only at a checkpoint or
        a lane's end; a lane sharing tokens with the prompt but no such point
        inside them is no match.
        """
        match = best_match(self.refreshed(identity).items(), prompt, positional)
        return None if match.key is None else DiskMatch(identity, match.key, match.length)

    def load(self, match: DiskMatch, held_blocks: Callable[[list[str]], dict[str, Block]],
             held_checkpoints: dict[str, Checkpoint]) -> LoadedSnapshot | None:
        """The lane's first `match.length` tokens as an entry, reading only the blocks and states RAM does not
        hold (`held_blocks`, `held_checkpoints`), each checked end to end.

        A block or state that is damaged (deleted, counted) or gone (another
        server evicted it) ends the entry at the longest prefix before it that
        it restores; None (counted, logged) if nothing is left.
        """
        folder = self.files.folder(match.identity)
        path = self.files.place(folder, LANE, match.name)
        started = time.perf_counter()
        with self._lock:
            record = self._lookup.get(path)
        if record is None or not path.exists():
            logger.info("disk cache: lane %s vanished before it was read (another server evicted it)", match.name)
            self.forget(path)
            return None
        read = LaneLoad(self.files, folder, record, record.file_bytes, self.faults)
        length = read.blocks_up_to(match.length, held_blocks)
        entry = read.entry(length, held_checkpoints)
        if entry is None:
            return None
        seconds = time.perf_counter() - started
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU clock, shared with every server on this directory
        with self._lock:
            counters = self.faults.counters
            counters.loads += 1
            counters.bytes_loaded += read.bytes_loaded
            counters.blocks_loaded += read.blocks_loaded
            counters.load_seconds += seconds
            blocks, states = self._on_disk.setdefault(folder, (set(), set()))
            blocks.update(ref.block.key for ref in entry.blocks)
            states.update(c.key for c in entry.checkpoints)
        logger.info("disk cache: loaded %d tokens, %d checkpoints (%d blocks read, %.1f MiB) in %.3f s",
                    len(entry.tokens), len(entry.checkpoints), read.blocks_loaded, read.bytes_loaded / 2**20, seconds)
        return LoadedSnapshot(entry, read.bytes_loaded, seconds)

    # --- the manifests --------------------------------------------------------------

    def refreshed(self, identity: ModelIdentity) -> dict[str, LaneRecord]:
        """This model's lanes as the directory holds them now, with their token ids.

        A manifest and its blocks' token ids are read once each (headers and a
        few KB of ids, never KV bytes); a lane whose block is gone or damaged is
        cut at the longest prefix it restores before that block.
        """
        folder = self.files.folder(identity)
        index = {}
        for name, size in self.files.sizes(folder, LANE).items():
            path = self.files.place(folder, LANE, name)
            with self._lock:
                record = self._indexed.get(path)
            if record is None or record.file_bytes != size:
                described = self._record(path, size, identity.key)
                if described is None:
                    continue
                record = with_tokens(described, self._block_token_ids(folder, identity.key, [piece.key for piece in described.blocks]))
                if record.token_count == described.token_count:
                    with self._lock:
                        self._indexed[path] = record  # a cut one is tried again next time (a block may come back)
            if record.tokens is not None:
                index[name] = record
        with self._lock:
            self._lookup = {self.files.place(folder, LANE, name): record for name, record in index.items()}
        return index

    def _block_token_ids(self, folder: Path, identity: str, keys: list[str]) -> dict[str, Any]:
        """The token ids of the blocks `keys` (in order, up to the first that is gone or bad), from their headers."""
        found = {}
        for key in keys:
            path = self.files.place(folder, BLOCK, key)
            with self._lock:
                token_ids = self._token_ids.get(path)
            if token_ids is None:
                try:
                    header = read_header(path, identity, "block")
                    if header.metadata.get("key") != key or header.tokens is None:
                        raise SnapshotFileError(f"the file of block {key} holds another block")
                    token_ids = header.tokens
                except FileNotFoundError:
                    self.faults.block_gone(path)
                    break
                except (SnapshotFileError, OSError) as error:
                    self.faults.count_error(f"reading the header of {path}; deleted it, its lanes restore the prefix before it", error)
                    self.faults.delete_bad_file(path)
                    break
                with self._lock:
                    self._token_ids[path] = token_ids
            found[key] = token_ids
        return found

    def _record(self, path: Path, size: int, identity: str) -> LaneRecord | None:
        """A manifest's lane, without its token ids (read once); a bad manifest of this model is deleted and counted."""
        with self._lock:
            known = self._records.get(path, False)
        if known is not False and (known is None or known.file_bytes == size):
            return known
        try:
            header = read_header(path, identity, "lane")
            record = lane_record(path.name[: -len(".kv")], header.metadata, header.file_bytes)
        except FileNotFoundError:
            return None
        except (SnapshotFileError, OSError, ValueError) as error:
            if len(identity) < 64:
                record = None  # another model's: eviction takes it as it is
            else:
                self.faults.count_error(f"reading the header of {path}; deleted it", error)
                self.faults.delete_bad_file(path)
                return None
        with self._lock:
            self._records[path] = record
        return record

    def held_on_disk(self, identity: ModelIdentity, record: LaneRecord) -> bool:
        """Whether a lane on disk restores everything `record` would (counted as a skipped write)."""
        index = self.refreshed(identity).items()
        if placement(index, record.tokens, record.checkpoint_positions, bool(record.positional)).held_by is None:
            return False
        self.faults.count(writes_skipped=1)
        return True

    def committed(self, folder: Path, manifest: Path, record: LaneRecord) -> None:
        """A lane this server just wrote: known with its blocks and states, no header read back."""
        with self._lock:
            self._records[manifest] = self._indexed[manifest] = record
            blocks_known, states_known = self._on_disk.setdefault(folder, (set(), set()))
            blocks_known.update(piece.key for piece in record.blocks)
            states_known.update(state_keys(record))

    def delete_replaced(self, identity: ModelIdentity, new_manifest: Path, record: LaneRecord) -> None:
        """Drop the lanes whose whole prompt the new one repeats (as RAM does), and the blocks and states
        no lane refers to any more (call under the directory lock)."""
        folder = self.files.folder(identity)
        for name, lane in self.refreshed(identity).items():
            path = self.files.place(folder, LANE, name)
            if path != new_manifest and repeats_prompt_of(lane, record.tokens):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                self.forget(path)
        referenced = {path for unit in self._lane_units([folder]) for path in unit.refers_to}
        for path in self.files.unreferenced(folder, referenced):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self.forget(path)

    def delete_lanes_of(self, identities: list[ModelIdentity]) -> int:
        """Delete these models' lanes, blocks and states (call under the directory lock); the lanes deleted."""
        deleted = 0
        for identity in identities:
            folder = self.files.folder(identity)
            with self._lock:
                self._on_disk[folder] = (set(), set())
            for kind in (LANE, BLOCK, STATE):  # manifests first: a lane never names a deleted block
                for name in self.files.sizes(folder, kind):
                    path = self.files.place(folder, kind, name)
                    try:
                        path.unlink()
                        deleted += kind == LANE
                    except FileNotFoundError:
                        pass
                    except OSError as error:
                        self.faults.count_error(f"deleting {path}", error)
                    self.forget(path)
        return deleted

    def forget(self, path: Path) -> None:
        with self._lock:
            for known in (self._records, self._indexed, self._lookup, self._token_ids):
                known.pop(path, None)

    # --- the block and state keys on disk ---------------------------------------------

    def learn_what_is_on_disk(self, folder: Path, blocks=None, states=None) -> None:
        """The block and state keys in `folder` now (listed, unless given)."""
        blocks = set(self.files.sizes(folder, BLOCK) if blocks is None else blocks)
        states = set(self.files.sizes(folder, STATE) if states is None else states)
        with self._lock:
            self._on_disk[folder] = (blocks, states)

    def known_on_disk(self, folder: Path) -> tuple[set[str], set[str]]:
        """The block and state keys this tier knows `folder` holds (copies)."""
        with self._lock:
            blocks, states = self._on_disk.get(folder, ((), ()))
            return set(blocks), set(states)

    # --- the budget -------------------------------------------------------------------

    def make_room(self, plan: WritePlan, manifest_bytes: int) -> bool:
        """Evict lanes until the write fits the budget (call under the directory lock); False: it never will."""
        limit, limited_by = self.files.budget_limit()
        if plan.footprint + manifest_bytes > limit:
            self.faults.warn_once("too-large", "disk cache: a %.1f MiB lane does not fit the disk budget (%.1f MiB now, set by %s); not written",
                                  (plan.footprint + manifest_bytes) / 2**20, limit / 2**20, limited_by)
            self.faults.count(writes_skipped=1)
            return False
        fits, deleted = self.files.evict_until(limit - plan.new_bytes - manifest_bytes, self._lane_units(), plan.protected)
        self._evicted(deleted)
        if not fits:
            self.faults.warn_once("no-room", "disk cache: evicting every other lane leaves no room for a %.1f MiB write; not written",
                                  (plan.new_bytes + manifest_bytes) / 2**20)
            self.faults.count(writes_skipped=1)
        return fits

    def stats(self, identities: list[ModelIdentity | None]) -> dict[str, Any]:
        """What a write may use now, what the directory holds (every model's files: what the budget bounds), and
        these models' lanes and blocks."""
        files = self.files.files()
        lanes = [record for identity in identities if identity for record in self.refreshed(identity).values()]
        blocks = {piece.key: piece.end - piece.start for record in lanes for piece in record.blocks}
        return {
            **self._effective_budget(),
            "disk_bytes": sum(status.st_size for _, status in files),
            "disk_entries": sum(path.suffix == ".kv" and not path.name.startswith(".") for path, _ in files),
            "disk_model_entries": len(lanes),
            "disk_blocks": len(blocks),
            "disk_block_tokens": sum(blocks.values()),
        }

    def _effective_budget(self) -> dict[str, Any]:
        """What a write may use now: the configured budget unless the free-space margin leaves less."""
        try:
            effective, reason = self.files.budget_limit()
        except OSError as error:
            return {"disk_effective_budget_bytes": 0, "disk_budget_limited_by": f"the directory cannot be read ({error})"}
        return {"disk_effective_budget_bytes": effective, "disk_budget_limited_by": reason}

    def _lane_units(self, folders: list[Path] | None = None) -> list[LaneUnit]:
        """Every lane of every model in the directory (or in `folders`), as eviction sees it."""
        own = {self.files.folder(identity): identity.key for identity in self.known_identities()}
        units = []
        for folder in self.files.model_folders() if folders is None else folders:
            for name, size in self.files.sizes(folder, LANE).items():
                path = self.files.place(folder, LANE, name)
                record = self._record(path, size, own.get(folder, folder.name))
                with contextlib.suppress(FileNotFoundError):
                    mtime_ns = path.stat().st_mtime_ns
                    if record is None:
                        units.append(LaneUnit(path, set(), mtime_ns, True))
                        continue
                    refers_to = {self.files.place(folder, BLOCK, piece.key) for piece in record.blocks}
                    refers_to |= {self.files.place(folder, STATE, key) for key in state_keys(record)}
                    one_shot = record.turns == 1 and mtime_ns <= (record.written_at + LOADED_AFTER_SECONDS) * 1e9
                    units.append(LaneUnit(path, refers_to, mtime_ns, one_shot))
        return units

    def _evicted(self, paths: list[Path]) -> None:
        with self._lock:
            self.faults.counters.evictions += sum(path.parent.name == FOLDERS[LANE] for path in paths)
            for path in paths:
                for known in (self._records, self._indexed, self._lookup, self._token_ids):
                    known.pop(path, None)
                known = self._on_disk.get(path.parent.parent)
                if known is not None:
                    (known[0] if path.parent.name == FOLDERS[BLOCK] else known[1]).discard(path.name.rsplit(".", 1)[0])

    # --- leftovers ----------------------------------------------------------------------

    def remove_stale_temporary_files(self, folder: Path) -> None:
        for path in self.files.stale_temporary_files(folder):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as error:
                self.faults.count_error(f"removing the unfinished write {path}", error)
                continue
            logger.warning("disk cache: removed %s, left by a write that did not finish", path)
            self.faults.count(temp_files_removed=1)

    def remove_legacy_files(self) -> None:
        """Delete files of the formats that kept a whole lane per file (their identities are never this build's)."""
        removed, freed = 0, 0
        for path in self.files.legacy_files():
            version = format_version_of(path)
            if version is None or version == str(FORMAT_VERSION):
                continue
            with contextlib.suppress(FileNotFoundError):
                size = path.stat().st_size
                path.unlink()
                removed, freed = removed + 1, freed + size
        if removed:
            logger.warning("disk cache: removed %d snapshot files of older formats (whole lanes, %.1f MiB) from %s; "
                           "this build keeps each KV block once", removed, freed / 2**20, self.files.path)
            self.faults.count(legacy_files_removed=removed)
