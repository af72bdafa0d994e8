"""Install the real Claude Code CLI (pinned) and run it offline against a local endpoint.

The CLI comes from npm into a git-ignored folder next to the repository
(`.claude-cli/`), never into the user's global npm prefix. Every run gets a
throwaway sandbox: its own HOME, CLAUDE_CONFIG_DIR (with onboarding done, the
dummy API key approved and the working directory trusted, so no dialog waits
for a keypress) and working directory, so nothing of the user's own Claude Code
set-up is read or changed.

    python -m stable_prefix.agents.claude_code install          # idempotent; prints the binary and its version
    python -m stable_prefix.agents.claude_code run --base-url http://127.0.0.1:8080 -- -p "hello"

Two ways to drive it:
- `ClaudeCode.print_turn()`: `claude -p` (and `--continue` for later turns), one
  request per turn on the main lane; the process exits when the turn is done.
- `InteractiveSession`: the full-screen UI under tmux, as a user runs it. It also
  sends side requests (a session-title request per user turn) on their own lane.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.agents import npm_package
from stable_prefix.agents.base import ANTHROPIC, NOT_STREAMED, REQUEST_TIMEOUT_MS, STREAMED, CodingAgent, LaneFacts, Launcher, Resends, Turn
from stable_prefix.agents.npm_package import AgentUnavailable, is_native_executable
from stable_prefix.agents.scratch_project import Sandbox
from stable_prefix.pins import Pin

# Pinned (`stable-prefix doctor` sets it against npm's newest): the request shapes (tools, system blocks, side requests) change between releases.
PIN = Pin("Claude Code", "npm", "@anthropic-ai/claude-code", "2.1.332")
CLI_PACKAGE = PIN.package
CLI_VERSION = PIN.version
DEFAULT_CLI_DIR = npm_package.INSTALL_ROOT
# Any key works offline; Claude Code remembers approval by the key's last 20 characters.
DUMMY_API_KEY = "sk-ant-api03-offline-e2e-0000000000000000000000000000"
# Dialogs the sandbox config answers in advance; seeing one means that config no longer works.
FIRST_RUN_DIALOGS = ("Do you want to use this API key?", "Is this a project you created or one you trust",
                     "Choose the text style", "Select login method")
# What every local run needs besides the URL: no telemetry, error reports or update checks, and
# a timeout long enough for a cold prefill.
OFFLINE_ENVIRONMENT = {
    "API_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS),
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
# Claude Code then says in headers what each request is (a subagent's type, `fork` for a fork, a
# compaction, the request's class): the lanes and the diagnosis read them instead of guessing
# (`addons/lanes.py`). Off by default against a custom base URL.
HINT_HEADERS = {"CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1"}
# Sent as `Authorization: Bearer`: unlike ANTHROPIC_API_KEY, Claude Code asks no approval for it.
LOCAL_AUTH_TOKEN = "local-model"
# The user's own credentials must not go to a local server, and would make Claude Code ask which to use.
CREDENTIAL_VARIABLES = ("ANTHROPIC_API_KEY", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_OAUTH_TOKEN")
# How its requests name their conversation and subagents (`addons/lanes.py`; docs/agents.md has the headers).
AGENT_ID_HEADER = "x-claude-code-agent-id"
SESSION_ID_HEADER = "x-claude-code-session-id"


class ClaudeCodeUnavailable(AgentUnavailable):
    """Claude Code (or claude-code-router) cannot be installed or started here."""


def find_binary(cli_dir: Path = DEFAULT_CLI_DIR) -> Path | None:
    """The native `claude` binary inside an npm install, or None.

    The wrapper package's postinstall copies the platform binary over
    `bin/claude.exe`; when npm skipped install scripts it is still a placeholder,
    and the binary lives in the platform package (`claude-code-<os>-<arch>`).
    """
    modules = cli_dir / "node_modules" / "@anthropic-ai"
    wrapper_binary = modules / "claude-code" / "bin" / "claude.exe"
    if is_native_executable(wrapper_binary):
        return wrapper_binary
    for platform_binary in sorted(modules.glob("claude-code-*/claude")):
        if is_native_executable(platform_binary):
            return platform_binary
    return None


def stack_environment(base_url: str, model: str, max_output_tokens: int) -> dict[str, str]:
    """The variables that point a user's own Claude Code at a running stack (`stable-prefix up`).

    Every model slot names the served model, so the proxy's model mapping has nothing
    to fix and Claude Code shows the real name; the output cap matches the proxy's.
    """
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": LOCAL_AUTH_TOKEN,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output_tokens),
        **OFFLINE_ENVIRONMENT,
        **HINT_HEADERS,
    }


def user_binary(explicit: str | None = None) -> Path:
    """The Claude Code to launch for a user: `explicit`, else `claude` on PATH, else the pinned one in `.claude-cli/`."""
    return npm_package.user_binary(explicit, "claude", find_binary(),
                                   npm_package.how_to_install(CLI_PACKAGE, CLI_VERSION, DEFAULT_CLI_DIR, "claude_code"), ClaudeCodeUnavailable)


def installed_version(binary: Path) -> str | None:
    words = npm_package.version_words(binary)  # `2.1.332 (Claude Code)`
    return words[0] if words else None


def install(cli_dir: Path = DEFAULT_CLI_DIR, version: str = CLI_VERSION) -> Path:
    """Install the pinned CLI into `cli_dir` unless it is already there; return the binary."""
    return npm_package.install_binary(cli_dir, CLI_PACKAGE, version, find_binary,
                                      f"a native `claude` binary for this platform ({sys.platform}; optional platform package missing?)",
                                      ClaudeCodeUnavailable, reported_version=installed_version)


def create_sandbox(root: Path, api_key: str = DUMMY_API_KEY, *, git_repository: bool = False) -> Sandbox:
    """A throwaway HOME, CLAUDE_CONFIG_DIR (`claude-config`) and working directory for one conversation;
    `git_repository`: the working directory is a git repository with one commit, as a user's project is
    (Claude Code then sends its git status)."""
    sandbox = Sandbox.create(root, "claude-config", git_repository=git_repository)
    # Each key answers a first-run dialog that would otherwise wait for a keypress.
    global_config = {
        "hasCompletedOnboarding": True,
        "lastOnboardingVersion": CLI_VERSION,
        "theme": "dark",
        "customApiKeyResponses": {"approved": [api_key[-20:]], "rejected": []},
        "projects": {str(sandbox.workdir.resolve()): {
            "hasTrustDialogAccepted": True,
            "hasCompletedProjectOnboarding": True,
            "allowedTools": [],
        }},
    }
    (sandbox.config_dir / ".claude.json").write_text(json.dumps(global_config, indent=2))
    return sandbox


@dataclass(frozen=True)
class ClaudeCode:
    """The pinned CLI, pointed at `base_url` (our proxy), inside one sandbox; `base_url=None`: no
    ANTHROPIC_BASE_URL (a forward proxy set in `extra_environment`, HTTPS_PROXY and its CA)."""

    binary: Path
    sandbox: Sandbox
    base_url: str | None
    api_key: str = DUMMY_API_KEY
    hint_headers: bool = True  # as `stable-prefix claude` runs it; False: what a plain ANTHROPIC_BASE_URL user sends
    extra_environment: tuple[tuple[str, str], ...] = ()  # e.g. (("CLAUDE_CODE_FORK_SUBAGENT", "1"),)
    # 0: a retry would be a second cold prefill and blur the lanes; None: the CLI's own retries, as a user runs it.
    max_retries: int | None = 0

    def environment(self, *, side_requests: bool = False) -> dict[str, str]:
        """A minimal environment: nothing of the caller's shell leaks in (no real keys, no proxies).

        `side_requests=False` sets CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC, which also
        stops the session-title requests; with True, telemetry, error reporting and
        updates are still off one by one, so the only traffic is to `base_url`.
        """
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.sandbox.home),
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
            "CLAUDE_CONFIG_DIR": str(self.sandbox.config_dir),
            "ANTHROPIC_API_KEY": self.api_key,
            **OFFLINE_ENVIRONMENT,
        }
        if self.max_retries is not None:
            environment["CLAUDE_CODE_MAX_RETRIES"] = str(self.max_retries)
        if not side_requests:
            environment["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
        if self.base_url is not None:
            environment["ANTHROPIC_BASE_URL"] = self.base_url
        if self.hint_headers:
            environment.update(HINT_HEADERS)
        return {**environment, **dict(self.extra_environment)}

    def print_turn(self, prompt: str, *, continue_conversation: bool = False,
                   timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
        """One `claude -p` turn (`--continue` resumes the latest conversation in the workdir)."""
        command = [str(self.binary), "-p", prompt]
        if continue_conversation:
            command.insert(1, "--continue")
        return subprocess.run(command, cwd=self.sandbox.workdir, env=self.environment(), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    @contextlib.contextmanager
    def interactive(self, *, columns: int = 160, rows: int = 50) -> Iterator[InteractiveSession]:
        """The full-screen UI in a detached tmux session, with side requests enabled."""
        tmux = shutil.which("tmux")
        if tmux is None:
            raise ClaudeCodeUnavailable("tmux not found on PATH; the interactive Claude Code run needs it")
        # A private tmux server (-L): the user's own tmux sessions are neither seen nor touched.
        session = InteractiveSession(tmux=tmux, socket=f"claude-e2e-{uuid.uuid4().hex[:8]}")
        # tmux passes its server's environment, not ours, to the pane: `env -i` sets it exactly.
        assignments = [f"{name}={value}" for name, value in self.environment(side_requests=True).items()]
        command = ["env", "-i", *assignments, str(self.binary)]
        session.tmux_command("new-session", "-d", "-s", "claude", "-x", str(columns), "-y", str(rows),
                             "-c", str(self.sandbox.workdir), *command)
        try:
            yield session
        finally:
            session.close()


@dataclass
class InteractiveSession:
    tmux: str
    socket: str
    target: str = "claude"

    def tmux_command(self, *arguments: str, check: bool = True) -> str:
        completed = subprocess.run([self.tmux, "-L", self.socket, *arguments], capture_output=True, text=True)
        if check and completed.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(arguments[:2])} failed: {completed.stderr.strip()}")
        return completed.stdout

    def screen(self) -> str:
        return self.tmux_command("capture-pane", "-p", "-t", self.target, check=False)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Claude Code (tmux -L {self.socket}): {what} did not happen within "
                                   f"{timeout:.0f}s; screen:\n{self.screen()}")
            time.sleep(0.5)

    def wait_until_ready(self, timeout: float = 60.0) -> None:
        """Until the empty input prompt shows; a first-run dialog instead is an error, not a wait."""
        def ready() -> bool:
            screen = self.screen()
            for dialog in FIRST_RUN_DIALOGS:
                if dialog in screen:
                    raise RuntimeError(f"Claude Code shows a first-run dialog ({dialog!r}) although the sandbox's "
                                       f".claude.json should have answered it; screen:\n{screen}")
            return any(line.strip() == "❯" for line in screen.splitlines())
        self.wait_for(ready, "the empty input prompt", timeout)

    def type_message(self, text: str) -> None:
        # Literal text, then Enter as a separate key: a pasted newline would not submit.
        self.tmux_command("send-keys", "-t", self.target, "-l", text)
        time.sleep(0.5)
        self.tmux_command("send-keys", "-t", self.target, "Enter")

    def close(self) -> None:
        socket_path = self.tmux_command("display-message", "-p", "#{socket_path}", check=False).strip()
        self.tmux_command("kill-server", check=False)
        if socket_path:  # tmux leaves the socket file of a killed server behind
            Path(socket_path).unlink(missing_ok=True)


# `stable-prefix claude`: a user's own claude against the running stack (`stable_prefix/launch.py` does the rest).
LAUNCH_HELP = """`stable-prefix claude [--port N] [--claude PATH] [claude arguments]`: Claude Code against a running stack.

