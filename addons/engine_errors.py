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
which writes the page or closes. The addon (`EngineErrors`) registers a
handler on that seam (`client_writes.py`, after the stream recovery) that
changes only failures on the API paths below, while `answer_engine_failures`
is on.
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
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import HttpEvent, ResponseProtocolError
from mitmproxy.proxy.layers.http._http1 import Http1Server

from stable_prefix.addons import client_writes
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


def _enabled() -> bool:
    return bool(getattr(ctx.options, OPTION, False))


def answer_failure(server: Http1Server, event: HttpEvent, rest: client_writes.Send) -> CommandGenerator[None] | None:
    """The seam's handler: the protocol's error for a failed forward on an API path; None leaves it to mitmproxy."""
    if not (isinstance(event, ResponseProtocolError) and server.conn.state & ConnectionState.CAN_WRITE and _enabled()):
        return None
    found = answer(server.request, server.response, event.code.http_status_code(), event.message)
    return None if found is None else _write_answer(server, *found)


def _write_answer(server: Http1Server, data: bytes, note: str) -> CommandGenerator[None]:
    logger.warning(f"{server.request.method} {server.request.path}: {note}")
    yield commands.SendData(server.conn, data)
    yield commands.CloseConnection(server.conn)


class EngineErrors:
    """The addon: declares `answer_engine_failures` and answers on the client-writes seam."""

    def load(self, loader) -> None:
        loader.add_option(
            OPTION, bool, True,
            "When the engine cannot be reached, answer with a 502 JSON error in the request's protocol; when it breaks off "
            "a streamed answer, end the stream with the protocol's SSE error event (mitmproxy: an HTML page, a cut stream).",
        )
        client_writes.register("engine_errors", answer_failure)

    def configure(self, updated) -> None:
        if getattr(ctx.options, OPTION) and getattr(ctx.options, "connection_strategy", None) == "eager":
            # Eagerly, a client that connects while the engine is down is cut off before it sends a request,
            # so there is nothing to answer; lazily, the request comes first and gets its 502. Set here, before
            # the proxy listens (in `running` a client could connect while it was still eager).
            ctx.options.update(connection_strategy="lazy")
            logger.info(f"connection_strategy=lazy: a request while the engine is down gets an answer ({OPTION})")
