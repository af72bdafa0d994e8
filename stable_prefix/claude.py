"""`stable-prefix claude [--port N] [--claude PATH] [claude arguments]`: Claude Code against a running stack.

Reads where the stack is from the state file `stable-prefix up` writes, checks
that it answers, and replaces itself with Claude Code (`claude` on PATH, or the
pinned one in `.claude-cli/`) in an environment that points it there: base URL,
a local token that needs no approval (so no key prompt), every model slot set
to the served model, the output cap, no telemetry, error reports or update
checks. The user's own Claude Code settings and sessions are used as they are;
their Anthropic credentials are taken out of the environment, not sent.
"""

from __future__ import annotations

import json
import os
import sys

from stable_prefix.stack import DEFAULT_PORT, stack_state_path
from stable_prefix.tools.claude_code import CREDENTIAL_VARIABLES, ClaudeCodeUnavailable, stack_environment, user_binary
from stable_prefix.tools.servers import http_ok

USAGE = "usage: stable-prefix claude [--port N] [--claude PATH] [claude arguments...]"


class CannotLaunch(Exception):
    """A usage error, or no running stack: the message says which and what to do."""


def split_arguments(argv: list[str], binary_flag: str = "--claude", usage: str = USAGE) -> tuple[int, str | None, list[str]]:
    """Our flags (`--port`, and `binary_flag` naming the agent's binary) come
    first; everything from the first other argument on is the agent's."""
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


def main(argv: list[str]) -> int:
    try:
        port, explicit_binary, claude_arguments = split_arguments(argv)
        state = stack_state(port)
        binary = user_binary(explicit_binary)
    except (CannotLaunch, ClaudeCodeUnavailable) as error:
        print(f"stable-prefix claude: {error}", file=sys.stderr)
        return 2
    environment = {name: value for name, value in os.environ.items() if name not in CREDENTIAL_VARIABLES}
    environment.update(stack_environment(state["url"], state["model"], state["max_tokens"]))
    sys.stdout.flush()
    os.execve(binary, [str(binary), *claude_arguments], environment)
    return 0  # not reached: exec replaced this process
