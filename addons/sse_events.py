"""Server-sent events: the one parser, formatter and "first token" of the project.

A streaming modifier sees the body as the network delivers it: an event can be
split anywhere, even inside a multi-byte UTF-8 character. `SSEParser` keeps the
incomplete tail and only hands out whole events (text is decoded per complete
event, so split characters are never an issue). Each event keeps its original
bytes, so an addon that leaves an event alone can send exactly what it received.
`format_event` writes one. `carries_output` is what "first token" means
everywhere (capture, the bench's replay, test clients and recorders): the first
event that holds generated output, not the message opening that servers send
before they prefill. `EventStream` follows one response's events with it and
with `merge_usage` (and keeps llama.cpp's `timings`, where it reports its reuse: `stable_prefix/usage.py`). Three protocols: Anthropic messages, OpenAI chat
completions, and the Responses API, whose events are typed `response.*`
(`response.created` and `response.in_progress` come before the prefill, each
`….delta` carries output, `response.completed` holds the whole response: its
id, output items and usage).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stable_prefix.usage import timings_in

# An event ends at a blank line; servers use "\n" or "\r\n" line endings.
_EVENT_END = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True)
class SSEEvent:
    raw: bytes  # as received, including the blank line that ended it
    event: str | None  # the `event:` field, if any
    data: str | None  # the `data:` lines joined by "\n"; None for comments / keep-alives / undecodable bytes

    def json(self) -> Any | None:
        """The data as JSON, or None when there is none or it is not JSON (e.g. OpenAI's `[DONE]`)."""
        if self.data is None:
            return None
        try:
            return json.loads(self.data)
        except ValueError:
            return None


def parse_event(raw: bytes) -> SSEEvent:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return SSEEvent(raw=raw, event=None, data=None)
    event_name = None
    data_lines = []
    for line in text.splitlines():
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event_name = value
        elif field == "data":
            data_lines.append(value)
    return SSEEvent(raw=raw, event=event_name, data="\n".join(data_lines) if data_lines else None)


def format_event(data: Any, event: str | None = None) -> bytes:
    """One SSE event; `data` is serialized as compact JSON unless it is already a string."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {payload}\n\n".encode()


class SSEParser:
    """Feed it chunks; it returns the events completed so far."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        self._buffer += chunk
        events = []
        start = 0
        while match := _EVENT_END.search(self._buffer, start):
            events.append(parse_event(self._buffer[start : match.end()]))
            start = match.end()
        self._buffer = self._buffer[start:]
        return events

    def finish(self) -> bytes:
        """Bytes left after the last complete event (a stream cut short); the caller passes them on as they are."""
        rest, self._buffer = self._buffer, b""
        return rest


# Responses events that end a response; each holds the whole response object.
RESPONSE_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def carries_output(payload: Any) -> bool:
    """Whether an event holds generated output: an Anthropic `content_block_delta`
    (text, tool input or thinking), an OpenAI chunk with content, tool calls or
    reasoning, or a Responses `response.….delta` (text, call arguments,
    reasoning). `message_start` / a role-only first chunk / `response.created`
    do not: vllm-mlx sends them before it prefills. The first event that does
    marks the time to first token."""
    if not isinstance(payload, dict):
        return False
    kind = payload.get("type")
    if kind == "content_block_delta" or (isinstance(kind, str) and kind.startswith("response.") and kind.endswith(".delta") and payload.get("delta")):
        return True
    choices = payload.get("choices")
    return isinstance(choices, list) and any(
        isinstance(choice, dict) and isinstance(choice.get("delta"), dict) and any(choice["delta"].get(key) for key in ("content", "tool_calls", "reasoning_content"))
        for choice in choices
    )


def merge_usage(usage: dict, payload: Any) -> None:
    """Fold the usage found in one JSON payload (an SSE event or a whole
    response) into `usage`: Anthropic sends it in message_start and
    message_delta, OpenAI in the last chunk or the response, the Responses
    API in the response object (the last event's `response`)."""
    if not isinstance(payload, dict):
        return
    found = payload.get("usage")
    if payload.get("type") == "message_start" and isinstance(payload.get("message"), dict):
        found = payload["message"].get("usage")
    if payload.get("type") in RESPONSE_FINAL_EVENTS and isinstance(payload.get("response"), dict):
        found = payload["response"].get("usage")
    if isinstance(found, dict):
        usage.update({key: value for key, value in found.items() if value is not None})


def error_in(payload: Any) -> Any | None:
    """The error an event reports (Anthropic `{"type": "error", "error": ...}`, OpenAI `{"error": ...}`,
    Responses `response.failed` with its response's error), or None."""
    if not isinstance(payload, dict):
        return None
    if payload.get("type") == "response.failed" and isinstance(payload.get("response"), dict):
        return payload["response"].get("error") or "response.failed"
    if payload.get("type") == "error" or payload.get("error") is not None:
        return payload.get("error", payload)
    return None


def final_response(payload: Any) -> dict | None:
    """The response object a Responses stream ends with (`response.completed` and
    its kin), or None for any other event."""
    if isinstance(payload, dict) and payload.get("type") in RESPONSE_FINAL_EVENTS and isinstance(payload.get("response"), dict):
        return payload["response"]
    return None


class EventStream:
    """One response's events as they arrive: the usage they report (and llama.cpp's
    last `timings`), when the first one carrying output arrived (`first_output_at`,
    on `clock`), the first error event's error, and a Responses stream's final
    response object."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.parser = SSEParser()
        self.usage: dict = {}
        self.timings: dict | None = None
        self.first_output_at: float | None = None
        self.error: Any | None = None
        self.response: dict | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        events = self.parser.feed(chunk)
        for event in events:
            payload = event.json()
            merge_usage(self.usage, payload)
            self.timings = timings_in(payload) or self.timings
            if self.first_output_at is None and carries_output(payload):
                self.first_output_at = self.clock()
            if self.error is None:
                self.error = error_in(payload)
            self.response = final_response(payload) or self.response
        return events
