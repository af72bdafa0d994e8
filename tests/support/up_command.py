"""`stable-prefix up ...` run as a user runs it, its output read line by line until it is stopped (Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


class Up:
    def __init__(self, program: Path, cwd: Path, *arguments: str, env: dict[str, str] | None = None) -> None:
        self.output: list[str] = []
        self.process = subprocess.Popen([str(program), "up", *arguments], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True, cwd=cwd, env=env, start_new_session=True)

    def line_with(self, text: str, timeout: float = 180.0) -> str:
        """The next line holding `text`; fails naming what `up` printed if it exits or the time runs out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line and self.process.poll() is not None:
                break
            self.output.append(line.rstrip("\n"))
            if text in line:
                return line.rstrip("\n")
        raise AssertionError(f"`up` never printed {text!r}; it printed:\n" + "\n".join(self.output[-60:]))

    def stop(self) -> int:
        """Ctrl-C: `up` stops its servers, then exits (130); killed with its group if it does not within a minute."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.process.stdout.close()
        return self.process.returncode
