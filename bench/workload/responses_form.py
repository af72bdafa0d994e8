"""A session request in the Responses API's form (`POST /v1/responses`), as Codex CLI speaks it.

The team bench's users behave as each agent does, Codex too (`bench/clients/agent_clients.py`): the same session,
sent as Codex sends a conversation. The system blocks become `instructions`; each message an input item in
place: text as a message of its role, a tool call as a `function_call`, a tool result as a
`function_call_output`; tools as function tools. A mid-conversation `role:"system"` message is a
`developer` message, as Codex appends one.
"""

from __future__ import annotations

import json
from typing import Any

from stable_prefix.bench.workload.openai_form import _text


def _items(message: dict) -> list[dict]:
    role, content = message["role"], message["content"]
    if role == "system":
        return [{"type": "message", "role": "developer", "content": _text(content)}]
    if isinstance(content, str):
        return [{"type": "message", "role": role, "content": content}]
    items: list[dict[str, Any]] = []
    text = _text(content)
    if text:
        items.append({"type": "message", "role": role, "content": text})
    for block in content:
        if block.get("type") == "tool_use":
            items.append({"type": "function_call", "call_id": block["id"], "name": block["name"], "arguments": json.dumps(block["input"])})
        elif block.get("type") == "tool_result":
            items.append({"type": "function_call_output", "call_id": block["tool_use_id"], "output": _text(block["content"])})
    return items


def responses_body(body: dict, *, max_tokens: int) -> dict:
    """The Responses body for an Anthropic `/v1/messages` body (no `model`: the proxy sets the served one)."""
    converted: dict[str, Any] = {
        "instructions": _text(body.get("system") or ""),
        "input": [item for message in body["messages"] for item in _items(message)],
        "max_output_tokens": max_tokens,
        "stream": True,
    }
    if body.get("temperature") is not None:
        converted["temperature"] = body["temperature"]
    if body.get("tools"):
        converted["tools"] = [{"type": "function", "name": tool["name"], "description": tool.get("description", ""),
                               "parameters": tool["input_schema"]} for tool in body["tools"]]
    return converted
