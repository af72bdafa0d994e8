"""`stable-prefix doctor`: every client we pin against its registry's newest, and the engine installed here
against the versions the patch is tested with.

For each agent's pin (its record's, listed in `stable_prefix/agents/roster.py`) and each router's
(`stable_prefix/pins.py`): the version `make test` runs, the newest the registry serves (`npm view`, `pip index
versions`: `stable_prefix/registry.py`) and the Node each declares (`engines.node`). A registry that cannot be
reached, or a client that is not installed, is said so on its row; no version is ever filled in. Then the vllm-mlx
and mlx-lm installed in this Python, whether they are the ones the patch is run against (`engine_patch/install.py`'s
`TESTED_VERSIONS`, pins.py's mlx-lm), and the Python each requires. `make check-clients` runs it. The exit status is
0 when it could print its table, whatever the table says: a newer release is news, not a failure.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata

from stable_prefix import pins, registry
from stable_prefix.agents.roster import AGENTS
from stable_prefix.pins import Pin
from stable_prefix.registry import Lookup

USAGE = "usage: stable-prefix doctor"
COLUMNS = ("client", "package", "pinned", "newest", "node (pinned; newest)", "")


def runtime_version(command: str) -> str:
    """`node --version` or `npm --version`, or why there is none."""
    binary = shutil.which(command)
    if binary is None:
        return "not found on PATH"
    try:
        completed = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"does not run ({error})"
    return completed.stdout.strip() or f"exit status {completed.returncode}"


def lookups(pin: Pin) -> tuple[Lookup, Lookup]:
    """(the pinned version as the registry has it, the registry's newest)."""
    if pin.registry == "npm":
        return registry.npm_view(pin.package, pin.version), registry.npm_view(pin.package)
    return Lookup(pin.version), registry.pip_newest(pin.package)


def verdict(pin: Pin, pinned: Lookup, newest: Lookup) -> str:
    if newest.version is None:
        return newest.problem
    if pinned.problem:
        return f"the pinned version: {pinned.problem}"
    news = "the newest" if newest.version == pin.version else f"{newest.version} is newer"
    return f"{news}; {pin.note}" if pin.note else news


def node_requirement(pinned: Lookup, newest: Lookup) -> str:
    def one(lookup: Lookup) -> str:
        return lookup.node or ("none declared" if lookup.version else "unknown")

    return one(pinned) if (pinned.version, pinned.node) == (newest.version, newest.node) else f"{one(pinned)}; {one(newest)}"


def agent_pins() -> tuple[Pin, ...]:
    """Every agent's pin, in the roster's order: each record carries its own, so a new agent needs no row elsewhere."""
    return tuple(agent.pin for agent in AGENTS)


def agent_rows() -> list[tuple[str, ...]]:
    checked = agent_pins()
    with ThreadPoolExecutor(max_workers=len(checked)) as pool:
        answers = list(pool.map(lookups, checked))
    return [(pin.name, pin.package, pin.version, newest.version or "unknown", node_requirement(pinned, newest),
             verdict(pin, pinned, newest)) for pin, (pinned, newest) in zip(checked, answers, strict=True)]


def tested_engine_versions() -> tuple[tuple[str, ...] | None, str]:
    """The vllm-mlx releases the patch installs on, or None with the reason it cannot be asked here."""
    try:
        from stable_prefix.engine_patch.install import TESTED_VERSIONS
    except Exception as error:  # the engine patch imports mlx: a proxy-only install has none
        return None, f"the engine patch cannot be imported here ({error.__class__.__name__}: {error})"
    return TESTED_VERSIONS, ""


def installed(distribution: str) -> tuple[str | None, str]:
    """(the installed version, its Requires-Python) of a distribution in this Python."""
    try:
        found = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return None, "unknown"
    return found.version, found.metadata.get("Requires-Python") or "none declared"


def engine_rows() -> list[tuple[str, ...]]:
    tested_vllm_mlx, why_not = tested_engine_versions()
    tested = {pins.VLLM_MLX.package: tested_vllm_mlx, pins.MLX_LM.package: (pins.MLX_LM.version,)}
    with ThreadPoolExecutor(max_workers=len(pins.ENGINE_PINS)) as pool:
        newest = list(pool.map(lambda pin: registry.pip_newest(pin.package), pins.ENGINE_PINS))
    rows = []
    for pin, latest in zip(pins.ENGINE_PINS, newest, strict=True):
        version, python = installed(pin.package)
        versions = tested[pin.package]
        if version is None:
            state = "not installed in this Python"
        elif versions is None:
            state = why_not
        else:
            state = "tested" if version in versions else f"NOT tested: the patch is run against {', '.join(versions)}"
        rows.append((pin.name, version or "-", ", ".join(versions or ()) or "unknown", latest.version or latest.problem,
                     python, f"{state}; {pin.note}"))
    return rows


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[index]) for row in (header, *rows)) for index in range(len(header) - 1)]
    lines = []
    for row in (header, *rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    return "\n".join(line.rstrip() for line in lines)


def report() -> str:
    routers = table(COLUMNS, [(pin.name, pin.package, pin.version, newest.version or "unknown", "-", verdict(pin, Lookup(pin.version), newest))
                              for pin in pins.ROUTER_PINS for newest in [lookups(pin)[1]]])
    return "\n".join([
        f"stable-prefix doctor: node {runtime_version('node')}, npm {runtime_version('npm')}, "
        f"Python {platform.python_version()}",
        "",
        "Agents and clients (pinned: what `make test` installs and runs; newest: the registry's `latest`):",
        table(COLUMNS, agent_rows()),
        "",
        "Routers (pinned: what `make routers` installs, each in its own venv; HAProxy is the system's package):",
        routers,
        "",
        "Engine in this Python (tested: the versions the cache tests run against):",
        table(("engine", "installed", "tested", "newest", "python", ""), engine_rows()),
    ])


def main(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="stable-prefix doctor", description=__doc__.split("\n\n")[0]).parse_args(argv)
    print(report(), flush=True)
    return 0
