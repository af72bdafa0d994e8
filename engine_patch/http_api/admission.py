"""A generation request's admission: refused in its protocol's own error, or stopped when its client has gone.

Two findings of a day's use, answered across the HTTP layer and the engine:
- A prompt longer than the model's context is refused before any of it is
  prefilled (`context_window.check_prompt_fits`), with the error each
  protocol's clients know: HTTP 400, Anthropic `invalid_request_error`
  "prompt is too long: N tokens > M maximum", OpenAI
  `context_length_exceeded`. Streamed requests too: vllm-mlx starts a stream
  (status 200, `message_start`) before the engine has seen the prompt, so this
  middleware holds the start of an event stream until the engine has admitted
  or refused its prompt (at most HOLD_SECONDS: a request queued behind a long
  one gets its stream then, and a later refusal as the stream's error event,
  in the protocol's shape).
- A client that disconnects during the prefill stops it at the next chunk
  (vllm-mlx stops decoding on a disconnect, but not a prefill). The middleware
  gives the request a way to ask whether its connection is gone; the engine
  seam asks between chunks.

The engine side calls `admit_prompt(token_count, context)` where it knows a
prompt's tokens and `stop_if_client_gone(processed, total)` between prefill
chunks, in the request's context (a context variable, carried to the engine's
thread): SimpleEngine's seam is `admitted_generation.py`, the batched
scheduler's `batched_admission.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stable_prefix.engine_patch.cache.context_window import PromptTooLong, check_prompt_fits, estimated_tokens_if_far_too_long

from . import usage_fields
from .usage_fields import ANTHROPIC_PATHS, GenerationMiddleware

logger = logging.getLogger("engine_patch")

# OpenAI's error shape: chat and text completions, and the Responses API.
OPENAI_PATHS = usage_fields.OPENAI_PATHS | usage_fields.RESPONSES_PATHS
# How long an event stream's start waits for the engine's verdict on its prompt:
# long enough to tokenize a multi-megabyte paste, short enough that a request
# queued behind another one is not left without response headers.
HOLD_SECONDS = 10.0


class ClientGone(Exception):
    """The request's client disconnected; its prefill was stopped between chunks."""


@dataclass
class RequestAdmission:
    """What the engine decided about one request's prompt, and whether its client is still there."""

    client_gone: Callable[[], bool] = lambda: False
    arrived_at: float = field(default_factory=time.monotonic)
    started: bool = False  # the engine took it up (its wait is counted once)
    refusal: PromptTooLong | None = None
    decided: asyncio.Event = field(default_factory=asyncio.Event)
    loop: asyncio.AbstractEventLoop | None = None

    def _decide(self) -> None:
        if self.loop is None:
            self.decided.set()
        else:  # called from the engine's worker thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                self.loop.call_soon_threadsafe(self.decided.set)


_current: contextvars.ContextVar[RequestAdmission | None] = contextvars.ContextVar("request_admission", default=None)


@dataclass
class AdmissionCounters:
    """What the engine seams refused and stopped, for `/v1/cache/stats` (one server, one set)."""

    requests_admitted: int = 0
    # From the request's arrival to the engine taking it up (SimpleEngine: its turn on the worker).
    queue_wait_seconds_total: float = 0.0
    queue_wait_seconds_max: float = 0.0
    prompts_refused: int = 0
    prefills_stopped: int = 0
    prefill_tokens_skipped: int = 0  # prompt tokens a stopped prefill never computed
    context_tokens: int | None = None  # the model's context, as the last check saw it


COUNTERS = AdmissionCounters()


def stats() -> dict[str, int | None]:
    return dict(vars(COUNTERS))


def current_admission() -> RequestAdmission | None:
    return _current.get()


def admit_prompt(prompt_tokens: int, context_tokens: int | None, starts_now: bool = True) -> None:
    """Admit a prompt, or refuse it (PromptTooLong, also told to the HTTP layer); any engine's seam calls this.
    `starts_now`: the engine takes the request up at once (SimpleEngine); a scheduler that queues it first
    calls `record_start` when the request joins the batch."""
    admission = current_admission()
    COUNTERS.context_tokens = context_tokens
    try:
        check_prompt_fits(prompt_tokens, context_tokens)
    except PromptTooLong as refusal:
        COUNTERS.prompts_refused += 1
        logger.warning("engine_patch: refused a request before its prefill: %s", refusal)
        if admission is not None:
            admission.refusal = refusal
            admission._decide()
        raise
    if admission is not None:
        admission._decide()
    if starts_now:
        record_start(prompt_tokens)


def record_start(prompt_tokens: int) -> None:
    """The engine takes the current request up now: how long it waited since it arrived is logged and counted."""
    admission = current_admission()
    if admission is None or admission.started:
        return
    admission.started = True
    waited = time.monotonic() - admission.arrived_at
    COUNTERS.requests_admitted += 1
    COUNTERS.queue_wait_seconds_total += waited
    COUNTERS.queue_wait_seconds_max = max(COUNTERS.queue_wait_seconds_max, waited)
    logger.info("engine_patch: took up a %d-token prompt after %.2f s in the queue", prompt_tokens, waited)


