"""Qwen Code (pinned) from npm, pointed at our proxy's OpenAI path, run offline.

Installed into `.claude-cli/qwen-code/` (`stable_prefix/agents/npm_package.py`). It declares node
>= 22; 0.24.4 runs on node 20 as well (every scenario of
`tests/e2e/test_qwen_code_e2e.py` passes on 20.20.2), so the node on PATH is used.
Its configuration: the OpenAI endpoint, key and model in `OPENAI_BASE_URL`,
`OPENAI_API_KEY`, `OPENAI_MODEL`, the output cap in
`QWEN_CODE_MAX_OUTPUT_TOKENS` (an answer cut at the cap would be asked again
with a larger one, then resumed), and a settings file named by
`QWEN_CODE_SYSTEM_SETTINGS_PATH`, which outranks the user's and the project's
settings: OpenAI auth, the model, no usage statistics, no telemetry, no update
check. Nothing but requests to the proxy leaves the machine.

    python -m stable_prefix.agents.qwen_code install

`QwenCode.run_turn()` drives it as the tests do: `qwen PROMPT`, one-shot and
non-interactive (`--continue` resumes the project's latest session), in a
throwaway HOME and a scratch git repository.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from stable_prefix import pins
from stable_prefix.agents import npm_package
from stable_prefix.agents.claude_code import DEFAULT_CLI_DIR
from stable_prefix.agents.npm_package import AgentUnavailable
from stable_prefix.agents.scratch_project import ScratchProject

PACKAGE = pins.QWEN_CODE.package
# Pinned: its prompt layout (git snapshot, memory section, date reminder) changes between releases.
VERSION = pins.QWEN_CODE.version
DEFAULT_DIR = DEFAULT_CLI_DIR / "qwen-code"
API_KEY = "local-model"
# The ripgrep it ships comes without its executable bit; without it Qwen Code says so and greps in JavaScript.
VENDORED_RIPGREP = "vendor/ripgrep/*/rg"


def stack_settings(model: str) -> dict:
    """Qwen Code settings for a stack serving `model` (as a system settings file: they win)."""
    return {
        # The settings format of 0.24: an older (or missing) version is migrated and the file rewritten.
        "$version": 4,
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"name": model},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    }


def stack_environment(base_url: str, model: str, max_output_tokens: int, settings_path: Path) -> dict[str, str]:
    """The variables that point a user's own Qwen Code at a running stack, its settings in `settings_path`
    (written by `write_settings`)."""
    return {
        "OPENAI_BASE_URL": f"{base_url}/v1",
        "OPENAI_API_KEY": API_KEY,
        "OPENAI_MODEL": model,
        "QWEN_CODE_MAX_OUTPUT_TOKENS": str(max_output_tokens),
        "QWEN_CODE_SYSTEM_SETTINGS_PATH": str(settings_path),
    }


def write_settings(path: Path, model: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stack_settings(model), indent=1))
    return path


def package_dir(cli_dir: Path = DEFAULT_DIR) -> Path:
    return cli_dir / "node_modules" / PACKAGE


def find_cli(cli_dir: Path = DEFAULT_DIR) -> Path | None:
    """npm's `qwen` link (to `cli-entry.js`, a node script), or None."""
    return npm_package.bin_link(cli_dir, "qwen")


def install(cli_dir: Path = DEFAULT_DIR, version: str = VERSION) -> Path:
    """Install the pinned Qwen Code into `cli_dir` unless it is there; return its `qwen`."""
    if shutil.which("node") is None:
        raise AgentUnavailable("node not found on PATH; Qwen Code needs it")
    cli = npm_package.install_binary(cli_dir, PACKAGE, version, find_cli, "node_modules/.bin/qwen")
    for ripgrep in package_dir(cli_dir).glob(VENDORED_RIPGREP):
        ripgrep.chmod(ripgrep.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return cli


def user_binary(explicit: str | None = None) -> Path:
    """The Qwen Code to launch for a user: `explicit`, else `qwen` on PATH, else the pinned one."""
    return npm_package.user_binary(explicit, "qwen", find_cli(), npm_package.how_to_install(PACKAGE, VERSION, DEFAULT_DIR, "qwen_code"))


@dataclass(frozen=True)
class QwenCode:
    """The pinned CLI against `base_url` (our proxy) in one scratch project."""

    cli: Path
    project: ScratchProject
    base_url: str
    model: str
    max_output_tokens: int

    @property
    def settings_path(self) -> Path:
        return self.project.home / "system-settings.json"

    def environment(self) -> dict[str, str]:
        """Nothing of the caller's shell leaks in; Qwen Code's own folder is the scratch HOME's `.qwen`."""
        write_settings(self.settings_path, self.model)
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.project.home),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            **stack_environment(self.base_url, self.model, self.max_output_tokens, self.settings_path),
        }

    def run_turn(self, prompt: str, *, continue_conversation: bool = False, approval_mode: str | None = None,
                 timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
        """One `qwen PROMPT` turn; `approval_mode="yolo"` lets it run subagents and shell commands unasked
        (the non-interactive default offers only the tools that need no approval)."""
        command = [str(self.cli), *(["--continue"] if continue_conversation else []),
                   *(["--approval-mode", approval_mode] if approval_mode else []), prompt]
        return subprocess.run(command, cwd=self.project.workdir, env=self.environment(), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def main() -> None:
    npm_package.install_command(__doc__.splitlines()[0], install, DEFAULT_DIR, PACKAGE)


if __name__ == "__main__":
    main()
