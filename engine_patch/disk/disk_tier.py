"""KV blocks on disk, under the RAM cache, so a restarted server (or a replica taking over a lane) starts warm.

A lane is a small manifest naming its blocks and positional states, each a
file of its own written once (`persisted_entry.py`, `snapshot_directory.py`):
a turn writes only the blocks and states the directory does not hold yet (its
new tokens, its new checkpoints) and a manifest of a few KB. Several servers
on one directory share every block any of them wrote.

`DiskTier` is the tier's one door, over three parts: the index
(`disk_index.py`: the manifests, lookups that read no KV bytes, loads, the
budget), the writer (`disk_writer.py`: a bounded queue and a thread, off the
request path) and the faults both count (`disk_faults.py`); each model's
identity is found in the background (`loaded_models.py`).

Anything wrong on disk (a truncated or corrupt file, a foreign header, a full
disk, a read-only directory, a block another server evicted mid-read) costs a
logged warning, a counted `disk_errors` (or `disk_blocks_missing`) and that
request's disk hit, never the request: a lane whose block is damaged or gone
restores the prefix before it; a bad file is deleted, a failed write removes
its temporary file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stable_prefix.engine_patch.cache.kv_blocks import Block
from stable_prefix.engine_patch.cache.ram_tier import CachedPrefix, Checkpoint

from .disk_faults import DiskCounters, DiskFaults
from .disk_index import DiskIndex, DiskMatch, LoadedSnapshot
from .disk_writer import DiskWriter
from .loaded_models import LoadedModels
from .model_identity import ModelIdentity
from .persisted_entry import LaneRecord
from .snapshot_directory import SnapshotDirectory, free_and_total_bytes
from .snapshot_file import PreparedSnapshot, write_snapshot

DEFAULT_DIRECTORY = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stable-prefix" / "kv"
DEFAULT_BUDGET_BYTES = 20 * 2**30
# Pending writes hold their new blocks' arrays alive: a small bound caps that memory.
QUEUE_LIMIT = 2


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
        self.faults = DiskFaults(self.counters, threading.Condition())
        self.models = LoadedModels(self.files, self.faults, self._model_found)
        self.index = DiskIndex(self.files, self.faults, self.models.known)
        try:
            self.files.prepare()
            self.index.remove_legacy_files()
        except OSError as error:
            self.faults.count_error(f"preparing {self.directory}", error)
        self.writer = DiskWriter(self.files, self.index, self.faults, self.queue_limit, self.write_file)

    # --- the models -------------------------------------------------------------------

    def model_loaded(self, model: Any, model_dir: Path) -> None:
        """Identify `model` (loaded from `model_dir`) in the background; its lanes are
        looked up and written once that is done."""
        self.models.loaded(model, model_dir)

    def _model_found(self, folder: Path) -> None:
        self.index.remove_stale_temporary_files(folder)
        self.index.learn_what_is_on_disk(folder)

    def bind(self, model: Any, identity: ModelIdentity) -> None:
        """Use `identity` for `model` (a caller that knows it already: the restore benchmark)."""
        self.models.bind(model, identity)
        self.index.learn_what_is_on_disk(self.files.folder(identity))

    def identity_for(self, model: Any, wait: float | None = 0) -> ModelIdentity | None:
        return self.models.identity_for(model, wait)

    # --- lookups and loads (generation thread) ----------------------------------------

    def longest_restorable_prefix(self, model: Any, prompt, positional: bool) -> DiskMatch | None:
        """The lane restoring the most of `prompt`, from the index alone (`DiskIndex.longest_restorable_prefix`)."""
        identity = self.identity_for(model)
        return None if identity is None else self.index.longest_restorable_prefix(identity, prompt, positional)

    def load(self, match: DiskMatch, held_blocks: Callable[[list[str]], dict[str, Block]] = lambda keys: {},
             held_checkpoints: dict[str, Checkpoint] | None = None) -> LoadedSnapshot | None:
        """The lane's first `match.length` tokens as an entry, reading only what RAM does not hold (`DiskIndex.load`)."""
        return self.index.load(match, held_blocks, held_checkpoints or {})

    def record_hit(self, tokens_reused: int) -> None:
        self.faults.count(hits=1, tokens_loaded=tokens_reused)

    def lanes(self, model: Any) -> list[LaneRecord]:
        """This model's lanes on disk now, with their token ids (nothing if the model has no identity yet)."""
        identity = self.identity_for(model)
        return [] if identity is None else list(self.index.refreshed(identity).values())

    # --- writes -----------------------------------------------------------------------

    def submit(self, model: Any, entry: CachedPrefix) -> None:
        """Queue a RAM entry for writing; returns at once (`DiskWriter.submit`)."""
        identity = self.models.future(model)
        if identity is not None and not (identity.done() and identity.result() is None):
            self.writer.submit(identity, entry)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done; False if `timeout` ran out first."""
        return self.writer.flush(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish queued writes (up to `timeout`) and stop the writer."""
        self.writer.close(timeout)

    # --- faults, clearing and stats ---------------------------------------------------

    def count_error(self, what: str, error: BaseException) -> None:
        self.faults.count_error(what, error)

    def clear(self) -> int:
        """Delete this server's models' lanes, blocks and states (other models' in the directory stay).

        Under the directory lock writers take (this server's and every other's on the directory): a
        write in flight finishes first, so no lane is left naming a block deleted between its write and
        its manifest's. It waits for that write: call it off the event loop.
        """
        identities = self.models.known()
        self.writer.cancel()
        try:
            with self.files.lock():
                return self.index.delete_lanes_of(identities)  # counts each file it cannot delete itself
        except OSError as error:  # the lock file cannot be opened: a read-only or vanished directory
            self.faults.count_error("locking the directory to clear it", error)
            return 0

    def stats(self) -> dict[str, Any]:
        with self.faults.lock:
            counters = dict(vars(self.counters))
        identities = self.models.all()
        return {
            "disk_enabled": True,
            "disk_dir": str(self.directory),
            "disk_budget_bytes": self.budget_bytes,
            **self.index.stats(identities),
            "disk_model_identity": [identity.short if identity else None for identity in identities],
            "disk_writes_pending": self.writer.pending(),
            **{f"disk_{name}": value for name, value in counters.items()},
        }
