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

from stable_prefix.agents.codex_cli import config_overrides, stack_settings, user_binary
from stable_prefix.launch import launch

USAGE = "usage: stable-prefix codex [--port N] [--codex PATH] [codex arguments...]"


def stack_options(state: dict) -> list[str]:
    """The stack's configuration as root options, before the user's arguments, so every subcommand gets them."""
    return config_overrides(stack_settings(state["url"], state["model"]))


def main(argv: list[str]) -> int:
    return launch("codex", argv, "--codex", USAGE, user_binary, __doc__,
                  arguments_for=lambda state, port: stack_options(state))
