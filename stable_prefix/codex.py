"""`stable-prefix codex [--port N] [--codex PATH] [codex arguments]`: Codex CLI against a running stack.

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

from __future__ import annotations

import os
import sys

from stable_prefix.claude import CannotLaunch, split_arguments, stack_state
from stable_prefix.tools.codex_cli import CodexUnavailable, config_overrides, stack_settings, user_binary

USAGE = "usage: stable-prefix codex [--port N] [--codex PATH] [codex arguments...]"


def command_line(binary: str, state: dict, codex_arguments: list[str]) -> list[str]:
    """Codex with the stack's configuration first (root options, so every subcommand gets them)."""
    return [binary, *config_overrides(stack_settings(state["url"], state["model"])), *codex_arguments]


def main(argv: list[str]) -> int:
    try:
        port, explicit_binary, codex_arguments = split_arguments(argv, "--codex", USAGE)
        state = stack_state(port)
        binary = user_binary(explicit_binary)
    except (CannotLaunch, CodexUnavailable) as error:
        print(f"stable-prefix codex: {error}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(binary, command_line(str(binary), state, codex_arguments))
    return 0  # not reached: exec replaced this process
