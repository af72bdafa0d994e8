"""system_messages: a system message inside the conversation rewritten, in
place, as a user message.

What the rule does, and why: its option's help below (docs/proxy.md's table
shows it). Claude Code's late tool changes (betas
`mid-conversation-tool-changes-...` and `inline-tools-...`) arrive as such
messages (`late_tool_change`).
"""

from __future__ import annotations

from typing import Any

from stable_prefix.addons.prompt_order import is_system_text, message_index
from stable_prefix.addons.request_shape import (
    CONVERSATION_KEY,
    HOISTED_ROLES,
    SYSTEM_REMINDER_CLOSE,
    SYSTEM_REMINDER_OPEN,
    TEXT_TYPE,
    Api,
    conversation,
    is_message,
    is_text_block,
    leading_count,
    tool_name,
)
from stable_prefix.addons.rules.base import AtBreak, Break, Change, Option, Place, Rule
from stable_prefix.addons.rules.loaded_tools import INLINED_TOOLS_CLOSE, INLINED_TOOLS_OPEN, tool_schema_line

NAME = "system_messages"
TOOL_CHANGE_TYPES = ("tool_addition", "tool_removal")


def late_tool_change(block: Any) -> tuple[str, str, dict | None] | None:
    """(`tool_addition`/`tool_removal`, the tool's name, its definition when the block carries it)
    for a tool change block of a system message; None for any other block."""
    if not (isinstance(block, dict) and block.get("type") in TOOL_CHANGE_TYPES and isinstance(block.get("tool"), dict)):
        return None
    tool = block["tool"]
    definition = tool.get("definition") if tool.get("type") == "tool_definition" else None
    name = tool_name(definition) if isinstance(definition, dict) else (tool.get("name") if tool.get("type") == "tool_reference" else None)
    if not isinstance(name, str) or not name:
        return None
    return block["type"], name, definition if isinstance(definition, dict) else None


def late_tool_names(body: dict, api: Api) -> set[str]:
    """Tools that system messages inside the conversation add (Claude Code's late tool changes)."""
    names = set()
    for message in conversation(body, api) or []:
        if isinstance(message, dict) and message.get("role") == "system" and isinstance(message.get("content"), list):
            names |= {change[1] for change in map(late_tool_change, message["content"]) if change and change[0] == "tool_addition"}
    return names


def _tool_change_text(block: dict, text_type: str) -> dict:
    """A tool change block as text: a definition in ToolSearch's encoding (as `inline_loaded_tools`
    writes a loaded tool), a reference by its name."""
    kind, name, definition = late_tool_change(block)
    if definition is not None:
        text = INLINED_TOOLS_OPEN + tool_schema_line(definition) + "\n" + INLINED_TOOLS_CLOSE
    else:
        text = f"{'Tool added' if kind == 'tool_addition' else 'Tool removed'}: {name}"
    return {"type": text_type, "text": text}


def wrap_reminder(content: Any, text_type: str = "text") -> Any | None:
    """The user-message content for a system message's content, or None when
    it has a shape we do not know how to wrap (then it is left alone). Tool
    change blocks become text (`_tool_change_text`)."""
    if isinstance(content, list) and any(late_tool_change(block) for block in content):
        if not all(is_text_block(block) or late_tool_change(block) for block in content):
            return None
        content = [block if is_text_block(block) else _tool_change_text(block, text_type) for block in content]
    if isinstance(content, str):
        if content.startswith("<system-reminder>"):
            return content
        return SYSTEM_REMINDER_OPEN + content + SYSTEM_REMINDER_CLOSE
    if content == []:  # Claude Code sends `[]` after /compact; empty is still a system message to hoist
        return [{"type": text_type, "text": SYSTEM_REMINDER_OPEN + SYSTEM_REMINDER_CLOSE}]
    if isinstance(content, list) and content and all(is_text_block(block) for block in content):
        # Keep the blocks (and their cache_control); wrap around all of them.
        blocks = [dict(block) for block in content]
        if not blocks[0]["text"].startswith("<system-reminder>"):
            blocks[0]["text"] = SYSTEM_REMINDER_OPEN + blocks[0]["text"]
            blocks[-1]["text"] = blocks[-1]["text"] + SYSTEM_REMINDER_CLOSE
        return blocks
    return None


def rewrite_system_messages(body: dict, api: Api) -> list[Change]:
    messages = conversation(body, api)
    if messages is None:
        return []
    roles = HOISTED_ROLES[api]
    changes = []
    for index in range(leading_count(body, api, roles), len(messages)):
        message = messages[index]
        if not is_message(message, api) or message.get("role") not in roles:
            continue
        wrapped = wrap_reminder(message.get("content"), TEXT_TYPE[api])
        if wrapped is None:
            continue
        changes.append(Change(NAME, f"{CONVERSATION_KEY[api]}[{index}]", f"{message['role']} message rewritten as user <system-reminder>"))
        message["role"] = "user"
        message["content"] = wrapped
    return changes


def holds_system_message(at: Break) -> bool:
    """Either prompt's segment at the break is a system message this rule rewrites: any inside an
    Anthropic `messages`; on the OpenAI and Responses paths only those after the first
    non-system message (the leading ones are the system prompt itself)."""
    return any(_is_mid_conversation_system_message(order, segment, at.api) for order, segment in at.pair)


def _is_mid_conversation_system_message(order, segment, api: Api) -> bool:
    index = message_index(segment)
    if index is None or not (isinstance(segment.value, dict) and segment.value.get("role") in HOISTED_ROLES[api]):
        return False
    if api == "anthropic":
        return True
    messages = [message_index(s) for s in order.segments if message_index(s) is not None and not is_system_text(s)]
    return bool(messages) and index > min(messages)


RULE = Rule(
    name=NAME,
    option=Option(
        "rewrite_system_messages", bool, True,
        "Rewrite each `role:\"system\"` item inside `messages`, in place, into a user message `<system-reminder>\\n…\\n"
        "</system-reminder>`, empty ones (`\"\"`, `[]`: what 2.1.332 sends after `/compact`) included; the rewrite of "
        "`messages[i]` depends only on `messages[i]`, so it is identical on every later turn (vllm-mlx hoists system "
        "messages to the front of the prompt: a new one at the tail would change the prefix). On the OpenAI path the "
        "leading system messages (the system prompt) stay. On the Responses path `developer` items too (vllm-mlx "
        "merges both into its one system message in front; Codex appends one when a conversation's sandbox mode "
        "changes), their parts `input_text`; the leading ones stay. A system message carrying a late tool change "
        "(Claude Code's `tool_addition` / `tool_removal` blocks) becomes text in the same place: an added tool's "
        "definition in ToolSearch's `<functions>` encoding, a tool named by reference as its name; `tools` is not "
        "touched.",
    ),
    label="system message",
    done="rewritten",
    apply=rewrite_system_messages,
    at_break=AtBreak(Place.SYSTEM_MESSAGE, holds_system_message),
)
