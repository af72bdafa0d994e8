"""What a client gets when the engine cannot be reached or breaks off an answer.

mitmproxy answers a request it cannot forward with an HTML page, and ends a
streamed answer the engine broke off (killed mid-stream) by closing the
connection: the client sees a cut stream, no `message_stop` and no error, and
Claude Code retries blindly. Here both become errors in the protocol's own
shape, naming the engine's address:

- not forwarded (the engine is down): `502` with a JSON error body, Anthropic's
  `{"type":"error","error":{"type":"api_error",...}}` or OpenAI's
  `{"error":{"type":"server_error",...}}`;
- broken off mid-stream: a last SSE event, Anthropic's `event: error`, OpenAI
  chat's `data: {"error":...}`, the Responses API's `event: error`, then a
  clean end of the chunked body.

The proxy keeps serving: the next request is forwarded as usual.

mitmproxy has no hook for this: after the `error` hook it hands the failure
to its HTTP/1 server side (`Http1Server.send`, a `ResponseProtocolError`),
which writes the page or closes. `install()` wraps that one method (mitmproxy
is pinned; the wrapper checks the names it relies on) and changes only
failures on the API paths below, while `answer_engine_failures` is on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Literal

from mitmproxy import ctx, http
from mitmproxy.connection import ConnectionState
from mitmproxy.net.http import http1
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers.http import ResponseProtocolError
from mitmproxy.proxy.layers.http._http1 import Http1Server

from stable_prefix.addons.sse_events import format_event

logger = logging.getLogger(__name__)

OPTION = "answer_engine_failures"
Protocol = Literal["anthropic", "openai", "responses"]
# Which wire format a path speaks: wider than request_shape.api_for, which names
# only the paths the rules rewrite (count_tokens and /v1/models fail too).
_ROUTES: tuple[tuple[Callable[[str], bool], Protocol], ...] = (
    (lambda route: "/v1/messages" in route, "anthropic"),
    (lambda route: route.endswith("/v1/responses"), "responses"),
    (lambda route: "/v1/" in route, "openai"),
)
ERROR_CODE = "engine_unavailable"


def protocol_of(path: str) -> Protocol | None:
    route = path.split("?", 1)[0].rstrip("/")
    return next((protocol for matches, protocol in _ROUTES if matches(route)), None)


def error_body(protocol: Protocol, message: str) -> dict:
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": "api_error", "message": message}}
    return {"error": {"message": message, "type": "server_error", "param": None, "code": ERROR_CODE}}


def error_event(protocol: Protocol, message: str) -> bytes:
    """The SSE event that ends a stream the engine broke off, as the protocol's own servers send one."""
    if protocol == "anthropic":
        return format_event(error_body(protocol, message), "error")
    if protocol == "responses":
        return format_event({"type": "error", "code": ERROR_CODE, "message": message, "param": None}, "error")
    return format_event(error_body(protocol, message))  # chat completions: a data line with an error object


def engine_address(request: http.Request) -> str:
    # In reverse mode mitmproxy has already pointed the request at the engine.
    return f"{request.scheme}://{request.host}:{request.port}"


def not_forwarded(request: http.Request, protocol: Protocol, status: int, reason: str) -> tuple[bytes, str]:
    """The whole HTTP/1 response for a request that never reached the engine, and what to log."""
    message = (f"stable-prefix proxy: the engine at {engine_address(request)} did not answer ({reason}); "
               "the request was not forwarded. Is the engine running? The proxy keeps serving.")
    content = json.dumps(error_body(protocol, message)).encode()
    response = http.Response.make(status, content, {"content-type": "application/json", "connection": "close"})
    return http1.assemble_response(response), f"{message} The client got a {status} JSON error."


def broken_off(request: http.Request, response: http.Response, protocol: Protocol, reason: str) -> tuple[bytes, str] | None:
    """The bytes that end a streamed answer the engine broke off, and what to log; None when it is not an event stream."""
    if not response.headers.get("content-type", "").lower().startswith("text/event-stream"):
        return None
    message = (f"stable-prefix proxy: the engine at {engine_address(request)} broke off its answer ({reason}); "
               "what arrived before this error is incomplete.")
    event = error_event(protocol, message)
    if "chunked" in response.headers.get("transfer-encoding", "").lower():
        event = b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event)  # the event, then the body's last chunk
    return event, f"{message} The stream was ended with an error event."


def answer(request: http.Request | None, response: http.Response | None, status: int | None, reason: str) -> tuple[bytes, str] | None:
    """What to write to the client for a failed forward, or None to leave it to mitmproxy."""
    protocol = protocol_of(request.path) if request is not None else None
    if protocol is None or status is None:  # not an API path; or no answer is due (a flow killed in mitmweb)
        return None
    if response is None:
        return not_forwarded(request, protocol, status, reason)
    return broken_off(request, response, protocol, reason)


def declare_option(loader) -> None:
    loader.add_option(
        OPTION, bool, True,
        "When the engine cannot be reached, answer with a 502 JSON error in the request's protocol; when it breaks off "
        "a streamed answer, end the stream with the protocol's SSE error event (mitmproxy: an HTML page, a cut stream).",
    )


def _enabled() -> bool:
    return bool(getattr(ctx.options, OPTION, False))


def install() -> None:
    """Wrap `Http1Server.send` once per process (mitmproxy loads a script again when it changes)."""
    original = Http1Server.send
    if getattr(original, "answers_engine_failures", False):
        return

    def send(self, event):
        if isinstance(event, ResponseProtocolError) and self.conn.state & ConnectionState.CAN_WRITE and _enabled():
            found = answer(self.request, self.response, event.code.http_status_code(), event.message)
            if found is not None:
                data, note = found
                logger.warning(f"{self.request.method} {self.request.path}: {note}")
                yield commands.SendData(self.conn, data)
                yield commands.CloseConnection(self.conn)
                return
        yield from original(self, event)

    send.answers_engine_failures = True
    Http1Server.send = send
