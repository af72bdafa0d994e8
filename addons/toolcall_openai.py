"""OpenAI Chat Completions: text tool calls become `tool_calls`.

Streamed (`/v1/chat/completions` with `stream: true`): each choice's
`delta.content` goes through a `ToolCallScanner`; text comes out as content
deltas, each found call as a `delta.tool_calls` entry (index 0, 1, ... per
choice, with id, type and the whole `function.arguments` at once), and the
choice's `finish_reason` becomes `"tool_calls"` once a call was made. Chunks
that need no change are sent as the original bytes; usage chunks and `[DONE]`
pass through.

Once the upstream sends `delta.tool_calls` itself for a choice, nothing more is
converted in it: the server's own parser is working for this response. If the
server sends structured calls only after calls were already made from the text
(vllm-mlx's end-of-stream parse of the whole text can find them again), they are
held until the choice finishes; repeats of a call already made (same name, same
arguments) are dropped, the others go out numbered after ours.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stable_prefix.addons.sse_events import SSEEvent, SSEParser, format_event
from stable_prefix.addons.text_tool_calls import SYNTAXES, Piece, Text, ToolCall, ToolCallScanner

# A converted call replaces these; "length" and the like still tell the truth.
_NATURAL_FINISHES = {"stop"}


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def offered_tool_names(request: dict[str, Any]) -> frozenset[str]:
    """Function tools the request lets the model call (none when tool_choice is "none")."""
    tools = request.get("tools")
    if not isinstance(tools, list) or request.get("tool_choice") == "none":
        return frozenset()
    names = set()
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return frozenset(names)


def tool_call_entry(call: ToolCall, index: int, new_id: Callable[[], str]) -> dict[str, Any]:
    return {
        "index": index,
        "id": new_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }


@dataclass(frozen=True)
class UpstreamCall:
    """A structured call the server sent after calls were made from text."""

    id: str | None
    name: str | None
    arguments: str


@dataclass
class _Choice:
    scanner: ToolCallScanner
    calls: int = 0  # tool_calls entries sent for this choice
    made: list[tuple[str, Any]] = field(default_factory=list)  # (name, arguments) of calls made from text
    held: dict[int, dict[str, Any]] = field(default_factory=dict)  # the server's later calls, by its index
    upstream_structured: bool = False
    finished: bool = False


@dataclass
class OpenAIStreamRewriter:
    offered_tools: frozenset[str]
    syntaxes: tuple[str, ...] = SYNTAXES
    new_id: Callable[[], str] = new_tool_call_id
    problems: list[str] = field(default_factory=list)
    duplicates_dropped: int = 0

    def __post_init__(self) -> None:
        self._parser = SSEParser()
        self._choices: dict[int, _Choice] = {}
        self._envelope: dict[str, Any] = {}  # id, model, created... of the last chunk, for chunks we add

    @property
    def calls_converted(self) -> int:
        return sum(choice.calls for choice in self._choices.values())

    @property
    def upstream_structured(self) -> bool:
        return any(choice.upstream_structured for choice in self._choices.values())

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._handle(event) for event in self._parser.feed(chunk))

    def finish(self) -> bytes:
        """End of the upstream stream (without `[DONE]`, or after it): whatever is still held goes out."""
        return self._finish_open_choices() + self._parser.finish()

    def _handle(self, event: SSEEvent) -> bytes:
        if event.data == "[DONE]":
            return self._finish_open_choices() + event.raw
        chunk = event.json()
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not choices or not all(isinstance(choice, dict) for choice in choices):
            return event.raw  # usage-only chunk, error, comment
        self._envelope = {key: value for key, value in chunk.items() if key not in ("choices", "usage")}
        outputs = [self._rewrite_choice(chunk, choice) for choice in choices]
        if all(output is None for output in outputs):
            return event.raw
        out = b""
        for choice, output in zip(choices, outputs, strict=True):
            out += output if output is not None else self._chunk_bytes(chunk, [choice])
        return out

    def _rewrite_choice(self, chunk: dict[str, Any], choice: dict[str, Any]) -> bytes | None:
        """The chunks this choice becomes, or None when it goes out unchanged."""
        state = self._state(choice.get("index", 0))
        delta = choice.get("delta") or {}
        upstream_calls = delta.get("tool_calls")
        if upstream_calls and not state.calls:
            state.upstream_structured = True
        if state.upstream_structured or state.finished:
            return None
        if upstream_calls:
            self._hold(state, upstream_calls)
        content = delta.get("content")
        pieces = state.scanner.feed(content) if isinstance(content, str) else []
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None:
            pieces += self._finish_choice(state)
        made_calls = state.calls + sum(not isinstance(piece, Text) for piece in pieces)
        new_finish = "tool_calls" if made_calls and finish_reason in _NATURAL_FINISHES else finish_reason
        unchanged = pieces == [Text(content)] or (not content and not pieces)
        if new_finish == finish_reason and not upstream_calls and unchanged:
            return None
        rest_of_delta = {key: value for key, value in delta.items() if key not in ("content", "tool_calls")}
        return self._piece_chunks(chunk, choice, rest_of_delta, pieces, state, new_finish)

    def _piece_chunks(
        self,
        chunk: dict[str, Any],
        choice: dict[str, Any],
        rest_of_delta: dict[str, Any],
        pieces: list[Piece | UpstreamCall],
        state: _Choice,
        finish_reason: str | None,
    ) -> bytes:
        deltas: list[dict[str, Any]] = []
        for piece in pieces:
            if isinstance(piece, Text):
                deltas.append({"content": piece.text})
                continue
            if isinstance(piece, ToolCall):
                entry = tool_call_entry(piece, state.calls, self.new_id)
                state.made.append((piece.name, piece.arguments))
            else:
                function = {"name": piece.name, "arguments": piece.arguments}
                entry = {"index": state.calls, "id": piece.id, "type": "function", "function": function}
            deltas.append({"tool_calls": [entry]})
            state.calls += 1
        if not deltas and not rest_of_delta and finish_reason is None and not chunk.get("usage"):
            return b""  # everything is held for now: nothing to say yet
        if rest_of_delta or not deltas:
            deltas.insert(0, {})
        deltas[0] = {**rest_of_delta, **deltas[0]}
        # Other per-choice fields (logprobs...) stay with the first chunk, the finish with the last.
        extra = {key: value for key, value in choice.items() if key not in ("index", "delta", "finish_reason")}
        out = b""
        for position, delta in enumerate(deltas):
            last = position == len(deltas) - 1
            new_choice = {
                "index": choice.get("index", 0),
                "delta": delta,
                **(extra if position == 0 else {}),
                "finish_reason": finish_reason if last else None,
            }
            # Usage belongs to the last chunk only (others keep the key, as null, if the upstream sends it).
            envelope = chunk if last or "usage" not in chunk else {**chunk, "usage": None}
            out += self._chunk_bytes(envelope, [new_choice])
        return out

    def _chunk_bytes(self, chunk: dict[str, Any], choices: list[dict[str, Any]]) -> bytes:
        return format_event({**chunk, "choices": choices})

    def _finish_choice(self, state: _Choice) -> list[Piece | UpstreamCall]:
        pieces: list[Piece | UpstreamCall] = state.scanner.finish()
        state.finished = True
        self.problems += state.scanner.problems
        made = state.made + [(piece.name, piece.arguments) for piece in pieces if isinstance(piece, ToolCall)]
        for _, held in sorted(state.held.items()):
            try:
                arguments = json.loads(held["arguments"])
            except ValueError:
                arguments = None
            if (held["name"], arguments) in made:
                made.remove((held["name"], arguments))
                self.duplicates_dropped += 1
            else:
                pieces.append(UpstreamCall(held["id"], held["name"], held["arguments"]))
        return pieces

    @staticmethod
    def _hold(state: _Choice, upstream_calls: list[Any]) -> None:
        """Collect the server's call fragments (id and name first, arguments in pieces)."""
        for fragment in upstream_calls:
            if not isinstance(fragment, dict):
                continue
            held = state.held.setdefault(fragment.get("index", 0), {"id": None, "name": None, "arguments": ""})
            function = fragment.get("function") or {}
            held["id"] = fragment.get("id") or held["id"]
            held["name"] = function.get("name") or held["name"]
            held["arguments"] += function.get("arguments") or ""

    def _finish_open_choices(self) -> bytes:
        """A stream that ends without a finish_reason: flush what the scanners hold."""
        out = b""
        for index, state in self._choices.items():
            if state.finished or state.upstream_structured:
                continue
            pieces = self._finish_choice(state)
            if pieces:
                choice = {"index": index, "delta": {}, "finish_reason": None}
                out += self._piece_chunks(self._envelope, choice, {}, pieces, state, None)
        return out

    def _state(self, index: int) -> _Choice:
        if index not in self._choices:
            self._choices[index] = _Choice(ToolCallScanner(self.offered_tools, self.syntaxes))
        return self._choices[index]


