"""The disk tier's directory: its layout, the cross-process lock, the byte budget.

    DIR/                      0700, default ~/.cache/stable-prefix/kv
      .lock                   flock: one writer at a time across processes
      file-digests.json       remembered model-file digests (model_identity.py)
      <identity>/             one folder per model identity (first 32 hex digits)
        <uuid>.kv             one snapshot (snapshot_file.py), 0600, never rewritten
        .tmp-<pid>-<uuid>.kv  a write in flight

Several servers may share DIR: files are written under per-process temporary
names and renamed into place, and the budget covers every model's files, so
each write checks it under the lock. Least recently used files (by mtime, which
a load touches) are evicted first, whichever model they belong to.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from .model_identity import ModelIdentity

SUFFIX = ".kv"
TEMP_PREFIX = ".tmp-"
# Never fill the user's disk: keep this much free whatever the budget says.
FREE_SPACE_MARGIN_BYTES = 2**30
FREE_SPACE_MARGIN_SHARE = 0.05
# A temporary file this old is a crashed write, whoever's pid it names.
STALE_TEMP_SECONDS = 24 * 3600


def free_and_total_bytes(path: Path) -> tuple[int, int]:
    usage = shutil.disk_usage(path)
    return usage.free, usage.total


def is_snapshot(name: str) -> bool:
    return name.endswith(SUFFIX) and not name.startswith(".")


class SnapshotDirectory:
    def __init__(self, path: Path, budget_bytes: int, free_space: Callable[[Path], tuple[int, int]] = free_and_total_bytes):
        self.path = Path(path).expanduser()
        self.budget_bytes = budget_bytes
        self.free_space = free_space

    def prepare(self) -> None:
        """Create DIR 0700 (tightened if it is looser and ours): KV states are the user's prompts in another form."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = self.path.stat()
        if status.st_mode & 0o077 and status.st_uid == os.getuid():
            self.path.chmod(0o700)

    def folder(self, identity: ModelIdentity) -> Path:
        return self.path / identity.key[:32]

    def snapshot_sizes(self, folder: Path) -> dict[str, int]:
        """The snapshots in one model's folder and their sizes; none if it cannot be listed."""
        sizes = {}
        for entry in _listing(folder):
            if is_snapshot(entry.name):
                with contextlib.suppress(OSError):  # gone since the listing
                    sizes[entry.name] = entry.stat().st_size
        return sizes

    def files(self) -> list[tuple[Path, os.stat_result]]:
        """Every snapshot and temporary file of every model (what can be listed)."""
        found = []
        for folder in _listing(self.path):
            if folder.is_dir(follow_symlinks=False):
                for entry in _listing(Path(folder.path)):
                    if entry.name.endswith(SUFFIX):
                        with contextlib.suppress(OSError):
                            found.append((Path(entry.path), entry.stat(follow_symlinks=False)))
        return found

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        descriptor = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # releases the lock

    def budget_limit(self) -> tuple[int, str]:
        """The effective budget (the configured one, capped so the filesystem keeps its margin free) and what sets it."""
        free, total = self.free_space(self.path)
        margin = max(FREE_SPACE_MARGIN_BYTES, int(total * FREE_SPACE_MARGIN_SHARE))
        held = sum(status.st_size for _, status in self.files())
        room = held + free - margin
        if room >= self.budget_bytes:
            return self.budget_bytes, "the configured budget"
        return max(0, room), (f"the free space: {_mib(free)} free on the filesystem, {_mib(margin)} kept free "
                              f"(max(1 GiB, 5% of {_mib(total)})), {_mib(held)} held by snapshots")

    def evict_until(self, allowed_bytes: int) -> tuple[bool, list[Path]]:
        """Delete least recently used snapshots (any model) until at most `allowed_bytes` remain
        (call under `lock`); whether that was reached, and what was deleted."""
        files = self.files()
        held = sum(status.st_size for _, status in files)
        deleted = []
        for path, status in sorted((f for f in files if is_snapshot(f[0].name)), key=lambda f: f[1].st_mtime_ns):
            if held <= allowed_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            held -= status.st_size
            deleted.append(path)
        return held <= allowed_bytes, deleted

    def new_names(self, folder: Path) -> tuple[Path, Path]:
        """A temporary path for a write of this process, and the final path it is renamed to."""
        name = f"{uuid.uuid4().hex}{SUFFIX}"
        return folder / f"{TEMP_PREFIX}{os.getpid()}-{name}", folder / name

    @staticmethod
    def commit(temporary: Path, final: Path) -> None:
        """Rename a finished write into place and make the rename durable."""
        os.rename(temporary, final)
        with contextlib.suppress(OSError):
            descriptor = os.open(final.parent, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)

    def stale_temporary_files(self, folder: Path) -> list[Path]:
        """Temporary files of writes that crashed: their process is gone, or they are a day old.

        Call before this process writes into `folder`: its own pid then names only leftovers.
        """
        stale = []
        for entry in _listing(folder):
            if entry.name.startswith(TEMP_PREFIX):
                pid = entry.name[len(TEMP_PREFIX) :].split("-", 1)[0]
                with contextlib.suppress(OSError):
                    if not _another_process_runs(pid) or time.time() - entry.stat().st_mtime > STALE_TEMP_SECONDS:
                        stale.append(Path(entry.path))
        return stale


def _mib(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB"


def _listing(folder: Path) -> list[os.DirEntry]:
    """The folder's entries; none if it is missing or unreadable (counted where it matters)."""
    try:
        return list(os.scandir(folder))
    except OSError:
        return []


def _another_process_runs(pid: str) -> bool:
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs, as another user
    return True
