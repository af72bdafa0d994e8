"""Test-side name for the server harness, which lives in `stable_prefix/servers.py` so the
demo and the benchmark use the same start/stop code as the tests.

Every server a test starts gets a home directory of its own (unless the test
gives one): vllm-mlx's batched engine saves its prefix cache under
`~/.cache/vllm-mlx/` on a clean shutdown and loads it at start, so with the
user's home a reference server would answer from an earlier test's (or run's)
cache, and tests would write into the user's home.
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path

from stable_prefix import servers
from stable_prefix.servers import (  # noqa: F401
    LOOPBACK,
    REPO_ROOT,
    VENV_BIN,
    Server,
    free_port,
    http_ok,
    mitmdump_command,
    port_open,
    serving,
    stop,
)


@contextlib.contextmanager
def running(name: str, command: list[str], *, port: int, log_dir: Path, env: dict[str, str] | None = None, **options) -> Iterator[Server]:
    home = log_dir / f"{name}-{port}-home"
    home.mkdir(parents=True, exist_ok=True)
    with servers.running(name, command, port=port, log_dir=log_dir, env={"HOME": str(home), **(env or {})}, **options) as server:
        yield server
