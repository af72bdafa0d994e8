"""A chat completion stream the engine broke off (its replica died mid-reply) is completed by the proxy.

Qwen Code and Pi do not send a request again when its stream is cut: the turn
is lost (`bench/probes/agent_cuts.py` measures every agent). So when an OpenAI chat
completion stream (`POST /v1/chat/completions`, `stream: true`) is broken off
after its response began, the proxy asks the upstream (a router, which has
moved the request's key to a survivor, or the engine come back) for the
answer again and splices it into the client's open stream
(`chat_splice.py`): the client reads one whole answer, one id, no text twice
or missing, tool calls whole, usage of the whole answer. How (`stream_recovery`):

- `replay` (the default): the same request again; the replay's output is
  checked against what the client has, piece by piece, and only what goes
  beyond it is sent. Under greedy decoding that is the answer the engine would
  have given uncut, token for token, whatever the cut: before the first output
  event (then simply the request sent again) or mid-reply, in text, reasoning
  or a tool call. Where the replay differs (sampling), it stops at the first
  piece that differs, before sending any of it, and a continuation follows.
- `continue`: at once a continuation: the request with the text delivered so
  far as the assistant's last message, which the engine continues
  (`chat_splice.continuation_request`): no output decoded twice; a
  continuation of what was sent, the same as the uncut answer where the
  delivered text tokenizes back into the tokens generated (a model's text
  usually does; a random-weight model's often does not). Its cap and usage
  count the delivered tokens as the upstream counts them (two one-token
  requests before it: the prompt's count, and the prompt's with the
  delivered text), never by the events that carried them.
- `off`: the stream ends with the protocol's error event (`engine_errors.py`).

Each recovery is one line in the log, on the flow's comment, and counted
(`done` prints the totals). What cannot be completed (a recovery the upstream
refuses: no replica left; a replay that differs where a continuation cannot
carry what the client has: reasoning or a tool call; `MAX_ATTEMPTS` cuts in a
row) ends as its agent sends it again after (`CodingAgent.resends_after_error_event, stable_prefix/agents/base.py`):
the error event `engine_errors.py` writes, or, for Qwen Code and Pi, which lose
the turn to that event and send the request again only after a silent cut, a
silent cut. A stream with more than one choice or an error in it is not
completed. Anthropic and Responses streams are not completed here: Claude Code
and Codex send the request again themselves.

Every streamed answer on an API path, whatever its protocol and mode, goes to
the client in whole events only: an upstream dies anywhere, inside an event or
a character, and the half it sent is never the client's; at the cut it is
dropped, so a spliced answer or the error event goes on after a whole event.

A replica can also freeze (a Mac asleep, a network partition): the connection
stays open and nothing comes. With `stall_timeout` set, an answer in flight
that gets no byte for that long has its upstream connection closed, which
makes it a cut like any other; a recovery's own reads wait no longer either.

The seam: mitmproxy has no hook for a broken-off stream, only the `error`
hook after the fact, and the client's side is written by its HTTP/1 server
layer (`Http1Server.send`; the seam over it is `client_writes.py`). This
addon's handler comes first there: for a stream this addon follows, instead of
the error it runs the recovery there, one upstream read at a time through a
blocking hook of its own (`StreamRecoveryStepHook`, answered by
`StreamRecovery.stream_recovery_step`, async: only this client's connection
waits, every other flow goes on), and writes each spliced event through the
flow's stream callables (so `toolcall_stream.py` and `capture.py` see one
stream), then the end of the body: the connection stays usable; a hook of its
own (`StreamRecoveredHook`) tells `capture.py` the stream was completed. The recovery
request is sent by a small HTTP/1.1 client over asyncio (h11, which mitmproxy
itself uses) to the flow's upstream, with the headers as forwarded (the
routing key among them).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import h11
from mitmproxy import ctx, exceptions, http
from mitmproxy.connection import ConnectionState
from mitmproxy.proxy import commands
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import ErrorCode, ResponseData, ResponseEndOfMessage, ResponseProtocolError
from mitmproxy.proxy.layers.http._http1 import Http1Server

from stable_prefix.addons import client_writes
from stable_prefix.addons.chat_splice import Delivered, Diverged, Splice, continuation_request, count_request, prompt_tokens_of
from stable_prefix.addons.engine_errors import protocol_of
from stable_prefix.addons.lanes import agent_of
from stable_prefix.addons.request_body import LeftAlone, read_json_body
from stable_prefix.addons.sse_events import SSEParser

logger = logging.getLogger(__name__)

OPTION = "stream_recovery"
MODES = ("replay", "continue", "off")
CHAT_PATH = "/v1/chat/completions"
# Recovery requests per broken stream: a replay, a continuation after it differs, one more if a survivor dies too.
MAX_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 30.0
READ_BYTES = 65536
ERROR_DETAIL_BYTES = 2000
COUNT_ANSWER_BYTES = 1 << 20
RECOVERED_NOTE = "completed a stream the engine broke off"
STALE_AFTER_S = 60.0
STALL_OPTION = "stall_timeout"
# flow.metadata key of how the proxy completed a broken-off stream (mitmproxy hooks take one argument).
COMPLETED_NOTES = "completed_by_proxy"
# A team's value (`stable-prefix up --upstream`): above the longest silent prefill a replica makes (minutes for a cold 100K tokens).
TEAM_STALL_TIMEOUT_S = 300
# With stall_timeout off, a recovery's read still waits no longer than mitmproxy itself lets a connection idle (tcp_timeout's default).
IDLE_READ_LIMIT_S = 600.0


def parse_mode(value: str) -> str:
    if value not in MODES:
        raise exceptions.OptionsError(f"{OPTION}={value!r}: not one of {', '.join(MODES)}")
    return value


def parse_stall_timeout(value: int) -> int:
    if value < 0:
        raise exceptions.OptionsError(f"{STALL_OPTION}={value!r}: must be 0 (off) or a number of seconds")
    return value


def read_limit_s(stall_timeout: float) -> float:
    """How long a recovery waits for the next byte of an answer: the stall timeout, or mitmproxy's idle limit when it is off."""
    return stall_timeout if stall_timeout > 0 else IDLE_READ_LIMIT_S


