"""What `stable-prefix claude|opencode|qwen|codex|pi` share: our flags first, the running stack's state,
and replacing this process with the agent, pointed at the stack by its environment or its arguments.

Each agent's own part (which binary, which variables or options) is its record's `Launcher`
(`agents/base.py`; the record `AGENT` in `agents/claude_code.py`, `opencode.py`, `qwen_code.py`, `codex_cli.py`, `pi.py`),
beside its install and environment; `CodingAgent.launch` calls `launch` with it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from stable_prefix.agents.npm_package import AgentUnavailable
from stable_prefix.servers import http_ok
from stable_prefix.stack_state import DEFAULT_PORT, stack_state_path


class CannotLaunch(Exception):
    """A usage error, or no running stack: the message says which and what to do."""


def split_arguments(argv: list[str], binary_flag: str, usage: str) -> tuple[int, str | None, list[str]]:
    """Our flags (`--port N`, `binary_flag PATH`) come first; everything from the first other argument on is the agent's."""
    port, binary = DEFAULT_PORT, None
    while argv and argv[0] in ("--port", binary_flag):
        if len(argv) < 2:
            raise CannotLaunch(f"{argv[0]} needs a value\n{usage}")
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--port":
            if not value.isdigit():
                raise CannotLaunch(f"--port {value!r}: not a port number\n{usage}")
            port = int(value)
        else:
            binary = value
    return port, binary, argv


def stack_state(port: int) -> dict:
    path = stack_state_path(port)
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise CannotLaunch(f"no stack is running on port {port} ({path} does not exist). "
                           f"Start one with `stable-prefix up MODEL{'' if port == DEFAULT_PORT else f' --port {port}'}`.") from None
    except (OSError, ValueError) as error:
        raise CannotLaunch(f"{path}: cannot be read ({error})") from None
    if not http_ok(f"{state['url']}/v1/models", timeout=10):
        raise CannotLaunch(f"the stack recorded in {path} does not answer at {state['url']} (did `stable-prefix up` stop?)")
    return state


HELP_FLAGS = ("-h", "--help")


def help_text(command: str, usage: str, description: str) -> str:
    """What `stable-prefix COMMAND --help` prints: the usage, what the command does (its module's
    docstring, past the first line, which repeats the usage) and where the agent's own help is."""
    what_it_does = description.split("\n", 1)[1].strip() if "\n" in description else description.strip()
    return (f"{usage}\n\n{what_it_does}\n\n"
            f"Our options come first: --port N (the stack `stable-prefix up` started on that port; default {DEFAULT_PORT}) "
            f"and the agent's binary; every argument from the first other one on is the agent's "
            f"(`stable-prefix {command} --port {DEFAULT_PORT} --help` shows the agent's own help, through the stack).")


def launch(command: str, argv: list[str], binary_flag: str, usage: str, find_binary: Callable[[str | None], Path],
           description: str, *, environment_for: Callable[[dict, int], dict[str, str]] | None = None,
           arguments_for: Callable[[dict, int], list[str]] | None = None, removed: tuple[str, ...] = ()) -> int:
    """Replace this process with the agent: `find_binary(explicit)` names it; `environment_for(state, port)`
    gives the variables that point it at the stack, `arguments_for(state, port)` the options that go before
    the user's own (both: the stack's state file); `removed` leave the user's environment first. A first
    argument `-h`/`--help` prints `help_text` (`description`: the launcher module's docstring), stack or not."""
    if argv[:1] and argv[0] in HELP_FLAGS:
        print(help_text(command, usage, description))
        return 0
    try:
        port, explicit_binary, agent_arguments = split_arguments(argv, binary_flag, usage)
        state = stack_state(port)
        binary = find_binary(explicit_binary)
    except (CannotLaunch, AgentUnavailable) as error:
        print(f"stable-prefix {command}: {error}", file=sys.stderr)
        return 2
    environment = {name: value for name, value in os.environ.items() if name not in removed}
    environment.update(environment_for(state, port) if environment_for else {})
    stack_arguments = arguments_for(state, port) if arguments_for else []
    sys.stdout.flush()
    os.execve(binary, [str(binary), *stack_arguments, *agent_arguments], environment)
    return 0  # not reached: exec replaced this process
