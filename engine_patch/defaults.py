"""The engine's choices and defaults that the CLI offers before any engine runs: which engine modes exist, which one
runs unless told, the drafting modes, the releases the patch is tested on, and how a size is written.

Imports nothing but the standard library (and `drafts/cost_gate.py`, which imports nothing else): `stable-prefix up`
reads these in a proxy-only install, where mlx-lm, numpy and psutil are absent (the engine is the `[engine]` extra).
"""

from __future__ import annotations

import argparse
import re

from stable_prefix.engine_patch.drafts.cost_gate import MODES as DRAFT_MODES

# The releases the patch is run against in `make test`, and only those: 0.6.0
# runs the whole suite, 0.3.0 (no cache of its own on the chat path) a warm hit
# through `serve` (tests/engine_patch/test_install.py). Releases between them were read but
# never run, so they are left unpatched too (`stable-prefix doctor` says which
# one is installed).
TESTED_VERSIONS = ("0.3.0", "0.6.0")
ENGINES = ("simple", "batched")
# The engine mode `install()`, `serve` and `stable-prefix up` run unless told otherwise (docs/engine.md: the measured choice).
DEFAULT_ENGINE = "batched"
# Drafted decoding: on where the verify-cost curve measured at start lets a draft pay (docs/engine.md).
DEFAULT_DRAFT = "auto"

__all__ = ["DEFAULT_DRAFT", "DEFAULT_ENGINE", "DRAFT_MODES", "ENGINES", "TESTED_VERSIONS", "parse_size"]

UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
         "g": 10**9, "gb": 10**9, "gib": 2**30}


def parse_size(text: str, flag: str = "--prefix-cache-bytes") -> int:
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"{flag}: {text!r} is not a size (examples: 8GiB, 512MB, 1000000)")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])
