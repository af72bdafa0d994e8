"""Start real servers on 127.0.0.1 (tests, demo, benchmark), and always stop them.

Every server goes through `running()`: it picks a free loopback
port, waits until the server answers, and on exit (also on failure or Ctrl-C)
terminates the whole process group, so no orphan keeps a port or a CPU core.
Small stand-in upstreams run in a thread of the caller through `serving()`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# The folder that holds addons/ (mitmdump loads the scripts from there) and .claude-cli/: the checkout in an editable
# install, the installed package's own folder in a wheel's.
REPO_ROOT = Path(importlib.util.find_spec("stable_prefix.addons").origin).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
LOOPBACK = "127.0.0.1"


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def _port_share() -> tuple[int, int]:
    """(this process's share, how many shares) of the port numbers: under pytest-xdist each worker
    takes only ports of its own blocks (`_port_block`), so two workers never hand out the same port
    between choosing it and a server binding it."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1:
        return int(worker[2:]), int(count)
    return 0, 1


def _port_block(port: int) -> int:
    # Blocks of 16, not parity: Linux gives bind(("", 0)) even ports and leaves odd ones to connect().
    return port // 16


def free_port() -> int:
    """A loopback port nobody listens on, never one this process handed out before: the kernel may give a
    just-released port again, and a stack takes several ports before any server binds (a second server on
    the door's port fails to listen, while the door answers its readiness check in its place)."""
    share, shares = _port_share()
    with _handed_out_lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((LOOPBACK, 0))
                port = sock.getsockname()[1]
            if port not in _handed_out and _port_block(port) % shares == share:
                _handed_out.add(port)
                return port


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status < 500
    except urllib.error.HTTPError as error:
        return error.code < 500
    except (OSError, urllib.error.URLError):
        return False


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def running(
    name: str,
    command: list[str],
    *,
    port: int,
    log_dir: Path,
    ready: Callable[[], bool] | None = None,
    startup_timeout: float = 180.0,
    env: dict[str, str] | None = None,
    cwd: Path = REPO_ROOT,
) -> Iterator[Server]:
    """Run `command` (which must listen on `port`) for the duration of the block."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        command,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # its own process group: we stop children too
    )
    server = Server(name=name, port=port, process=process, log_path=log_path)
    is_ready = ready or (lambda: port_open(port))
    try:
        deadline = time.monotonic() + startup_timeout
        while not is_ready():
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} {exit_description(process.returncode)} before it was ready:\n{server.log_text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {startup_timeout:.0f}s:\n{server.log_text()[-4000:]}")
            time.sleep(0.2)
        yield server
    finally:
        stop(process)
        log_file.close()


def exit_description(returncode: int) -> str:
    """`exited with code 1`, or `was killed by signal SIGKILL` (Popen's negative return codes)."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=grace)


def mitmdump_command(scripts: list[str], upstream: str, port: int, options: dict[str, object] | None = None,
                     program: str = "mitmdump", mode: str | None = None) -> list[str]:
    """`program` (mitmdump, or mitmweb) in reverse mode before `upstream` (or in `mode`, e.g. `regular`: a forward
    proxy, `upstream` then unused), listening on 127.0.0.1:`port`."""
    command = [str(VENV_BIN / program), "--mode", mode or f"reverse:{upstream}", "--listen-host", LOOPBACK, "-p", str(port)]
    for script in scripts:
        command += ["-s", str(REPO_ROOT / script)]
    for name, value in (options or {}).items():
        # mitmproxy reads `true`/`false`: `--set name=True` fails its option parsing, and the script's options stay unset.
        command += ["--set", f"{name}={str(value).lower() if isinstance(value, bool) else value}"]
    return command


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler], port: int, name: str) -> Iterator[ThreadingHTTPServer]:
    """An HTTP server on 127.0.0.1:`port`, answering from a daemon thread for the duration of the block."""
    server = ThreadingHTTPServer((LOOPBACK, port), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
