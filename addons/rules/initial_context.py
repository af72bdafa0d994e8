"""initial_context: the system messages that lead a conversation moved to just
before its first user message, as user messages.

What the rule does, and why: its option's help below (docs/proxy.md's table
shows it).

It has no detector of its own: a system message it leaves in place (switched
off) is one the system messages rule rewrites or, off too, names to the
diagnosis (`system_messages.holds_system_message`).
"""

from __future__ import annotations

from stable_prefix.addons import responses_input
from stable_prefix.addons.request_shape import (
    CONVERSATION_KEY,
    HOISTED_ROLES,
    TEXT_TYPE,
    Api,
    conversation,
    first_user_index,
    is_message,
    is_model_output,
    leading_count,
)
from stable_prefix.addons.rules import system_messages
from stable_prefix.addons.rules.base import Change, Option, Rule
from stable_prefix.addons.rules.system_messages import wrap_reminder

NAME = "initial_context"


def lead_with_stable_context(body: dict, api: Api) -> list[Change]:
    messages = conversation(body, api)
    if messages is None:
        return []
    first_user = first_user_index(messages)
    if first_user is None:
        return []
    first_assistant = next((i for i, m in enumerate(messages) if is_model_output(m, api)), len(messages))
    roles = HOISTED_ROLES[api]
    moved: list[tuple[int, dict]] = []
    for index in range(leading_count(body, api, responses_input.SYSTEM_ROLES), first_assistant):
        message = messages[index]
        if is_message(message, api) and message.get("role") in roles:
            wrapped = wrap_reminder(message.get("content"), TEXT_TYPE[api])
            if wrapped is not None:
                moved.append((index, {**message, "role": "user", "content": wrapped}))
    if not moved:
        return []
    moved_indexes = {index for index, _ in moved}
    rest = [message for index, message in enumerate(messages) if index not in moved_indexes]
    insert_at = first_user_index(rest)
    key = CONVERSATION_KEY[api]
    body[key] = rest[:insert_at] + [message for _, message in moved] + rest[insert_at:]
    detail = "initial system message moved before the first user message, as user <system-reminder>"
    return [Change(NAME, f"{key}[{index}]", detail) for index, _ in moved]


RULE = Rule(
    name=NAME,
    option=Option(
        "lead_with_stable_context", bool, True,
        "Move the `role:\"system\"` messages that come before any assistant message (initial context: 2.1.332 sends the "
        "environment, deferred tool names, agent types and the date so, as `messages[1]`, behind the git status in "
        "`messages[0]`) to just before the first user message, rewritten as user `<system-reminder>` messages, in their "
        "order: a new conversation in the same repository then shares system, tools and that context, and parts only "
        "at the first user message. Those appended later stay in place (next option). On the OpenAI path they go after "
        "the leading system messages (the system prompt).",
    ),
    label="initial system message",
    done="moved before the first user message",
    apply=lead_with_stable_context,
    moves_messages=True,
    named_by=system_messages.NAME,
)