# --- what the client has been sent -------------------------------------------------------------------


@dataclass
class FollowedStream:
    """A streamed answer the client is reading, passed on in whole events; for a chat completion, what the
    client has been sent of it and how to ask again."""

    flow: weakref.ref  # the flow, while mitmproxy keeps it (its comment gets the recovery's line)
    body: dict  # the request as forwarded
    request: http.Request
    response: http.Response
    recoverable: bool = True  # a chat completion the proxy completes (else: whole events, and the error event at a cut)
    delivered: Delivered = field(default_factory=Delivered)
    parser: SSEParser = field(default_factory=SSEParser)
    errored_at: float | None = None  # the flow failed: its cut is recovered right after, or never (the client left)
    last_byte_at: float = field(default_factory=time.monotonic)  # when the upstream last sent a byte (`stall_timeout`)
    stall_cut: float | None = None  # when the proxy cut the upstream for sending nothing

    def to_client(self, data: bytes) -> list[bytes]:
        """`data` through the flow's stream callables, all of them (ours first, later addons' after)."""
        stream = self.response.stream
        return _chunks(stream(data)) if callable(stream) else ([data] if data else [])

    def whole_events(self, chunk: bytes) -> bytes:
        """The complete events in `chunk` (after the bytes held from the last one), each observed as
        delivered; at the end (b"") the bytes held. Only whole events go on, so the client never holds
        half an event when the upstream dies mid-event: a stream spliced after a cut, or ended by the error
        event, continues after a whole one, here and in a later addon's parser."""
        if not chunk:
            return self.parser.finish()
        self.last_byte_at = time.monotonic()
        events = self.parser.feed(chunk)
        if self.recoverable:
            for event in events:
                self.delivered.observe(event)
        return b"".join(event.raw for event in events)

    def drop_unfinished_event(self) -> int:
        """At a cut: what the upstream sent of an event it never finished, which the client never got, goes
        (the client's stream goes on after its last whole event). Returns its length in bytes."""
        return len(self.parser.finish())


# Streams followed, by the id of their request object (what Http1Server holds), while the request lives.
_followed: dict[int, tuple[weakref.ref, FollowedStream]] = {}


