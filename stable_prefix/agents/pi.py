"""Pi (`@mariozechner/pi-coding-agent`, pinned) from npm, pointed at our proxy's OpenAI path, run offline.

Installed into `.claude-cli/pi/` (`stable_prefix/agents/npm_package.py`). It declares node
>= 20.6, so the node on PATH is used. Pi reads custom providers from
`~/.pi/agent/models.json`, a file the user owns (it holds their own providers
too), so the stack's provider comes in another way Pi offers: an extension
file of ours, loaded with `--extension`, that registers one provider,
`stable-prefix` (`openai-completions` at the proxy's `/v1`, the served model,
the output cap as its `maxTokens`, sent as `max_tokens`); `--provider` and
`--model` select it for the run. Nothing of the user's agent folder is
written. `PI_OFFLINE=1` turns off its startup network calls (update checks,
install telemetry).

    python -m stable_prefix.agents.pi install

`Pi.run_turn()` drives it as the tests do: `pi -p PROMPT` (print mode: one
prompt, tools run until the model answers, then exit; `--continue` resumes
the project's latest session), in a throwaway HOME (its agent folder and
sessions in it) and a scratch git repository.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from stable_prefix.addons.capture_folder import write_private
from stable_prefix.agents import npm_package
from stable_prefix.agents.base import OPENAI_CHAT, STREAMED, CodingAgent, LaneFacts, Launcher, Resends
from stable_prefix.agents.driver import AgentDriver
from stable_prefix.agents.npm_package import AgentUnavailable
from stable_prefix.pins import Pin
from stable_prefix.stack_state import stack_state_path

# Pinned (`stable-prefix doctor` sets it against npm's newest): what its system prompt holds (date, working directory) and where changes between releases.
PIN = Pin("Pi", "npm", "@mariozechner/pi-coding-agent", "0.73.1")
PACKAGE = PIN.package
VERSION = PIN.version
DEFAULT_DIR = npm_package.INSTALL_ROOT / "pi"
PROVIDER = "stable-prefix"
# Any value: the engine checks no key; Pi sends it as `Authorization: Bearer`.
API_KEY = "local-model"
# What Pi assumes of a model the config does not describe is 128,000 tokens; it compacts near the
# limit. The served model's own limit is not known to the stack, so a common one (as for opencode).
DEFAULT_CONTEXT_TOKENS = 32768
OFFLINE_ENVIRONMENT = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}


def provider_config(base_url: str, model: str, max_output_tokens: int, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> dict:
    """The `pi.registerProvider` config for a stack whose proxy is at `base_url` serving `model`.

    `compat` is read from the model only (a registered provider's own is not merged in): vllm-mlx
    knows neither the `developer` role, `reasoning_effort` nor `store`, and caps `max_tokens`;
    `sendSessionAffinityHeaders` makes Pi name its session in a `session_id` header on every
    request, which is how the proxy tells its conversations apart (`addons/lanes.py`)."""
    compat = {"supportsDeveloperRole": False, "supportsReasoningEffort": False, "supportsStore": False,
              "maxTokensField": "max_tokens", "sendSessionAffinityHeaders": True}
    return {
        "name": "stable-prefix",
        "baseUrl": f"{base_url}/v1",
        "apiKey": API_KEY,
        "api": "openai-completions",
        "models": [{"id": model, "name": model, "reasoning": False, "input": ["text"], "compat": compat,
                    "contextWindow": context_tokens, "maxTokens": max_output_tokens,
                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}],
    }


def extension_source(base_url: str, model: str, max_output_tokens: int) -> str:
    """A Pi extension (ES module) that registers the stack's provider."""
    config = json.dumps(provider_config(base_url, model, max_output_tokens), indent=2)
    return ("// Written by stable-prefix: the stack's OpenAI-compatible provider for Pi (stable_prefix/agents/pi.py).\n"
            f"export default function (pi) {{\n  pi.registerProvider({json.dumps(PROVIDER)}, {config});\n}}\n")


def write_extension(path: Path, base_url: str, model: str, max_output_tokens: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(extension_source(base_url, model, max_output_tokens))
    return path


def stack_arguments(extension: Path, model: str) -> list[str]:
    """The options, before the user's own, that load the stack's provider and select its model."""
    return ["--extension", str(extension), "--provider", PROVIDER, "--model", model]


def find_cli(cli_dir: Path = DEFAULT_DIR) -> Path | None:
    """npm's `pi` link (to `dist/cli.js`, a node script), or None."""
    return npm_package.bin_link(cli_dir, "pi")


def install(cli_dir: Path = DEFAULT_DIR, version: str = VERSION) -> Path:
    """Install the pinned Pi into `cli_dir` unless it is there; return its `pi`."""
    if shutil.which("node") is None:
        raise AgentUnavailable("node not found on PATH; Pi needs node >= 20.6")
    return npm_package.install_binary(cli_dir, PACKAGE, version, find_cli, "node_modules/.bin/pi")


def user_binary(explicit: str | None = None) -> Path:
    """The Pi to launch for a user: `explicit`, else `pi` on PATH, else the pinned one."""
    return npm_package.user_binary(explicit, "pi", find_cli(), npm_package.how_to_install(PACKAGE, VERSION, DEFAULT_DIR, "pi"))


class Pi(AgentDriver):
    """`pi -p PROMPT` with the stack's provider in an extension of ours; Pi's agent folder and sessions are the
    scratch HOME's `.pi`."""

    @property
    def extension_path(self) -> Path:
        return self.project.home / "stable-prefix-provider.js"

    def stack_environment(self) -> dict[str, str]:
        return {"TERM": "dumb", **OFFLINE_ENVIRONMENT}

    def turn_arguments(self, prompt: str, *, continue_conversation: bool) -> list[str]:
        """`--continue` resumes the project's latest session."""
        extension = write_extension(self.extension_path, self.base_url, self.model, self.max_output_tokens)
        return [*stack_arguments(extension, self.model), *(["--continue"] if continue_conversation else []), "-p", prompt]


# `stable-prefix pi`: a user's own pi against the running stack (`stable_prefix/launch.py` does the rest).
LAUNCH_HELP = """`stable-prefix pi [--port N] [--pi PATH] [pi arguments]`: Pi against a running stack.

Reads where the stack is from the state file `stable-prefix up` writes, checks
that it answers, writes a Pi extension for it next to that file
(`pi-provider-PORT.js`, 0600; `stable_prefix/agents/pi.py: extension_source`: one provider,
`stable-prefix`, OpenAI-compatible at the proxy, serving the stack's model
with the output cap) and replaces itself with Pi (`pi` on PATH, or the pinned
one in `.claude-cli/pi/`), told to load that extension and use that model
(`--extension`, `--provider`, `--model`, before the user's arguments), with no
update check or install telemetry. Pi's own folder (`~/.pi/agent`: its
`models.json`, settings, sessions, keys) is used as it is and never written
for the stack.
"""


def launch_arguments(state: dict, port: int) -> list[str]:
    extension = stack_state_path(port).with_name(f"pi-provider-{port}.js")
    write_private(extension, extension_source(state["url"], state["model"], state["max_tokens"]))
    return stack_arguments(extension, state["model"])


# Its User-Agent is any OpenAI JS SDK client's, so the `session_id` header (its session, with the provider we
# register) must be there too; it starts no subagents, and loses the turn to an error event.
AGENT = CodingAgent(
    "pi", PIN, OPENAI_CHAT, install, fixture="pi_cli",
    launcher=Launcher("pi", user_binary, LAUNCH_HELP, environment_for=lambda state, port: dict(OFFLINE_ENVIRONMENT),
                      arguments_for=launch_arguments),
    conversation=Pi.conversation,
    resends=Resends(after_error_event=None, after_silent_cut=STREAMED),
    lanes=LaneFacts("OpenAI/JS", session_header="session_id", identifying_header="session_id"),
)


def main() -> None:
    npm_package.install_command(__doc__.splitlines()[0], install, DEFAULT_DIR, PACKAGE)


if __name__ == "__main__":
    main()
