"""What the disk tier counts, and how a fault on disk is reported: once per kind in the log, every time in a counter.

Both halves of the tier report here: the index (a manifest or block header it
cannot read, a block another server evicted) and the writer (a full disk, a
read-only directory). Nothing here knows either of them, so each imports it
without closing a circle; the index hears of every bad file deleted
(`on_deleted`), so it never names a file that is gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("engine_patch")


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


class DiskFaults:
    """The tier's counters and its fault reports, under the one lock the tier's tables share."""

    def __init__(self, counters: DiskCounters, lock: threading.Condition):
        self.counters = counters
        self.lock = lock
        # Told of every bad file deleted (the index forgets what it read of it).
        self.on_deleted: list[Callable[[Path], None]] = []
        self._warned: set[str] = set()
        self._gone: set[Path] = set()

    def count(self, **increments: int) -> None:
        with self.lock:
            for name, increment in increments.items():
                setattr(self.counters, name, getattr(self.counters, name) + increment)

    def count_error(self, what: str, error: BaseException) -> None:
        with self.lock:
            self.counters.errors += 1
            self.counters.last_error = f"{what}: {error!r}"
        kind = f"{what.split(' ')[0]}:{type(error).__name__}:{getattr(error, 'errno', '')}"
        self.warn_once(kind, "disk cache: %s: %r", what, error)

    def warn_once(self, kind: str, message: str, *args: Any) -> None:
        """The first of each kind is a warning; repeats go to debug (they are counted)."""
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        logger.log(level, message, *args)

    def block_gone(self, path: Path) -> None:
        """A block a lane names is not on disk (another server evicted it): logged and counted once."""
        with self.lock:
            if path in self._gone:
                return
            self._gone.add(path)
            self.counters.blocks_missing += 1
        logger.info("disk cache: %s is gone (another server evicted it); its lanes restore the prefix before it", path.name)

    def delete_bad_file(self, path: Path) -> None:
        for forget in self.on_deleted:
            forget(path)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            self.warn_once(f"undeletable:{error.errno}", "disk cache: cannot delete %s (%s); it will be skipped", path, error)
