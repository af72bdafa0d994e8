"""`stable-prefix up`, run as a user runs it, for the soak and the load scenario; and its engine killed.

Each life is one `stable-prefix up` process (its own ports, its own capture
folder, the same KV directory and budgets). `up` stops the proxy and exits when
its engine dies, so a SIGKILL of the engine ends a life and the next life
starts a new `up` on the same directory: its first requests come back warm from
disk. The state file `up` writes names the engine's and the proxy's processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.engine_patch.install import DEFAULT_ENGINE
from stable_prefix.servers import VENV_BIN, free_port, http_ok, stop

READY_TIMEOUT_S = 300.0
SERVED_NAME = "tiny"


@dataclass
class StackLife:
    number: int
    process: subprocess.Popen
    proxy_url: str
    engine_url: str
    engine_pid: int
    proxy_pid: int
    capture_dir: Path
    log_path: Path

    def kill_engine(self) -> None:
        """SIGKILL the engine's process group, as a crash does; `up` notices and stops the proxy."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.engine_pid, signal.SIGKILL)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop(self.process)

    def stop(self) -> None:
        stop(self.process, grace=30.0)


@dataclass(frozen=True)
class StackSettings:
    model: Path
    out: Path  # logs, captures, the KV directory, the state home
    ram_budget: str
    disk_budget: str
    engine_mode: str = DEFAULT_ENGINE

    @property
    def kv_dir(self) -> Path:
        return self.out / "kv"


def start_life(settings: StackSettings, number: int) -> StackLife:
    port = free_port()
    state_home = settings.out / "state"
    capture_dir = settings.out / "captures" / f"life-{number}"
    log_path = settings.out / f"up-life-{number}.log"
    settings.out.mkdir(parents=True, exist_ok=True)
    command = [str(VENV_BIN / "stable-prefix"), "up", str(settings.model), "--port", str(port), "--served-model-name", SERVED_NAME,
               "--cache-bytes", settings.ram_budget, "--capture-dir", str(capture_dir), "--engine", settings.engine_mode, "--",
               "--prefix-cache-dir", str(settings.kv_dir),
               "--prefix-cache-disk-bytes", settings.disk_budget]
    log = log_path.open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ, "XDG_STATE_HOME": str(state_home), "ENGINE_PATCH_NO_DISK_CACHE": "0",
                                    "PYTHONUNBUFFERED": "1"})
    log.close()
    state_path = state_home / "stable-prefix" / f"stack-{port}.json"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (state_path.exists() and http_ok(f"http://127.0.0.1:{port}/v1/models")):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise RuntimeError(f"stable-prefix up (life {number}) did not come up; its output:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    state = json.loads(state_path.read_text())
    return StackLife(number, process, state["url"], state["engine_url"], state["engine_pid"], state["proxy_pid"], capture_dir, log_path)
