"""Tool calls that a model wrote as text, found while the text is still streaming.

Local Coder models served by vllm-mlx sometimes print a tool call instead of
making one: Hermes style

    <tool_call>
    {"name": "Read", "arguments": {"file_path": "/tmp/a.py"}}
    </tool_call>

(several in a row), or a fenced ```json block holding the same object. When the
server's parser misses it, the client receives the JSON as ordinary text.

`ToolCallScanner` takes the text in whatever pieces it arrives and returns
`Text` pieces (to send on at once) and `ToolCall` pieces (complete calls). Text
before a call is never delayed, except for a few characters at the end of a
piece that might be the start of an opening tag, held back until the next piece
decides. From an opening on, the text is kept until the call is complete.
Anything that turns out not to be a valid call to an offered tool is handed back
as the original text, never dropped, and described in `problems`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

HERMES = "hermes"  # <tool_call>{...}</tool_call>
JSON_FENCE = "json_fence"  # ```json {...} ```
SYNTAXES = (HERMES, JSON_FENCE)

_OPENING = {HERMES: "<tool_call>", JSON_FENCE: "```json"}
_CLOSING = {HERMES: "</tool_call>", JSON_FENCE: "```"}

# A call that never closes is given up (and sent on as text) beyond this size,
# so a model that rambles after "<tool_call>" cannot make the proxy hold megabytes.
MAX_CALL_CHARS = 1_000_000


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    source: str  # the text it was written as

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


Piece = Text | ToolCall


def parse_tool_call(body: str) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments) from the JSON between the tags, or why it is not a call."""
    try:
        value = json.loads(body)
    except ValueError as error:
        return f"JSON does not parse ({error})"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return 'JSON is not an object with a string "name"'
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some templates double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return f'"arguments" of {value["name"]!r} is a string that is not JSON'
    if not isinstance(arguments, dict):
        return f'"arguments" of {value["name"]!r} is not an object'
    return value["name"], arguments


@dataclass
class ToolCallScanner:
    offered_tools: frozenset[str]
    syntaxes: tuple[str, ...] = SYNTAXES
    calls_found: int = 0
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._pending = ""  # text not yet handed out
        self._syntax: str | None = None  # inside a call of this syntax
        self._scan_pos = 0  # how far the pending call text has been scanned for its closing
        self._in_string = False
        self._escaped = False
        # Whitespace at the start and between calls is held: a reply that is only
        # calls should not grow empty text blocks around them.
        self._held_whitespace = ""
        self._holding_whitespace = True

    def feed(self, text: str) -> list[Piece]:
        self._pending += text
        pieces: list[Piece] = []
        while self._pending:
            if self._syntax is None:
                if not self._scan_text(pieces):
                    break
            elif not self._scan_call(pieces):
                break
        return pieces

    def finish(self) -> list[Piece]:
        """The end of the text: hand out what is left."""
        pieces: list[Piece] = []
        if self._syntax is not None:
            opening = _OPENING[self._syntax]
            body, self._pending = self._pending, ""
            # A model stopped by a "</tool_call>" stop sequence never prints the
            # closing tag; a complete call is still a call.
            self._resolve(opening + body, body, pieces, unclosed=True)
            self._syntax = None
        rest, self._pending = self._pending, ""
        self._emit_text(rest, pieces)
        # Whitespace after the last call is dropped (as the server's own parser
        # does); a reply that is only whitespace is kept.
        if self._held_whitespace and not self.calls_found:
            pieces.append(Text(self._held_whitespace))
        self._held_whitespace = ""
        return pieces

    def _scan_text(self, pieces: list[Piece]) -> bool:
        """Hand out text up to the next opening; False when more input is needed."""
        found = [(self._pending.find(_OPENING[s]), s) for s in self.syntaxes]
        found = [(at, s) for at, s in found if at >= 0]
        if found:
            at, syntax = min(found)
            self._emit_text(self._pending[:at], pieces)
            self._pending = self._pending[at + len(_OPENING[syntax]) :]
            self._syntax, self._scan_pos, self._in_string, self._escaped = syntax, 0, False, False
            return True
        keep = self._partial_opening_length(self._pending)
        self._emit_text(self._pending[: len(self._pending) - keep], pieces)
        self._pending = self._pending[len(self._pending) - keep :]
        return False

    def _partial_opening_length(self, text: str) -> int:
        """Length of the longest end of `text` that could still become an opening."""
        longest = 0
        for syntax in self.syntaxes:
            opening = _OPENING[syntax]
            for length in range(min(len(opening) - 1, len(text)), longest, -1):
                if opening.startswith(text[-length:]):
                    longest = length
                    break
        return longest

    def _scan_call(self, pieces: list[Piece]) -> bool:
        """Look for the closing outside JSON strings; False when more input is needed."""
        closing = _CLOSING[self._syntax]
        text = self._pending
        position = self._scan_pos
        while position < len(text):
            char = text[position]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"' or char == "\n":  # a raw newline cannot be inside a JSON string
                    self._in_string = False
                position += 1
                continue
            if char == '"':
                self._in_string = True
            elif text.startswith(closing, position):
                body = text[:position]
                source = _OPENING[self._syntax] + body + closing
                self._pending = text[position + len(closing) :]
                self._syntax = None
                self._resolve(source, body, pieces, unclosed=False)
                return True
            elif len(text) - position < len(closing) and closing.startswith(text[position:]):
                break  # maybe the start of the closing: wait for more
            position += 1
        self._scan_pos = position
        if len(text) > MAX_CALL_CHARS:
            self.problems.append(f"a {self._syntax} tool call grew past {MAX_CALL_CHARS} characters without closing")
            source = _OPENING[self._syntax] + text
            self._pending, self._syntax = "", None
            self._emit_text(source, pieces)
            return True
        return False

    def _resolve(self, source: str, body: str, pieces: list[Piece], *, unclosed: bool) -> None:
        parsed = parse_tool_call(body)
        if isinstance(parsed, str):
            reason = parsed
        elif parsed[0] not in self.offered_tools:
            reason = f"tool {parsed[0]!r} was not offered (offered: {', '.join(sorted(self.offered_tools))})"
        else:
            self.calls_found += 1
            self._held_whitespace = ""
            self._holding_whitespace = True
            pieces.append(ToolCall(name=parsed[0], arguments=parsed[1], source=source))
            return
        # A fenced block that is plain JSON (no "name") is ordinary content, not a failed call.
        looks_like_call = source.startswith(_OPENING[HERMES]) or '"name"' in body
        if looks_like_call:
            where = "unclosed at the end of the text" if unclosed else "closed"
            self.problems.append(f"text tool call ({where}) sent on as text: {reason}")
        self._emit_text(source, pieces)

    def _emit_text(self, text: str, pieces: list[Piece]) -> None:
        if not text:
            return
        if self._holding_whitespace:
            if not text.strip():
                self._held_whitespace += text
                return
            text, self._held_whitespace, self._holding_whitespace = self._held_whitespace + text, "", False
        pieces.append(Text(text))
