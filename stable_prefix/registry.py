"""What a package registry says of a package, asked through its own client: `npm view` for npm,
`pip index versions` for PyPI.

Every answer is a `Lookup`: the version and the runtime it declares (npm's
`engines.node`; PyPI's `Requires-Python` is not in pip's answer, so none), or
why there is none: the registry could not be reached, it does not serve the
package, or its client is not installed. Nothing is guessed: a lookup that
failed has no version.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

LOOKUP_TIMEOUT_S = 60
# npm's error codes for a registry it could not talk to (its others, E404 aside, are reported as they are).
NETWORK_ERRORS = ("ECONNREFUSED", "ENOTFOUND", "ETIMEDOUT", "EAI_AGAIN", "ECONNRESET", "ENETUNREACH", "EHOSTUNREACH",
                  "ERR_SOCKET_TIMEOUT", "UNABLE_TO_GET_ISSUER_CERT_LOCALLY", "SELF_SIGNED_CERT_IN_CHAIN")
_PIP_NEWEST = re.compile(r"^(?P<name>\S+) \((?P<version>[^)]+)\)$", re.MULTILINE)
_PIP_NETWORK = re.compile(r"NewConnectionError|Max retries exceeded|Connection refused|Failed to establish|timed out|"
                          r"Name or service not known|Temporary failure in name resolution", re.IGNORECASE)


@dataclass(frozen=True)
class Lookup:
    version: str | None = None
    node: str | None = None  # npm's engines.node, when the package declares one
    problem: str | None = None  # why there is no version

    def __post_init__(self) -> None:
        assert (self.version is None) != (self.problem is None), "a lookup has a version or a problem, never both or neither"


def unreachable(detail: str) -> Lookup:
    return Lookup(problem=f"registry not reachable ({detail})")


def npm_view(package: str, version: str | None = None) -> Lookup:
    """`npm view PACKAGE[@VERSION] version engines`: the newest (the `latest` tag), or that version."""
    npm = shutil.which("npm")
    if npm is None:
        return Lookup(problem="npm not found on PATH")
    spec = f"{package}@{version}" if version else package
    command = [npm, "view", spec, "version", "engines", "--json", "--fetch-retries=0", "--fetch-timeout=20000", "--loglevel=silent"]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=LOOKUP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return unreachable(f"npm gave no answer in {LOOKUP_TIMEOUT_S} s")
    try:
        answer = json.loads(completed.stdout or "null")
    except ValueError:
        answer = None
    if isinstance(answer, list):  # a range matched several versions: the last is the newest
        answer = answer[-1] if answer else None
    if isinstance(answer, str):  # npm answers a bare value when only one of the fields is there (no engines)
        answer = {"version": answer}
    if not isinstance(answer, dict):
        return Lookup(problem=f"npm view {spec} answered nothing readable (exit status {completed.returncode})")
    if "error" in answer:
        error = answer["error"] if isinstance(answer["error"], dict) else {}
        code, summary = str(error.get("code", "")), str(error.get("summary", "")).splitlines()[0:1]
        if code == "E404":
            return Lookup(problem=f"not on the registry ({spec}: 404)")
        if code in NETWORK_ERRORS:
            return unreachable(code)
        return Lookup(problem=f"npm view {spec}: {code} {''.join(summary)}".strip())
    engines = answer.get("engines") if isinstance(answer.get("engines"), dict) else {}
    if not isinstance(answer.get("version"), str):
        return Lookup(problem=f"npm view {spec} named no version")
    return Lookup(answer["version"], engines.get("node"))


def pip_newest(package: str) -> Lookup:
    """`pip index versions PACKAGE` (this Python's pip, its configured index): the newest it serves for this Python."""
    # One retry: pip names a connection that failed only in the warning before it retries.
    command = [sys.executable, "-m", "pip", "index", "versions", package, "--retries", "1", "--timeout", "20",
               "--disable-pip-version-check"]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=LOOKUP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return unreachable(f"pip gave no answer in {LOOKUP_TIMEOUT_S} s")
    match = _PIP_NEWEST.search(completed.stdout)
    if completed.returncode == 0 and match and match["name"].lower().replace("_", "-") == package.lower().replace("_", "-"):
        return Lookup(match["version"])
    if _PIP_NETWORK.search(completed.stderr):
        return unreachable("pip could not connect to its index")
    last_error = next((line for line in reversed(completed.stderr.splitlines()) if line.startswith("ERROR")), "")
    if "No matching distribution" in last_error:
        return Lookup(problem="not on the registry, or its index not reachable (pip cannot tell them apart)")
    return Lookup(problem=f"pip index versions {package}: {last_error or f'exit status {completed.returncode}'}")
