"""billing_header: Claude Code's billing line out of the system prompt.

What the rule does, and why: its option's help below (docs/proxy.md's table
shows it). The date line rule drops its lines the same way
(`drop_system_lines`).
"""

from __future__ import annotations

import re

from stable_prefix.addons.request_shape import Api, drop_lines, take_from_system_text
from stable_prefix.addons.rules.base import Change, Option, Rule

NAME = "billing_header"
# A line that *starts* with the header; a mention mid-sentence is not one.
_BILLING_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header:", re.IGNORECASE)


def is_billing_line(line: str) -> bool:
    return bool(_BILLING_LINE.match(line))


def drop_system_lines(body: dict, api: Api, rule: str, is_volatile, what: str) -> list[Change]:
    """Drop matching lines from the system prompt; a text block or message
    left empty is removed entirely."""
    def take(text: str) -> tuple[str, int] | None:
        kept, dropped = drop_lines(text, is_volatile)
        return (kept, dropped) if dropped else None

    return [Change(rule, path, f"removed {what} {'block' if emptied else 'line'}") for path, _, emptied in take_from_system_text(body, api, take)]


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
