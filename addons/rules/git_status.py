"""git_status: a git status paragraph out of the system prompt, into the first user message.

What the rule does, and why: its option's help below (docs/proxy.md's table
shows it).
"""

from __future__ import annotations

import re

from stable_prefix.addons.request_shape import (
    CONVERSATION_KEY,
    TEXT_TYPE,
    Api,
    as_blocks,
    conversation,
    first_user_index,
    first_user_with_blocks,
    reminder_block,
    take_from_system_text,
)
from stable_prefix.addons.rules.base import Change, Option, Rule

NAME = "git_status"
# Where a git status paragraph starts: a line opening with `gitStatus:`. It
# runs to the end of its text block (the status itself holds blank lines, and
# releases that send it put it last in the system prompt).
_GIT_STATUS_LINE = re.compile(r"^[ \t]*gitStatus:", re.MULTILINE)


def git_status_start(text: str) -> int | None:
    """Where the git status paragraph of a system text starts (a character
    offset), or None when it has none."""
    match = _GIT_STATUS_LINE.search(text)
    return match.start() if match else None


def git_status_span(text: str) -> list[tuple[int, None]]:
    """The git status paragraph of a system text: from its start to the end of the text."""
    start = git_status_start(text)
    return [] if start is None else [(start, None)]


def _take_git_status(text: str) -> tuple[str, str] | None:
    """(the text before the paragraph, the paragraph), or None."""
    start = git_status_start(text)
    return None if start is None else (text[:start].rstrip("\n"), text[start:])


def relocate_git_status(body: dict, api: Api) -> list[Change]:
    if first_user_with_blocks(body, api) is None:
        return []
    taken = take_from_system_text(body, api, _take_git_status)
    if not taken:
        return []
    paragraphs = [paragraph for _, paragraph, _ in taken]
    changes = [Change(NAME, path, "git status paragraph taken out") for path, _, _ in taken]
    messages = conversation(body, api)  # the OpenAI path may have lost an emptied system message
    first_user = first_user_index(messages)
    text_type = TEXT_TYPE[api]
    reminders = [reminder_block(paragraph, text_type) for paragraph in paragraphs]
    messages[first_user] = {**messages[first_user], "content": reminders + as_blocks(messages[first_user]["content"], text_type)}
    return changes + [Change(NAME, f"{CONVERSATION_KEY[api]}[{first_user}]", "git status paragraph put first, in a <system-reminder>")]


RULE = Rule(
    name=NAME,
    option=Option(
        "relocate_git_status", bool, True,
        "Move a git status paragraph out of the system prompt (older releases such as 2.1.197 end their system prompt "
        "with it, before the tools; it changes with every commit) into a `<system-reminder>` text block at the start of "
        "the first user message, verbatim. The paragraph runs from a line that starts with `gitStatus:` to the end of "
        "its text block (the status holds blank lines of its own, and every release that sends it puts it last). A "
        "block left empty is removed; the first user message becomes a list of blocks (a string is its one text "
        "block), so it reads the same whether Claude Code sends it as a list or, later, as a string. Without a user "
        "message nothing moves.",
    ),
    label="git status",
    done="moved to the first user message",
    apply=relocate_git_status,
    spans=git_status_span,
)
