"""`stable-prefix opencode [--port N] [--opencode PATH] [opencode arguments]`: opencode against a running stack.

Reads where the stack is from the state file `stable-prefix up` writes, checks
that it answers, and replaces itself with opencode (`opencode` on PATH, or the
pinned one in `.claude-cli/opencode/`) with its configuration in
`OPENCODE_CONFIG_CONTENT` (`stable_prefix/agents/opencode.py: stack_config`), which outranks
the user's and the project's: the proxy as an OpenAI-compatible provider
serving the stack's model (also for titles), the output cap, no update check,
no model catalogue download, no default plugins, no sharing. The user's own
sessions and settings are used otherwise.
"""

from __future__ import annotations

from stable_prefix.agents.opencode import stack_environment, user_binary
from stable_prefix.launch import launch

USAGE = "usage: stable-prefix opencode [--port N] [--opencode PATH] [opencode arguments...]"


def main(argv: list[str]) -> int:
    return launch("opencode", argv, "--opencode", USAGE, user_binary, __doc__,
                  environment_for=lambda state, port: stack_environment(state["url"], state["model"], state["max_tokens"]))
