"""billing_header: Claude Code's billing line out of the system prompt.

What the rule does, and why: its option's help below (docs/proxy.md's table
shows it). The date line rule drops its lines the same way
(`drop_system_lines`).
"""

from __future__ import annotations

import re
from typing import Any

from stable_prefix.addons.request_shape import Api, drop_lines, remove_emptied, system_text_places
from stable_prefix.addons.rules.base import Change, Option, Rule

NAME = "billing_header"
# A line that *starts* with the header; a mention mid-sentence is not one.
_BILLING_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header:", re.IGNORECASE)


def is_billing_line(line: str) -> bool:
    return bool(_BILLING_LINE.match(line))


def drop_system_lines(body: dict, api: Api, rule: str, is_volatile, what: str) -> list[Change]:
    """Drop matching lines from the system prompt; a text block or message
    left empty is removed entirely."""
    changes: list[Change] = []
    emptied: list[tuple[str, Any, str]] = []
    for path, container, key in list(system_text_places(body, api)):
        new_text, dropped = drop_lines(container[key], is_volatile)
        if not dropped:
            continue
        if new_text.strip():
            changes.append(Change(rule, path, f"removed {what} line"))
            container[key] = new_text
        else:
            changes.append(Change(rule, path, f"removed {what} block"))
            emptied.append((path, container, key))
    remove_emptied(body, api, emptied)
    return changes


def strip_billing_header(body: dict, api: Api) -> list[Change]:
    return drop_system_lines(body, api, NAME, is_billing_line, "billing header")


RULE = Rule(
    name=NAME,
    option=Option(
        "strip_billing_header", bool, True,
        "Remove Claude Code's `x-anthropic-billing-header: …` line from the system prompt (it rotates per conversation, "
        "subagent call or request, at the prompt's first byte): the whole block when it holds nothing else, only that "
        "line otherwise (also inside an OpenAI system message). Text that merely mentions it, and user/assistant/tool "
        "content, are never touched.",
    ),
    label="billing header",
    done="stripped",
    apply=strip_billing_header,
    line=is_billing_line,
)
