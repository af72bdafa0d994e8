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
import shutil
import stat
from pathlib import Path

from stable_prefix.addons.capture_folder import write_private
from stable_prefix.agents import npm_package
from stable_prefix.agents.base import OPENAI_CHAT, STREAMED, CodingAgent, LaneFacts, Launcher, Resends
from stable_prefix.agents.driver import AgentDriver
from stable_prefix.agents.npm_package import AgentUnavailable
from stable_prefix.pins import Pin
from stable_prefix.stack_state import stack_state_path

# Pinned (`stable-prefix doctor` sets it against npm's newest): its prompt layout (git snapshot, memory section, date reminder) changes between releases.
PIN = Pin("Qwen Code", "npm", "@qwen-code/qwen-code", "0.24.4")
PACKAGE = PIN.package
VERSION = PIN.version
DEFAULT_DIR = npm_package.INSTALL_ROOT / "qwen-code"
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


class QwenCode(AgentDriver):
    """`qwen PROMPT`, one-shot and non-interactive, its settings in a system settings file; Qwen Code's own folder
    is the scratch HOME's `.qwen`."""

    @property
    def settings_path(self) -> Path:
        return self.project.home / "system-settings.json"

    def stack_environment(self) -> dict[str, str]:
        write_settings(self.settings_path, self.model)
        return {"TERM": "dumb", **stack_environment(self.base_url, self.model, self.max_output_tokens, self.settings_path)}

    def turn_arguments(self, prompt: str, *, continue_conversation: bool, approval_mode: str | None = None) -> list[str]:
        """`--continue` resumes the project's latest session; `approval_mode="yolo"` lets it run subagents and shell
        commands unasked (the non-interactive default offers only the tools that need no approval)."""
        return [*(["--continue"] if continue_conversation else []), *(["--approval-mode", approval_mode] if approval_mode else []), prompt]


# `stable-prefix qwen`: a user's own qwen against the running stack (`stable_prefix/launch.py` does the rest).
LAUNCH_HELP = """`stable-prefix qwen [--port N] [--qwen PATH] [qwen arguments]`: Qwen Code against a running stack.

Reads where the stack is from the state file `stable-prefix up` writes, checks
that it answers, writes Qwen Code's settings for it next to that file
(`qwen-settings-PORT.json`, 0600; `stable_prefix/agents/qwen_code.py: stack_settings`: OpenAI
auth, the served model, no usage statistics, telemetry or update check) and
replaces itself with Qwen Code (`qwen` on PATH, or the pinned one in
`.claude-cli/qwen-code/`), the settings named by
`QWEN_CODE_SYSTEM_SETTINGS_PATH` (they outrank the user's and the project's),
the proxy, key, model and output cap in its OpenAI variables. The user's own
sessions and settings are used otherwise; their own OpenAI key is not sent.
"""


def launch_environment(state: dict, port: int) -> dict[str, str]:
    settings = stack_state_path(port).with_name(f"qwen-settings-{port}.json")
    write_private(settings, json.dumps(stack_settings(state["model"]), indent=1))
    return stack_environment(state["url"], state["model"], state["max_tokens"], settings)


# Subagents start with `agent`; no header names anything, so an instance is named by its first prompt (its task).
# It loses the turn to an error event and sends the request again only after a silent cut (mid-reply it sends the
# partial answer back to go on: a bench client sends the request again, streamed, in its place).
AGENT = CodingAgent(
    "qwen", PIN, OPENAI_CHAT, install, fixture="qwen_cli",
    launcher=Launcher("qwen", user_binary, LAUNCH_HELP, environment_for=launch_environment),
    conversation=QwenCode.conversation,
    resends=Resends(after_error_event=None, after_silent_cut=STREAMED),
    lanes=LaneFacts("QwenCode/", frozenset({"agent"}), instance_by_first_prompt=True),
)


def main() -> None:
    npm_package.install_command(__doc__.splitlines()[0], install, DEFAULT_DIR, PACKAGE)


if __name__ == "__main__":
    main()
