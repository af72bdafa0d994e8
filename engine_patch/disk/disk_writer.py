"""The disk tier's writes, off the request path: a bounded queue and the thread that works it off.

`submit` (generation thread) takes zero-copy numpy views of the blocks and
states the index does not know to be on disk and queues them; the writer
thread, which never calls MLX, writes each new block and state (temporary
file, fsync, rename to its key's name), syncs their folders, then writes the
manifest the same way: a manifest is never committed before its blocks. The
queue is bounded: if the disk is slower than the requests, the oldest pending
write is dropped (counted; its blocks are not on disk, so the next write of
that lane carries them), and a pending write whose prompt a newer one repeats
is superseded. Each write holds the directory lock from the budget check to its
last rename, so two servers on one directory never exceed the budget together,
and a block one relies on is never deleted under it.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stable_prefix.engine_patch.cache.prefix_index import repeats_prompt_of
from stable_prefix.engine_patch.cache.ram_tier import CachedPrefix

from .disk_faults import DiskFaults
from .disk_index import DiskIndex
from .lane_write_plan import WritePlan, written_part
from .persisted_entry import LaneRecord, block_arrays, lane_metadata, record_of, state_arrays, state_keys
from .snapshot_directory import BLOCK, FOLDERS, LANE, STATE, SnapshotDirectory
from .snapshot_file import HostArray, PreparedSnapshot, host_view, prepare_snapshot


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


class DiskWriter:
    def __init__(self, files: SnapshotDirectory, index: DiskIndex, faults: DiskFaults, queue_limit: int,
                 write_file: Callable[[Path, PreparedSnapshot], None]):
        self.files, self.index, self.faults = files, index, faults
        self.queue_limit, self.write_file = queue_limit, write_file
        self._lock = faults.lock
        self._queue: collections.deque[PendingWrite] = collections.deque()
        self._writing = False
        self._closing = False
        self._epoch = 0  # bumped by cancel(): a write that started before it is discarded
        # A daemon thread: a shutdown never waits for a write (`close` finishes them first, up to its timeout).
        self._thread = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        self._thread.start()

    def submit(self, identity: Future, entry: CachedPrefix) -> None:
        """Queue a RAM entry of the model `identity` resolves to; returns at once (its arrays are evaluated).

        Only the blocks and states this tier does not know to be on disk travel
        with it (zero-copy views); the writer finds out what the directory holds.
        """
        record, own_end_state = record_of(entry)
        # Only what the write will put on disk travels: a hybrid turn ends there at its prompt's checkpoint.
        written = written_part(record)
        wanted_blocks = {piece.key for piece in written.blocks}
        wanted_states = set(state_keys(written))
        known = identity.result() if identity.done() else None
        known_blocks, known_states = (set(), set()) if known is None else self.index.known_on_disk(self.files.folder(known))
        blocks = {ref.block.key: _host_arrays(*block_arrays(ref.block)) for ref in entry.blocks
                  if ref.block.key in wanted_blocks and ref.block.key not in known_blocks}
        states = {c.key: _host_arrays(*state_arrays(c.layers, c.key, c.position)) for c in entry.checkpoints
                  if c.key in wanted_states and c.key not in known_states}
        if own_end_state and record.end_state in wanted_states:
            states[record.end_state] = _host_arrays(*state_arrays(entry.layers, record.end_state, len(entry.tokens)))
        pending = PendingWrite(identity, record, blocks, states)
        with self._lock:
            kept = collections.deque()
            for queued in self._queue:
                if queued.identity is identity and repeats_prompt_of(queued, pending.tokens):
                    self.faults.counters.writes_superseded += 1
                else:
                    kept.append(queued)
            self._queue = kept
            while len(self._queue) >= self.queue_limit:
                self._queue.popleft()
                self.faults.counters.writes_dropped += 1
            self._queue.append(pending)
            self._lock.notify_all()

    def pending(self) -> int:
        with self._lock:
            return len(self._queue) + int(self._writing)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done; False if `timeout` ran out first."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._queue and not self._writing, timeout)

    def cancel(self) -> None:
        """Drop every queued write, and the one in flight before it commits anything more (a clear)."""
        with self._lock:
            self._epoch += 1
            self._queue.clear()

    def close(self, timeout: float) -> None:
        """Finish queued writes (up to `timeout`) and stop the thread."""
        self.flush(timeout)
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._thread.join(timeout=1)

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
                self.faults.count_error("writing a lane; it is kept in RAM only", error)
            finally:
                with self._lock:
                    self._writing = False
                    self._lock.notify_all()

    def _write(self, pending: PendingWrite, epoch: int) -> None:
        identity = pending.identity.result()
        if identity is None or self.index.held_on_disk(identity, pending.record):
            return
        started = time.perf_counter()
        blocks = {key: prepare_snapshot("block", identity.key, *data) for key, data in pending.blocks.items()}
        states = {key: prepare_snapshot("state", identity.key, *data) for key, data in pending.states.items()}
        folder = self.files.folder(identity)
        with self.files.lock():
            if self.index.held_on_disk(identity, pending.record):  # another server wrote it while this one prepared
                return
            plan = WritePlan(self.files, folder, pending.record, blocks, states, self.index.refreshed(identity).values())
            self.index.learn_what_is_on_disk(folder, plan.present_block_files, plan.present_state_files)
            if plan.record is None:
                self.faults.count(writes_skipped=1)
                return
            record = replace(plan.record, name=uuid.uuid4().hex, written_at=time.time())
            manifest = prepare_snapshot("lane", identity.key, {}, lane_metadata(record))
            if not self.index.make_room(plan, manifest.file_bytes):
                return
            if not (self._write_files(folder, BLOCK, plan.new_blocks, epoch) and self._write_files(folder, STATE, plan.new_states, epoch)):
                return
            final = self.files.place(folder, LANE, record.name)
            if not self._write_one(final, manifest, epoch):
                return
            self.files.sync(final.parent)
            record = replace(record, file_bytes=manifest.file_bytes)
            self.index.committed(folder, final, record)
            with self._lock:
                counters = self.faults.counters
                counters.writes += 1
                counters.bytes_written += manifest.file_bytes
                counters.blocks_reused += len(plan.present_blocks)
                counters.writes_truncated += int(plan.truncated)
                counters.write_seconds += time.perf_counter() - started
            self.index.delete_replaced(identity, final, record)

    def _write_files(self, folder: Path, kind: str, prepared: dict[str, PreparedSnapshot], epoch: int) -> bool:
        """Write new blocks or states (each under its key's name), then make their renames durable."""
        if not prepared:
            return True
        for key, file in prepared.items():
            if not self._write_one(self.files.place(folder, kind, key), file, epoch):
                return False
            self.faults.count(**{f"{kind}s_written": 1, f"{kind}_bytes_written": file.file_bytes}, bytes_written=file.file_bytes)
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


def _host_arrays(arrays: dict[str, Any], metadata: dict[str, str]) -> tuple[dict[str, HostArray], dict[str, str]]:
    """Zero-copy host views of a file's arrays, for the writer thread (call on the generation thread)."""
    return {name: host_view(array) for name, array in arrays.items()}, metadata