def follow(flow: http.HTTPFlow, recovery_mode: str) -> FollowedStream | None:
    """Follow a streamed answer on an API path in whole events (with the stream callable set before, if any,
    after ours), and a chat completion's content too, to complete it at a cut unless `recovery_mode` is off."""
    response = flow.response
    if response is None or response.status_code != 200 or protocol_of(flow.request.path) is None:
        return None
    if response.headers.get("content-encoding", "identity").lower() != "identity":
        return None  # its events cannot be told apart without decoding it
    body = read_json_body(flow.request)
    if isinstance(body, LeftAlone):
        body = {}
    recoverable = (recovery_mode != "off" and flow.request.path.split("?")[0].endswith(CHAT_PATH)
                   and body.get("stream") is True and body.get("n", 1) == 1)
    followed = FollowedStream(weakref.ref(flow), body, flow.request, response, recoverable)
    previous = response.stream if callable(response.stream) else None

    def ours_first(chunk: bytes) -> list[bytes]:
        # Never an empty chunk: mitmproxy writes it as one, and an empty chunk ends a chunked body.
        whole = followed.whole_events(chunk)
        if previous is None:
            return _chunks(whole)
        out = _chunks(previous(whole)) if whole else []
        if chunk == b"":  # the end: what we held, then the end for the next callable too
            out += _chunks(previous(b""))
        return out

    response.stream = ours_first
    # A failed flow's entry is taken as soon as its error hook is done, when its cut is recovered; one still here
    # a while later never will be (the client left).
    now = time.monotonic()
    for key in [key for key, (alive, old) in _followed.items() if alive() is None or (old.errored_at or now) < now - STALE_AFTER_S]:
        del _followed[key]
    _followed[id(flow.request)] = (weakref.ref(flow.request), followed)
    return followed


def _chunks(result: bytes | Iterable[bytes]) -> list[bytes]:
    """A stream callable's result as non-empty chunks (an empty one would end a chunked body)."""
    return [chunk for chunk in ([result] if isinstance(result, bytes) else list(result)) if chunk]


def taken(request: http.Request | None) -> FollowedStream | None:
    """The followed stream of this request, no longer followed."""
    if request is None:
        return None
    alive, followed = _followed.pop(id(request), (None, None))
    return followed if alive is not None and alive() is request else None


# --- asking the upstream again -------------------------------------------------------------------------


class UpstreamBroke(Exception):
    """The recovery's own answer was cut, refused or malformed."""


class UpstreamAnswer:
    """One POST to the upstream over its own connection (HTTP/1.1, h11), read chunk by chunk, no read waiting
    longer than `read_limit_s` (a frozen survivor is a cut too)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: h11.Connection, status: int,
                 read_limit_s: float = IDLE_READ_LIMIT_S) -> None:
        self.reader, self.writer, self.connection, self.status = reader, writer, connection, status
        self.read_limit_s = read_limit_s

    @classmethod
    async def post(cls, request: http.Request, body: bytes, insecure: bool, read_limit_s: float = IDLE_READ_LIMIT_S) -> UpstreamAnswer:
        context = None
        if request.scheme == "https":
            context = ssl.create_default_context()
            if insecure:
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(request.host, request.port, ssl=context), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as error:
            raise UpstreamBroke(f"could not connect to {request.scheme}://{request.host}:{request.port} ({error})") from error
        connection = h11.Connection(h11.CLIENT)
        # The body is sent as plain JSON, read as it arrives (no content-encoding either way), on a connection of its own.
        skip = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding", "keep-alive", "content-encoding"}
        headers = [("host", f"{request.host}:{request.port}"), *((name, value) for name, value in request.headers.items(multi=True)
                                                                 if name.lower() not in skip),
                   ("content-length", str(len(body))), ("accept-encoding", "identity"), ("connection", "close")]
        answer = cls(reader, writer, connection, 0, read_limit_s)
        try:
            writer.write(connection.send(h11.Request(method=request.method, target=request.path, headers=headers)))
            writer.write(connection.send(h11.Data(data=body)) + connection.send(h11.EndOfMessage()))
            await asyncio.wait_for(writer.drain(), read_limit_s)
            head = await answer._next()
        except TimeoutError as error:
            answer.close()
            raise UpstreamBroke(f"the upstream sent nothing for {read_limit_s:g} s before answering") from error
        except (OSError, h11.ProtocolError) as error:
            answer.close()
            raise UpstreamBroke(f"the upstream broke off before answering ({error})") from error
        if not isinstance(head, h11.Response):
            answer.close()
            raise UpstreamBroke(f"the upstream did not answer ({type(head).__name__})")
        answer.status = head.status_code
        return answer

    async def _next(self):
        while True:
            event = self.connection.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.connection.receive_data(await asyncio.wait_for(self.reader.read(READ_BYTES), self.read_limit_s))

    async def read(self) -> bytes | None:
        """The next piece of the body; None at its end; UpstreamBroke if it is cut, or sends nothing for `read_limit_s`."""
        try:
            event = await self._next()
        except TimeoutError as error:
            raise UpstreamBroke(f"the recovery's answer sent nothing for {self.read_limit_s:g} s") from error
        except (OSError, h11.ProtocolError) as error:
            raise UpstreamBroke(f"the recovery's answer was cut too ({error})") from error
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            return None
        raise UpstreamBroke(f"the recovery's answer ended with {type(event).__name__}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


async def _read_whole(answer: Answer, limit: int) -> bytes:
    """An answer's body up to `limit` bytes (each read bounded as `Answer.read` is); what came before a fault."""
    content = b""
    with contextlib.suppress(UpstreamBroke):
        while len(content) < limit and (piece := await answer.read()) is not None:
            content += piece
    answer.close()
    return content


