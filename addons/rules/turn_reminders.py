"""turn_reminders: a reminder an agent puts on its newest user message for one
request only, pinned to the first user message.

What the rule does, and why: its option's help below (docs/proxy.md's table
shows it). The agents' reminders are `TURN_REMINDER_OPENINGS`.
"""

from __future__ import annotations

import re
from typing import Any

from stable_prefix.addons.prompt_order import message_index
from stable_prefix.addons.request_shape import (
    CONVERSATION_KEY,
    TEXT_TYPE,
    Api,
    as_blocks,
    conversation,
    first_user_with_blocks,
    is_reminder_block,
    is_text_block,
)
from stable_prefix.addons.rules.base import AtBreak, Break, Change, Option, Place, Rule

NAME = "turn_reminders"
# Each agent's reminders of one request, found by how their text part opens
# (the agents' own texts stay theirs: these openings are all we need of them):
# (name, whether it names the agent's mode, opening).
TURN_REMINDER_OPENINGS = (
    # Qwen Code 0.24: the current date, before the prompt.
    ("current date", False, re.compile(r"<system-reminder>\s*The current date is:")),
    # opencode 1.18: the plan-mode reminder, and after a plan the switch-to-build one, after the prompt.
    ("plan mode", True, re.compile(r"<system-reminder>\s*# Plan Mode\b")),
    ("build after plan", True, re.compile(r"<system-reminder>\s*Your operational mode has changed\b")),
)
_REMINDER_END = re.compile(r"</system-reminder>\s*$")


def turn_reminder_name(part: Any) -> str | None:
    """The name of the turn reminder a text part of a user message is (the whole part), or None."""
    if not is_text_block(part) or not _REMINDER_END.search(part["text"]):
        return None
    return next((name for name, _, opening in TURN_REMINDER_OPENINGS if opening.match(part["text"])), None)


def turn_reminders(body: dict, api: Api) -> list[str]:
    """The names of the turn reminders in a request's user messages, in order."""
    names = []
    for message in conversation(body, api) or []:
        content = message.get("content") if isinstance(message, dict) and message.get("role") == "user" else None
        if isinstance(content, list):
            names += [name for name in map(turn_reminder_name, content) if name]
    return names


def agent_mode(body: dict, api: Api) -> str | None:
    """The mode a request's turn reminders name last (opencode's plan mode, or build after a plan), or None."""
    modes = {name for name, names_mode, _ in TURN_REMINDER_OPENINGS if names_mode}
    return next((name for name in reversed(turn_reminders(body, api)) if name in modes), None)


def insert_after_leading_reminders(messages: list, index: int, blocks: list, text_type: str) -> None:
    """Put text blocks into `messages[index]` after the <system-reminder> blocks it starts with,
    turn reminders aside (a string content becomes one text block): what the agent itself leads
    with stays first, then conversation context, then turn reminders, which change most."""
    content = as_blocks(messages[index]["content"], text_type)
    lead = next((i for i, block in enumerate(content) if not is_reminder_block(block) or turn_reminder_name(block)), len(content))
    messages[index] = {**messages[index], "content": content[:lead] + blocks + content[lead:]}


def pin_turn_reminders(body: dict, api: Api) -> list[Change]:
    """Qwen Code puts its reminder on the newest message the user typed, so a
    later message may hold one; each text is moved once."""
    first_user = first_user_with_blocks(body, api)
    if first_user is None:
        return []
    messages, key = conversation(body, api), CONVERSATION_KEY[api]
    first_before = messages[first_user]
    moved: dict[str, dict] = {}
    changes = []
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) and message.get("role") == "user" else None
        if not isinstance(content, list):
            continue
        reminders = [part for part in content if turn_reminder_name(part)]
        rest = [part for part in content if not turn_reminder_name(part)]
        if not reminders or (not rest and index != first_user):
            continue
        messages[index] = {**message, "content": rest}
        moved.update((part["text"], part) for part in reminders if part["text"] not in moved)
        if index != first_user:
            names = ", ".join(dict.fromkeys(map(turn_reminder_name, reminders)))
            changes.append(Change(NAME, f"{key}[{index}]", f"{names} reminder moved to {key}[{first_user}], after its leading reminders"))
    if not moved:
        return []
    insert_after_leading_reminders(messages, first_user, list(moved.values()), TEXT_TYPE[api])
    if not changes and messages[first_user] != first_before:
        changes.append(Change(NAME, f"{key}[{first_user}]", "turn reminder put after the leading reminders"))
    return changes


def holds_turn_reminder(at: Break) -> bool:
    """The previous prompt's message at the break is a user message with a turn reminder in it."""
    segment = at.pair[0][1]
    value = segment.value
    if not (message_index(segment) is not None and isinstance(value, dict) and value.get("role") == "user"):
        return False
    return isinstance(value.get("content"), list) and any(turn_reminder_name(part) for part in value["content"])


RULE = Rule(
    name=NAME,
    option=Option(
        "pin_turn_reminders", bool, True,
        "Move a turn reminder, a `<system-reminder>` text part an agent attaches to its newest user message for one "
        "request and leaves off that message on the next (Qwen Code's `The current date is: …`; opencode's plan-mode "
        "reminder and, once a plan was made, its switch-to-build one), so a prefix cache re-read that whole turn, its "
        "tool calls and results, on the next request. It moves from every user message to the first user "
        "message, after the reminders it starts with (an identical one only once). Every request then carries it in "
        "the same place; it moves only when it changes (the date at midnight, a switch of mode). A message holding "
        "nothing but the reminder is left alone. See docs/agents.md.",
    ),
    label="turn reminder",
    done="pinned to the first user message",
    apply=pin_turn_reminders,
    at_break=AtBreak(Place.MESSAGE, holds_turn_reminder),
)
