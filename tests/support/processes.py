"""Test-side name for the server harness, which lives in `tools/servers.py` so the
demo and the benchmark use the same start/stop code as the tests."""

from stable_prefix.tools.servers import (  # noqa: F401
    LOOPBACK,
    REPO_ROOT,
    VENV_BIN,
    Server,
    free_port,
    http_ok,
    mitmdump_command,
    port_open,
    running,
    serving,
    stop,
)