# --- one recovery ----------------------------------------------------------------------------------------


class Answer(Protocol):
    """The upstream's answer to one recovery request (`UpstreamAnswer`; a test's answer from memory)."""

    status: int

    async def read(self) -> bytes | None: ...

    def close(self) -> None: ...


# How a recovery asks the upstream: (the request as forwarded, the body to send, skip TLS checks) -> its answer.
Ask = Callable[[http.Request, bytes, bool], Awaitable[Answer]]


@dataclass
class Attempt:
    kind: str  # "replay" or "continuation"
    started: float
    splice: Splice
    answer: Answer | None = None
    parser: SSEParser = field(default_factory=SSEParser)


@dataclass
class Outcome:
    """What one step of a recovery gives the client."""

    events: list[bytes] = field(default_factory=list)
    finished: bool = False
    failed: str | None = None


class Recovery:
    """Completing one broken-off stream: attempts (a replay, a continuation) one upstream read at a time."""

    def __init__(self, followed: FollowedStream, mode: str, reason: str, insecure: bool = False, ask: Ask | None = None,
                 read_limit_s: float = IDLE_READ_LIMIT_S) -> None:
        self.followed, self.mode, self.reason, self.insecure = followed, mode, reason, insecure
        self.ask = ask or functools.partial(UpstreamAnswer.post, read_limit_s=read_limit_s)
        self.started = time.monotonic()
        # The answer goes on after the client's last whole event: the half of one the upstream died in goes.
        self.dropped_bytes = followed.drop_unfinished_event()
        self.attempts: list[Attempt] = []
        self.current: Attempt | None = None
        self.next_kind = "replay" if mode == "replay" else "continuation"
        self.delivered_at_cut = followed.delivered.output_events
        self.prompt_tokens: int | None = None  # the original request's, as the upstream counts them (a continuation asks)
        self.counted = ""  # what the counts said, for the log

    async def step(self) -> Outcome:
        if self.current is None and self.followed.delivered.finished:
            if not self._usage_missing() or any(attempt.kind == "replay" for attempt in self.attempts):
                return self._end_after_finish()
            self.next_kind = "replay"  # cut after the answer's end, before its usage: a replay has it
        if self.current is None:
            problem = await self._start()
            if problem:
                return Outcome(failed=problem)
        attempt = self.current
        try:
            data = await attempt.answer.read()
        except UpstreamBroke as error:
            return self._lost_attempt(str(error))
        if data is None:
            if attempt.splice.finished or self.followed.delivered.finished:
                attempt.answer.close()
                return Outcome(finished=True)
            return self._lost_attempt("the recovery's answer ended before its end")
        outcome = Outcome()
        for event in attempt.parser.feed(data):
            try:
                outcome.events += attempt.splice.events(event)
            except Diverged as difference:
                attempt.answer.close()
                self.current = None
                self.next_kind = "continuation"
                logger.info(f"{OPTION}: the replay differs from what the client has ({difference}); continuing from it instead")
                return outcome
        outcome.finished = attempt.splice.finished
        return outcome

    async def _start(self) -> str | None:
        if len(self.attempts) >= MAX_ATTEMPTS:
            return f"{MAX_ATTEMPTS} recovery requests did not complete it"
        continuation = self.next_kind == "continuation"
        delivered = self.followed.delivered
        if continuation and (why := delivered.continuable()):
            return why
        body, prompt_tokens = self.followed.body, None
        if continuation:
            prompt_tokens, delivered_tokens = await self._count_tokens()
            body = continuation_request(self.followed.body, delivered, delivered_tokens)
        splice = Splice(delivered, continuation=continuation, original_prompt_tokens=prompt_tokens, usage_wanted=self._usage_wanted())
        attempt = Attempt("continuation" if continuation else "replay", time.monotonic(), splice)
        self.attempts.append(attempt)
        try:
            attempt.answer = await self.ask(self.followed.request, json.dumps(body, ensure_ascii=False).encode(), self.insecure)
        except UpstreamBroke as error:
            return str(error)
        if attempt.answer.status != 200:
            detail = await _read_whole(attempt.answer, ERROR_DETAIL_BYTES)
            return f"the upstream answered the {attempt.kind} with {attempt.answer.status}: {detail[:300].decode(errors='replace')}"
        self.current = attempt
        return None

    async def _count_tokens(self) -> tuple[int | None, int | None]:
        """(the original prompt's tokens, the delivered text's), as the server counts them: the prompt tokens of the
        request and of the continuation (that one only where a cap needs them); None where it did not say."""
        if self.prompt_tokens is None:
            self.prompt_tokens = await self._prompt_tokens(self.followed.body)
        if self.prompt_tokens is None or not any(isinstance(self.followed.body.get(cap), int) for cap in ("max_tokens", "max_completion_tokens")):
            return self.prompt_tokens, None
        with_delivered = await self._prompt_tokens(continuation_request(self.followed.body, self.followed.delivered, 0))
        if with_delivered is None:
            return self.prompt_tokens, None
        self.counted = f"{with_delivered - self.prompt_tokens} tokens delivered, {self.prompt_tokens} in the prompt, as the upstream counts them"
        return self.prompt_tokens, max(0, with_delivered - self.prompt_tokens)

    async def _prompt_tokens(self, body: dict) -> int | None:
        try:
            answer = await self.ask(self.followed.request, json.dumps(count_request(body), ensure_ascii=False).encode(), self.insecure)
        except UpstreamBroke as error:
            logger.info(f"{OPTION}: could not count the prompt's tokens ({error})")
            return None
        content = await _read_whole(answer, COUNT_ANSWER_BYTES)
        count = prompt_tokens_of(content) if answer.status == 200 else None
        if count is None:
            logger.info(f"{OPTION}: the upstream did not count the prompt's tokens ({answer.status}: {content[:200].decode(errors='replace')}); "
                        "the continuation's cap is less the chunks delivered (each at least a token) and its usage is as the upstream reports it")
        return count

    def _lost_attempt(self, why: str) -> Outcome:
        """The recovery's own answer broke off: the next attempt starts from what the client has by then."""
        logger.info(f"{OPTION}: {why}; asking again")
        if self.current is not None and self.current.answer is not None:
            self.current.answer.close()
        self.current = None
        if len(self.attempts) >= MAX_ATTEMPTS:
            return Outcome(failed=f"{why}, {MAX_ATTEMPTS} times")
        return Outcome()

    def _usage_wanted(self) -> bool:
        """The client asked for the usage chunk."""
        options = self.followed.body.get("stream_options")
        return isinstance(options, dict) and options.get("include_usage") is True

    def _usage_missing(self) -> bool:
        return self._usage_wanted() and not self.followed.delivered.usage_sent

    def _end_after_finish(self) -> Outcome:
        """The client has the whole answer but not the stream's end: it gets the end."""
        return Outcome(events=[] if self.followed.delivered.done_sent else [b"data: [DONE]\n\n"], finished=True)

    def close(self) -> None:
        if self.current is not None and self.current.answer is not None:
            self.current.answer.close()

    def summary(self) -> str:
        kinds = " then ".join(attempt.kind for attempt in self.attempts) or "nothing sent"
        delivered = self.followed.delivered
        return (f"{len(self.attempts)} request(s) to {self.followed.request.scheme}://{self.followed.request.host}:{self.followed.request.port} "
                f"({kinds}); the client had {self.delivered_at_cut} output events at the cut and has {delivered.output_events} now"
                + (f" ({self.counted})" if self.counted else ""))


