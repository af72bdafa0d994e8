"""A session request in OpenAI chat-completions form, for servers that only speak it.

mlx-lm's `mlx_lm.server` (the benchmark's outside anchor) has no `/v1/messages`;
a Claude Code user in front of it runs a translating proxy. This is the plain
translation such a proxy makes: system blocks joined into one leading system
message (the billing line included: nothing is normalized), every other
message in place (a mid-conversation `role:"system"` stays where it is), tool
calls as `tool_calls`, tool results as `role:"tool"` messages, tools as
functions.
"""

from __future__ import annotations

import json
from typing import Any


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(block.get("text", "") for block in content if block.get("type") == "text")


def _messages(message: dict) -> list[dict]:
    role, content = message["role"], message["content"]
    if isinstance(content, str) or role == "system":
        return [{"role": role, "content": _text(content)}]
    if role == "assistant":
        converted: dict[str, Any] = {"role": "assistant", "content": _text(content)}
        calls = [
            {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": json.dumps(block["input"])}}
            for block in content
            if block.get("type") == "tool_use"
        ]
        if calls:
            converted["tool_calls"] = calls
        return [converted]
    results = [
        {"role": "tool", "tool_call_id": block["tool_use_id"], "content": _text(block["content"])}
        for block in content
        if block.get("type") == "tool_result"
    ]
    text = _text(content)
    return ([{"role": role, "content": text}] if text or not results else []) + results


def openai_body(body: dict, *, max_tokens: int) -> dict:
    """The chat-completions body for an Anthropic `/v1/messages` body (no `model`: the server's own)."""
    system = body.get("system")
    messages = [{"role": "system", "content": _text(system)}] if system else []
    for message in body["messages"]:
        messages += _messages(message)
    converted: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if body.get("temperature") is not None:
        converted["temperature"] = body["temperature"]
    if body.get("tools"):
        converted["tools"] = [
            {"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""), "parameters": tool["input_schema"]}}
            for tool in body["tools"]
        ]
    return converted
