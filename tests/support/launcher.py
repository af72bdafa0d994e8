"""A running `stable-prefix up` with the test tiny model, as the launcher tests and the llama.cpp stacks start it.

It runs as a subprocess in its own state home (its state file names the servers' process groups), its output
collected line by line as it comes; `stop_launcher` stops it, also after a failed test, with no process left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.models import require_model
from tests.support.processes import LOOPBACK, VENV_BIN, free_port

ANSWER_TOKENS = 8
READY_TIMEOUT_S = 240.0


@dataclass
class Launcher:
    """A running `stable-prefix up`, its output collected line by line as it comes."""

    process: subprocess.Popen
    state_home: Path
    port: int
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)
    # The servers' process group leaders, from the state file once ready: teardown kills what is left of them.
    children: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def state_path(self) -> Path:
        return self.state_home / "stable-prefix" / f"stack-{self.port}.json"

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def wait_for(self, pattern: str, timeout: float = READY_TIMEOUT_S, stream: str = "stdout") -> re.Match:
        deadline = time.monotonic() + timeout
        lines = self.stdout if stream == "stdout" else self.stderr
        while time.monotonic() < deadline:
            for line in list(lines):
                if match := re.search(pattern, line):
                    return match
            if self.process.poll() is not None and not self._readers_busy():
                break
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not in the launcher's {stream} (exit status {self.process.poll()}):\n"
                             + "".join(self.stdout) + "\n--- stderr ---\n" + "".join(self.stderr))

    def wait_until_ready(self) -> dict:
        self.wait_for(r"stable-prefix: ready\.")
        state = self.state()
        self.children = [state["engine_pid"], state["proxy_pid"]]
        return state

    def exit_status(self, timeout: float = 60.0) -> int:
        returncode = self.process.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=10)
        return returncode

    def _readers_busy(self) -> bool:
        return any(reader.is_alive() for reader in self.readers)


def start_launcher(tmp_path: Path, *arguments: str, model: Path | None = None) -> Launcher:
    port = free_port()
    state_home = tmp_path / "state"
    command = [str(VENV_BIN / "stable-prefix"), "up", str(model or require_model()), "--port", str(port),
               "--max-tokens", str(ANSWER_TOKENS), "--capture-dir", str(tmp_path / "captures"), *arguments]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                               cwd=tmp_path, env={**os.environ, "XDG_STATE_HOME": str(state_home), "PYTHONUNBUFFERED": "1"})
    launcher = Launcher(process=process, state_home=state_home, port=port)
    for source, sink in ((process.stdout, launcher.stdout), (process.stderr, launcher.stderr)):
        reader = threading.Thread(target=lambda source=source, sink=sink: sink.extend(iter(source.readline, "")), daemon=True)
        reader.start()
        launcher.readers.append(reader)
    return launcher


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_launcher(launcher: Launcher) -> None:
    """Teardown, also after a failed test: Ctrl-C first, then whatever is left, by process group."""
    if not launcher.children and launcher.state_path.exists():
        with contextlib.suppress(OSError, ValueError, KeyError):
            launcher.children = [launcher.state()["engine_pid"], launcher.state()["proxy_pid"]]
    if launcher.process.poll() is None:
        launcher.process.send_signal(signal.SIGINT)
        try:
            launcher.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.process.kill()
    for pid in launcher.children:
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)