# --- the seam in mitmproxy -------------------------------------------------------------------------------


@dataclass
class RecoveryStep:
    """One blocking hook call's worth of a recovery (`StreamRecovery.stream_recovery_step` fills `outcome`)."""

    recovery: Recovery
    outcome: Outcome | None = None


@dataclass
class StreamRecoveryStepHook(commands.StartHook):
    """Read the next piece of a recovery's answer (blocks only the client connection it is for)."""

    step: RecoveryStep


@dataclass
class StreamRecoveredHook(commands.StartHook):
    """The proxy completed the flow's broken-off stream (after its `error` hook); how is in `flow.metadata[COMPLETED_NOTES]`
    (how, requests, seconds, the cut, the bytes of an unfinished event dropped). `capture.py` rewrites the flow's record."""

    flow: http.HTTPFlow


@dataclass
class Counts:
    completed: dict[str, int] = field(default_factory=dict)  # by how: replay, continuation, replay then continuation
    not_completed: dict[str, int] = field(default_factory=dict)  # by why
    seconds: list[float] = field(default_factory=list)


COUNTS = Counts()


def mode() -> str:
    return str(getattr(ctx.options, OPTION, "off"))


def stall_timeout() -> int:
    return int(getattr(ctx.options, STALL_OPTION, 0))


