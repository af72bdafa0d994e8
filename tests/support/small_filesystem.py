"""A real, small filesystem for the disk-full tests: a tmpfs mounted for the test and unmounted after.

tmpfs refuses a write past its size and a new file past its inode count with ENOSPC, from the kernel,
like a full disk. Mounting needs root (CI runs as root); elsewhere the tests that need one are skipped
with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mount_point: Path, size: str, inodes: int | None = None) -> Iterator[Path]:
    mount_point.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700" + (f",nr_inodes={inodes}" if inodes else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}): the real disk-full tests need root")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill(folder: Path, leave_bytes: int = 0) -> Path:
    """Write a filler file until the filesystem has at most `leave_bytes` free (another program filling the disk)."""
    filler = folder / "filler.bin"
    with open(filler, "wb") as file:
        chunk = b"\0" * 2**20
        while True:
            free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
            if free <= leave_bytes:
                break
            try:
                file.write(chunk[: max(4096, min(len(chunk), free - leave_bytes))])
                file.flush()
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
    return filler


def use_up_inodes(folder: Path) -> list[Path]:
    """Create empty files until the filesystem has no inode left: the next new file fails with ENOSPC."""
    made = []
    while True:
        path = folder / f"inode-{len(made)}"
        try:
            path.touch()
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            return made
        made.append(path)
