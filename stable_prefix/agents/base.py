"""What every coding agent is: one record (`CodingAgent`), the same fields for all, as `addons/rules/base.py` is for the
proxy's rules.

An agent's module defines its record, `AGENT`, beside the code the record names (its pin, `PIN`, its install, its
launcher, its driver); `stable_prefix/agents/roster.py` lists the records, and everything that treats agents alike
reads them there: `stable-prefix doctor`, the `stable-prefix <agent>` commands (`stable_prefix/cli.py`), the bench's
clients (`bench/clients/cli_agents.py`, `agent_clients.py`), the tests' install fixtures (`tests/conftest.py`) and the
proxy's lanes (`addons/lanes.py`, which reads `lanes`: nothing here may import more than the standard library and the
CLI's own light modules, since the proxy imports it).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.launch import launch
from stable_prefix.pins import Pin

# The API an agent speaks to the stack.
ANTHROPIC = "anthropic"  # Anthropic messages
OPENAI_CHAT = "openai"  # OpenAI chat completions
RESPONSES = "responses"  # OpenAI's Responses API
PROTOCOLS = (ANTHROPIC, OPENAI_CHAT, RESPONSES)

# How an agent sends a request again after its stream was cut (`Resends`).
STREAMED, NOT_STREAMED = "streamed", "not streamed"

# A cold prompt can take minutes to prefill on a CPU: how long every agent the tests drive waits for an answer (a
# client's default, 10 minutes for Claude Code, would give up and retry: a second cold prefill).
REQUEST_TIMEOUT_MS = 30 * 60 * 1000


@dataclass(frozen=True)
class Resends:
    """What an agent does when the stream it reads is cut, measured with its real CLI (`bench/probes/agent_cuts.py`,
    the proxy's own recovery off; `tests/bench/clients/test_agent_clients.py` checks these against the committed run): how it
    sends the request again, STREAMED, NOT_STREAMED or None (it does not: the turn is lost), after the stream ended
    with the protocol's error event (the proxy's default) and after a silent cut. No agent sends a request again on
    an error status (none measured: the routers retry a request refused before any answer)."""

    after_error_event: str | None
    after_silent_cut: str | None


@dataclass(frozen=True)
class LaneFacts:
    """How an agent's requests say whose they are and which conversation and subagent they belong to: what the
    proxy's lanes read (`addons/lanes.py`)."""

    user_agent: str  # how its User-Agent header starts
    subagent_tools: frozenset[str] = frozenset()  # the tools its main agent starts subagents with
    session_header: str | None = None  # names the main agent's conversation
    subagent_header: str | None = None  # present on a subagent's requests only
    instance_header: str | None = None  # names the subagent instance
    instance_by_first_prompt: bool = False  # no header does: its first prompt names the instance
    random_ids: bool = False  # its instance ids are random from the first character (else they are hashed for a name)
    identifying_header: str | None = None  # its User-Agent is shared with other clients: this header must be there too


@dataclass(frozen=True)
class Launcher:
    """How `stable-prefix <agent>` replaces itself with the user's own agent, pointed at the running stack
    (`stable_prefix/launch.py` does what all share: our flags, the stack's state file, the exec)."""

    binary: str  # the executable's name on PATH; `--<binary> PATH` names another
    user_binary: Callable[[str | None], Path]  # the binary to run: the one named, else on PATH, else the pinned one
    help: str  # what `--help` prints after the usage
    environment_for: Callable[[dict, int], dict[str, str]] | None = None  # (stack state, port) -> the variables
    arguments_for: Callable[[dict, int], list[str]] | None = None  # (stack state, port) -> options before the user's
    removed: tuple[str, ...] = ()  # variables of the user's taken out first (credentials that must not reach the stack)


@dataclass(frozen=True)
class Turn:
    """One non-interactive turn of an agent's CLI: its exit status, its answer as printed and its output."""

    returncode: int
    reply: str
    stdout: str
    stderr: str

    @classmethod
    def of(cls, completed: subprocess.CompletedProcess[str]) -> Turn:
        """A CLI that prints its answer: the answer is its output, stripped."""
        return cls(completed.returncode, completed.stdout.strip(), completed.stdout, completed.stderr)


# (binary, scratch root, proxy URL, served model, output cap, user_retries) -> turn(prompt, continued, timeout)
Conversation = Callable[[Path, Path, str, str, int, bool], Callable[[str, bool, float], Turn]]


@dataclass(frozen=True)
class CodingAgent:
    """One coding agent: what it is, how it is installed, launched and driven, how it takes a cut stream, how its
    requests name their lanes."""

    key: str  # its command (`stable-prefix <key>`) and its name in the bench and the tests
    pin: Pin  # its package and pinned version, defined in its module and nowhere else (the doctor reads it here)
    protocol: str  # ANTHROPIC, OPENAI_CHAT or RESPONSES
    install: Callable[[], Path]  # the pinned install, idempotent: the binary (or entry) it runs
    fixture: str  # the tests' session fixture that installs it (`tests/conftest.py` makes one per record)
    launcher: Launcher | None = None  # `stable-prefix <key>`; None: `launched_by` says how a user points it at a stack
    launched_by: str = ""
    conversation: Conversation | None = None  # one conversation of non-interactive turns in a scratch project
    resends: Resends | None = None  # None: not measured
    lanes: LaneFacts | None = None  # None: its requests are another agent's (claude-code-router and the SDK send Claude Code's)

    @property
    def name(self) -> str:
        return self.pin.name

    @property
    def release(self) -> str:
        """Its name with its pinned version, e.g. `Claude Code 2.1.332`."""
        return f"{self.pin.name} {self.pin.version}"

    @property
    def resends_after_error_event(self) -> bool:
        """Whether it sends a request again when its stream ends with the protocol's error event (Qwen Code and Pi
        lose the turn to one, and send it again only after a silent cut); unmeasured agents are taken to."""
        return self.resends is None or self.resends.after_error_event is not None

    @property
    def usage(self) -> str:
        """`stable-prefix <key>`'s usage line (an agent with a launcher)."""
        binary = self._launcher().binary
        return f"usage: stable-prefix {self.key} [--port N] [--{binary} PATH] [{binary} arguments...]"

    @property
    def command_help(self) -> str:
        """The command's line in `stable-prefix --help` (an agent with a launcher)."""
        binary = self._launcher().binary
        return f"{self.name} against the running stack: {self.key} [--port 8080] [{binary} arguments]"

    def launch(self, argv: list[str]) -> int:
        """`stable-prefix <key> ARGS`: the user's own agent against the running stack."""
        launcher = self._launcher()
        return launch(self.key, argv, f"--{launcher.binary}", self.usage, launcher.user_binary, launcher.help,
                      environment_for=launcher.environment_for, arguments_for=launcher.arguments_for, removed=launcher.removed)

    def _launcher(self) -> Launcher:
        if self.launcher is None:
            raise ValueError(f"{self.name} has no `stable-prefix {self.key}` command; a user runs it so: {self.launched_by}")
        return self.launcher