def _recovers(server: Http1Server, event) -> FollowedStream | None:
    """The followed stream this failure broke off, if it is one to complete: the upstream's side failed
    (not a flow killed in mitmweb) after the response began, and the client is still there."""
    if not isinstance(event, ResponseProtocolError) or event.code is not ErrorCode.GENERIC_SERVER_ERROR:
        return None
    if server.response is None or not server.conn.state & ConnectionState.CAN_WRITE:
        return None
    followed = taken(server.request)
    if followed is None or not followed.recoverable or followed.response is not server.response or followed.delivered.unreadable:
        return None  # whole events so far: the error event goes on after them
    return followed


def _client_is_reading(server: Http1Server) -> bool:
    state = server.conn.state
    return bool(state & ConnectionState.CAN_WRITE and state & ConnectionState.CAN_READ)


def _recover(server: Http1Server, event: ResponseProtocolError, followed: FollowedStream, send) -> CommandGenerator[None]:
    # Held while the recovery runs: mitmproxy drops the failed flow's stream right after this starts, and with it maybe
    # the flow's last reference (then its comment, the completion's note and hook would be lost).
    flow = followed.flow()
    reason = f"it sent nothing for {stall_timeout():g} s: {STALL_OPTION}" if followed.stall_cut else event.message
    recovery = Recovery(followed, mode(), reason, bool(getattr(ctx.options, "ssl_insecure", False)), read_limit_s=read_limit_s(stall_timeout()))
    where = f"{server.request.method} {server.request.path}"
    dropped = f", {recovery.dropped_bytes} bytes of an unfinished event dropped" if recovery.dropped_bytes else ""
    logger.warning(f"{where}: the engine broke off its answer ({reason}{dropped}); {OPTION}={recovery.mode}: completing it in the client's stream")
    while True:
        step = RecoveryStep(recovery)
        yield StreamRecoveryStepHook(step)
        outcome = step.outcome or Outcome(failed="no addon answered the recovery's hook")
        if not _client_is_reading(server):
            recovery.close()
            _count(COUNTS.not_completed, "the client left")
            logger.info(f"{where}: {OPTION}: the client left during the recovery; {recovery.summary()}, {time.monotonic() - recovery.started:.2f} s")
            return
        for data in outcome.events:
            for chunk in followed.to_client(data):
                yield from send(server, ResponseData(server.stream_id, chunk))
        if outcome.finished:
            for chunk in followed.to_client(b""):
                yield from send(server, ResponseData(server.stream_id, chunk))
            how = " then ".join(attempt.kind for attempt in recovery.attempts) or "its end"
            _count(COUNTS.completed, how)
            COUNTS.seconds.append(time.monotonic() - recovery.started)
            note = recovered_line(how, followed.delivered.envelope.get("id"), recovery.summary(), time.monotonic() - recovery.started)
            # Said before the body's end goes out: whoever reads the whole answer finds the line written.
            logger.warning(f"{where}: {note} ({sum(COUNTS.completed.values())} completed since the proxy started)")
            _comment(followed, note)
            if flow is not None:  # its record says so (capture.py), before the end goes out too
                flow.metadata[COMPLETED_NOTES] = {"how": how, "requests": len(recovery.attempts), "seconds": round(time.monotonic() - recovery.started, 3),
                                                  "cut": recovery.reason, "dropped_bytes": recovery.dropped_bytes}
                yield StreamRecoveredHook(flow)
            yield from send(server, ResponseEndOfMessage(server.stream_id))
            return
        if outcome.failed:
            recovery.close()
            _count(COUNTS.not_completed, outcome.failed.split(" (")[0][:80])
            agent = agent_of(followed.request.headers)
            ending = "the error event" if agent.resends_after_error_event else f"a silent cut, after which {agent.name} sends it again"
            note = f"{OPTION}: could not complete the stream ({outcome.failed}); {recovery.summary()}, {time.monotonic() - recovery.started:.2f} s; it ends with {ending}"
            logger.warning(f"{where}: {note}")
            _comment(followed, note)
            if agent.resends_after_error_event:
                yield from send(server, event)
            else:
                yield commands.CloseConnection(server.conn)
            return


