"""`stable-prefix pi [--port N] [--pi PATH] [pi arguments]`: Pi against a running stack.

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

from __future__ import annotations

from stable_prefix.addons.capture_folder import write_private
from stable_prefix.agents.pi import OFFLINE_ENVIRONMENT, extension_source, stack_arguments, user_binary
from stable_prefix.launch import launch
from stable_prefix.stack import stack_state_path

USAGE = "usage: stable-prefix pi [--port N] [--pi PATH] [pi arguments...]"


def arguments_for(state: dict, port: int) -> list[str]:
    extension = stack_state_path(port).with_name(f"pi-provider-{port}.js")
    write_private(extension, extension_source(state["url"], state["model"], state["max_tokens"]))
    return stack_arguments(extension, state["model"])


def main(argv: list[str]) -> int:
    return launch("pi", argv, "--pi", USAGE, user_binary, __doc__, environment_for=lambda state, port: dict(OFFLINE_ENVIRONMENT),
                  arguments_for=arguments_for)