def refuse_if_far_too_long(tokenizer, text: str, context_tokens: int | None) -> None:
    """Refuse a prompt text far longer than the context before it is tokenized whole (an engine seam calls
    this where the text arrives, ahead of its own tokenization); the count in the refusal is estimated."""
    estimate = estimated_tokens_if_far_too_long(tokenizer, text, context_tokens)
    if estimate is not None:
        admit_prompt(estimate, context_tokens)  # raises PromptTooLong


def stop_if_client_gone(processed: int, total: int) -> None:
    """Raise ClientGone when the current request's client has disconnected (call between prefill chunks,
    with the prompt tokens computed so far and in all)."""
    admission = current_admission()
    if admission is not None and admission.client_gone():
        COUNTERS.prefills_stopped += 1
        COUNTERS.prefill_tokens_skipped += total - processed
        raise ClientGone(f"the client disconnected after {processed} of {total} prompt tokens")


def uvicorn_disconnected(receive) -> Callable[[], bool]:
    """uvicorn sets `disconnected` on the request cycle when the connection closes, whether or not
    anyone reads `receive`; vllm-mlx's own disconnect check reads the same flag."""
    cycle = getattr(receive, "__self__", None)
    if not isinstance(getattr(cycle, "disconnected", None), bool):
        return lambda: False
    return lambda: cycle.disconnected


def error_response(path: str, refusal: PromptTooLong) -> tuple[int, dict]:
    """The status and body each protocol answers a prompt longer than the context with."""
    if path in ANTHROPIC_PATHS:
        return 400, {"type": "error", "error": {"type": "invalid_request_error", "message": str(refusal)}}
    message = (f"This model's maximum context length is {refusal.context_tokens} tokens. However, your messages "
               f"resulted in {refusal.prompt_tokens} tokens. Please reduce the length of the messages.")
    return 400, {"error": {"message": message, "type": "invalid_request_error", "param": "messages",
                           "code": "context_length_exceeded"}}


class AdmissionMiddleware(GenerationMiddleware):
    """One `RequestAdmission` per generation request; a refusal becomes the protocol's error."""

    paths = ANTHROPIC_PATHS | OPENAI_PATHS

    async def handle(self, scope, receive, send, path: str) -> None:
        admission = RequestAdmission(client_gone=uvicorn_disconnected(receive), loop=asyncio.get_running_loop())
        token = _current.set(admission)
        response = _HeldUntilAdmitted(send, path, admission)
        try:
            await self.app(scope, receive, response.send)
        except PromptTooLong as refusal:  # the non-streamed path: the engine's exception reaches here
            if response.started:
                raise
            await response.send_error(refusal)
        finally:
            _current.reset(token)
            response.close()


class _HeldUntilAdmitted:
    """Passes a response through, except an event stream's start, held until the engine decides on the prompt."""

    def __init__(self, send, path: str, admission: RequestAdmission):
        self._send = send
        self.path = path
        self.admission = admission
        self.held: list[dict] | None = None
        self.started = False
        self.replaced = False  # by our error: what the app still sends is dropped
        self._lock = asyncio.Lock()
        self._release: asyncio.Task | None = None

    async def send(self, message):
        async with self._lock:
            if self.replaced:
                return
            undecided_or_refused = not self.admission.decided.is_set() or self.admission.refusal is not None
            if message["type"] == "http.response.start" and _is_event_stream(message) and undecided_or_refused:
                self.held = [message]
                self._release = asyncio.create_task(self._release_when_decided())
                return
            if self.held is not None:
                self.held.append(message)
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    await self._flush_or_refuse()  # the whole response came before the hold ended
                return
            if message["type"] == "http.response.body" and self.admission.refusal is not None and self.started:
                message = {**message, "body": self._protocol_error_event(message.get("body", b""))}
            if message["type"] == "http.response.start":
                if self.admission.refusal is not None and message.get("status", 200) >= 400:
                    # vllm-mlx's own answer to the engine's exception (e.g. {"detail": ...}): ours instead
                    self.held = [message]
                    return
                self.started = True
            await self._send(message)

    async def send_error(self, refusal: PromptTooLong) -> None:
        status, body = error_response(self.path, refusal)
        encoded = json.dumps(body).encode()
        self.held = None
        self.started = self.replaced = True
        await self._send({"type": "http.response.start", "status": status,
                          "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(encoded)).encode())]})
        await self._send({"type": "http.response.body", "body": encoded, "more_body": False})

    def _protocol_error_event(self, body: bytes) -> bytes:
        """A started stream's error event (vllm-mlx's says "Internal server error"), as the refusal in the protocol's shape."""
        if b"event: error" not in body and not body.startswith(b'data: {"error"'):
            return body
        _, error = error_response(self.path, self.admission.refusal)
        if self.path in ANTHROPIC_PATHS:
            return b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n"
        return b"data: " + json.dumps(error).encode() + b"\n\n"

    async def _release_when_decided(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.admission.decided.wait(), HOLD_SECONDS)
        async with self._lock:
            if self.held is not None:
                await self._flush_or_refuse()

    async def _flush_or_refuse(self) -> None:
        if self.admission.refusal is not None:
            await self.send_error(self.admission.refusal)
            return
        held, self.held = self.held, None
        self.started = True
        for message in held:
            await self._send(message)

    def close(self) -> None:
        if self._release is not None and not self._release.done():
            self._release.cancel()


def _is_event_stream(message: dict) -> bool:
    return any(name.lower() == b"content-type" and value.lower().startswith(b"text/event-stream")
               for name, value in message.get("headers", []))
