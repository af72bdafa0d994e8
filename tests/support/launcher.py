"""A running `stable-prefix up` in a test: the one support module that starts it, reads its output and stops it.

`start_launcher` runs this checkout's command with the test tiny model (the launcher tests, the llama.cpp stacks);
`start_up` runs any installed `stable-prefix` (a clean venv's, for the proxy-only install) with the arguments a test
names. Either way it runs as a subprocess in a state home of its own (its state file names the servers' process
groups), its output collected line by line as it comes; `stop_launcher` stops it with Ctrl-C, also after a failed
test, and leaves no process behind.
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
    # How far `line_with` has read stdout: each call looks past the line the one before it returned.
    read_up_to: int = 0

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

    def line_with(self, text: str, timeout: float = READY_TIMEOUT_S) -> str:
        """The next stdout line holding `text`, after the one the last call returned: lines in the order `up` prints them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = list(self.stdout)
            for index in range(self.read_up_to, len(lines)):
                if text in lines[index]:
                    self.read_up_to = index + 1
                    return lines[index].rstrip("\n")
            self.read_up_to = len(lines)
            if self.process.poll() is not None and not self._readers_busy():
                break
            time.sleep(0.1)
        raise AssertionError(f"`up` never printed {text!r} (exit status {self.process.poll()}); it printed:\n{self.output_tail()}")

    def output_tail(self, lines: int = 60) -> str:
        """What `up` printed last, for a failure's message."""
        return "".join(self.stdout[-lines:]) + "\n--- stderr ---\n" + "".join(self.stderr[-lines:])

    def wait_until_ready(self) -> dict:
        self.wait_for(r"stable-prefix: ready\.")
        state = self.state()
        self.children = server_groups(state)
        return state

    def exit_status(self, timeout: float = 60.0) -> int:
        returncode = self.process.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=10)
        return returncode

    def _readers_busy(self) -> bool:
        return any(reader.is_alive() for reader in self.readers)


def start_launcher(tmp_path: Path, *arguments: str, model: Path | None = None) -> Launcher:
    """This checkout's `stable-prefix up` with the test tiny model (or `model`), short answers and captures in tmp_path."""
    return start_up(VENV_BIN / "stable-prefix", tmp_path, str(model or require_model()), "--max-tokens", str(ANSWER_TOKENS),
                    "--capture-dir", str(tmp_path / "captures"), *arguments, state_home=tmp_path / "state")


def start_up(program: Path, cwd: Path, *arguments: str, state_home: Path, env: dict[str, str] | None = None) -> Launcher:
    """`PROGRAM up --port N ARGUMENTS` on a free port, run as a user runs it, its state file in `state_home`.

    `env` is the whole environment (this process's by default); its own session, so that a stop can kill what is left."""
    port = free_port()
    command = [str(program), "up", "--port", str(port), *arguments]  # the port first: ARGUMENTS may end in `-- SERVER FLAGS`
    environment = {**(os.environ if env is None else env), "XDG_STATE_HOME": str(state_home), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                               cwd=cwd, env=environment, start_new_session=True)
    launcher = Launcher(process=process, state_home=state_home, port=port)
    for source, sink in ((process.stdout, launcher.stdout), (process.stderr, launcher.stderr)):
        reader = threading.Thread(target=lambda source=source, sink=sink: sink.extend(iter(source.readline, "")), daemon=True)
        reader.start()
        launcher.readers.append(reader)
    return launcher


def server_groups(state: dict) -> list[int]:
    """The servers' process group leaders in a state file (`up --upstream` starts no engine: its engine_pid is null)."""
    return [pid for pid in (state["engine_pid"], state["proxy_pid"]) if pid]


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_launcher(launcher: Launcher) -> int:
    """Teardown, also after a failed test: Ctrl-C first, then whatever is left, by process group; `up`'s exit status
    (130 after a Ctrl-C it handled, -9 where it had to be killed)."""
    if not launcher.children and launcher.state_path.exists():
        with contextlib.suppress(OSError, ValueError, KeyError):
            launcher.children = server_groups(launcher.state())
    if launcher.process.poll() is None:
        launcher.process.send_signal(signal.SIGINT)
        try:
            launcher.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.process.pid, signal.SIGKILL)
    for pid in launcher.children:
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)
    return launcher.exit_status()
