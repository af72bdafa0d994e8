"""The five coding agents' real CLIs behind one interface: a conversation of turns against a base URL.

Each agent's own driver (`stable_prefix/agents/claude_code.py`, `opencode.py`, `qwen_code.py`, `pi.py`, `codex_cli.py`)
knows how to start it; this module only puts them side by side for what runs all five alike (what each
does when its stream is cut, `bench/probes/agent_cuts.py`; the failover end-to-end tests): `conversation(key,
...)` gives one conversation in a fresh scratch project whose `turn(prompt)` runs the CLI once, the first
turn a new conversation and every later one a continuation of it (`--continue`, Codex's `exec resume`).

Run as a user runs it (`user_retries=True`): each CLI keeps its own retry settings (the drivers turn
Claude Code's and Codex's off for tests, where a retry would be a second cold prefill).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stable_prefix.agents import claude_code, codex_cli, opencode, pi, qwen_code
from stable_prefix.agents.scratch_project import ScratchProject

TURN_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class CliAgent:
    key: str
    name: str  # with its pinned version
    protocol: str  # the API it speaks: anthropic, openai (chat completions), responses
    install: Callable[[], Path]


AGENTS = {agent.key: agent for agent in (
    CliAgent("claude", f"Claude Code {claude_code.CLI_VERSION}", "anthropic", claude_code.install),
    CliAgent("opencode", f"opencode {opencode.VERSION}", "openai", opencode.install),
    CliAgent("qwen", f"Qwen Code {qwen_code.VERSION}", "openai", qwen_code.install),
    CliAgent("pi", f"Pi {pi.VERSION}", "openai", pi.install),
    CliAgent("codex", f"Codex CLI {codex_cli.CLI_VERSION}", "responses", codex_cli.install),
)}


@dataclass(frozen=True)
class TurnResult:
    returncode: int
    reply: str  # what the CLI printed as its answer (Codex: its last message)
    stdout: str
    stderr: str


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


def _completed(completed: subprocess.CompletedProcess[str]) -> TurnResult:
    return TurnResult(completed.returncode, completed.stdout.strip(), completed.stdout, completed.stderr)


def conversation(key: str, binary: Path, root: Path, base_url: str, model: str, max_output_tokens: int, *,
                 user_retries: bool = True, timeout: float = TURN_TIMEOUT_S) -> Conversation:
    """A conversation of agent `key` (one of AGENTS) against `base_url`, in `root` (emptied first)."""
    agent = AGENTS[key]
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    if key == "claude":
        claude = claude_code.ClaudeCode(binary, claude_code.Sandbox.create(root, git_repository=True), base_url,
                                        max_retries=None if user_retries else 0)
        return Conversation(agent, lambda prompt, continued: _completed(claude.print_turn(prompt, continue_conversation=continued, timeout=timeout)))
    if key == "codex":
        codex = codex_cli.Codex(binary, codex_cli.Sandbox.create(root, base_url, model, client_retries=user_retries))
        session: dict[str, str | None] = {"id": None}

        def codex_turn(prompt: str, continued: bool) -> TurnResult:
            turn = codex.exec_turn(prompt, resume=session["id"] if continued else None, timeout=timeout)
            session["id"] = session["id"] or turn.session
            return TurnResult(turn.returncode, turn.reply.strip(), turn.stdout, turn.stderr)

        return Conversation(agent, codex_turn)
    driver = {"opencode": opencode.OpenCode, "qwen": qwen_code.QwenCode, "pi": pi.Pi}[key]
    cli = driver(binary, ScratchProject.create(root), base_url, model, max_output_tokens)
    return Conversation(agent, lambda prompt, continued: _completed(cli.run_turn(prompt, continue_conversation=continued, timeout=timeout)))
