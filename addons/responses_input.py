"""The Responses API's `input` items, as the rest of the addons read them.

`POST /v1/responses` (what Codex CLI speaks) carries its conversation in
`input`: a string (one user message) or a list of items. An item is a message
(`"type": "message"`, or no type and a `role`, the short form clients may
send) whose content is a string or a list of parts (`input_text` for user,
system and developer messages, `output_text` for the assistant's), or one of
the items a model's turn leaves behind: `function_call` (its `call_id`, `name`,
`arguments`), `function_call_output` (the tool's `output`), `reasoning`.
`instructions` is the system prompt; `developer` and `system` messages are
system text as well: vllm-mlx 0.6.0 turns both into system messages and
merges every one of them, wherever it sat in `input`, into a single system
message in front of the prompt.

What the server never renders: an item's `id` (Codex gives every item a fresh
one per conversation, even the same instructions) and `status`. Prompt order
leaves them out (`RENDERED_KEYS_LEFT_OUT`).

Items of another type (images, hosted-tool calls, `item_reference`) are left
as they are by every rule and read as JSON by prompt order; the proxy names
each such type once in its log (`unread_item_types`).
"""

from __future__ import annotations

from typing import Any

RESPONSES_PATH = "/v1/responses"
# Tuples, not sets: a client's body may hold a list where a name belongs, and
# `[] in some_set` raises where `[] in some_tuple` is just False.
# Part types that hold text, and the one a rule writes into a message it builds.
TEXT_PART_TYPES = ("text", "input_text", "output_text")
INPUT_TEXT = "input_text"
SYSTEM_ROLES = ("system", "developer")
# Items the rules and the diagnosis know; anything else is passed on as it is.
KNOWN_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
# Item types a model's turn produces, besides an assistant message.
MODEL_OUTPUT_TYPES = ("function_call", "reasoning", "custom_tool_call", "local_shell_call")
RENDERED_KEYS_LEFT_OUT = ("id", "status")


def items(body: dict) -> list | None:
    """The `input` list, or None (a string input, or none at all)."""
    value = body.get("input")
    return value if isinstance(value, list) else None


def item_type(item: Any) -> str | None:
    """An item's type; a dict with a `role` and no type is a message."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return kind if isinstance(kind, str) else None


def is_message(item: Any) -> bool:
    return item_type(item) == "message"


def is_system_message(item: Any) -> bool:
    return is_message(item) and item.get("role") in SYSTEM_ROLES


def is_model_output(item: Any) -> bool:
    """An item the model produced: an assistant message, a tool call, reasoning."""
    return (is_message(item) and item.get("role") == "assistant") or item_type(item) in MODEL_OUTPUT_TYPES


def is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in TEXT_PART_TYPES and isinstance(part.get("text"), str)


def rendered(item: Any) -> Any:
    """An item without the keys no server renders into the prompt."""
    if not isinstance(item, dict) or not any(key in item for key in RENDERED_KEYS_LEFT_OUT):
        return item
    return {key: value for key, value in item.items() if key not in RENDERED_KEYS_LEFT_OUT}


def as_items(value: Any) -> list:
    """`input` as a list of items: a string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def unread_item_types(body: dict) -> set[str]:
    """Types of the items in `input` that no rule reads."""
    return {item_type(item) or type(item).__name__ for item in items(body) or [] if item_type(item) not in KNOWN_ITEM_TYPES}
