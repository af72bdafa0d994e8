"""Pinned CLIs from npm, each in a git-ignored folder of its own under `.claude-cli/`.

One `npm install --no-save` per folder (a second one into the same prefix
would prune the first), never into the user's global npm prefix. Shared by
claude-code-router, opencode and Qwen Code (`tools/claude_code.py` installs
Claude Code itself, whose binary it checks by running it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
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
