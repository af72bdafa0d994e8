"""A chat completion stream broken off, and another answer spliced into it: what the client has, and what it gets next.

OpenAI chat completions stream one `chat.completion.chunk` per event: a first
chunk with the role, then deltas of the one choice (`reasoning_content`,
`content`, `tool_calls` fragments: an id, type and name first, then pieces of
the arguments), a chunk with its `finish_reason`, a usage chunk (`choices: []`)
when the client asked for it, and `data: [DONE]`. An event carries any number of tokens: vllm-mlx's batched
engine merges outputs when the stream lags, a drafted step sends its accepted
run in one, a partial character or the stop token sends none. So tokens are
never counted here by events, only by what the server reports (`usage`).

`Delivered` is what the client has been sent of such a stream: the envelope
(id, created, model, system_fingerprint) and, in order, the segments of text
of each field (`Segment`: reasoning, content, or one tool call's arguments,
with that call's id and name). `stream_recovery.py` builds it from the events
that passed, and asks for another answer to the same request: the same
request again (a replay) or the request with the text delivered so far as an
assistant message the engine continues (a continuation). `Splice` turns that
answer's chunks into what the client gets next, so that what it reads is one
answer:

- replay: every piece of the replay's output is checked against what was
  delivered, in order, and only what goes beyond it is sent; the first piece
  that differs (sampling, or arithmetic that moved a near tie) stops it
  (`Diverged`), and nothing of that piece is sent;
- continuation: every piece is new;
- in both, the role chunk is not sent twice, nor the finish, every chunk
  carries the first answer's envelope (so the client sees one id), a tool
  call already begun keeps the id and name the client has, and the usage is
  that of the whole answer (`usage_of_whole_answer`), sent only to a client
  that asked for it.

A continuation's cap and usage need the tokens the client has, as the server
counts them: `count_request` asks the server for a prompt's token count (its
`usage.prompt_tokens`, for one generated token), of the original request and
of the continuation; the difference is what was delivered.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

from stable_prefix.addons.sse_events import SSEEvent, format_event

ENVELOPE_KEYS = ("id", "object", "created", "model", "system_fingerprint")
# The delta fields that carry generated text, in the order vllm-mlx streams them (`reasoning` is its older name).
REASONING_FIELDS = ("reasoning_content", "reasoning")
DONE = "[DONE]"


class Diverged(Exception):
    """A replay's output is not what the client was sent: the replay cannot continue the stream."""


@dataclass
class Segment:
    kind: str  # "reasoning", "content" or "tool"
    text: str  # the text (a tool call: its arguments) delivered
    index: int | None = None  # a tool call's index
    call_id: str | None = None
    name: str | None = None

    @property
    def key(self) -> tuple[str, int | None]:
        return self.kind, self.index


@dataclass
class Piece:
    """One field's text in one chunk's delta."""

    kind: str
    text: str
    index: int | None = None
    call_id: str | None = None
    name: str | None = None

    @property
    def key(self) -> tuple[str, int | None]:
        return self.kind, self.index


def pieces_of(delta: dict) -> list[Piece]:
    """The text a delta carries, field by field, in stream order."""
    pieces = []
    reasoning = next((delta[name] for name in REASONING_FIELDS if isinstance(delta.get(name), str)), None)
    if reasoning:
        pieces.append(Piece("reasoning", reasoning))
    if isinstance(delta.get("content"), str) and delta["content"]:
        pieces.append(Piece("content", delta["content"]))
    for fragment in delta.get("tool_calls") or []:
        if isinstance(fragment, dict):
            function = fragment.get("function") if isinstance(fragment.get("function"), dict) else {}
            pieces.append(Piece("tool", function.get("arguments") or "", fragment.get("index", 0), fragment.get("id"), function.get("name")))
    return pieces


