"""conversation_context: system-prompt text that changes from one conversation
to the next, moved into the first user message.

What the rule does, and why: its option's help below (docs/proxy.md's table
shows it). The agents' pieces are `SYSTEM_CONTEXT_OPENINGS` and
`STARTUP_CONTEXT`.
"""

from __future__ import annotations

import re
from typing import Any

from stable_prefix.addons.request_shape import (
    CONVERSATION_KEY,
    TEXT_TYPE,
    Api,
    as_blocks,
    conversation,
    first_user_index,
    first_user_with_blocks,
    is_text_block,
    reminder_block,
    take_from_system_text,
)
from stable_prefix.addons.rules.base import Change, Option, Rule
from stable_prefix.addons.rules.turn_reminders import insert_after_leading_reminders

NAME = "conversation_context"
# What each agent puts where a prefix cache loses it, found by how it opens
# (the agents' own texts stay theirs: these openings are all we need of them):
# (what, how volatile: where it goes among the moved pieces, 0 first, pattern).
# A date or directory line is one line; the others run to the next one that
# starts or to the end of the text.
_DATE_FIELD_LINE = re.compile(r"^[ \t]*Today's date: [^\n]*(?:\n|$)", re.MULTILINE)
_CURRENT_DATE_LINE = re.compile(r"^Current date: \d{4}-\d{2}-\d{2}[^\n]*(?:\n|$)", re.MULTILINE)
_WORKING_DIRECTORY_LINE = re.compile(r"^Current working directory: [^\n]*(?:\n|$)", re.MULTILINE)
ONE_LINE_CONTEXT = (_DATE_FIELD_LINE, _CURRENT_DATE_LINE, _WORKING_DIRECTORY_LINE)
SYSTEM_CONTEXT_OPENINGS = (
    # opencode 1.18 ends its system prompt's <env> block with `Today's date: Tue Dec 01 2026`.
    ("date line", 1, _DATE_FIELD_LINE),
    # Qwen Code 0.24 ends its system prompt with a git snapshot (branch, status, recent commits;
    # rebuilt by every `qwen` process) and then its memory section (which grows as memories are saved).
    ("git snapshot", 2, re.compile(r"^Git snapshot at conversation start\b", re.MULTILINE)),
    ("memory section", 0, re.compile(r"^# auto memory$", re.MULTILINE)),
    # Pi 0.73 ends its system prompt with `Current date: 2026-12-01` and `Current working directory:
    # /path` (the same all day in one project, and different in the next project: with both moved,
    # every project shares system prompt and tools).
    ("working directory", 0, _WORKING_DIRECTORY_LINE),
    ("current date", 1, _CURRENT_DATE_LINE),
)
# Qwen Code 0.24 leads its first user message with reminders, one of them the startup context
# (date, working directory, folder listing) between two that never change: a reminder block of
# the first user message that is conversation context.
STARTUP_CONTEXT = ("startup context", 1, re.compile(r"<system-reminder>\s*This is the Qwen Code\. We are setting up the context\b"))


def is_one_line_context(line: str) -> bool:
    """A date or working-directory line of conversation context."""
    return any(pattern.match(line) for pattern in ONE_LINE_CONTEXT)


def conversation_context_spans(text: str) -> list[tuple[int, int, str]]:
    """Where a system text holds conversation context (`SYSTEM_CONTEXT_OPENINGS`):
    (start, end, what) character spans, in order, each ending after its line break."""
    starts = sorted((match.start(), match.end(), what, pattern in ONE_LINE_CONTEXT)
                    for what, _, pattern in SYSTEM_CONTEXT_OPENINGS for match in pattern.finditer(text))
    spans = []
    for index, (start, line_end, what, one_line) in enumerate(starts):
        end = line_end if one_line else (starts[index + 1][0] if index + 1 < len(starts) else len(text))
        spans.append((start, end, what))
    return spans


def context_spans(text: str) -> list[tuple[int, int]]:
    """Where a system text holds conversation context: (start, end), for the diagnosis."""
    return [(start, end) for start, end, _ in conversation_context_spans(text)]


def _context_rank(what: str) -> int:
    return next(rank for name, rank, _ in (*SYSTEM_CONTEXT_OPENINGS, STARTUP_CONTEXT) if name == what)


def _is_startup_context(block: Any) -> bool:
    return is_text_block(block) and bool(STARTUP_CONTEXT[2].match(block["text"]))


def _without_spans(text: str, spans: list[tuple[int, int, str]]) -> str:
    """`text` with the (start, end, _) spans cut out; the spans are in order and do not overlap."""
    kept, position = [], 0
    for start, end, _ in spans:
        kept.append(text[position:start])
        position = end
    return "".join(kept) + text[position:]


def _take_context(text: str) -> tuple[str, list[tuple[str, str]]] | None:
    """(the text without its conversation context, [(what, the piece)]), or None."""
    spans = conversation_context_spans(text)
    return (_without_spans(text, spans), [(what, text[start:end]) for start, end, what in spans]) if spans else None


def relocate_conversation_context(body: dict, api: Api) -> list[Change]:
    """The pieces are found by `conversation_context_spans` in the system text and `STARTUP_CONTEXT`
    in the first message, and put in by their rank (`SYSTEM_CONTEXT_OPENINGS`)."""
    if first_user_with_blocks(body, api) is None:
        return []
    text_type = TEXT_TYPE[api]
    taken = take_from_system_text(body, api, _take_context)
    pieces = [(what, reminder_block(piece.rstrip("\n"), text_type)) for _, found, _ in taken for what, piece in found]
    changes = [Change(NAME, path, ", ".join(what for what, _ in found) + " taken out") for path, found, _ in taken]
    messages = conversation(body, api)  # the OpenAI path may have lost an emptied system message
    first_user = first_user_index(messages)
    content = as_blocks(messages[first_user]["content"], text_type)
    startup = [block for block in content if _is_startup_context(block)]
    if not pieces and not startup:
        return []
    pieces += [(STARTUP_CONTEXT[0], block) for block in startup]
    messages[first_user] = {**messages[first_user], "content": [block for block in content if not _is_startup_context(block)]}
    insert_after_leading_reminders(messages, first_user, [block for _, block in sorted(pieces, key=lambda piece: _context_rank(piece[0]))],
                                   text_type)
    if messages[first_user]["content"] == content and not changes:
        return []  # the startup context was already where it goes
    return changes + [Change(NAME, f"{CONVERSATION_KEY[api]}[{first_user}]", "conversation context put after its leading reminders, in a <system-reminder>")]


RULE = Rule(
    name=NAME,
    option=Option(
        "relocate_conversation_context", bool, True,
        "Move conversation context, text that changes from one conversation to the next but sits before the tools or "
        "before reminders that never change, into `<system-reminder>` text blocks of the first user message, verbatim, "
        "after the reminders that message starts with (the least volatile first): opencode's `Today's date: …` line "
        "(its `<env>` block, at the end of the system prompt); Qwen Code's git snapshot (from the line `Git snapshot at "
        "conversation start` to the next piece) and memory section (`# auto memory` to the end of the system prompt), "
        "and its startup-context reminder (date, working directory, folder listing), which it sends between two "
        "reminders that never change; Pi's `Current date: …` and `Current working directory: …` lines (the end of its "
        "system prompt). A new conversation the next day or after a commit then shares system prompt and tools. A "
        "system text left empty is removed; without a user message nothing moves. See docs/agents.md.",
    ),
    label="conversation context",
    done="moved to the first user message",
    apply=relocate_conversation_context,
    line=is_one_line_context,
    spans=context_spans,
)
