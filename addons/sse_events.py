"""Server-sent events, cut out of a byte stream that arrives in arbitrary chunks.

A streaming modifier sees the body as the network delivers it: an event can be
split anywhere, even inside a multi-byte UTF-8 character. `SSEParser` keeps the
incomplete tail and only hands out whole events (text is decoded per complete
event, so split characters are never an issue). Each event keeps its original
bytes, so an addon that leaves an event alone can send exactly what it received.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

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
