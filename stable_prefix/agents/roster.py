"""Every coding agent stable-prefix points at a stack: the one list of their records (`base.CodingAgent`).

The `stable-prefix <agent>` commands (`stable_prefix/cli.py`), the bench's clients (`bench/clients/cli_agents.py`,
`agent_clients.py`), the tests' install fixtures (`tests/conftest.py`), the proxy's lanes (`addons/lanes.py`) and the
pins `stable-prefix doctor` checks (`stable_prefix/doctor.py`) are made from it. Adding an agent: a module in this
folder with its `PIN` and its `AGENT`, and its line here (docs/agents.md, "Adding an agent");
`tests/stable_prefix/agents/test_roster.py` fails for a module whose record is not listed, and for an agent's package
named anywhere but its module.
"""

from __future__ import annotations

from stable_prefix.agents import claude_agent_sdk, claude_code, claude_code_router, codex_cli, opencode, pi, qwen_code
from stable_prefix.agents.base import CodingAgent

# In the order the commands, the bench's configurations and the tests' parameters take them.
AGENTS: tuple[CodingAgent, ...] = (
    claude_code.AGENT,
    claude_code_router.AGENT,
    opencode.AGENT,
    qwen_code.AGENT,
    pi.AGENT,
    codex_cli.AGENT,
    claude_agent_sdk.AGENT,
)


def agent_keyed(key: str) -> CodingAgent:
    return next(agent for agent in AGENTS if agent.key == key)
