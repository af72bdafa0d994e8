"""Install the real Codex CLI (pinned) and run it offline against a local Responses endpoint.

Codex CLI (npm `@openai/codex`) speaks only the Responses API (`wire_api =
"responses"`; the chat-completions wire is gone). The npm package is a small
node launcher over a native binary in a platform package
(`@openai/codex-linux-x64` and kin, `vendor/<target>/bin/codex`); the binary
is what runs, so node's version does not matter (node 20 here). It comes from
npm into a git-ignored folder next to the repository (`.codex-cli/`), never
into the user's global npm prefix.

Every run gets a throwaway sandbox: its own HOME, CODEX_HOME (where Codex keeps
its config, sessions and state, with a `config.toml` written for the stack: a
custom model provider on loopback, no analytics, no feedback uploads, no
update check, no plugin marketplace, no retries) and a working directory that
is a git repository.

    python -m stable_prefix.agents.codex_cli install     # idempotent; prints the binary and its version

(Against a running stack, as a user: `stable-prefix codex`, its record's `Launcher` below.)

`Codex.exec_turn()` drives it non-interactively: `codex exec PROMPT` starts a
conversation, `codex exec resume SESSION PROMPT` continues one; each is one
process whose requests end with its turn (a tool call is one more request).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.agents import npm_package
from stable_prefix.agents.base import REQUEST_TIMEOUT_MS, RESPONSES, STREAMED, CodingAgent, LaneFacts, Launcher, Resends
from stable_prefix.agents.base import Turn as CliTurn
from stable_prefix.agents.npm_package import AgentUnavailable, is_native_executable
from stable_prefix.agents.scratch_project import Sandbox
from stable_prefix.pins import Pin
from stable_prefix.servers import REPO_ROOT

# Pinned (`stable-prefix doctor` sets it against npm's newest): the request shapes (developer messages, tools, item ids) change between releases.
PIN = Pin("Codex CLI", "npm", "@openai/codex", "0.171.0")
CLI_PACKAGE = PIN.package
CLI_VERSION = PIN.version
DEFAULT_CLI_DIR = REPO_ROOT / ".codex-cli"
PROVIDER_ID = "stable-prefix"
# npm's platform packages, by (system, machine).
PLATFORM_PACKAGES = {("Linux", "x86_64"): "codex-linux-x64", ("Linux", "aarch64"): "codex-linux-arm64",
                     ("Darwin", "x86_64"): "codex-darwin-x64", ("Darwin", "arm64"): "codex-darwin-arm64"}


class CodexUnavailable(AgentUnavailable):
    """Codex CLI cannot be installed or started here."""


def stack_settings(base_url: str, model: str) -> dict:
    """Codex's configuration for a stack whose proxy is at `base_url`: the served
    model through a custom provider speaking the Responses API (no key: the
    engine checks none), nothing sent anywhere else. The stream may be silent
    for as long as a cold prefill takes. Plugins are off: with them on, every
    start looks up github.com, api.github.com and chatgpt.com (the plugin
    marketplace; seen with strace on 0.171.0, none of it otherwise)."""
    return {
        "model": model,
        "model_provider": PROVIDER_ID,
        "check_for_update_on_startup": False,
        "analytics": {"enabled": False},
        "feedback": {"enabled": False},
        "features": {"plugins": False},
        "otel": {"exporter": "none", "trace_exporter": "none", "metrics_exporter": "none"},
        "model_providers": {PROVIDER_ID: {
            "name": "stable-prefix (local)",
            "base_url": f"{base_url.rstrip('/')}/v1",
            "wire_api": "responses",
            "stream_idle_timeout_ms": REQUEST_TIMEOUT_MS,
        }},
    }


def toml_value(value) -> str:
    """A TOML value for the settings' scalars and inline tables (`-c key=value` takes the same)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(key)} = {toml_value(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def config_toml(settings: dict) -> str:
    """`config.toml` text: top-level keys, then one table per dict (nested dicts inline)."""
    lines = [f"{key} = {toml_value(value)}" for key, value in settings.items() if not isinstance(value, dict)]
    for table, entries in settings.items():
        if isinstance(entries, dict):
            lines += ["", f"[{table}]"] + [f"{json.dumps(key)} = {toml_value(value)}" for key, value in entries.items()]
    return "\n".join(lines) + "\n"


def config_overrides(settings: dict) -> list[str]:
    """The settings as `-c key=value` arguments, one per entry of a table
    (`model_providers.stable-prefix={...}`): each is merged into the user's own
    configuration, which keeps its other providers and settings."""
    arguments = []
    for key, value in settings.items():
        entries = value.items() if isinstance(value, dict) else [(None, value)]
        for name, item in entries:
            arguments += ["-c", f"{key}.{name}={toml_value(item)}" if name else f"{key}={toml_value(item)}"]
    return arguments


def find_binary(cli_dir: Path = DEFAULT_CLI_DIR) -> Path | None:
    """The native `codex` binary inside an npm install (its platform package), or None."""
    package = PLATFORM_PACKAGES.get((platform.system(), platform.machine()))
    if package is None:
        return None
    for binary in sorted((cli_dir / "node_modules" / "@openai" / package / "vendor").glob("*/bin/codex")):
        if is_native_executable(binary):
            return binary
    return None


def installed_version(binary: Path) -> str | None:
    words = npm_package.version_words(binary)  # `codex-cli 0.171.0`
    return words[-1] if words else None


def install(cli_dir: Path = DEFAULT_CLI_DIR, version: str = CLI_VERSION) -> Path:
    """Install the pinned CLI into `cli_dir` unless it is already there; return the binary."""
    return npm_package.install_binary(cli_dir, CLI_PACKAGE, version, find_binary,
                                      f"a native `codex` binary for this platform ({platform.system()} {platform.machine()})",
                                      CodexUnavailable, reported_version=installed_version)


