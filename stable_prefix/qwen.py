"""`stable-prefix qwen [--port N] [--qwen PATH] [qwen arguments]`: Qwen Code against a running stack.

Reads where the stack is from the state file `stable-prefix up` writes, checks
that it answers, writes Qwen Code's settings for it next to that file
(`qwen-settings-PORT.json`, 0600; `stable_prefix/agents/qwen_code.py: stack_settings`: OpenAI
auth, the served model, no usage statistics, telemetry or update check) and
replaces itself with Qwen Code (`qwen` on PATH, or the pinned one in
`.claude-cli/qwen-code/`), the settings named by
`QWEN_CODE_SYSTEM_SETTINGS_PATH` (they outrank the user's and the project's),
the proxy, key, model and output cap in its OpenAI variables. The user's own
sessions and settings are used otherwise; their own OpenAI key is not sent.
"""

from __future__ import annotations

import json

from stable_prefix.addons.capture_folder import write_private
from stable_prefix.agents.qwen_code import stack_environment, stack_settings, user_binary
from stable_prefix.launch import launch
from stable_prefix.stack import stack_state_path

USAGE = "usage: stable-prefix qwen [--port N] [--qwen PATH] [qwen arguments...]"


def environment_for(state: dict, port: int) -> dict[str, str]:
    settings = stack_state_path(port).with_name(f"qwen-settings-{port}.json")
    write_private(settings, json.dumps(stack_settings(state["model"]), indent=1))
    return stack_environment(state["url"], state["model"], state["max_tokens"], settings)


def main(argv: list[str]) -> int:
    return launch("qwen", argv, "--qwen", USAGE, user_binary, __doc__, environment_for=environment_for)