Reads where the stack is from the state file `stable-prefix up` writes, checks
that it answers, and replaces itself with Claude Code (`claude` on PATH, or the
pinned one in `.claude-cli/`) in an environment that points it there: base URL,
a local token that needs no approval (so no key prompt), every model slot set
to the served model, the output cap, no telemetry, error reports or update
checks. The user's own Claude Code settings and sessions are used as they are;
their Anthropic credentials are taken out of the environment, not sent.
"""


def conversation(binary: Path, root: Path, base_url: str, model: str, max_output_tokens: int, user_retries: bool):
    """`claude -p`, then `--continue`, in a git repository; `user_retries`: the CLI's own retries, as a user runs it."""
    claude = ClaudeCode(binary, create_sandbox(root, git_repository=True), base_url, max_retries=None if user_retries else 0)
    return lambda prompt, continued, timeout: Turn.of(claude.print_turn(prompt, continue_conversation=continued, timeout=timeout))


AGENT = CodingAgent(
    "claude", PIN, ANTHROPIC, install, fixture="claude_binary",
    launcher=Launcher("claude", user_binary, LAUNCH_HELP, removed=CREDENTIAL_VARIABLES,
                      environment_for=lambda state, port: stack_environment(state["url"], state["model"], state["max_tokens"])),
    conversation=conversation,
    resends=Resends(after_error_event=NOT_STREAMED, after_silent_cut=STREAMED),
    # Subagents start with `Task`/`Agent`; a subagent's requests carry its (random) agent id, every request the session's.
    lanes=LaneFacts("claude-cli/", frozenset({"Task", "Agent"}), session_header=SESSION_ID_HEADER, subagent_header=AGENT_ID_HEADER,
                    instance_header=AGENT_ID_HEADER, random_ids=True),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    install_parser = commands.add_parser("install", help=f"install {CLI_PACKAGE}@{CLI_VERSION} (idempotent)")
    install_parser.add_argument("--cli-dir", type=Path, default=DEFAULT_CLI_DIR)
    run_parser = commands.add_parser("run", help="run the CLI in a throwaway sandbox against --base-url")
    run_parser.add_argument("--cli-dir", type=Path, default=DEFAULT_CLI_DIR)
    run_parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080 (the mitmdump proxy)")
    run_parser.add_argument("--sandbox", type=Path, required=True, help="folder for HOME, config and workdir")
    run_parser.add_argument("arguments", nargs=argparse.REMAINDER, help="arguments for claude, after --")
    args = parser.parse_args()
    try:
        binary = install(args.cli_dir)
    except ClaudeCodeUnavailable as error:
        sys.exit(f"error: {error}")
    if args.command == "install":
        print(f"{binary} ({installed_version(binary)})")
        return
    claude = ClaudeCode(binary=binary, sandbox=create_sandbox(args.sandbox), base_url=args.base_url)
    arguments = [argument for argument in args.arguments if argument != "--"]
    sys.exit(subprocess.call([str(binary), *arguments], cwd=claude.sandbox.workdir, env=claude.environment()))


if __name__ == "__main__":
    main()
