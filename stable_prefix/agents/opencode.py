"""opencode (pinned) from npm, pointed at our proxy's OpenAI path, run offline.

Installed into `.claude-cli/opencode/` (`stable_prefix/agents/npm_package.py`). Its whole
configuration goes in one variable, `OPENCODE_CONFIG_CONTENT`, which outranks
the user's and the project's `opencode.json`: one provider, `stable-prefix`
(`@ai-sdk/openai-compatible`, bundled in the binary), at the proxy's `/v1`,
serving one model, which is also the small model of its title requests.
Nothing but requests to the proxy leaves the machine: no update check, no
models.dev catalogue, no default plugins (npm), no sharing.

    python -m stable_prefix.agents.opencode install

`OpenCode.run_turn()` drives it as the tests do: `opencode run PROMPT` (with
`--continue` for a later turn of the same session, `--agent plan` for plan
mode), in a throwaway HOME (its config, data, cache and state folders all in
it) and a scratch git repository.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stable_prefix.agents import npm_package
from stable_prefix.agents.base import OPENAI_CHAT, STREAMED, CodingAgent, LaneFacts, Launcher, Resends
from stable_prefix.agents.driver import AgentDriver
from stable_prefix.agents.npm_package import is_native_executable
from stable_prefix.pins import Pin

# Pinned (`stable-prefix doctor` sets it against npm's newest): where its date line and reminders sit changes between releases (docs/agents.md).
PIN = Pin("opencode", "npm", "opencode-ai", "1.18.33")
PACKAGE = PIN.package
VERSION = PIN.version
DEFAULT_DIR = npm_package.INSTALL_ROOT / "opencode"
PROVIDER = "stable-prefix"
# Any value: the engine checks no key; opencode sends it as `Authorization: Bearer`.
API_KEY = "local-model"
# What opencode assumes of the model when the config does not say: it compacts a conversation near
# the context limit. The served model's own limit is not known to the stack, so a common one.
DEFAULT_CONTEXT_TOKENS = 32768
OFFLINE_ENVIRONMENT = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",  # the models.dev catalogue
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",  # installed from npm at start
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
}


def stack_config(base_url: str, model: str, max_output_tokens: int, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> dict:
    """The opencode config for a stack whose proxy is at `base_url` serving `model`."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {PROVIDER: {
            "npm": "@ai-sdk/openai-compatible",
            "name": "stable-prefix",
            "options": {"baseURL": f"{base_url}/v1", "apiKey": API_KEY},
            "models": {model: {"name": model, "limit": {"context": context_tokens, "output": max_output_tokens}}},
        }},
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        "autoupdate": False,
        "share": "disabled",
    }


def stack_environment(base_url: str, model: str, max_output_tokens: int) -> dict[str, str]:
    """The variables that point a user's own opencode at a running stack (`stable-prefix up`)."""
    return {"OPENCODE_CONFIG_CONTENT": json.dumps(stack_config(base_url, model, max_output_tokens)), **OFFLINE_ENVIRONMENT}


def find_binary(cli_dir: Path = DEFAULT_DIR) -> Path | None:
    """The native `opencode` binary inside an npm install, or None. The wrapper's postinstall links
    the platform binary to `bin/opencode.exe`; without install scripts it is in the platform package."""
    modules = cli_dir / "node_modules"
    for candidate in (modules / PACKAGE / "bin" / "opencode.exe", *sorted(modules.glob("opencode-*/bin/opencode"))):
        if is_native_executable(candidate):
            return candidate
    return None


def install(cli_dir: Path = DEFAULT_DIR, version: str = VERSION) -> Path:
    """Install the pinned opencode into `cli_dir` unless it is there; return its binary."""
    return npm_package.install_binary(cli_dir, PACKAGE, version, find_binary,
                                      f"a native opencode binary for this platform ({sys.platform}; optional platform package missing?)")


def user_binary(explicit: str | None = None) -> Path:
    """The opencode to launch for a user: `explicit`, else `opencode` on PATH, else the pinned one."""
    return npm_package.user_binary(explicit, "opencode", find_binary(), npm_package.how_to_install(PACKAGE, VERSION, DEFAULT_DIR, "opencode"))


class OpenCode(AgentDriver):
    """`opencode run PROMPT`, its config, data, cache and state folders in the scratch HOME."""

    def stack_environment(self) -> dict[str, str]:
        home = self.project.home
        return {
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",  # no ~/.claude instructions or skills
            **stack_environment(self.base_url, self.model, self.max_output_tokens),
        }

    def turn_arguments(self, prompt: str, *, continue_conversation: bool, agent: str | None = None) -> list[str]:
        """`--continue` resumes the latest session in the project; `agent`: `plan` or `build` mode."""
        return ["run", *(["--continue"] if continue_conversation else []), *(["--agent", agent] if agent else []), prompt]


# `stable-prefix opencode`: a user's own opencode against the running stack (`stable_prefix/launch.py` does the rest).
LAUNCH_HELP = """`stable-prefix opencode [--port N] [--opencode PATH] [opencode arguments]`: opencode against a running stack.

Reads where the stack is from the state file `stable-prefix up` writes, checks
that it answers, and replaces itself with opencode (`opencode` on PATH, or the
pinned one in `.claude-cli/opencode/`) with its configuration in
`OPENCODE_CONFIG_CONTENT` (`stable_prefix/agents/opencode.py: stack_config`), which outranks
the user's and the project's: the proxy as an OpenAI-compatible provider
serving the stack's model (also for titles), the output cap, no update check,
no model catalogue download, no default plugins, no sharing. The user's own
sessions and settings are used otherwise.
"""

# Subagents start with `task`; every request carries `x-session-id`, a subagent's the child session's, with
# `x-parent-session-id`.
AGENT = CodingAgent(
    "opencode", PIN, OPENAI_CHAT, install, fixture="opencode_binary",
    launcher=Launcher("opencode", user_binary, LAUNCH_HELP,
                      environment_for=lambda state, port: stack_environment(state["url"], state["model"], state["max_tokens"])),
    conversation=OpenCode.conversation,
    resends=Resends(after_error_event=STREAMED, after_silent_cut=STREAMED),
    lanes=LaneFacts("opencode/", frozenset({"task"}), session_header="x-session-id", subagent_header="x-parent-session-id",
                    instance_header="x-session-id"),
)


def main() -> None:
    npm_package.install_command(__doc__.splitlines()[0], install, DEFAULT_DIR, PACKAGE)


if __name__ == "__main__":
    main()
