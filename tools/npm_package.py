"""Agent CLIs pinned on npm: installed into a folder of the repository's own, never the user's global prefix.

One `npm install --no-save` per prefix (a second package installed into the
same prefix would prune the first). Each agent's installer (`claude_code.py`,
`claude_code_router.py`, `codex_cli.py`) says where its binary lies in the
installed tree and how it reports its version; this module runs npm, asks a
binary its version, and finds the binary to launch for a user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def npm_install(prefix: Path, package: str, version: str, unavailable: type[Exception]) -> None:
    """`npm install PACKAGE@VERSION` into `prefix`; `unavailable` is raised, naming the cause, when it cannot be."""
    npm = shutil.which("npm")
    if npm is None:
        raise unavailable(f"npm not found on PATH, so {package} {version} cannot be installed into {prefix}. "
                          "Install Node.js with npm (https://nodejs.org).")
    prefix.mkdir(parents=True, exist_ok=True)
    command = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save", "--loglevel=error",
               f"{package}@{version}"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        raise unavailable(f"`{' '.join(command)}` failed with exit code {completed.returncode}:\n{completed.stderr[-3000:]}")


def version_words(binary: Path) -> list[str]:
    """The words `binary --version` prints (none when it cannot run), run with no HOME of the user's."""
    try:
        completed = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60,
                                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"})
    except (OSError, subprocess.TimeoutExpired):
        return []
    return completed.stdout.split() if completed.returncode == 0 else []


def user_binary(explicit: str | None, name: str, pinned: Path | None, unavailable: type[Exception], how_to_install: str) -> Path:
    """The binary to launch for a user: `explicit`, else `name` on PATH, else the pinned install."""
    if explicit:
        path = Path(explicit).expanduser()
        if not os.access(path, os.X_OK):
            raise unavailable(f"{explicit}: not an executable file")
        return path
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    if pinned:
        return pinned
    raise unavailable(f"no {name} found: none on PATH and no pinned install. {how_to_install}")
