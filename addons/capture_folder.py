"""The folders and files capture records go into, so that no record ever replaces another.

- A session folder named by default (the start time) is claimed: two proxies
  started in the same second get `20261201-093000` and `20261201-093000-2`.
- A session folder named on purpose (`capture_session`) may already hold
  records (the proxy restarted): numbering continues after the last one.
- A record is written to a temporary file first and linked to its name only
  if that name is free, so a reader never sees half a record and a second
  proxy writing into the same folder can never overwrite one: a taken number
  moves the record to the next free one.

Records hold the user's code and prompts: files are created 0600, the folders
made here 0700.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from pathlib import Path

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
# NNNN-<lane>.json; more digits once a session passes 9,999 records.
RECORD_NAME = re.compile(r"^([0-9]+)-.+\.json$")
RECORD_GLOB = "[0-9]*-*.json"


def make_private_dirs(path: Path) -> None:
    """Create `path` and any missing parents 0700; folders that exist keep their modes."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
        folder.chmod(PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask


def _private_temporary(path: Path, data: bytes) -> Path:
    """`data` in a 0600 file beside `path`, named for this process (two writers never share one)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(descriptor, "wb") as file:
            os.fchmod(file.fileno(), PRIVATE_FILE_MODE)  # an older temporary file keeps its mode otherwise
            file.write(data)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` (0600), replacing it whole: a reader never sees half of it."""
    _private_temporary(path, text.encode("utf-8")).replace(path)


def create_private(path: Path, data: bytes) -> None:
    """Write `data` to a new file `path` (0600), whole; FileExistsError if `path` exists."""
    temporary = _private_temporary(path, data)
    try:
        os.link(temporary, path)  # atomic, and refuses an existing name (rename would replace it)
    finally:
        temporary.unlink(missing_ok=True)


def record_file_name(seq: int, lane: str) -> str:
    return f"{seq:04d}-{lane.replace(':', '-').replace('/', '-')}.json"


def record_number(path: Path) -> int | None:
    match = RECORD_NAME.match(path.name)
    return int(match.group(1)) if match else None


def last_record_number(folder: Path) -> int:
    """The highest record number in `folder`; 0 when it holds none (or does not exist)."""
    numbers = [record_number(path) for path in folder.glob(RECORD_GLOB)] if folder.is_dir() else []
    return max((number for number in numbers if number is not None), default=0)


def claim_new_session(root: Path, name: str) -> Path:
    """A new session folder under `root`: `name`, or `name-2`, `name-3`... when
    another proxy took it first (mkdir is the claim: only one creator succeeds)."""
    make_private_dirs(root)
    for attempt in range(1, 1000):
        folder = root / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            continue
        folder.chmod(PRIVATE_DIR_MODE)
        return folder
    raise FileExistsError(f"{root}: {name} and 998 numbered variants all exist")


def write_record(folder: Path, seq: int, lane: str, encode: Callable[[int], bytes]) -> tuple[int, int]:
    """Write the record `encode(seq)` as `folder/NNNN-<lane>.json` under the
    first number from `seq` on that no record in `folder` uses; returns the
    number and the bytes written. Never replaces a file."""
    make_private_dirs(folder)
    while True:
        if any(folder.glob(f"{seq:04d}-*.json")):  # another proxy's record took the number
            seq = max(seq + 1, last_record_number(folder) + 1)
            continue
        path = folder / record_file_name(seq, lane)
        data = encode(seq)
        with contextlib.suppress(FileExistsError):
            create_private(path, data)
            return seq, len(data)
