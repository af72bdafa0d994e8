"""Driving an agent CLI in a scratch project, whichever agent: the pinned binary against our proxy, one turn a
process, nothing of the caller's shell inherited. Each agent's module says what is its own: the command line of a
turn and the environment that points it at the proxy (`opencode.OpenCode`, `qwen_code.QwenCode`, `pi.Pi`).
Claude Code and Codex have drivers of their own (`claude_code.ClaudeCode`, `codex_cli.Codex`): their sandboxes hold
a config folder beside the project (`scratch_project.Sandbox`).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.agents.base import Turn
from stable_prefix.agents.scratch_project import ScratchProject


@dataclass(frozen=True)
class AgentDriver:
    """The pinned CLI (`binary`) against `base_url` (our proxy) serving `model`, in one scratch project."""

    binary: Path
    project: ScratchProject
    base_url: str
    model: str
    max_output_tokens: int

    def stack_environment(self) -> dict[str, str]:
        """The agent's own variables: what points it at the stack, keeps it offline, keeps its folders in the scratch HOME."""
        raise NotImplementedError

    def turn_arguments(self, prompt: str, *, continue_conversation: bool, **options) -> list[str]:
        """The command line of one non-interactive turn after the binary; `continue_conversation` resumes the
        project's latest conversation; `options` are the agent's own (a mode, an approval policy)."""
        raise NotImplementedError

    def environment(self, timezone: str = "UTC") -> dict[str, str]:
        """Nothing of the caller's shell leaks in: its PATH, the scratch HOME, a UTF-8 locale, and `timezone`, which
        sets the day an agent writes into its prompt (a conversation continued past midnight)."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.project.home), "LANG": "C.UTF-8", "TZ": timezone,
                **self.stack_environment()}

    def run_turn(self, prompt: str, *, continue_conversation: bool = False, timezone: str = "UTC", timeout: float = 900.0,
                 **options) -> subprocess.CompletedProcess[str]:
        """One turn, in the project, with nothing on its standard input."""
        command = [str(self.binary), *self.turn_arguments(prompt, continue_conversation=continue_conversation, **options)]
        return subprocess.run(command, cwd=self.project.workdir, env=self.environment(timezone), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    @classmethod
    def conversation(cls, binary: Path, root: Path, base_url: str, model: str, max_output_tokens: int, user_retries: bool):
        """A conversation in a new scratch project under `root`: a new conversation, then `--continue`d
        (`CodingAgent.conversation`; these agents keep their own retry settings either way)."""
        cli = cls(binary, ScratchProject.create(root), base_url, model, max_output_tokens)
        return lambda prompt, continued, timeout: Turn.of(cli.run_turn(prompt, continue_conversation=continued, timeout=timeout))