def rewrite_completion(
    completion: dict[str, Any],
    offered_tools: frozenset[str],
    syntaxes: tuple[str, ...] = SYNTAXES,
    new_id: Callable[[], str] = new_tool_call_id,
) -> tuple[dict[str, Any] | None, int, list[str]]:
    """A non-streamed completion: (rewritten completion or None if unchanged, calls converted, problems)."""
    choices = completion.get("choices")
    if not isinstance(choices, list):
        return None, 0, []
    rewritten = copy.deepcopy(completion)
    calls, problems = 0, []
    for choice in rewritten["choices"]:
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict) or message.get("tool_calls") or not isinstance(message.get("content"), str):
            continue
        scanner = ToolCallScanner(offered_tools, syntaxes)
        pieces = scanner.feed(message["content"]) + scanner.finish()
        problems += scanner.problems
        if not scanner.calls_found:
            continue
        found = [piece for piece in pieces if isinstance(piece, ToolCall)]
        text = "".join(piece.text for piece in pieces if isinstance(piece, Text))
        message["content"] = text or None
        message["tool_calls"] = [
            {key: value for key, value in tool_call_entry(call, 0, new_id).items() if key != "index"} for call in found
        ]
        if choice.get("finish_reason") in _NATURAL_FINISHES:
            choice["finish_reason"] = "tool_calls"
        calls += len(found)
    return (rewritten if calls else None), calls, problems
