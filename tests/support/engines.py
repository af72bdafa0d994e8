"""Patched engines on 127.0.0.1 for tests: `python -m stable_prefix.engine_patch serve MODEL`, served as "tiny"."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from stable_prefix.bench.clients.reference_answers import UNCACHED_FLAGS
from stable_prefix.engine_patch.install import DEFAULT_ENGINE

from .models import TEST_MODEL, require_model
from .processes import free_port, http_ok, running

# vllm-mlx's SimpleEngine as shipped: the uncached reference of the real-weights test, for both modes.
SHIPPED = UNCACHED_FLAGS["simple"]
# The default engine mode as shipped, uncached: the reference of tests that run the default mode.
SHIPPED_DEFAULT_MODE = UNCACHED_FLAGS[DEFAULT_ENGINE]
# Per engine mode: the patched server's flags, and the same engine as shipped.
ENGINE_MODE_FLAGS = {
    "simple": (["--engine", "simple"], ["--engine", "simple", "--no-prefix-cache"]),
    "batched": (["--engine", "batched"], ["--engine", "batched", "--no-prefix-cache"]),
}


def engine(log_dir: Path, name: str, *flags: str, model: Path = TEST_MODEL, env: dict[str, str] | None = None, port: int | None = None):
    """A patched server (flags after the model go to it); RAM-only unless `--prefix-cache-dir` or env say otherwise.
    `port`: a given one (a replica restarted where a router expects it), else a free one."""
    port = port or free_port()
    command = [sys.executable, "-m", "stable_prefix.engine_patch", "serve", str(require_model(model)), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", "tiny", *flags]
    disk = {"ENGINE_PATCH_NO_DISK_CACHE": "0"} if "--prefix-cache-dir" in flags else {}
    return running(name, command, port=port, log_dir=log_dir, env={**disk, **(env or {})},
                   ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models"))


def kill_9(server) -> None:
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)
