"""A mitmdump script that turns the engine's answer to chosen requests into scripted tool calls.

The tiny test model has random weights and never calls a tool, so a test that
needs an agent to call one (Claude Code to start subagents, a subagent to take
a step, Codex to run a command) scripts that one decision here, at the
engine's door. The request itself still goes to the real engine, which
prefills (and caches) it as usual; only the answer that comes back is
replaced:

    mitmdump --mode reverse:http://127.0.0.1:ENGINE -p DOOR \\
        -s tests/support/upstream_recorder.py -s tests/support/scripted_tool_use.py \\
        --set scripted_tool_uses=script.json

`script.json` is a list of steps, each used once, in order:

    [{"tool": "Agent", "inputs": [{"subagent_type": "Explore", "description": "...", "prompt": "..."}, ...]}]

A step answers the first request that offers a tool named `tool` and whose
last message is a fresh user prompt, not a tool result (system messages aside:
Claude Code sends its environment after the prompt), holding `prompt_contains`
when the step names one: one streamed answer with
one call per input, so two inputs start two subagents at once. Two protocols:
`POST /v1/messages` gets an Anthropic message of `tool_use` blocks,
`POST /v1/responses` a Responses stream of `function_call` items (the input is
their `arguments`, as JSON). The usage the engine reported is kept. Load it
after the recorder, which then records the engine's own answer.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mitmproxy import ctx, http

from stable_prefix.addons.responses_input import RESPONSES_PATH, is_message
from stable_prefix.addons.sse_events import EventStream, format_event

logger = logging.getLogger(__name__)

SCRIPTED_CALLS = "scripted_calls"
MESSAGES_PATH = "/v1/messages"


def usage_in(stream: bytes) -> dict:
    """The usage the engine's streamed answer reported (either protocol)."""
    events = EventStream()
    events.feed(stream)
    return events.usage


def tool_use_events(model: str, calls: list[tuple[str, str, dict]], usage: dict) -> bytes:
    """An Anthropic streamed message whose content is the given (id, name, input) tool calls."""
    opening = {key: value for key, value in usage.items() if key != "output_tokens"}
    events = [format_event({"type": "message_start", "message": {
        "id": "msg_scripted", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {**opening, "output_tokens": 0}}}, "message_start")]
    for index, (call_id, name, tool_input) in enumerate(calls):
        events += [
            format_event({"type": "content_block_start", "index": index,
                          "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}}}, "content_block_start"),
            format_event({"type": "content_block_delta", "index": index,
                          "delta": {"type": "input_json_delta", "partial_json": json.dumps(tool_input)}}, "content_block_delta"),
            format_event({"type": "content_block_stop", "index": index}, "content_block_stop"),
        ]
    events += [
        format_event({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                      "usage": {"output_tokens": len(calls)}}, "message_delta"),
        format_event({"type": "message_stop"}, "message_stop"),
    ]
    return b"".join(events)


def function_call_events(model: str, calls: list[tuple[str, str, dict]], usage: dict) -> bytes:
    """A Responses stream whose output is the given (call id, name, arguments) function calls."""
    items = [{"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
              "arguments": json.dumps(arguments), "status": "completed"} for call_id, name, arguments in calls]
    response = {"id": "resp_scripted", "object": "response", "status": "in_progress", "model": model, "output": [], "usage": None}
    events = [format_event({"type": "response.created", "sequence_number": 0, "response": response}, "response.created")]
    for index, item in enumerate(items):
        events += [
            format_event({"type": "response.output_item.added", "sequence_number": 0, "output_index": index,
                          "item": {**item, "arguments": "", "status": "in_progress"}}, "response.output_item.added"),
            format_event({"type": "response.function_call_arguments.delta", "sequence_number": 0, "item_id": item["id"],
                          "output_index": index, "delta": item["arguments"]}, "response.function_call_arguments.delta"),
            format_event({"type": "response.output_item.done", "sequence_number": 0, "output_index": index, "item": item},
                         "response.output_item.done"),
        ]
    completed = {**response, "status": "completed", "output": items, "usage": usage or None}
    events.append(format_event({"type": "response.completed", "sequence_number": 0, "response": completed}, "response.completed"))
    return b"".join(events)


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(block.get("text", "") for block in content or [] if isinstance(block, dict) and isinstance(block.get("text"), str))


# Per path: the answer to script, and the text of the request's fresh user prompt (None: it ends otherwise).
def _anthropic_prompt(body: dict) -> str | None:
    messages = [message for message in body.get("messages") or [] if message.get("role") != "system"]
    if not messages or messages[-1].get("role") != "user":
        return None
    content = messages[-1].get("content")
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
        return None
    return _text(content)


def _responses_prompt(body: dict) -> str | None:
    items = body.get("input")
    if isinstance(items, str):
        return items
    last = items[-1] if isinstance(items, list) and items else None
    return _text(last.get("content")) if is_message(last) and last.get("role") == "user" else None


PROTOCOLS = {MESSAGES_PATH: (tool_use_events, _anthropic_prompt), RESPONSES_PATH: (function_call_events, _responses_prompt)}


def offered(body: dict) -> set[str]:
    """Tool names: Anthropic's and the Responses API's function tools both name themselves at the top."""
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
        path = flow.request.path.split("?")[0]
        if not self.steps or flow.request.method != "POST" or path not in PROTOCOLS:
            return
        try:
            body = json.loads(flow.request.content or b"")
        except ValueError:
            return
        step = self.steps[0]
        _, fresh_prompt = PROTOCOLS[path]
        prompt = fresh_prompt(body)
        if step["tool"] not in offered(body) or prompt is None or step.get("prompt_contains", "") not in prompt:
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
        answer, _ = PROTOCOLS[script["path"]]

        def replace(chunk: bytes) -> list[bytes]:
            engine_answer.append(previous(chunk) if previous else chunk)
            if chunk:
                return []  # nothing of the engine's answer goes on
            return [answer(script["model"], script["calls"], usage_in(b"".join(engine_answer)))]

        flow.response.stream = replace
        flow.response.headers.pop("content-length", None)


addons = [ScriptedToolUse()]