def recovered_line(how: str, answer_id: str | None, summary: str, seconds: float) -> str:
    """The log line of a completed stream: the answer's id as the client reads it, and the seconds from the
    cut to the whole answer (`recovered_in_log` reads them back: the team bench counts recoveries by them)."""
    return f"{OPTION}: {RECOVERED_NOTE} ({how}) [{answer_id}]: {summary}; whole after {seconds:.2f} s"


_RECOVERED_LINE = re.compile(re.escape(RECOVERED_NOTE) + r" \([^)]*\) \[([^\]]*)\]: .*?; whole after ([0-9.]+) s")


def recovered_in_log(log: str) -> dict[str, float]:
    """{answer id: seconds from the cut to the whole answer} of every stream a proxy's log says it completed."""
    return {match.group(1): float(match.group(2)) for match in _RECOVERED_LINE.finditer(log)}


def _comment(followed: FollowedStream, line: str) -> None:
    """Where mitmweb shows a flow's notes."""
    flow = followed.flow()
    if flow is not None:
        flow.comment = f"{flow.comment}\n{line}" if flow.comment else line


def _count(counter: dict[str, int], key: str) -> None:
    counter[key] = counter.get(key, 0) + 1


def complete_broken_stream(server: Http1Server, event, rest: client_writes.Send) -> CommandGenerator[None] | None:
    """The seam's handler: the recovery of a followed stream this failure broke off; None leaves the event to the next
    handler (`engine_errors`), through which the recovery also writes (`rest`)."""
    followed = _recovers(server, event)
    return None if followed is None else _recover(server, event, followed, rest)


# --- a frozen upstream -----------------------------------------------------------------------------------


def stalled(now: float, timeout: float) -> list[tuple[http.HTTPFlow, FollowedStream]]:
    """The streams in flight whose upstream has sent nothing for `timeout` seconds (not yet cut for it)."""
    found = []
    for alive, followed in list(_followed.values()):
        flow = followed.flow()
        if alive() is None or flow is None or not flow.live or followed.errored_at is not None or followed.stall_cut is not None:
            continue
        if followed.response.timestamp_end is None and now - followed.last_byte_at > timeout:
            found.append((flow, followed))
    return found


def cut_upstream(flow: http.HTTPFlow, why: str) -> str | None:
    """Close the flow's upstream connection as mitmproxy closes an idle one (its reading task cancelled): the stream is then
    broken off as by a dead replica. None when done, else why not. mitmproxy has no command for it: this reads its proxy
    server's connection handlers (pinned mitmproxy; each name checked)."""
    handlers = getattr(ctx.master.addons.get("proxyserver"), "connections", None)
    handler = handlers.get(flow.client_conn.id) if isinstance(handlers, dict) else None
    transports = getattr(handler, "transports", None)
    if transports is None:
        return "the client's connection is gone"
    client, upstream = transports.get(flow.client_conn), transports.get(flow.server_conn)
    if upstream is None or upstream.handler is None:
        return "the upstream connection is gone"
    backlog = getattr(getattr(getattr(client, "writer", None), "transport", None), "get_write_buffer_size", lambda: 0)()
    if backlog:
        return f"the client has not read the last {backlog} bytes yet (the upstream waits for it, it is not frozen)"
    upstream.handler.cancel(why)
    return None


