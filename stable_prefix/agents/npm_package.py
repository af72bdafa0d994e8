"""Agent CLIs pinned on npm: installed into a folder of the repository's own, never the user's global prefix.

One `npm install --no-save` per prefix (a second package installed into the
same prefix would prune the first). Each agent's installer (`claude_code.py`,
`claude_code_router.py`, `codex_cli.py`, `opencode.py`, `qwen_code.py`, `pi.py`,
`claude_agent_sdk.py`) says
which package and version, where its binary lies in the installed tree and how
that binary reports its version; this module runs npm when the pinned version
is not there yet, asks a binary its version, finds the binary to launch for a
user, and gives each installer its `python -m stable_prefix.agents.<agent>
install` command.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from stable_prefix.servers import REPO_ROOT

INSTALL_TIMEOUT_S = 900
# Where the pinned agents are installed, each in a folder of its own (Codex in `.codex-cli/`, beside it): git-ignored.
INSTALL_ROOT = REPO_ROOT / ".claude-cli"
# How a native executable starts (ELF, Mach-O both ways, fat Mach-O, PE): an npm package whose postinstall did not
# run leaves a placeholder script where its binary goes.
NATIVE_MAGICS = (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe", b"MZ")


class AgentUnavailable(RuntimeError):
    """An agent's CLI cannot be installed or started here (no npm or node, no network for npm, no binary)."""


def is_native_executable(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return file.read(4).startswith(NATIVE_MAGICS)
    except OSError:
        return False


def installed_version(prefix: Path, package: str) -> str | None:
    """The version of `package` installed under `prefix`, from its package.json."""
    try:
        return json.loads((prefix / "node_modules" / package / "package.json").read_text()).get("version")
    except (OSError, ValueError):
        return None


def install_package(prefix: Path, package: str, version: str, unavailable: type[AgentUnavailable] = AgentUnavailable,
                    npm_options: tuple[str, ...] = ()) -> None:
    """`npm install PACKAGE@VERSION` into `prefix` unless that version is there; `unavailable`
    is raised, with npm's own words, when it cannot be; `npm_options` go to npm too. One process at a
    time per prefix (test workers in parallel): the others wait, then find it installed."""
    # Under the lock even when it looks installed: another process's npm may be halfway through (the
    # package.json written, the binary not yet).
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed_version(prefix, package) != version:
            _npm_install(prefix, package, version, unavailable, npm_options)


def _npm_install(prefix: Path, package: str, version: str, unavailable: type[AgentUnavailable], npm_options: tuple[str, ...]) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise unavailable(f"npm not found on PATH, so {package} {version} cannot be installed into {prefix}. "
                          "Install Node.js with npm (https://nodejs.org).")
    command = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save", "--loglevel=error", *npm_options, f"{package}@{version}"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if completed.returncode != 0:
        raise unavailable(f"`{' '.join(command)}` failed with exit code {completed.returncode}:\n{completed.stderr[-3000:]}")
    if installed_version(prefix, package) != version:
        raise unavailable(f"npm installed {package}@{version} into {prefix}, but its package.json says {installed_version(prefix, package)!r}")


def install_binary(prefix: Path, package: str, version: str, find: Callable[[Path], Path | None], what: str,
                   unavailable: type[AgentUnavailable] = AgentUnavailable,
                   reported_version: Callable[[Path], str | None] | None = None, npm_options: tuple[str, ...] = ()) -> Path:
    """`install_package`, then the binary `find(prefix)` names in the installed tree (`what` it is,
    for the error when it is not there); with `reported_version`, the binary must say it is `version`."""
    install_package(prefix, package, version, unavailable, npm_options)
    binary = find(prefix)
    if binary is None:
        raise unavailable(f"npm installed {package}@{version} into {prefix}, but {what} is not in it")
    if reported_version is not None and (found := reported_version(binary)) != version:
        raise unavailable(f"{binary} reports version {found!r}, expected {version}")
    return binary


def bin_link(prefix: Path, name: str) -> Path | None:
    """npm's `node_modules/.bin/NAME` link under `prefix` (to a node script), or None."""
    link = prefix / "node_modules" / ".bin" / name
    return link if link.exists() and os.access(link, os.X_OK) else None


def version_words(binary: Path) -> list[str]:
    """The words `binary --version` prints (none when it cannot run), run with no HOME of the user's."""
    try:
        completed = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60,
                                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"})
    except (OSError, subprocess.TimeoutExpired):
        return []
    return completed.stdout.split() if completed.returncode == 0 else []


def how_to_install(package: str, version: str, default_dir: Path, module: str) -> str:
    """What a user without the agent can do: a global npm install, or the pinned one of `stable_prefix/agents/<module>.py`."""
    return (f"Install it with `npm install -g {package}`, or the pinned {version} into {default_dir} "
            f"with `python -m stable_prefix.agents.{module} install`.")


def user_binary(explicit: str | None, name: str, pinned: Path | None, how_to_install: str,
                unavailable: type[AgentUnavailable] = AgentUnavailable) -> Path:
    """The binary to launch for a user: `explicit`, else `name` on PATH, else the `pinned` install;
    `how_to_install` says how to get one when there is none."""
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


def install_command(description: str, install: Callable[[Path], Path], default_dir: Path, package: str) -> None:
    """`python -m stable_prefix.agents.<agent> install [--cli-dir DIR]`: install, print the CLI and its version."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("command", choices=["install"])
    parser.add_argument("--cli-dir", type=Path, default=default_dir)
    args = parser.parse_args()
    try:
        cli = install(args.cli_dir)
    except AgentUnavailable as error:
        sys.exit(f"error: {error}")
    print(f"{cli} ({installed_version(args.cli_dir, package)})")