@dataclass
class Delivered:
    """What the client has been sent of one chat completion stream (choice 0)."""

    envelope: dict = field(default_factory=dict)
    segments: list[Segment] = field(default_factory=list)
    role_sent: bool = False
    output_events: int = 0  # chunks carrying generated text (not tokens: a chunk carries any number)
    finish_reason: str | None = None
    usage_sent: bool = False
    done_sent: bool = False
    unreadable: str | None = None  # why another answer cannot be spliced in (an error event, several choices, ...)

    def observe(self, event: SSEEvent) -> None:
        """One whole event that went to the client."""
        if event.data is None:
            return  # a comment or keep-alive
        if event.data.strip() == DONE:
            self.done_sent = True
            return
        chunk = event.json()
        if not isinstance(chunk, dict) or "error" in chunk:
            self.unreadable = self.unreadable or "the stream carried an error or an event that is not a chunk"
            return
        self.envelope = self.envelope or {key: chunk[key] for key in ENVELOPE_KEYS if key in chunk}
        self.usage_sent = self.usage_sent or bool(chunk.get("usage"))
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                self.unreadable = self.unreadable or "more than one choice"
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            self.role_sent = self.role_sent or "role" in delta
            pieces = pieces_of(delta)
            self.output_events += bool(pieces)
            for piece in pieces:
                self.add(piece)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def add(self, piece: Piece) -> None:
        last = self.segments[-1] if self.segments else None
        if last is not None and last.key == piece.key:
            last.text += piece.text
            return
        self.segments.append(Segment(piece.kind, piece.text, piece.index, piece.call_id, piece.name))

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def text(self) -> str:
        return "".join(segment.text for segment in self.segments if segment.kind == "content")

    def continuable(self) -> str | None:
        """Why the delivered part cannot be given to the engine to continue, or None: only text can
        (reasoning and tool calls render in each model's own way inside the assistant message)."""
        if self.unreadable:
            return self.unreadable
        kinds = {segment.kind for segment in self.segments}
        if kinds - {"content"}:
            return f"the client has {' and '.join(sorted(kinds - {'content'}))} of the answer, which a continuation cannot carry"
        return None


def continuation_request(body: dict, delivered: Delivered, delivered_tokens: int | None) -> dict:
    """The request that makes the engine continue the delivered text: it as the assistant's last
    message, rendered without a generation prompt and without its end (vllm-mlx passes
    `chat_template_kwargs` to the tokenizer's template: `continue_final_message`), with its usage asked
    for (the whole answer's is made from it), and the output cap less the `delivered_tokens` as the server
    counted them. Where they could not be counted, the cap is less the chunks that carried output, each
    at least one token: a lower bound, so the answer may run past the cap by the tokens chunks merged."""
    request = copy.deepcopy(body)
    request["messages"] = [*request.get("messages", []), {"role": "assistant", "content": delivered.text()}]
    template = request.get("chat_template_kwargs") if isinstance(request.get("chat_template_kwargs"), dict) else {}
    request["chat_template_kwargs"] = {**template, "add_generation_prompt": False, "continue_final_message": True}
    options = request.get("stream_options") if isinstance(request.get("stream_options"), dict) else {}
    request["stream_options"] = {**options, "include_usage": True}
    spent = delivered.output_events if delivered_tokens is None else delivered_tokens
    for cap in ("max_tokens", "max_completion_tokens"):
        if isinstance(request.get(cap), int):
            request[cap] = max(1, request[cap] - spent)
    return request


def count_request(body: dict) -> dict:
    """The request whose answer's `usage.prompt_tokens` is the server's count of `body`'s prompt: not
    streamed, one token generated (a continuation then finds the prompt in the engine's prefix cache)."""
    request = {key: value for key, value in body.items() if key not in ("stream", "stream_options", "max_completion_tokens", "n")}
    return {**request, "stream": False, "max_tokens": 1}


def prompt_tokens_of(answer: bytes) -> int | None:
    """The prompt's token count in a count request's answer (a chat completion object), or None."""
    try:
        usage = json.loads(answer).get("usage")
    except (ValueError, AttributeError):
        return None
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) and count >= 0 else None


def usage_of_whole_answer(usage: dict, original_prompt_tokens: int | None) -> dict:
    """A replay's usage is the whole answer's already (`original_prompt_tokens` None). A continuation's
    prompt holds the original prompt and the delivered tokens: the whole answer's prompt is the original's
    (as the server counted it), and every token beyond it was generated (the total unchanged)."""
    if original_prompt_tokens is None or not isinstance(usage.get("prompt_tokens"), int) or not isinstance(usage.get("completion_tokens"), int):
        return usage
    moved = min(max(0, usage["prompt_tokens"] - original_prompt_tokens), usage["prompt_tokens"])
    whole = {**usage, "prompt_tokens": usage["prompt_tokens"] - moved, "completion_tokens": usage["completion_tokens"] + moved}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        whole["prompt_tokens_details"] = {**details, "cached_tokens": min(details["cached_tokens"], whole["prompt_tokens"])}
    return whole


