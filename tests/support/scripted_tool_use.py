"""A mitmdump script that answers chosen requests with scripted tool calls.

The tiny test model has random weights and never calls a tool, so a test that
needs Claude Code to start subagents or load a deferred tool scripts that one
decision here, in front of the real engine, and forwards everything else:

    mitmdump --mode reverse:http://127.0.0.1:ENGINE -p DOOR \\
        -s tests/support/scripted_tool_use.py -s tests/support/upstream_recorder.py \\
        --set scripted_tool_uses=script.json

`script.json` is a list of steps, each used once, in order:

    [{"tool": "Agent", "inputs": [{"subagent_type": "Explore", "description": "...", "prompt": "..."}, ...]}]

A step answers the first `POST /v1/messages` that offers a tool named `tool`
and ends with a fresh user prompt (its last non-system message holds no
`tool_result`):
one streamed assistant message with one `tool_use` block per input, so two
inputs start two subagents at once. Every other request goes on to the engine.
Scripted flows are marked (`flow.metadata["scripted"]`), so the recorder
behind this script knows they never reached the engine.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mitmproxy import ctx, http

logger = logging.getLogger(__name__)

SCRIPTED = "scripted"


def sse_event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def tool_use_events(model: str, calls: list[tuple[str, str, dict]]) -> bytes:
    """An Anthropic streamed message whose content is the given (id, name, input) tool calls."""
    usage = {"input_tokens": 0, "output_tokens": 0}
    events = [sse_event("message_start", {"type": "message_start", "message": {
        "id": "msg_scripted", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": usage}})]
    for index, (call_id, name, tool_input) in enumerate(calls):
        events += [
            sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                              "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}}}),
            sse_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "input_json_delta", "partial_json": json.dumps(tool_input)}}),
            sse_event("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    events += [
        sse_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                    "usage": {"output_tokens": 1}}),
        sse_event("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(events)


def ends_with_user_prompt(body: dict) -> bool:
    """The last message (system messages aside: Claude Code appends its environment after the prompt) is a user prompt."""
    messages = [message for message in body.get("messages") or [] if message.get("role") != "system"]
    if not messages or messages[-1].get("role") != "user":
        return False
    content = messages[-1].get("content")
    return isinstance(content, str) or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def offered(body: dict) -> set[str]:
    return {tool.get("name") for tool in body.get("tools") or [] if isinstance(tool, dict)}


class ScriptedToolUse:
    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.answered = 0

    def load(self, loader) -> None:
        loader.add_option("scripted_tool_uses", str, "", "JSON file: a list of {tool, inputs} steps, each used once")

    def configure(self, updated) -> None:
        if "scripted_tool_uses" in updated and ctx.options.scripted_tool_uses:
            self.steps = json.loads(Path(ctx.options.scripted_tool_uses).read_text())

    def request(self, flow: http.HTTPFlow) -> None:
        if not self.steps or flow.request.method != "POST" or flow.request.path.split("?")[0] != "/v1/messages":
            return
        try:
            body = json.loads(flow.request.content or b"")
        except ValueError:
            return
        step = self.steps[0]
        if step["tool"] not in offered(body) or not ends_with_user_prompt(body):
            return
        self.steps.pop(0)
        self.answered += 1
        calls = [(f"toolu_scripted_{self.answered:02d}_{index:02d}", step["tool"], tool_input)
                 for index, tool_input in enumerate(step["inputs"])]
        logger.info(f"scripted_tool_use: answering with {len(calls)} {step['tool']} call(s)")
        flow.metadata[SCRIPTED] = True
        flow.response = http.Response.make(200, tool_use_events(str(body.get("model", "")), calls),
                                           {"content-type": "text/event-stream", "cache-control": "no-cache"})


addons = [ScriptedToolUse()]
