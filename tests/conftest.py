"""Settings every test process and every server it starts share."""

import os
from pathlib import Path

import pytest

from stable_prefix.tools import claude_code, codex_cli

# Servers started by tests keep their KV snapshots in RAM only: no test reads or
# writes the user's ~/.cache, and no snapshot carries from one test's server to
# the next. Tests of the disk tier turn it on with a directory of their own.
os.environ.setdefault("ENGINE_PATCH_NO_DISK_CACHE", "1")


@pytest.fixture(scope="session")
def claude_binary() -> Path:
    """The pinned Claude Code CLI, installed from npm into .claude-cli/ once."""
    try:
        return claude_code.install()
    except claude_code.ClaudeCodeUnavailable as error:
        pytest.fail(f"the tests that run the real Claude Code CLI cannot run: {error}", pytrace=False)


@pytest.fixture(scope="session")
def codex_binary() -> Path:
    """The pinned Codex CLI, installed from npm into .codex-cli/ once."""
    try:
        return codex_cli.install()
    except codex_cli.CodexUnavailable as error:
        pytest.fail(f"the tests that run the real Codex CLI cannot run: {error}", pytrace=False)