class Splice:
    """Turns another answer's events into the events the client gets next (module docstring)."""

    def __init__(self, delivered: Delivered, *, continuation: bool, original_prompt_tokens: int | None = None, usage_wanted: bool = True) -> None:
        self.continuation = continuation
        # A continuation's usage is made the whole answer's from the original prompt's count (None: unknown, left as it is).
        self.original_prompt_tokens = original_prompt_tokens if continuation else None
        self.usage_wanted = usage_wanted  # the client asked for the usage chunk
        self.envelope = dict(delivered.envelope)
        self.role_sent = delivered.role_sent
        # A replay must first repeat these, in order; a continuation repeats nothing.
        self.to_verify = [] if continuation else [Segment(s.kind, s.text, s.index, s.call_id, s.name) for s in delivered.segments]
        self.begun_calls = {s.index: s for s in delivered.segments if s.kind == "tool"}
        self.finish_sent = delivered.finished  # the client has the answer's end (cut before its usage chunk)
        self.finished = False

    def events(self, event: SSEEvent) -> list[bytes]:
        """What the client gets for one event of the other answer; Diverged when a replay differs."""
        if event.data is None:
            return []
        if event.data.strip() == DONE:
            self.finished = True
            return [format_event(DONE)]
        chunk = event.json()
        if not isinstance(chunk, dict) or "error" in chunk:
            raise Diverged(f"the other answer sent an error: {event.data[:300]}")
        if not self.envelope:
            self.envelope = {key: chunk[key] for key in ENVELOPE_KEYS if key in chunk}
        choices = []
        for choice in chunk.get("choices") or []:
            spliced = self._choice(choice)
            if spliced is not None:
                choices.append(spliced)
        usage = chunk.get("usage") if self.usage_wanted else None
        if not choices and not usage and (chunk.get("choices") or chunk.get("usage")):
            return []  # everything in it was delivered already, or a usage the client did not ask for
        out = {key: value for key, value in chunk.items() if key != "usage"} | self.envelope | {"choices": choices}
        if usage:
            out["usage"] = usage_of_whole_answer(usage, self.original_prompt_tokens)
        return [format_event(out)]

    def _choice(self, choice: dict) -> dict | None:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            raise Diverged("the other answer has more than one choice")
        delta = dict(choice.get("delta") or {})
        if self.role_sent:
            delta.pop("role", None)
        self.role_sent = self.role_sent or "role" in delta
        new = {key: value for key, value in delta.items() if key not in ("content", "tool_calls", *REASONING_FIELDS)}
        for piece in pieces_of(delta):
            self._put(new, piece, self._beyond_delivered(piece))
        finish = choice.get("finish_reason")
        if finish is not None and self.to_verify:
            raise Diverged(f"the replay ended ({finish}) where the client has more")
        if self.finish_sent:
            finish = None  # never a second end
        self.finish_sent = self.finish_sent or finish is not None
        if not new and finish is None:
            return None
        return {**{k: v for k, v in choice.items() if k not in ("delta", "finish_reason")}, "delta": new, "finish_reason": finish}

    def _beyond_delivered(self, piece: Piece) -> str:
        """The part of `piece` the client does not have; Diverged where it differs from what it has."""
        if not self.to_verify:
            return piece.text
        expected = self.to_verify[0]
        if piece.key != expected.key or (piece.kind == "tool" and piece.name is not None and piece.name != expected.name):
            raise Diverged(f"the replay wrote {piece.kind} where the client has {expected.kind}")
        shared = min(len(piece.text), len(expected.text))
        if piece.text[:shared] != expected.text[:shared]:
            raise Diverged(f"the replay wrote {piece.text[:shared]!r} where the client has {expected.text[:shared]!r}")
        expected.text = expected.text[shared:]
        rest = piece.text[shared:]
        if not expected.text:
            self.to_verify.pop(0)
        if rest and self.to_verify:
            raise Diverged(f"the replay went on with {piece.kind} where the client has {self.to_verify[0].kind} next")
        return rest

    def _put(self, delta: dict, piece: Piece, text: str) -> None:
        if piece.kind == "tool":
            begun = self.begun_calls.get(piece.index)
            if begun is None:  # a call the client has not seen: as the engine sent it (its own id)
                self.begun_calls[piece.index] = Segment("tool", "", piece.index, piece.call_id, piece.name)
                fragment = {"index": piece.index, "id": piece.call_id, "type": "function", "function": {"name": piece.name, "arguments": text}}
                delta.setdefault("tool_calls", []).append({k: v for k, v in fragment.items() if v is not None})
            elif text:  # more of a call the client has begun: its id and name were sent already
                delta.setdefault("tool_calls", []).append({"index": piece.index, "function": {"arguments": text}})
            return
        if text:
            name = "reasoning_content" if piece.kind == "reasoning" else "content"
            delta[name] = delta.get(name, "") + text
