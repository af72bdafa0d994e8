"""KV blocks on disk, under the RAM cache, so a restarted server (or a replica taking over a lane) starts warm.

A lane is a small manifest naming its blocks and positional states, each a
file of its own written once (`persisted_entry.py`, `snapshot_directory.py`):
a turn writes only the blocks and states the directory does not hold yet (its
new tokens, its new checkpoints) and a manifest of a few KB. Several servers
on one directory share every block any of them wrote.

Writes leave the request path: `submit` (generation thread) takes zero-copy
numpy views of the blocks and states this tier does not know to be on disk and
queues them; a writer thread, which never calls MLX, writes each new block and
state (temporary file, fsync, rename to its key's name), syncs their folders,
then writes the manifest the same way: a manifest is never committed before
its blocks. The queue is bounded: if the disk is slower than the requests, the
oldest pending write is dropped (counted; its blocks are not on disk, so the
next write of that lane carries them), and a pending write whose prompt a newer
one repeats is superseded. Each write holds the directory lock from the budget
check to its last rename, so two servers on one directory never exceed the
budget together, and a block one relies on is never deleted under it.

Lookups read no KV bytes: the index holds each manifest's token ids and
checkpoint positions, read from its header the first time it is seen (a
directory listing per lookup finds lanes other servers wrote or evicted), and
`prefix_index.py` picks the lane restoring the most, as in RAM. A load reads
only the blocks and states RAM does not hold, for the prefix the prompt
restores. A new manifest deletes those whose whole prompt it repeats; blocks
and states no manifest refers to any more go with them. Eviction is by lane,
one-shot lanes first, then the least recently used.

Anything wrong on disk (a truncated or corrupt file, a foreign header, a full
disk, a read-only directory, a block another server evicted mid-read) costs a
logged warning, a counted `disk_errors` (or `disk_blocks_missing`) and that
request's disk hit, never the request: a lane whose block is damaged or gone
restores the prefix before it; a bad file is deleted, a failed write removes
its temporary file.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from stable_prefix.engine_patch.cache.kv_blocks import Block
from stable_prefix.engine_patch.cache.per_model import PerModel
from stable_prefix.engine_patch.cache.prefix_cache import CachedPrefix, Checkpoint
from stable_prefix.engine_patch.cache.prefix_index import Match, best_match, placement, repeats_prompt_of

from .lane_load import LaneLoad
from .lane_write_plan import WritePlan
from .model_identity import DigestMemo, ModelIdentity, identity_of, loaded_model_description
from .persisted_entry import (
    LaneRecord,
    block_arrays,
    lane_metadata,
    lane_record,
    record_of,
    state_arrays,
    state_keys,
    with_tokens,
)
from .snapshot_directory import BLOCK, FOLDERS, LANE, STATE, LaneUnit, SnapshotDirectory, free_and_total_bytes
from .snapshot_file import (
    FORMAT_VERSION,
    HostArray,
    PreparedSnapshot,
    SnapshotFileError,
    format_version_of,
    host_view,
    prepare_snapshot,
    read_header,
    write_snapshot,
)

logger = logging.getLogger("engine_patch")

DEFAULT_DIRECTORY = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stable-prefix" / "kv"
DEFAULT_BUDGET_BYTES = 20 * 2**30
# Pending writes hold their new blocks' arrays alive: a small bound caps that memory.
QUEUE_LIMIT = 2
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


@dataclass
class PendingWrite:
    identity: Future
    record: LaneRecord
    # Arrays of the blocks and states this tier did not know to be on disk when the lane was queued.
    blocks: dict[str, tuple[dict[str, HostArray], dict[str, str]]]
    states: dict[str, tuple[dict[str, HostArray], dict[str, str]]]

    @property
    def tokens(self):
        return self.record.tokens

    @property
    def prompt_length(self) -> int:
        return self.record.prompt_length

    @property
    def checkpoint_positions(self) -> list[int]:
        return self.record.checkpoint_positions


@dataclass
class DiskCounters:
    hits: int = 0  # requests whose reuse came from a lane loaded from disk
    tokens_loaded: int = 0
    loads: int = 0
    bytes_loaded: int = 0
    blocks_loaded: int = 0
    load_seconds: float = 0.0
    writes: int = 0  # lanes written (manifests committed)
    bytes_written: int = 0  # every byte written: blocks, states and manifests
    blocks_written: int = 0
    block_bytes_written: int = 0
    blocks_reused: int = 0  # blocks a written lane refers to that the directory held already
    states_written: int = 0  # positional states (checkpoints, end states)
    state_bytes_written: int = 0
    write_seconds: float = 0.0
    writes_dropped: int = 0  # the queue was full: the disk is slower than the requests
    writes_superseded: int = 0  # a newer pending write repeats its whole prompt
    writes_skipped: int = 0  # already on disk, or larger than the budget
    writes_truncated: int = 0  # a block the lane relied on was evicted meanwhile: the prefix before it was written
    evictions: int = 0  # lanes evicted for the budget
    blocks_missing: int = 0  # a lane's block was gone when it was read (another server evicted it)
    errors: int = 0
    last_error: str | None = None
    temp_files_removed: int = 0
    legacy_files_removed: int = 0


@dataclass
class DiskTier:
    directory: Path
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    queue_limit: int = QUEUE_LIMIT
    free_space: Callable[[Path], tuple[int, int]] = free_and_total_bytes
    write_file: Callable[[Path, PreparedSnapshot], None] = write_snapshot
    counters: DiskCounters = field(default_factory=DiskCounters)

    def __post_init__(self) -> None:
        self.files = SnapshotDirectory(self.directory, self.budget_bytes, self.free_space)
        self.directory = self.files.path
        self._lock = threading.Condition()
        # Per model object, held weakly (an unloaded model must be freed: cache/per_model.py).
        self._identities: PerModel[Future] = PerModel()
        # Every manifest read so far, by path (manifests are never rewritten); None: unreadable.
        self._records: dict[Path, LaneRecord | None] = {}
        # This server's lanes with their token ids, once whole; and as the latest lookup found them.
        self._indexed: dict[Path, LaneRecord] = {}
        self._lookup: dict[Path, LaneRecord] = {}
        # Every block's token ids read so far, by path (blocks are never rewritten), and blocks found gone.
        self._token_ids: dict[Path, Any] = {}
        self._gone: set[Path] = set()
        # Per model folder: the block and state keys known to be on disk (a submit carries only the others).
        self._on_disk: dict[Path, tuple[set[str], set[str]]] = {}
        self._queue: collections.deque[PendingWrite] = collections.deque()
        self._writing = False
        self._closing = False
        self._epoch = 0  # bumped by clear(): a write that started before it is discarded
        self._warned: set[str] = set()
        try:
            self.files.prepare()
            self._remove_legacy_files()
        except OSError as error:
            self.count_error(f"preparing {self.directory}", error)
        self._memo = DigestMemo(self.directory / "file-digests.json")
        # Daemon threads: a shutdown never waits for a model to finish hashing.
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._writer.start()

    # --- model identity ---------------------------------------------------------

    def model_loaded(self, model: Any, model_dir: Path) -> None:
        """Identify `model` (loaded from `model_dir`) in the background; its lanes are
        looked up and written once that is done."""
        loaded = loaded_model_description(model)
        identity: Future = Future()
        self._identities.set(model, identity)
        threading.Thread(target=lambda: identity.set_result(self._identify_model(Path(model_dir), loaded)),
                         name="kv-disk-identity", daemon=True).start()

    def _identify_model(self, model_dir: Path, loaded: dict[str, Any]) -> ModelIdentity | None:
        started = time.perf_counter()
        try:
            identity = identity_of(model_dir, self._memo, loaded)
        except Exception as error:
            self.count_error(f"identifying the model in {model_dir} (disk cache off for it)", error)
            return None
        if self._memo.hashed_files:
            with contextlib.suppress(OSError):
                self._memo.save()
        folder = self.files.folder(identity)
        self._remove_stale_temporary_files(folder)
        self.learn_what_is_on_disk(folder)
        logger.info(
            "disk cache: model %s is %s (%d files, %d hashed, %.1f s); lanes in %s",
            model_dir, identity.short, len(identity.description["files"]), self._memo.hashed_files,
            time.perf_counter() - started, folder,
        )
        return identity

    def bind(self, model: Any, identity: ModelIdentity) -> None:
        """Use `identity` for `model` (a caller that knows it already: the restore benchmark)."""
        known: Future = Future()
        known.set_result(identity)
        self._identities.set(model, known)
        self.learn_what_is_on_disk(self.files.folder(identity))

    def identity_for(self, model: Any, wait: float | None = 0) -> ModelIdentity | None:
        future = self._identity_future(model)
        if future is None:
            return None
        with contextlib.suppress(TimeoutError):
            return future.result(timeout=wait)
        return None

    def _identity_future(self, model: Any) -> Future | None:
        return self._identities.get(model)

    def _identity_futures(self) -> list[Future]:
        return list(self._identities.values())

    def _known_identities(self) -> list[ModelIdentity]:
        return [future.result() for future in self._identity_futures() if future.done() and future.result()]

    # --- lookups and loads (generation thread) ----------------------------------

    def longest_restorable_prefix(self, model: Any, prompt, positional: bool) -> DiskMatch | None:
        """The lane restoring the most of `prompt` (all but its last token, as in RAM), from the index alone.

        `positional`: the model has layers that restore only at a checkpoint or
        a lane's end; a lane sharing tokens with the prompt but no such point
        inside them is no match.
        """
        identity = self.identity_for(model)
        if identity is None:
            return None
        match: Match = best_match(self._refreshed_index(identity).items(), prompt, positional)
        return None if match.key is None else DiskMatch(identity, match.key, match.length)

    def load(self, match: DiskMatch, held_blocks: Callable[[list[str]], dict[str, Block]] = lambda keys: {},
             held_checkpoints: dict[str, Checkpoint] | None = None) -> LoadedSnapshot | None:
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
            self._forget(path)
            return None
        read = LaneLoad(self.files, folder, record, record.file_bytes, self)
        length = read.blocks_up_to(match.length, held_blocks)
        entry = read.entry(length, held_checkpoints or {})
        if entry is None:
            return None
        seconds = time.perf_counter() - started
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU clock, shared with every server on this directory
        with self._lock:
            self.counters.loads += 1
            self.counters.bytes_loaded += read.bytes_loaded
            self.counters.blocks_loaded += read.blocks_loaded
            self.counters.load_seconds += seconds
            blocks, states = self._on_disk.setdefault(folder, (set(), set()))
            blocks.update(ref.block.key for ref in entry.blocks)
            states.update(c.key for c in entry.checkpoints)
        logger.info("disk cache: loaded %d tokens, %d checkpoints (%d blocks read, %.1f MiB) in %.3f s",
                    len(entry.tokens), len(entry.checkpoints), read.blocks_loaded, read.bytes_loaded / 2**20, seconds)
        return LoadedSnapshot(entry, read.bytes_loaded, seconds)

    def record_hit(self, tokens_reused: int) -> None:
        with self._lock:
            self.counters.hits += 1
            self.counters.tokens_loaded += tokens_reused

    # --- writes -------------------------------------------------------------------

    def submit(self, model: Any, entry: CachedPrefix) -> None:
        """Queue a RAM entry for writing; returns at once (its arrays are evaluated).

        Only the blocks and states this tier does not know to be on disk travel
        with it (zero-copy views); the writer finds out what the directory holds.
        """
        future = self._identity_future(model)
        if future is None or (future.done() and future.result() is None):
            return
        record, own_end_state = record_of(entry)
        identity = future.result() if future.done() else None
        with self._lock:
            known_blocks, known_states = (set(), set()) if identity is None else map(set, self._on_disk.get(self.files.folder(identity), ((), ())))
        blocks = {ref.block.key: _host_arrays(*block_arrays(ref.block)) for ref in entry.blocks if ref.block.key not in known_blocks}
        states = {c.key: _host_arrays(*state_arrays(c.layers, c.key, c.position)) for c in entry.checkpoints if c.key not in known_states}
        if own_end_state:
            states[record.end_state] = _host_arrays(*state_arrays(entry.layers, record.end_state, len(entry.tokens)))
        pending = PendingWrite(future, record, blocks, states)
        with self._lock:
            kept = collections.deque()
            for queued in self._queue:
                if queued.identity is future and repeats_prompt_of(queued, pending.tokens):
                    self.counters.writes_superseded += 1
                else:
                    kept.append(queued)
            self._queue = kept
            while len(self._queue) >= self.queue_limit:
                self._queue.popleft()
                self.counters.writes_dropped += 1
            self._queue.append(pending)
            self._lock.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done; False if `timeout` ran out first."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._queue and not self._writing, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish queued writes (up to `timeout`) and stop the writer."""
        self.flush(timeout)
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._writer.join(timeout=1)

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._queue or self._closing)
                if self._closing:
                    return
                pending = self._queue.popleft()
                self._writing = True
                epoch = self._epoch
            try:
                self._write(pending, epoch)
            except Exception as error:
                self.count_error("writing a lane; it is kept in RAM only", error)
            finally:
                with self._lock:
                    self._writing = False
                    self._lock.notify_all()

    def _write(self, pending: PendingWrite, epoch: int) -> None:
        identity = pending.identity.result()
        if identity is None or self._held_on_disk(identity, pending.record):
            return
        started = time.perf_counter()
        blocks = {key: prepare_snapshot("block", identity.key, *data) for key, data in pending.blocks.items()}
        states = {key: prepare_snapshot("state", identity.key, *data) for key, data in pending.states.items()}
        folder = self.files.folder(identity)
        with self.files.lock():
            if self._held_on_disk(identity, pending.record):  # another server wrote it while this one prepared
                return
            plan = WritePlan(self.files, folder, pending.record, blocks, states, self._refreshed_index(identity).values())
            self.learn_what_is_on_disk(folder, plan.present_block_files, plan.present_state_files)
            if plan.record is None:
                self.count(writes_skipped=1)
                return
            record = replace(plan.record, name=uuid.uuid4().hex, written_at=time.time())
            manifest = prepare_snapshot("lane", identity.key, {}, lane_metadata(record))
            if not self._make_room(plan, manifest.file_bytes):
                return
            if not (self._write_files(folder, BLOCK, plan.new_blocks, epoch) and self._write_files(folder, STATE, plan.new_states, epoch)):
                return
            final = self.files.place(folder, LANE, record.name)
            if not self._write_one(final, manifest, epoch):
                return
            self.files.sync(final.parent)
            record = replace(record, file_bytes=manifest.file_bytes)
            with self._lock:
                self._records[final] = self._indexed[final] = record
                blocks_known, states_known = self._on_disk.setdefault(folder, (set(), set()))
                blocks_known.update(piece.key for piece in record.blocks)
                states_known.update(state_keys(record))
                self.counters.writes += 1
                self.counters.bytes_written += manifest.file_bytes
                self.counters.blocks_reused += len(plan.present_blocks)
                self.counters.writes_truncated += int(plan.truncated)
                self.counters.write_seconds += time.perf_counter() - started
            self._delete_replaced(identity, final, record)

    def _held_on_disk(self, identity: ModelIdentity, record: LaneRecord) -> bool:
        """Whether a lane on disk restores everything `record` would (counted as a skipped write)."""
        index = self._refreshed_index(identity).items()
        if placement(index, record.tokens, record.checkpoint_positions, bool(record.positional)).held_by is None:
            return False
        self.count(writes_skipped=1)
        return True

    def _make_room(self, plan: WritePlan, manifest_bytes: int) -> bool:
        """Evict lanes until the write fits the budget (call under the directory lock); False: it never will."""
        limit, limited_by = self.files.budget_limit()
        if plan.footprint + manifest_bytes > limit:
            self._warn_once("too-large", "disk cache: a %.1f MiB lane does not fit the disk budget (%.1f MiB now, set by %s); not written",
                            (plan.footprint + manifest_bytes) / 2**20, limit / 2**20, limited_by)
            self.count(writes_skipped=1)
            return False
        fits, deleted = self.files.evict_until(limit - plan.new_bytes - manifest_bytes, self._lane_units(), plan.protected)
        self._evicted(deleted)
        if not fits:
            self._warn_once("no-room", "disk cache: evicting every other lane leaves no room for a %.1f MiB write; not written",
                            (plan.new_bytes + manifest_bytes) / 2**20)
            self.count(writes_skipped=1)
        return fits

    def _write_files(self, folder: Path, kind: str, prepared: dict[str, PreparedSnapshot], epoch: int) -> bool:
        """Write new blocks or states (each under its key's name), then make their renames durable."""
        if not prepared:
            return True
        for key, file in prepared.items():
            if not self._write_one(self.files.place(folder, kind, key), file, epoch):
                return False
            self.count(**{f"{kind}s_written": 1, f"{kind}_bytes_written": file.file_bytes}, bytes_written=file.file_bytes)
        self.files.sync(folder / FOLDERS[kind])
        return True

    def _write_one(self, final: Path, prepared: PreparedSnapshot, epoch: int) -> bool:
        """Temporary file, fsync, rename; False (nothing left behind) if the cache was cleared meanwhile."""
        final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.files.temporary_for(final)
        try:
            self.write_file(temporary, prepared)
            with self._lock:
                if self._epoch != epoch:
                    temporary.unlink()  # the cache was cleared while this was written
                    return False
                self.files.commit(temporary, final)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        return True

    def _delete_replaced(self, identity: ModelIdentity, new_manifest: Path, record: LaneRecord) -> None:
        """Drop the lanes whose whole prompt the new one repeats (as RAM does), and the blocks and states
        no lane refers to any more (call under the directory lock)."""
        folder = self.files.folder(identity)
        index = self._refreshed_index(identity)
        for name, lane in index.items():
            path = self.files.place(folder, LANE, name)
            if path != new_manifest and repeats_prompt_of(lane, record.tokens):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                self._forget(path)
        referenced = {path for unit in self._lane_units([folder]) for path in unit.refers_to}
        for path in self.files.unreferenced(folder, referenced):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._forget(path)

    def _evicted(self, paths: list[Path]) -> None:
        with self._lock:
            self.counters.evictions += sum(path.parent.name == FOLDERS[LANE] for path in paths)
            for path in paths:
                for known in (self._records, self._indexed, self._lookup, self._token_ids):
                    known.pop(path, None)
                known = self._on_disk.get(path.parent.parent)
                if known is not None:
                    (known[0] if path.parent.name == FOLDERS[BLOCK] else known[1]).discard(path.name.rsplit(".", 1)[0])

    # --- the index ----------------------------------------------------------------

    def lanes(self, model: Any) -> list[LaneRecord]:
        """This model's lanes on disk now, with their token ids (nothing if the model has no identity yet)."""
        identity = self.identity_for(model)
        return [] if identity is None else list(self._refreshed_index(identity).values())

    def _refreshed_index(self, identity: ModelIdentity) -> dict[str, LaneRecord]:
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
                    self.block_gone(path)
                    break
                except (SnapshotFileError, OSError) as error:
                    self.count_error(f"reading the header of {path}; deleted it, its lanes restore the prefix before it", error)
                    self.delete_bad_file(path)
                    break
                with self._lock:
                    self._token_ids[path] = token_ids
            found[key] = token_ids
        return found

    def block_gone(self, path: Path) -> None:
        """A block a lane names is not on disk (another server evicted it): logged and counted once."""
        with self._lock:
            if path in self._gone:
                return
            self._gone.add(path)
            self.counters.blocks_missing += 1
        logger.info("disk cache: %s is gone (another server evicted it); its lanes restore the prefix before it", path.name)

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
                self.count_error(f"reading the header of {path}; deleted it", error)
                self.delete_bad_file(path)
                return None
        with self._lock:
            self._records[path] = record
        return record

    def _lane_units(self, folders: list[Path] | None = None) -> list[LaneUnit]:
        """Every lane of every model in the directory (or in `folders`), as eviction sees it."""
        own = {self.files.folder(identity): identity.key for identity in self._known_identities()}
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

    def learn_what_is_on_disk(self, folder: Path, blocks=None, states=None) -> None:
        """The block and state keys in `folder` now (listed, unless given)."""
        blocks = set(self.files.sizes(folder, BLOCK) if blocks is None else blocks)
        states = set(self.files.sizes(folder, STATE) if states is None else states)
        with self._lock:
            self._on_disk[folder] = (blocks, states)

    def _forget(self, path: Path) -> None:
        with self._lock:
            for known in (self._records, self._indexed, self._lookup, self._token_ids):
                known.pop(path, None)

    def delete_bad_file(self, path: Path) -> None:
        self._forget(path)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            self._warn_once(f"undeletable:{error.errno}", "disk cache: cannot delete %s (%s); it will be skipped", path, error)

    def _remove_stale_temporary_files(self, folder: Path) -> None:
        for path in self.files.stale_temporary_files(folder):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as error:
                self.count_error(f"removing the unfinished write {path}", error)
                continue
            logger.warning("disk cache: removed %s, left by a write that did not finish", path)
            self.count(temp_files_removed=1)

    def _remove_legacy_files(self) -> None:
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
                           "this build keeps each KV block once", removed, freed / 2**20, self.directory)
            self.count(legacy_files_removed=removed)

    # --- errors, clearing and stats -----------------------------------------------

    def count_error(self, what: str, error: BaseException) -> None:
        with self._lock:
            self.counters.errors += 1
            self.counters.last_error = f"{what}: {error!r}"
        kind = f"{what.split(' ')[0]}:{type(error).__name__}:{getattr(error, 'errno', '')}"
        self._warn_once(kind, "disk cache: %s: %r", what, error)

    def count(self, **increments: int) -> None:
        with self._lock:
            for name, increment in increments.items():
                setattr(self.counters, name, getattr(self.counters, name) + increment)

    def _warn_once(self, kind: str, message: str, *args: Any) -> None:
        """The first of each kind is a warning; repeats go to debug (they are counted)."""
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        logger.log(level, message, *args)

    def clear(self) -> int:
        """Delete this server's models' lanes, blocks and states (other models' in the directory stay).

        Under the directory lock writers take (this server's and every other's on the directory): a
        write in flight finishes first, so no lane is left naming a block deleted between its write and
        its manifest's. It waits for that write: call it off the event loop.
        """
        identities = self._known_identities()
        with self._lock:
            self._epoch += 1
            self._queue.clear()
        try:
            with self.files.lock():
                return self._delete_lanes_of(identities)  # counts each file it cannot delete itself
        except OSError as error:  # the lock file cannot be opened: a read-only or vanished directory
            self.count_error("locking the directory to clear it", error)
            return 0

    def _delete_lanes_of(self, identities: list[ModelIdentity]) -> int:
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
                        self.count_error(f"deleting {path}", error)
                    self._forget(path)
        return deleted

    def stats(self) -> dict[str, Any]:
        files = self.files.files()
        with self._lock:
            counters = dict(vars(self.counters))
            pending = len(self._queue) + int(self._writing)
        identities = [future.result() if future.done() else None for future in self._identity_futures()]
        lanes = [record for identity in identities if identity for record in self._refreshed_index(identity).values()]
        blocks = {piece.key: piece.end - piece.start for record in lanes for piece in record.blocks}
        return {
            "disk_enabled": True,
            "disk_dir": str(self.directory),
            "disk_budget_bytes": self.budget_bytes,
            **self._effective_budget(),
            "disk_bytes": sum(status.st_size for _, status in files),  # every model's: what the budget bounds
            "disk_entries": sum(path.suffix == ".kv" and not path.name.startswith(".") for path, _ in files),
            "disk_model_entries": len(lanes),
            "disk_blocks": len(blocks),
            "disk_block_tokens": sum(blocks.values()),
            "disk_model_identity": [identity.short if identity else None for identity in identities],
            "disk_writes_pending": pending,
            **{f"disk_{name}": value for name, value in counters.items()},
        }

    def _effective_budget(self) -> dict[str, Any]:
        """What a write may use now: the configured budget unless the free-space margin leaves less."""
        try:
            effective, reason = self.files.budget_limit()
        except OSError as error:
            return {"disk_effective_budget_bytes": 0, "disk_budget_limited_by": f"the directory cannot be read ({error})"}
        return {"disk_effective_budget_bytes": effective, "disk_budget_limited_by": reason}


def _host_arrays(arrays: dict[str, Any], metadata: dict[str, str]) -> tuple[dict[str, HostArray], dict[str, str]]:
    """Zero-copy host views of a file's arrays, for the writer thread (call on the generation thread)."""
    return {name: host_view(array) for name, array in arrays.items()}, metadata
