"""Settings every test process and every server it starts share, and the pinned agent CLIs."""

import os
from pathlib import Path

import pytest

from stable_prefix.agents.base import CodingAgent
from stable_prefix.agents.npm_package import AgentUnavailable
from stable_prefix.agents.roster import AGENTS

# The suite's time against its budget, printed at the end of every run (docs/testing.md).
pytest_plugins = ["tests.support.suite_budget"]

# Servers started by tests keep their KV snapshots in RAM only: no test reads or
# writes the user's ~/.cache, and no snapshot carries from one test's server to
# the next. Tests of the disk tier turn it on with a directory of their own.
os.environ.setdefault("ENGINE_PATCH_NO_DISK_CACHE", "1")


def installed_agent_fixture(agent: CodingAgent):
    """The session fixture `agent.fixture`: the agent's pinned CLI (or entry), installed from npm
    (`stable_prefix/agents/npm_package.py`) unless it is there; a test that needs it fails, saying why, where it
    cannot be."""
    def installed() -> Path:
        try:
            return agent.install()
        except AgentUnavailable as error:
            pytest.fail(f"the tests that run the real {agent.name} cannot run: {error}", pytrace=False)

    installed.__name__ = agent.fixture
    installed.__doc__ = f"The pinned {agent.release}, installed by stable_prefix/agents/{agent.install.__module__.rsplit('.', 1)[-1]}.py."
    return pytest.fixture(scope="session", name=agent.fixture)(installed)


# One fixture per agent in the roster (claude_binary, router_cli, opencode_binary, qwen_cli, pi_cli, codex_binary,
# agent_sdk_entry), named by its record.
for _agent in AGENTS:
    globals()[_agent.fixture] = installed_agent_fixture(_agent)
