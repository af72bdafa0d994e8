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

from stable_prefix.agents.claude_code import CREDENTIAL_VARIABLES, stack_environment, user_binary
from stable_prefix.launch import launch

USAGE = "usage: stable-prefix claude [--port N] [--claude PATH] [claude arguments...]"


def main(argv: list[str]) -> int:
    return launch("claude", argv, "--claude", USAGE, user_binary, __doc__,
                  environment_for=lambda state, port: stack_environment(state["url"], state["model"], state["max_tokens"]),
                  removed=CREDENTIAL_VARIABLES)