class StreamRecovery:
    """The addon: follows streamed answers in whole events, completes broken-off chat completions (answering the
    recovery's hook), and cuts an upstream that has sent nothing for `stall_timeout` seconds."""

    def __init__(self) -> None:
        self.watch: asyncio.Task | None = None

    def load(self, loader) -> None:
        loader.add_option(
            OPTION, str, "replay",
            "When the engine breaks off a streamed chat completion (its replica died), complete it in the client's open stream: "
            "replay (send the request again, skip what the client has, checked piece by piece: exact under greedy decoding; "
            "where it differs, continue), continue (the engine continues the text delivered so far), off (end it with the error event).",
        )
        loader.add_option(
            STALL_OPTION, int, 0,
            "Seconds without a byte from the upstream while a streamed answer is in flight (after its headers) before its replica is "
            "taken for frozen (a Mac asleep, a network partition: the connection stays open, nothing comes) and the stream is cut as a "
            "dead replica's: a chat completion is completed on the survivor the upstream (a router) picks, another stream ends with the "
            "protocol's error event for the agent to send again; the recovery's own reads wait no longer. 0 (the default): off. Before "
            "one local engine there is no survivor to ask, and a long prefill sends no byte for minutes (a cold 100K-token prompt on a Mac, "
            "or a request queued behind others: engines send no keep-alive). `stable-prefix up --upstream` (a team behind a router) sets "
            f"{TEAM_STALL_TIMEOUT_S}: above such a prefill, where a frozen replica would otherwise hold the turn forever.",
        )
        client_writes.register("stream_recovery", complete_broken_stream)

    def configure(self, updated) -> None:
        if OPTION in updated:
            parse_mode(getattr(ctx.options, OPTION))
        if STALL_OPTION in updated:
            parse_stall_timeout(stall_timeout())

    def running(self) -> None:
        if self.watch is None:
            self.watch = asyncio.get_running_loop().create_task(self.watch_stalls(), name="stall_timeout")

    async def watch_stalls(self) -> None:
        """Every quarter of `stall_timeout` (at most a second), cut what has stalled that long."""
        while True:
            timeout = stall_timeout()
            await asyncio.sleep(min(1.0, timeout / 4) if timeout > 0 else 1.0)
            if timeout <= 0:
                continue
            for flow, followed in stalled(time.monotonic(), timeout):
                where = f"{flow.request.method} {flow.request.path}"
                why = f"{STALL_OPTION}: the upstream sent nothing for {timeout:g} s"
                problem = cut_upstream(flow, why)
                if problem is None:
                    followed.stall_cut = time.monotonic()
                    logger.warning(f"{where}: {why} with the answer in flight: taken for a frozen replica, its connection closed")
                elif "not frozen" not in problem:
                    followed.stall_cut = time.monotonic()  # once: what cannot be cut now will not be later
                    logger.warning(f"{where}: {why}, but its connection could not be closed ({problem})")

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None and flow.response.stream:
            follow(flow, mode())

    def response(self, flow: http.HTTPFlow) -> None:
        taken(flow.request)

    def error(self, flow: http.HTTPFlow) -> None:
        alive, followed = _followed.get(id(flow.request), (None, None))
        if followed is not None and alive() is flow.request:
            followed.errored_at = time.monotonic()

    async def stream_recovery_step(self, step: RecoveryStep) -> None:
        try:
            step.outcome = await step.recovery.step()
        except Exception as error:  # a fault of the recovery must end in the error event, never hang the client
            logger.exception(f"{OPTION}: the recovery failed")
            step.outcome = Outcome(failed=f"the recovery failed ({error!r})")

    def done(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        if COUNTS.completed or COUNTS.not_completed:
            completed = sum(COUNTS.completed.values())
            detail = ", ".join(f"{how} {count}" for how, count in COUNTS.completed.items())
            failures = ", ".join(f"{why} {count}" for why, count in COUNTS.not_completed.items()) or "none"
            seconds = f"; {max(COUNTS.seconds):.2f} s the longest" if COUNTS.seconds else ""
            logger.info(f"{OPTION}: {completed} broken-off stream(s) completed ({detail}){seconds}; not completed: {failures}")
