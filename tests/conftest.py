"""Settings every test process and every server it starts share, and the pinned agent CLIs."""

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from stable_prefix.agents import claude_agent_sdk, claude_code, claude_code_router, codex_cli, opencode, pi, qwen_code
from stable_prefix.agents.npm_package import AgentUnavailable

# The suite's time against its budget, printed at the end of every run (docs/testing.md).
pytest_plugins = ["tests.support.suite_budget"]

# Servers started by tests keep their KV snapshots in RAM only: no test reads or
# writes the user's ~/.cache, and no snapshot carries from one test's server to
# the next. Tests of the disk tier turn it on with a directory of their own.
os.environ.setdefault("ENGINE_PATCH_NO_DISK_CACHE", "1")


def _installed(install: Callable[[], Path], what: str) -> Path:
    """The pinned CLI, installed from npm (`stable_prefix/agents/npm_package.py`) unless it is there; a test that
    needs it fails, saying why, where it cannot be."""
    try:
        return install()
    except AgentUnavailable as error:
        pytest.fail(f"the tests that run the real {what} cannot run: {error}", pytrace=False)


@pytest.fixture(scope="session")
def claude_binary() -> Path:
    """The pinned Claude Code CLI, in .claude-cli/."""
    return _installed(claude_code.install, "Claude Code CLI")


@pytest.fixture(scope="session")
def router_cli() -> Path:
    """The pinned claude-code-router, in .claude-cli/router/."""
    return _installed(claude_code_router.install, "claude-code-router")


@pytest.fixture(scope="session")
def codex_binary() -> Path:
    """The pinned Codex CLI, in .codex-cli/."""
    return _installed(codex_cli.install, "Codex CLI")


@pytest.fixture(scope="session")
def opencode_binary() -> Path:
    """The pinned opencode, in .claude-cli/opencode/."""
    return _installed(opencode.install, "opencode")


@pytest.fixture(scope="session")
def qwen_cli() -> Path:
    """The pinned Qwen Code, in .claude-cli/qwen-code/."""
    return _installed(qwen_code.install, "Qwen Code")


@pytest.fixture(scope="session")
def pi_cli() -> Path:
    """The pinned Pi, in .claude-cli/pi/."""
    return _installed(pi.install, "Pi")


@pytest.fixture(scope="session")
def agent_sdk_entry() -> Path:
    """The pinned Claude Agent SDK's sdk.mjs, in .claude-cli/agent-sdk/."""
    return _installed(claude_agent_sdk.install, "Claude Agent SDK")
