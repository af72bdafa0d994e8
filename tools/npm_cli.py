"""Pinned CLIs from npm, each in a git-ignored folder of its own under `.claude-cli/`.

One `npm install --no-save` per folder (a second one into the same prefix
would prune the first), never into the user's global npm prefix. Shared by
claude-code-router, opencode and Qwen Code (`tools/claude_code.py` installs
Claude Code itself, whose binary it checks by running it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from stable_prefix.tools.claude_code import ClaudeCodeUnavailable

INSTALL_TIMEOUT_S = 900


def installed_version(prefix: Path, package: str) -> str | None:
    """The version of `package` installed under `prefix`, from its package.json."""
    try:
        return json.loads((prefix / "node_modules" / package / "package.json").read_text()).get("version")
    except (OSError, ValueError):
        return None


def install_package(prefix: Path, package: str, version: str) -> None:
    """`npm install package@version` into `prefix` unless that version is there; raises
    ClaudeCodeUnavailable with npm's own words when it cannot."""
    if installed_version(prefix, package) == version:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise ClaudeCodeUnavailable(f"npm not found on PATH, so {package} {version} cannot be installed into {prefix}. "
                                    "Install Node.js with npm (https://nodejs.org).")
    prefix.mkdir(parents=True, exist_ok=True)
    command = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save", "--loglevel=error", f"{package}@{version}"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if completed.returncode != 0:
        raise ClaudeCodeUnavailable(f"`{' '.join(command)}` failed with exit code {completed.returncode}:\n{completed.stderr[-3000:]}")
    if installed_version(prefix, package) != version:
        raise ClaudeCodeUnavailable(f"npm installed {package}@{version} into {prefix}, but its package.json says {installed_version(prefix, package)!r}")


def install_command(description: str, install: Callable[[Path], Path], default_dir: Path, package: str) -> None:
    """`python -m stable_prefix.tools.<agent> install [--cli-dir DIR]`: install, print the CLI and its version."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("command", choices=["install"])
    parser.add_argument("--cli-dir", type=Path, default=default_dir)
    args = parser.parse_args()
    try:
        cli = install(args.cli_dir)
    except ClaudeCodeUnavailable as error:
        sys.exit(f"error: {error}")
    print(f"{cli} ({installed_version(args.cli_dir, package)})")