def user_binary(explicit: str | None = None) -> Path:
    """The Codex to launch for a user: `explicit`, else `codex` on PATH, else the pinned one in `.codex-cli/`."""
    return npm_package.user_binary(explicit, "codex", find_binary(),
                                   npm_package.how_to_install(CLI_PACKAGE, CLI_VERSION, DEFAULT_CLI_DIR, "codex_cli"), CodexUnavailable)


def create_sandbox(root: Path, base_url: str, model: str, *, client_retries: bool = False) -> Sandbox:
    """A throwaway HOME, CODEX_HOME (`codex-home`, its `config.toml` pointing at the stack) and git repository for
    Codex runs; `client_retries`: Codex retries a failed request or a cut stream as it does for a user
    (`stable-prefix codex`); off by default, where a retry would be a second cold prefill."""
    sandbox = Sandbox.create(root, "codex-home")
    settings = stack_settings(base_url, model)
    if not client_retries:
        settings["model_providers"][PROVIDER_ID]["request_max_retries"] = 0
        settings["model_providers"][PROVIDER_ID]["stream_max_retries"] = 0
    (sandbox.config_dir / "config.toml").write_text(config_toml(settings))
    return sandbox


@dataclass(frozen=True)
class Turn:
    """One `codex exec` run: its session id (from the `--json` events), last message and exit status."""

    session: str | None
    reply: str
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Codex:
    """The pinned CLI inside one sandbox (whose config points it at the stack)."""

    binary: Path
    sandbox: Sandbox

    def environment(self) -> dict[str, str]:
        """A minimal environment: nothing of the caller's shell leaks in (no keys, no proxies)."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.sandbox.home),
                "CODEX_HOME": str(self.sandbox.config_dir), "LANG": "C.UTF-8", "TERM": "dumb"}

    def exec_turn(self, prompt: str, *, resume: str | None = None, timeout: float = 900.0, extra: tuple[str, ...] = ()) -> Turn:
        """`codex exec PROMPT`, or `codex exec resume SESSION PROMPT`; `extra`: more exec options (`-c key=value`)."""
        last_message = self.sandbox.home / "last-message.txt"
        last_message.unlink(missing_ok=True)
        # --strict-config: a key this release does not know (the sandbox's config is ours) is an error, not ignored.
        command = [str(self.binary), "exec", "--strict-config", "--json", "--color", "never", "-o", str(last_message), *extra]
        command += ["resume", resume, prompt] if resume else [prompt]
        completed = subprocess.run(command, cwd=self.sandbox.workdir, env=self.environment(), capture_output=True,
                                   text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        session = next((event["thread_id"] for event in _json_lines(completed.stdout) if event.get("type") == "thread.started"), None)
        reply = last_message.read_text() if last_message.exists() else ""
        return Turn(session, reply, completed.returncode, completed.stdout, completed.stderr)


def _json_lines(text: str) -> list[dict]:
    events = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


# `stable-prefix codex`: a user's own codex against the running stack (`stable_prefix/launch.py` does the rest).
LAUNCH_HELP = """`stable-prefix codex [--port N] [--codex PATH] [codex arguments]`: Codex CLI against a running stack.

Reads where the stack is from the state file `stable-prefix up` writes, checks
that it answers, and replaces itself with Codex (`codex` on PATH, or the pinned
one in `.codex-cli/`), its configuration set for this run on its command line
(`-c key=value`, merged into the user's own `config.toml`, which is neither
read here nor changed): the served model through a custom provider at the
proxy speaking the Responses API, no analytics, no feedback uploads, no update
check, no plugins (their marketplace is on github.com and chatgpt.com;
`stable-prefix codex --enable plugins` turns them back on: a later option wins). The user's own Codex home (sessions, other providers, settings) is used
as it is; no key is sent (the provider names none), so OpenAI credentials
stay where they are. Any Codex command works: `stable-prefix codex`,
`stable-prefix codex exec "..."`, `stable-prefix codex exec resume --last "..."`.
"""


def stack_options(state: dict) -> list[str]:
    """The stack's configuration as root options, before the user's arguments, so every subcommand gets them."""
    return config_overrides(stack_settings(state["url"], state["model"]))


def conversation(binary: Path, root: Path, base_url: str, model: str, max_output_tokens: int, user_retries: bool):
    """`codex exec`, then `codex exec resume SESSION` of the session the first turn started."""
    codex = Codex(binary, create_sandbox(root, base_url, model, client_retries=user_retries))
    session: dict[str, str | None] = {"id": None}

    def turn(prompt: str, continued: bool, timeout: float) -> CliTurn:
        result = codex.exec_turn(prompt, resume=session["id"] if continued else None, timeout=timeout)
        session["id"] = session["id"] or result.session
        return CliTurn(result.returncode, result.reply.strip(), result.stdout, result.stderr)

    return turn


# `codex_exec/0.171.0 (...)` from `codex exec`; the other front ends' originators start with `codex_` too. Every request
# carries `session-id`; no subagents reach a self-hosted server (its agents are a `namespace` tool, which vllm-mlx
# does not convert).
AGENT = CodingAgent(
    "codex", PIN, RESPONSES, install, fixture="codex_binary",
    launcher=Launcher("codex", user_binary, LAUNCH_HELP, arguments_for=lambda state, port: stack_options(state)),
    conversation=conversation,
    resends=Resends(after_error_event=STREAMED, after_silent_cut=STREAMED),
    lanes=LaneFacts("codex_", session_header="session-id"),
)


def main() -> None:
    npm_package.install_command(__doc__.splitlines()[0], install, DEFAULT_CLI_DIR, CLI_PACKAGE)


if __name__ == "__main__":
    main()
