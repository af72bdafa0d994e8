"""A mitmdump script that turns the engine's answer to chosen requests into scripted tool calls.

The tiny test model has random weights and never calls a tool, so a test that
needs Claude Code to start subagents (or a subagent to take a step) scripts
that one decision here, at the engine's door. The request itself still goes to
the real engine, which prefills (and caches) it as usual; only the answer that
comes back is replaced:

    mitmdump --mode reverse:http://127.0.0.1:ENGINE -p DOOR \\
        -s tests/support/upstream_recorder.py -s tests/support/scripted_tool_use.py \\
        --set scripted_tool_uses=script.json

`script.json` is a list of steps, each used once, in order:

    [{"tool": "Agent", "inputs": [{"subagent_type": "Explore", "description": "...", "prompt": "..."}, ...]}]

A step answers the first `POST /v1/messages` or `POST /v1/chat/completions`
that offers a tool named `tool` and whose last message (system messages
aside: Claude Code sends its environment after the prompt) is a fresh user
prompt without a `tool_result` (on the OpenAI path a tool result is a
`role:"tool"` message, so it is never last of a fresh prompt): one streamed
assistant message with one tool call per input, in the protocol the request
spoke (Anthropic `tool_use` blocks, OpenAI `tool_calls` deltas), so two
inputs start two subagents at once. The usage the engine reported is kept.
Load it after the recorder, which then records the engine's own answer.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mitmproxy import ctx, http

logger = logging.getLogger(__name__)

SCRIPTED_CALLS = "scripted_calls"
ANTHROPIC_PATH = "/v1/messages"
OPENAI_PATH = "/v1/chat/completions"


def sse_event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def usage_in(stream: bytes) -> dict:
    """The usage objects of Anthropic SSE events (or OpenAI chunks, whose last one carries it), merged."""
    usage: dict = {}
    for line in stream.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:"):
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            continue
        if isinstance(event, dict):
            message = event.get("message")
            for found in (message.get("usage") if isinstance(message, dict) else None, event.get("usage")):
                if isinstance(found, dict):
                    usage.update(found)
    return usage


def tool_use_events(model: str, calls: list[tuple[str, str, dict]], usage: dict) -> bytes:
    """An Anthropic streamed message whose content is the given (id, name, input) tool calls."""
    opening = {key: value for key, value in usage.items() if key != "output_tokens"}
    events = [sse_event("message_start", {"type": "message_start", "message": {
        "id": "msg_scripted", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {**opening, "output_tokens": 0}}})]
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
                                    "usage": {"output_tokens": len(calls)}}),
        sse_event("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(events)


def tool_call_chunks(model: str, calls: list[tuple[str, str, dict]], usage: dict) -> bytes:
    """An OpenAI streamed chat completion whose message is the given (id, name, input) tool calls,
    ending as vllm-mlx ends one: a `finish_reason` chunk, a usage chunk, `[DONE]`."""
    def chunk(choices: list, **extra) -> bytes:
        data = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "model": model, "choices": choices, **extra}
        return f"data: {json.dumps(data)}\n\n".encode()

    deltas = [{"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(tool_input)}}
              for index, (call_id, name, tool_input) in enumerate(calls)]
    return b"".join([
        chunk([{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": deltas}, "finish_reason": None}]),
        chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        chunk([], usage={**usage, "completion_tokens": len(calls)}),
        b"data: [DONE]\n\n",
    ])


SCRIPTED_ANSWERS = {ANTHROPIC_PATH: tool_use_events, OPENAI_PATH: tool_call_chunks}


def ends_with_user_prompt(body: dict) -> bool:
    messages = [message for message in body.get("messages") or [] if message.get("role") != "system"]
    if not messages or messages[-1].get("role") != "user":
        return False
    content = messages[-1].get("content")
    return isinstance(content, str) or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def offered(body: dict) -> set[str]:
    """Tool names, Anthropic (`name`) or OpenAI (`function.name`)."""
    names = set()
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            function = tool.get("function")
            names.add(function.get("name") if isinstance(function, dict) else tool.get("name"))
    return names


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
        path = flow.request.path.split("?")[0]
        if not self.steps or flow.request.method != "POST" or path not in SCRIPTED_ANSWERS:
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
        calls = [(f"toolu_scripted_{self.answered:02d}_{index:02d}", step["tool"], tool_input) for index, tool_input in enumerate(step["inputs"])]
        flow.metadata[SCRIPTED_CALLS] = {"model": str(body.get("model", "")), "calls": calls, "path": path}
        logger.info(f"scripted_tool_use: the engine's answer will be {len(calls)} {step['tool']} call(s)")

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        script = flow.metadata.get(SCRIPTED_CALLS)
        if script is None or flow.response is None or flow.response.status_code != 200:
            return
        previous = flow.response.stream if callable(flow.response.stream) else None
        engine_answer: list[bytes] = []

        def replace(chunk: bytes) -> list[bytes]:
            engine_answer.append(previous(chunk) if previous else chunk)
            if chunk:
                return []  # nothing of the engine's answer goes on
            answer = SCRIPTED_ANSWERS[script["path"]]
            return [answer(script["model"], script["calls"], usage_in(b"".join(engine_answer)))]

        flow.response.stream = replace
        flow.response.headers.pop("content-length", None)


addons = [ScriptedToolUse()]
