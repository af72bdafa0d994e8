"""KV snapshots on disk, under the RAM cache, so a restarted server starts warm.

Writes leave the request path: `submit` (generation thread) takes zero-copy
numpy views of the snapshot's evaluated arrays and queues them; a writer
thread, which never calls MLX, encodes, writes a temporary file, fsyncs and
renames it. The queue is bounded: if the disk is slower than the requests, the
oldest pending write is dropped (counted), and a pending write whose prompt a
newer one repeats is superseded. Each write holds the directory lock from the
budget check to the rename (`snapshot_directory.py`), so two servers on one
directory never exceed the budget together.

Each file holds a whole RAM entry: its end state and its checkpoints
(`persisted_entry.py`). Lookups read no KV bytes: the index holds each file's
token ids and checkpoint positions, read from its header the first time the
file is seen (a directory listing per lookup finds files other servers wrote or
evicted). The same rules as in RAM: the longest *restorable* prefix wins (for a
model with positional layers, a checkpoint or the entry's end inside the common
prefix: `prefix_cache.restorable_length`); a new snapshot deletes those whose
whole prompt it repeats; least recently used files are evicted first.

Anything wrong on disk (a truncated or corrupt file, a foreign header, a full
disk, a read-only directory, a file another server evicted mid-read) costs a
logged warning, a counted `disk_errors` and that request's disk hit, never the
request: a bad file is deleted, a failed write removes its temporary file.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stable_prefix.engine_patch.cache.cache_layers import positional_indices
from stable_prefix.engine_patch.cache.prefix_cache import CachedPrefix, common_prefix_length, restorable_length

from .model_identity import DigestMemo, ModelIdentity, identity_of, loaded_model_description
from .persisted_entry import checkpoint_positions, entry_from_arrays, entry_to_arrays
from .snapshot_directory import SnapshotDirectory, free_and_total_bytes, is_snapshot
from .snapshot_file import (
    HostArray,
    PreparedSnapshot,
    SnapshotFileError,
    host_view,
    load_arrays,
    prepare_snapshot,
    read_header,
    write_snapshot,
)

logger = logging.getLogger("engine_patch")

DEFAULT_DIRECTORY = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stable-prefix" / "kv"
DEFAULT_BUDGET_BYTES = 20 * 2**30
# Pending writes hold their snapshot's arrays alive: a small bound caps that memory.
QUEUE_LIMIT = 2


@dataclass
class IndexEntry:
    tokens: np.ndarray
    prompt_length: int
    checkpoint_positions: list[int]
    file_bytes: int

    def restorable_length(self, limit: int, positional: bool) -> int:
        return restorable_length(len(self.tokens), self.checkpoint_positions, limit, positional)


@dataclass(frozen=True)
class DiskMatch:
    identity: ModelIdentity
    name: str
    length: int  # prompt tokens the snapshot restores


@dataclass(frozen=True)
class LoadedSnapshot:
    entry: CachedPrefix
    file_bytes: int
    seconds: float


@dataclass
class PendingWrite:
    identity: Future
    tokens: np.ndarray
    prompt_length: int
    checkpoint_positions: list[int]
    positional: bool
    arrays: dict[str, HostArray]
    metadata: dict[str, str]


@dataclass
class DiskCounters:
    hits: int = 0  # requests whose reuse came from a snapshot loaded from disk
    tokens_loaded: int = 0
    loads: int = 0
    bytes_loaded: int = 0
    load_seconds: float = 0.0
    writes: int = 0
    bytes_written: int = 0
    write_seconds: float = 0.0
    writes_dropped: int = 0  # the queue was full: the disk is slower than the requests
    writes_superseded: int = 0  # a newer pending write repeats its whole prompt
    writes_skipped: int = 0  # already on disk, or larger than the budget
    evictions: int = 0
    errors: int = 0
    last_error: str | None = None
    temp_files_removed: int = 0


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
        # By id(model), holding the model: a freed model's address may be reused by
        # another, which must never inherit its identity.
        self._identities: dict[int, tuple[Any, Future]] = {}
        self._index: dict[str, dict[str, IndexEntry]] = {}
        self._queue: collections.deque[PendingWrite] = collections.deque()
        self._writing = False
        self._closing = False
        self._epoch = 0  # bumped by clear(): a write that started before it is discarded
        self._warned: set[str] = set()
        try:
            self.files.prepare()
        except OSError as error:
            self.count_error(f"preparing {self.directory}", error)
        self._memo = DigestMemo(self.directory / "file-digests.json")
        # Daemon threads: a shutdown never waits for a model to finish hashing.
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._writer.start()

    # --- model identity ---------------------------------------------------------

    def model_loaded(self, model: Any, model_dir: Path) -> None:
        """Identify `model` (loaded from `model_dir`) in the background; its snapshots are
        looked up and written once that is done."""
        loaded = loaded_model_description(model)
        identity: Future = Future()
        self._identities[id(model)] = (model, identity)
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
        self._remove_stale_temporary_files(self.files.folder(identity))
        logger.info(
            "disk cache: model %s is %s (%d files, %d hashed, %.1f s); snapshots in %s",
            model_dir, identity.short, len(identity.description["files"]), self._memo.hashed_files,
            time.perf_counter() - started, self.files.folder(identity),
        )
        return identity

    def bind(self, model: Any, identity: ModelIdentity) -> None:
        """Use `identity` for `model` (a caller that knows it already: the restore benchmark)."""
        known: Future = Future()
        known.set_result(identity)
        self._identities[id(model)] = (model, known)

    def identity_for(self, model: Any, wait: float | None = 0) -> ModelIdentity | None:
        future = self._identity_future(model)
        if future is None:
            return None
        with contextlib.suppress(TimeoutError):
            return future.result(timeout=wait)
        return None

    def _identity_future(self, model: Any) -> Future | None:
        return self._identities.get(id(model), (None, None))[1]

    def _identity_futures(self) -> list[Future]:
        return [future for _, future in list(self._identities.values())]

    def _known_identities(self) -> list[ModelIdentity]:
        return [future.result() for future in self._identity_futures() if future.done() and future.result()]

    # --- lookups and loads (generation thread) ----------------------------------

    def longest_restorable_prefix(self, model: Any, prompt: np.ndarray, positional: bool) -> DiskMatch | None:
        """The snapshot restoring the most of `prompt` (all but its last token, as in RAM), from the index alone.

        `positional`: the model has layers that restore only at a checkpoint or
        an entry's end; a file sharing tokens with the prompt but no such point
        inside them is no match.
        """
        identity = self.identity_for(model)
        if identity is None:
            return None
        best: DiskMatch | None = None
        for name, entry in self._refreshed_index(identity).items():
            common = common_prefix_length(entry.tokens, prompt)
            length = entry.restorable_length(min(common, len(prompt) - 1), positional)
            if length > 0 and (best is None or length > best.length):
                best = DiskMatch(identity, name, length)
        return best

    def load(self, match: DiskMatch) -> LoadedSnapshot | None:
        """The snapshot's layers, checked end to end; None (counted, logged) if anything is wrong."""
        path = self.files.folder(match.identity) / match.name
        started = time.perf_counter()
        try:
            header = read_header(path, match.identity.key)
            entry = entry_from_arrays(header.tokens, header.prompt_length, *load_arrays(path, header))
        except FileNotFoundError:
            logger.info("disk cache: %s vanished before it was read (another server evicted it)", path.name)
            self._forget(match.identity, match.name)
            return None
        except Exception as error:
            self.count_error(f"reading {path}; deleted it, this request runs without it", error)
            self._delete_bad_file(match.identity, path)
            return None
        seconds = time.perf_counter() - started
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU clock, shared with every server on this directory
        with self._lock:
            self.counters.loads += 1
            self.counters.bytes_loaded += header.file_bytes
            self.counters.load_seconds += seconds
        logger.info("disk cache: loaded %d tokens, %d checkpoints (%.1f MiB) in %.3f s",
                    len(header.tokens), len(entry.checkpoints), header.file_bytes / 2**20, seconds)
        return LoadedSnapshot(entry, header.file_bytes, seconds)

    def record_hit(self, tokens_reused: int) -> None:
        with self._lock:
            self.counters.hits += 1
            self.counters.tokens_loaded += tokens_reused

    # --- writes -------------------------------------------------------------------

    def submit(self, model: Any, entry: CachedPrefix) -> None:
        """Queue a RAM entry (end state and checkpoints) for writing; returns at once (its arrays are evaluated)."""
        future = self._identity_future(model)
        if future is None or (future.done() and future.result() is None):
            return
        arrays, metadata = entry_to_arrays(entry)
        pending = PendingWrite(future, np.asarray(entry.tokens, dtype=np.int64), entry.prompt_length,
                               [c.position for c in entry.checkpoints], bool(positional_indices(entry.layers)),
                               {name: host_view(array) for name, array in arrays.items()}, metadata)
        with self._lock:
            kept = collections.deque()
            for queued in self._queue:
                if queued.identity is future and common_prefix_length(queued.tokens, pending.tokens) >= queued.prompt_length:
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
                self.count_error("writing a snapshot; it is kept in RAM only", error)
            finally:
                with self._lock:
                    self._writing = False
                    self._lock.notify_all()

    def _write(self, pending: PendingWrite, epoch: int) -> None:
        identity = pending.identity.result()
        if identity is None:
            return
        if any(_restores_all_of(entry, pending) for entry in self._refreshed_index(identity).values()):
            with self._lock:
                self.counters.writes_skipped += 1  # the disk already holds this state
            return
        started = time.perf_counter()
        prepared = prepare_snapshot(identity.key, pending.tokens, pending.prompt_length, pending.arrays, pending.metadata)
        folder = self.files.folder(identity)
        with self.files.lock():
            limit, limited_by = self.files.budget_limit()
            fits = prepared.file_bytes <= limit
            if fits:
                fits, evicted = self.files.evict_until(limit - prepared.file_bytes)
                self._evicted(evicted)
            if not fits:
                self._warn_once("too-large", "disk cache: a %.1f MiB snapshot does not fit the disk budget (%.1f MiB now, set by %s); not written",
                                prepared.file_bytes / 2**20, limit / 2**20, limited_by)
                with self._lock:
                    self.counters.writes_skipped += 1
                return
            folder.mkdir(mode=0o700, exist_ok=True)
            temporary, final = self.files.new_names(folder)
            try:
                self.write_file(temporary, prepared)
                with self._lock:
                    if self._epoch != epoch:
                        temporary.unlink()  # the cache was cleared while this was written
                        return
                    self.files.commit(temporary, final)
                    self._index.setdefault(identity.key, {})[final.name] = IndexEntry(
                        pending.tokens, pending.prompt_length, pending.checkpoint_positions, prepared.file_bytes)
                    self.counters.writes += 1
                    self.counters.bytes_written += prepared.file_bytes
                    self.counters.write_seconds += time.perf_counter() - started
            except BaseException:
                with contextlib.suppress(OSError):
                    temporary.unlink()
                raise
        self._delete_dominated(identity, final.name, pending.tokens)

    def _delete_dominated(self, identity: ModelIdentity, new_name: str, tokens: np.ndarray) -> None:
        """Drop snapshots whose whole prompt the new one repeats (as the RAM cache does)."""
        with self._lock:
            entries = self._index.get(identity.key, {})
            dominated = [name for name, entry in entries.items()
                         if name != new_name and common_prefix_length(entry.tokens, tokens) >= entry.prompt_length]
            for name in dominated:
                entries.pop(name, None)
        for name in dominated:
            with contextlib.suppress(FileNotFoundError):
                (self.files.folder(identity) / name).unlink()

    def _evicted(self, paths: list[Path]) -> None:
        with self._lock:
            self.counters.evictions += len(paths)
            for path in paths:
                for key, entries in self._index.items():
                    if key[:32] == path.parent.name:
                        entries.pop(path.name, None)

    # --- the index ----------------------------------------------------------------

    def _refreshed_index(self, identity: ModelIdentity) -> dict[str, IndexEntry]:
        """This model's snapshots as the directory holds them now (headers read once per file)."""
        folder = self.files.folder(identity)
        present = self.files.snapshot_sizes(folder)
        with self._lock:
            known = dict(self._index.get(identity.key, {}))
        fresh = {name: entry for name, entry in known.items() if present.get(name) == entry.file_bytes}
        for name in present.keys() - fresh.keys():
            try:
                header = read_header(folder / name, identity.key)
                positions = checkpoint_positions(header.metadata, len(header.tokens))
            except FileNotFoundError:
                continue
            except (SnapshotFileError, OSError, ValueError) as error:
                self.count_error(f"reading the header of {folder / name}; deleted it", error)
                self._delete_bad_file(identity, folder / name)
                continue
            fresh[name] = IndexEntry(header.tokens, header.prompt_length, positions, header.file_bytes)
        with self._lock:
            self._index[identity.key] = fresh
        return fresh

    def _forget(self, identity: ModelIdentity, name: str) -> None:
        with self._lock:
            self._index.get(identity.key, {}).pop(name, None)

    def _delete_bad_file(self, identity: ModelIdentity, path: Path) -> None:
        self._forget(identity, path.name)
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
            with self._lock:
                self.counters.temp_files_removed += 1

    # --- errors, clearing and stats -----------------------------------------------

    def count_error(self, what: str, error: BaseException) -> None:
        with self._lock:
            self.counters.errors += 1
            self.counters.last_error = f"{what}: {error!r}"
        kind = f"{what.split(' ')[0]}:{type(error).__name__}:{getattr(error, 'errno', '')}"
        self._warn_once(kind, "disk cache: %s: %r", what, error)

    def _warn_once(self, kind: str, message: str, *args: Any) -> None:
        """The first of each kind is a warning; repeats go to debug (they are counted)."""
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        logger.log(level, message, *args)

    def clear(self) -> int:
        """Delete this server's models' snapshots (other models' in the directory stay)."""
        deleted = 0
        identities = self._known_identities()
        with self._lock:
            self._epoch += 1
            self._queue.clear()
            for identity in identities:
                self._index.pop(identity.key, None)
        for identity in identities:
            folder = self.files.folder(identity)
            for name in self.files.snapshot_sizes(folder):
                try:
                    (folder / name).unlink()
                    deleted += 1
                except FileNotFoundError:
                    pass
                except OSError as error:
                    self.count_error(f"deleting {folder / name}", error)
        return deleted

    def stats(self) -> dict[str, Any]:
        files = [(path, status) for path, status in self.files.files() if is_snapshot(path.name)]
        with self._lock:
            counters = dict(vars(self.counters))
            pending = len(self._queue) + int(self._writing)
        identities = [future.result() if future.done() else None for future in self._identity_futures()]
        own_folders = {identity.key[:32] for identity in identities if identity}
        return {
            "disk_enabled": True,
            "disk_dir": str(self.directory),
            "disk_budget_bytes": self.budget_bytes,
            **self._effective_budget(),
            "disk_bytes": sum(status.st_size for _, status in files),  # every model's: what the budget bounds
            "disk_entries": len(files),
            "disk_model_entries": sum(path.parent.name in own_folders for path, _ in files),
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


def _restores_all_of(entry: IndexEntry, pending: PendingWrite) -> bool:
    """Whether a file already restores every prefix the pending write would (its end and its checkpoints)."""
    if common_prefix_length(entry.tokens, pending.tokens) < len(pending.tokens):
        return False
    wanted = [*pending.checkpoint_positions, len(pending.tokens)]
    return all(entry.restorable_length(position, pending.positional) == position for position in wanted)
