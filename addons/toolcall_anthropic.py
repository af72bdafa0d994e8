"""Anthropic Messages API: text tool calls become `tool_use` content blocks.

Streamed (`/v1/messages` with `stream: true`): each upstream text block's
`text_delta`s go through a `ToolCallScanner`; text comes out as text deltas of
the same block, each found call closes the text block and comes out as a
`tool_use` block (`content_block_start` with id and name, one `input_json_delta`,
`content_block_stop`), and text after it opens a new text block. Blocks are
renumbered as they go out, so indexes always count 0, 1, 2, ... as the SDKs
require. `message_delta` gets `stop_reason: "tool_use"` once a call was made;
usage is left as it is. Events that need no change are sent as the original bytes.

Once the upstream sends a structured `tool_use` block itself, nothing more is
converted: the server's own parser is working for this response. vllm-mlx can
also do both: stream a call as text (its streaming parser missed it) and then,
parsing the whole text at the end, send it again as a `tool_use` block. Such a
block is held until complete and dropped when it repeats a call already made
from the text (same name, same input), so the client never runs a call twice.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Callable
from typing import Any

from stable_prefix.addons.sse_events import SSEEvent, SSEParser, format_event
from stable_prefix.addons.text_tool_calls import SYNTAXES, Piece, Text, ToolCall, ToolCallScanner

STRUCTURED_CALL_TYPES = ("tool_use", "server_tool_use")  # a tuple: a block's type may be any JSON value
# A converted call replaces these; "max_tokens" and the like still tell the truth.
_NATURAL_STOPS = {"end_turn", "stop_sequence", None}


def new_tool_use_id() -> str:
    return "toolu_" + secrets.token_hex(12)


def offered_tool_names(request: dict[str, Any]) -> frozenset[str]:
    """Tools the request lets the model call (none when tool_choice is "none")."""
    tools = request.get("tools")
    choice = request.get("tool_choice")
    if not isinstance(tools, list) or (isinstance(choice, dict) and choice.get("type") == "none"):
        return frozenset()
    return frozenset(tool["name"] for tool in tools if isinstance(tool, dict) and isinstance(tool.get("name"), str))


def tool_use_block(call: ToolCall, new_id: Callable[[], str]) -> dict[str, Any]:
    return {"type": "tool_use", "id": new_id(), "name": call.name, "input": call.arguments}


class AnthropicStreamRewriter:
    def __init__(
        self,
        offered_tools: frozenset[str],
        syntaxes: tuple[str, ...] = SYNTAXES,
        new_id: Callable[[], str] = new_tool_use_id,
    ) -> None:
        self.offered_tools = offered_tools
        self.syntaxes = syntaxes
        self.new_id = new_id
        self.calls_converted = 0
        self.problems: list[str] = []
        self.upstream_structured = False
        self._parser = SSEParser()
        self._next_index = 0
        self._index_map: dict[int, int] = {}  # upstream index -> our index, for blocks passed through
        # The upstream text block being scanned, and what we made of it so far.
        self._scanner: ToolCallScanner | None = None
        self._text_index: int | None = None  # upstream index of that block
        self._text_start: SSEEvent | None = None
        self._open_index: int | None = None  # our index of the text block currently open downstream
        self._block_emitted_anything = False
        self._made_calls: list[tuple[str, Any]] = []  # (name, input) of the calls made from text
        self._held_block: list[SSEEvent] | None = None  # an upstream tool_use block after calls were made
        self._held_index: int | None = None
        self.duplicates_dropped = 0

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._handle(event) for event in self._parser.feed(chunk))

    def finish(self) -> bytes:
        """End of the upstream stream: whatever is still held goes out."""
        held, self._held_block = self._held_block or [], None  # an upstream block cut short: as it came
        return self._finish_text_block() + b"".join(event.raw for event in held) + self._parser.finish()

    def _handle(self, event: SSEEvent) -> bytes:
        data = event.json()
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "content_block_start":
            return self._block_start(event, data)
        if kind in ("content_block_delta", "content_block_stop"):
            if self._held_block is not None and data.get("index") == self._held_index:
                return self._held_block_event(event, data)
            if self._scanner is not None and data.get("index") == self._text_index:
                return self._text_event(event, data)
            return self._reindexed(event, data)
        if kind == "message_delta":
            return self._finish_text_block() + self._message_delta(event, data)
        if kind == "message_stop":
            return self._finish_text_block() + event.raw
        return event.raw  # message_start, ping, error, comments, anything unknown

    def _block_start(self, event: SSEEvent, data: dict[str, Any]) -> bytes:
        out = self._finish_text_block()
        block = data.get("content_block") or {}
        if block.get("type") in STRUCTURED_CALL_TYPES:
            if not self._made_calls:
                self.upstream_structured = True
            else:
                self._held_block, self._held_index = [event], data.get("index")
                return out
        if block.get("type") == "text" and not self.upstream_structured:
            self._scanner = ToolCallScanner(self.offered_tools, self.syntaxes)
            self._text_index = data.get("index")
            self._text_start = event
            self._block_emitted_anything = False
            return out + self._emit(self._scanner.feed(block.get("text", "")))
        self._index_map[data.get("index")] = self._next_index
        self._next_index += 1
        return out + self._reindexed(event, data)

    def _text_event(self, event: SSEEvent, data: dict[str, Any]) -> bytes:
        if data["type"] == "content_block_stop":
            return self._finish_text_block()
        delta = data.get("delta") or {}
        if delta.get("type") != "text_delta":
            return self._reindexed_text_event(event, data)
        pieces = self._scanner.feed(delta.get("text", ""))
        if pieces == [Text(delta.get("text", ""))]:
            out = self._open_text_block()
            if self._open_index == self._text_index:  # unchanged text, unchanged place: the original bytes
                self._block_emitted_anything = True
                return out + event.raw
            return out + self._emit(pieces)
        return self._emit(pieces)

    def _held_block_event(self, event: SSEEvent, data: dict[str, Any]) -> bytes:
        self._held_block.append(event)
        if data["type"] != "content_block_stop":
            return b""
        events, self._held_block = self._held_block, None
        block = events[0].json()["content_block"]
        streamed_input = "".join(
            e.json()["delta"].get("partial_json", "") for e in events[1:-1] if e.json()["delta"].get("type") == "input_json_delta"
        )
        try:
            call_input = json.loads(streamed_input) if streamed_input else block.get("input", {})
        except ValueError:
            call_input = None
        if (block.get("name"), call_input) in self._made_calls:
            self._made_calls.remove((block.get("name"), call_input))
            self.duplicates_dropped += 1
            return b""
        self._index_map[self._held_index] = self._next_index
        self._next_index += 1
        return b"".join(self._reindexed(e, e.json()) for e in events)

    def _reindexed_text_event(self, event: SSEEvent, data: dict[str, Any]) -> bytes:
        """A non-text delta inside a text block (e.g. citations): keep it, in the open block."""
        out = self._open_text_block()
        self._block_emitted_anything = True
        if self._open_index == data.get("index"):
            return out + event.raw
        return out + format_event({**data, "index": self._open_index}, event.event)

    def _finish_text_block(self) -> bytes:
        if self._scanner is None:
            return b""
        out = self._emit(self._scanner.finish())
        if not self._block_emitted_anything:
            out += self._open_text_block()  # an empty block stays an empty block
        if self._open_index is not None:
            out += format_event({"type": "content_block_stop", "index": self._open_index}, "content_block_stop")
        self.calls_converted += self._scanner.calls_found
        self.problems += self._scanner.problems
        self._scanner = self._text_index = self._text_start = self._open_index = None
        return out

    def _emit(self, pieces: list[Piece]) -> bytes:
        out = b""
        for piece in pieces:
            if isinstance(piece, Text):
                out += self._open_text_block()
                delta = {"type": "text_delta", "text": piece.text}
                out += format_event(
                    {"type": "content_block_delta", "index": self._open_index, "delta": delta}, "content_block_delta"
                )
            else:
                out += self._tool_use_block(piece)
            self._block_emitted_anything = True
        return out

    def _open_text_block(self) -> bytes:
        if self._open_index is not None:
            return b""
        self._open_index = self._next_index
        self._next_index += 1
        start = self._text_start.json() if self._text_start is not None else {}
        if start.get("index") == self._open_index and start.get("content_block", {}).get("text") == "":
            return self._text_start.raw
        return format_event(
            {"type": "content_block_start", "index": self._open_index, "content_block": {"type": "text", "text": ""}},
            "content_block_start",
        )

    def _tool_use_block(self, call: ToolCall) -> bytes:
        out = b""
        if self._open_index is not None:
            out += format_event({"type": "content_block_stop", "index": self._open_index}, "content_block_stop")
            self._open_index = None
        index = self._next_index
        self._next_index += 1
        self._made_calls.append((call.name, call.arguments))
        block = {**tool_use_block(call, self.new_id), "input": {}}
        delta = {"type": "input_json_delta", "partial_json": call.arguments_json}
        out += format_event({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start")
        out += format_event({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
        out += format_event({"type": "content_block_stop", "index": index}, "content_block_stop")
        return out

    def _reindexed(self, event: SSEEvent, data: dict[str, Any]) -> bytes:
        index = self._index_map.get(data.get("index"), data.get("index"))
        if index == data.get("index"):
            return event.raw
        return format_event({**data, "index": index}, event.event)

    def _message_delta(self, event: SSEEvent, data: dict[str, Any]) -> bytes:
        delta = data.get("delta") or {}
        if not self.calls_converted or delta.get("stop_reason") not in _NATURAL_STOPS:
            return event.raw
        return format_event({**data, "delta": {**delta, "stop_reason": "tool_use", "stop_sequence": None}}, event.event)


def rewrite_message(
    message: dict[str, Any],
    offered_tools: frozenset[str],
    syntaxes: tuple[str, ...] = SYNTAXES,
    new_id: Callable[[], str] = new_tool_use_id,
) -> tuple[dict[str, Any] | None, int, list[str]]:
    """A non-streamed Messages response: (rewritten message or None if unchanged, calls converted, problems)."""
    content = message.get("content")
    if not isinstance(content, list) or any(
        isinstance(block, dict) and block.get("type") in STRUCTURED_CALL_TYPES for block in content
    ):
        return None, 0, []
    new_content: list[dict[str, Any]] = []
    calls, problems = 0, []
    for block in content:
        if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)):
            new_content.append(block)
            continue
        scanner = ToolCallScanner(offered_tools, syntaxes)
        pieces = scanner.feed(block["text"]) + scanner.finish()
        calls += scanner.calls_found
        problems += scanner.problems
        if not scanner.calls_found:
            new_content.append(block)
            continue
        made: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, ToolCall):
                made.append(tool_use_block(piece, new_id))
            elif made and made[-1]["type"] == "text":
                made[-1]["text"] += piece.text
            else:
                made.append({"type": "text", "text": piece.text})
        new_content += made
    if not calls:
        return None, 0, problems
    rewritten = copy.deepcopy(message)
    rewritten["content"] = new_content
    if rewritten.get("stop_reason") in _NATURAL_STOPS:
        rewritten["stop_reason"], rewritten["stop_sequence"] = "tool_use", None
    return rewritten, calls, problems
