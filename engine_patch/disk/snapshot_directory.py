"""The disk tier's directory: its layout, the cross-process lock, the byte budget and eviction by lane.

    DIR/                          0700, default ~/.cache/stable-prefix/kv
      .lock                       flock: one writer at a time across processes
      file-digests.json           remembered model-file digests (model_identity.py)
      <identity>/                 one folder per model identity (first 32 hex digits)
        lanes/<uuid>.kv           a lane's manifest (snapshot_file.py), 0600, never rewritten
        blocks/<key>.kvblock      a KV block, named by its key, written once
        states/<key>.kvstate      a positional state (a checkpoint, an end state), written once
        */.tmp-<host>-<pid>-<uuid>-...  a write in flight, by the process and host that writes it

Several servers, on several hosts, may share DIR: files are written under
temporary names of their host and process and renamed into place (a block's name is its key, so two servers
writing the same block write the same file), and the budget covers every
model's files, so each write checks it under the lock, held from the budget
check to the last rename. Eviction is by lane (a manifest): files no manifest
refers to first (what a crash between a block and its manifest left), then
one-shot lanes and files of older formats, then the least recently used lanes
(by mtime, which a load touches); a block or state goes with the last
manifest that refers to it.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .model_identity import ModelIdentity

# The kinds of files (snapshot_file.py), each in a folder of its own.
LANE, BLOCK, STATE = "lane", "block", "state"
FOLDERS = {LANE: "lanes", BLOCK: "blocks", STATE: "states"}
SUFFIXES = {LANE: ".kv", BLOCK: ".kvblock", STATE: ".kvstate"}
TEMP_PREFIX = ".tmp-"
# Never fill the user's disk: keep this much free whatever the budget says.
FREE_SPACE_MARGIN_BYTES = 2**30
FREE_SPACE_MARGIN_SHARE = 0.05
# A temporary file this old is a crashed write, whoever's pid it names. A pid is only proof of a crash on its
# own host: another host's write (replicas on one network share) is judged by its age alone.
STALE_TEMP_SECONDS = 24 * 3600


def host_label(hostname: str) -> str:
    """A host's name as it goes into a temporary file's name: no `-` (the name's separator), no path characters."""
    return re.sub(r"[^A-Za-z0-9.]", "_", hostname)[:64] or "_"


# This host, as its temporary files name it. A Mac may change its name with its network: its own files of
# before then read as another host's and go when a day old.
HOST = host_label(socket.gethostname())


def free_and_total_bytes(path: Path) -> tuple[int, int]:
    usage = shutil.disk_usage(path)
    return usage.free, usage.total


def is_ours(name: str) -> bool:
    """A finished file of this layout (not a temporary one)."""
    return not name.startswith(".") and any(name.endswith(suffix) for suffix in SUFFIXES.values())


@dataclass
class LaneUnit:
    """One lane as eviction sees it: its manifest and the files it refers to."""

    manifest: Path
    refers_to: set[Path] = field(default_factory=set)
    mtime_ns: int = 0
    one_shot: bool = True


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

    @staticmethod
    def place(folder: Path, kind: str, name: str) -> Path:
        """Where a file of `kind` (LANE, BLOCK, STATE) named `name` (a uuid or a key) lives in a model's folder."""
        return folder / FOLDERS[kind] / f"{name}{SUFFIXES[kind]}"

    @staticmethod
    def sizes(folder: Path, kind: str) -> dict[str, int]:
        """The finished files of `kind` in one model's folder, by name (without suffix), and their sizes."""
        sizes = {}
        for entry in _listing(folder / FOLDERS[kind]):
            if not entry.name.startswith(".") and entry.name.endswith(SUFFIXES[kind]):
                with contextlib.suppress(OSError):  # gone since the listing
                    sizes[entry.name[: -len(SUFFIXES[kind])]] = entry.stat().st_size
        return sizes

    def model_folders(self) -> list[Path]:
        return [Path(entry.path) for entry in _listing(self.path) if entry.is_dir(follow_symlinks=False)]

    def files(self) -> list[tuple[Path, os.stat_result]]:
        """Every file of ours of every model (finished, temporary, older formats): what the budget bounds."""
        found = []
        for folder in self.model_folders():
            for entry in _listing(folder):
                if entry.is_dir(follow_symlinks=False) and entry.name in FOLDERS.values():
                    found += _stats(_listing(Path(entry.path)))
                elif entry.name.endswith(".kv"):  # a file of format 1 or 2: a whole lane
                    found += _stats([entry])
        return found

    def legacy_files(self) -> list[Path]:
        """Files of the formats that kept a whole lane per file, directly in a model's folder."""
        return [Path(entry.path) for folder in self.model_folders() for entry in _listing(folder)
                if entry.name.endswith(".kv") and not entry.name.startswith(".") and entry.is_file(follow_symlinks=False)]

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

    def evict_until(self, allowed_bytes: int, lanes: list[LaneUnit], protected: set[Path]) -> tuple[bool, list[Path]]:
        """Delete lanes (and what only they refer to) until at most `allowed_bytes` remain; call under `lock`.

        `lanes` are every model's manifests; `protected` the files the write in
        progress refers to, never deleted. Returns whether that was reached, and
        the manifests and other files deleted.
        """
        sizes = {path: status.st_size for path, status in self.files()}
        held = sum(sizes.values())
        if held <= allowed_bytes:
            return True, []
        references = collections.Counter(path for lane in lanes for path in lane.refers_to)
        references.update(protected)
        orphans = [path for path in sizes if path.parent.name in (FOLDERS[BLOCK], FOLDERS[STATE]) and is_ours(path.name)
                   and path not in references]
        known = {lane.manifest for lane in lanes}
        legacy = [LaneUnit(path) for path in sizes if path.parent.name not in FOLDERS.values() and is_ours(path.name)]
        strays = [LaneUnit(path) for path in sizes if path.parent.name == FOLDERS[LANE] and is_ours(path.name) and path not in known]
        ordered = [LaneUnit(path) for path in orphans] + strays + sorted(
            [*legacy, *(lane for lane in lanes if lane.manifest in sizes)], key=lambda lane: (not lane.one_shot, lane.mtime_ns))
        deleted = []
        for lane in ordered:
            if held <= allowed_bytes:
                break
            freed = [lane.manifest]
            for path in lane.refers_to:
                references[path] -= 1
                if references[path] == 0 and path in sizes:
                    freed.append(path)
            for path in freed:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                held -= sizes.pop(path, 0)
                deleted.append(path)
        return held <= allowed_bytes, deleted

    def unreferenced(self, folder: Path, referenced: set[Path]) -> list[Path]:
        """The finished blocks and states of one model's folder that are not in `referenced`."""
        return [self.place(folder, kind, name) for kind in (BLOCK, STATE) for name in self.sizes(folder, kind)
                if self.place(folder, kind, name) not in referenced]

    @staticmethod
    def temporary_for(final: Path) -> Path:
        """A temporary path for a write of this process on this host, renamed to `final` once whole."""
        return final.parent / f"{TEMP_PREFIX}{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}-{final.name}"

    @staticmethod
    def commit(temporary: Path, final: Path) -> None:
        """Rename a finished write into place (its folder is synced by `sync`)."""
        os.rename(temporary, final)

    @staticmethod
    def sync(folder: Path) -> None:
        """Make the renames into `folder` durable: a manifest is committed only after its blocks' renames are."""
        with contextlib.suppress(OSError):
            descriptor = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)

    def stale_temporary_files(self, folder: Path, host: str = HOST) -> list[Path]:
        """Temporary files of writes that crashed: this host's whose process is gone, or any a day old.

        Another host's file (or one of the older `.tmp-<pid>-` form, whose host is unknown) is never
        judged by this host's processes: its pid may be free here while its writer runs there.
        Call before this process writes into `folder`: its own pid then names only leftovers.
        """
        stale = []
        for kind_folder in FOLDERS.values():
            for entry in _listing(folder / kind_folder):
                if entry.name.startswith(TEMP_PREFIX):
                    writer_host, _, rest = entry.name[len(TEMP_PREFIX) :].partition("-")
                    pid = rest.split("-", 1)[0]
                    with contextlib.suppress(OSError):
                        crashed_here = writer_host == host and not _another_process_runs(pid)
                        if crashed_here or time.time() - entry.stat().st_mtime > STALE_TEMP_SECONDS:
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


def _stats(entries: list[os.DirEntry]) -> list[tuple[Path, os.stat_result]]:
    found = []
    for entry in entries:
        with contextlib.suppress(OSError):
            status = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False):
                found.append((Path(entry.path), status))
    return found


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
