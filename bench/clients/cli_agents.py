"""The coding agents' real CLIs behind one interface: a conversation of turns against a base URL.

Each agent's record (`stable_prefix/agents/roster.py`) says how to start one of its conversations (`conversation`,
beside its driver in its module); this module only puts them side by side for what runs them all alike (what each
does when its stream is cut, `bench/probes/agent_cuts.py`; the failover end-to-end tests): `conversation(key, ...)`
gives one conversation in a fresh scratch project whose `turn(prompt)` runs the CLI once, the first turn a new
conversation and every later one a continuation of it (`--continue`, Codex's `exec resume`).

Run as a user runs it (`user_retries=True`): each CLI keeps its own retry settings (the drivers turn
Claude Code's and Codex's off for tests, where a retry would be a second cold prefill).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stable_prefix.agents.base import Turn as TurnResult
from stable_prefix.agents.roster import AGENTS as RECORDS

TURN_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class CliAgent:
    key: str
    name: str  # with its pinned version
    protocol: str  # the API it speaks: anthropic, openai (chat completions), responses
    install: Callable[[], Path]


# Every agent whose record can run a conversation of turns on its own.
AGENTS = {agent.key: CliAgent(agent.key, agent.release, agent.protocol, agent.install)
          for agent in RECORDS if agent.conversation is not None}
_CONVERSATIONS = {agent.key: agent.conversation for agent in RECORDS if agent.conversation is not None}


@dataclass
class Conversation:
    """One agent's conversation in one scratch project; `turn` runs the CLI once."""

    agent: CliAgent
    run: Callable[[str, bool], TurnResult]
    turns: list[TurnResult] = field(default_factory=list)

    def turn(self, prompt: str) -> TurnResult:
        result = self.run(prompt, bool(self.turns))
        self.turns.append(result)
        return result


def conversation(key: str, binary: Path, root: Path, base_url: str, model: str, max_output_tokens: int, *,
                 user_retries: bool = True, timeout: float = TURN_TIMEOUT_S) -> Conversation:
    """A conversation of agent `key` (one of AGENTS) against `base_url`, in `root` (emptied first)."""
    agent = AGENTS[key]
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    turn = _CONVERSATIONS[key](binary, root, base_url, model, max_output_tokens, user_retries)
    return Conversation(agent, lambda prompt, continued: turn(prompt, continued, timeout))
