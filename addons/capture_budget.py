"""How much the capture folder may hold, and what goes when it holds more.

Every request is recorded (both bodies: a Claude Code turn is a few hundred
KB), so a day of work writes hundreds of MB. The budget has two limits, each
off at 0: bytes (everything the sessions under `capture_dir` hold) and age (a
session whose newest file is older goes). When a limit is passed, whole
sessions go, the least recently written first, never the one this proxy
writes; if that one alone is over the byte limit, its oldest records go. Each
removal frees down to `LOW_WATER` of the limit, so a full folder is not
rescanned on every request (a scan of a full default budget, ~7,000 records,
takes about a second on a slow disk: the addon runs it in a thread).

Only what the capture addon and `stable-prefix up` write is ever removed:
records (`NNNN-<lane>.json`), temporary files a crash left (`*.tmp`) and the
server logs `up` keeps in `logs/`. A session folder holding anything else
keeps that and the folder, and says so.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.addons.capture_folder import record_number

LOW_WATER = 0.9
DAY_S = 86400.0
LOGS_FOLDER = "logs"
# The capture addon's options that set the budget.
BYTES_OPTION = "capture_max_bytes"
AGE_OPTION = "capture_max_age_days"


@dataclass(frozen=True)
class Budget:
    max_bytes: int = 0  # 0: no limit
    max_age_days: int = 0  # 0: no limit

    @property
    def limited(self) -> bool:
        return bool(self.max_bytes or self.max_age_days)


@dataclass(frozen=True)
class StoredFile:
    path: Path
    size: int
    mtime: float


@dataclass
class StoredSession:
    folder: Path
    files: list[StoredFile]  # the ones we may remove

    @property
    def size(self) -> int:
        return sum(file.size for file in self.files)

    @property
    def last_write(self) -> float:
        return max((file.mtime for file in self.files), default=_mtime(self.folder))

    @property
    def records(self) -> list[StoredFile]:
        return sorted((file for file in self.files if record_number(file.path) is not None), key=lambda file: record_number(file.path))


def size_text(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _is_ours(relative: Path) -> bool:
    if len(relative.parts) == 1:
        return record_number(relative) is not None or relative.name.endswith(".tmp")
    return len(relative.parts) == 2 and relative.parts[0] == LOGS_FOLDER and relative.suffix == ".log"


def _stored_file(path: Path) -> StoredFile | None:
    try:
        stat = path.stat()
    except OSError:  # removed meanwhile (another proxy pruning the same folder)
        return None
    return StoredFile(path, stat.st_size, stat.st_mtime)


def stored_sessions(root: Path) -> list[StoredSession]:
    """The session folders directly under `root`, each with the files we may remove."""
    sessions = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not folder.is_dir() or folder.is_symlink():
            continue
        candidates = [*folder.iterdir(), *((folder / LOGS_FOLDER).iterdir() if (folder / LOGS_FOLDER).is_dir() else ())]
        files = [stored for path in candidates if path.is_file() and _is_ours(path.relative_to(folder)) and (stored := _stored_file(path))]
        sessions.append(StoredSession(folder, files))
    return sessions


def _remove_files(files: list[StoredFile]) -> int:
    freed = 0
    for file in files:
        with contextlib.suppress(FileNotFoundError):
            file.path.unlink()
            freed += file.size
    return freed


def _remove_session(session: StoredSession) -> tuple[int, bool]:
    """Remove what we wrote in the session and, when nothing else is left, the folder; (bytes freed, folder gone)."""
    freed = _remove_files(session.files)
    for folder in (session.folder / LOGS_FOLDER, session.folder):
        with contextlib.suppress(OSError):
            folder.rmdir()  # fails, keeping the folder, when it holds something we did not write
    return freed, not session.folder.exists()


def _describe(session: StoredSession) -> str:
    written = time.strftime("%Y-%m-%d %H:%M", time.localtime(session.last_write))
    return f"session {session.folder.name} ({len(session.records)} records, {size_text(session.size)}, last written {written})"


def enforce(root: Path, current: Path | None, budget: Budget, now: float | None = None) -> tuple[list[str], int]:
    """Remove what is over `budget` under `root`, never the session folder
    `current` as a whole. Returns a log line per removal and the bytes the
    sessions hold afterwards."""
    now = time.time() if now is None else now
    sessions = stored_sessions(root)
    others = sorted((session for session in sessions if session.folder != current), key=lambda session: session.last_write)
    total = sum(session.size for session in sessions)
    lines: list[str] = []

    def remove(session: StoredSession, why: str) -> None:
        nonlocal total
        description = _describe(session)
        freed, gone = _remove_session(session)
        total -= freed
        kept = "" if gone else "; the folder stays, it holds files the capture addon did not write"
        lines.append(f"capture: removed {description}: {why}{kept}")

    if budget.max_age_days:
        cutoff = now - budget.max_age_days * DAY_S
        for session in [session for session in others if session.last_write < cutoff]:
            others.remove(session)
            remove(session, f"older than {AGE_OPTION}={budget.max_age_days}")
    if budget.max_bytes and total > budget.max_bytes:
        target = int(budget.max_bytes * LOW_WATER)
        why = f"the capture folder held {size_text(total)}, over {BYTES_OPTION} ({size_text(budget.max_bytes)})"
        while others and total > target:
            remove(others.pop(0), why)
        own = next((session for session in sessions if session.folder == current), None)
        if own is not None and total > target:
            lines += _remove_own_oldest_records(own, total - target, budget)
            total = sum(session.size for session in stored_sessions(root))
    return lines, total


def _remove_own_oldest_records(session: StoredSession, excess: int, budget: Budget) -> list[str]:
    doomed, size = [], 0
    for record in session.records:
        if size >= excess:
            break
        doomed.append(record)
        size += record.size
    if not doomed:
        return []
    freed = _remove_files(doomed)
    first, last = record_number(doomed[0].path), record_number(doomed[-1].path)
    return [f"capture: removed the {len(doomed)} oldest records of this session (#{first}-#{last}, {size_text(freed)}): "
            f"it alone is over {BYTES_OPTION} ({size_text(budget.max_bytes)})"]
