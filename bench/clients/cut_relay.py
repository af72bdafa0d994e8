"""A relay before an engine that dies mid-reply on cue: the first streamed answers are cut, the rest pass.

    proxy -> cut_relay (127.0.0.1) -> engine

It forwards every request to the engine and every answer back, byte for byte,
except the first `Cut.streams` streamed answers (server-sent events on an API
path): those are broken off as a killed replica breaks them, the connection
closed with no end of the chunked body, once `Cut.after_content_events`
events carrying output (`sse_events.carries_output`) have passed (0: before
the first one, after the opening events), and with `Cut.inside_event_bytes`
the first bytes of the next one too, as a replica losing power or its
network cuts: inside an event, maybe inside a character. Closing the engine's
side too makes it stop the request, as a client gone does.

What arrives is recorded (`RelayedRequest`): path, whether it asked for a
stream, the sampling it asked for, whether it was cut, its status. A client
that resends after the cut shows as a second request, streamed or not: this is
how `bench/probes/agent_cuts.py` tells what each agent does, and how the stream
recovery tests cut a real engine's answer at a chosen token.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from stable_prefix.addons.sse_events import SSEParser, carries_output
from stable_prefix.servers import LOOPBACK, free_port, serving

# Headers that belong to one connection, not to the message (RFC 9110 7.6.1), and the length the relay sets itself.
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "host",
                         "content-length"})
API_PATHS = ("/v1/messages", "/v1/chat/completions", "/v1/responses")


@dataclass(frozen=True)
class Cut:
    after_content_events: int  # events carrying output that pass before the cut (0: before the first one)
    streams: int = 1  # how many streamed answers are cut, the first ones
    # Only answers to requests at least this large: an agent's turn, not the title request it may send first.
    min_request_bytes: int = 0
    inside_event_bytes: int = 0  # bytes of the next output event written before the cut (0: the cut falls between events)


@dataclass
class RelayedRequest:
    path: str
    stream: bool
    sampling: dict  # temperature, top_p, top_k, seed as the request asked (absent: not sent)
    conversation: str | None  # a digest of its messages (Responses: input): a resend repeats it
    head: str | None  # a digest of its first two messages (system and first prompt): a resend or a resumption keeps it
    messages: int  # how many messages (items): a resumption adds the partial answer and a request to go on
    last_role: str | None  # the role of its last message (a continuation ends with the assistant's)
    body_bytes: int
    started: float
    status: int | None = None
    cut: bool = False
    content_events: int = 0  # events carrying output that reached the client
    to_cut: bool = False  # chosen to be cut (it is not if its answer ends first)
    client_left: bool = False  # the client hung up before the answer's end
    ended: float | None = None


@dataclass
class CutRelay:
    upstream: str
    cut: Cut | None
    port: int = 0
    requests: list[RelayedRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def api_requests(self) -> list[RelayedRequest]:
        return [request for request in self.requests if request.path.split("?")[0].endswith(API_PATHS)]

    def claim_cut(self, request: RelayedRequest) -> bool:
        """Whether this streamed answer is one of those to cut (the first `cut.streams` large enough)."""
        with self.lock:
            # Chosen so far, less those whose answer ended before the cut point (the next one is cut instead).
            chosen = sum(1 for other in self.requests if other.cut or (other.to_cut and other.ended is None))
            if self.cut is None or not request.stream or chosen >= self.cut.streams or request.body_bytes < self.cut.min_request_bytes:
                return False
            request.to_cut = True
            return True


def turns_of(body: object) -> list | None:
    turns = body.get("messages", body.get("input")) if isinstance(body, dict) else None
    return turns if isinstance(turns, list) else None


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def last_role(body: object) -> str | None:
    messages = body.get("messages") if isinstance(body, dict) else None
    return messages[-1].get("role") if isinstance(messages, list) and messages and isinstance(messages[-1], dict) else None


def sampling_of(body: object) -> dict:
    if not isinstance(body, dict):
        return {}
    return {key: body[key] for key in ("temperature", "top_p", "top_k", "seed") if key in body}


def _handler(relay: CutRelay) -> type[BaseHTTPRequestHandler]:
    upstream = urlsplit(relay.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - the standard library's signature
            pass

        def do_GET(self):
            self.relay(b"")

        def do_POST(self):
            self.relay(self.rfile.read(int(self.headers.get("content-length") or 0)))

        def relay(self, body: bytes) -> None:
            try:
                parsed = json.loads(body) if body else None
            except ValueError:
                parsed = None
            turns = turns_of(parsed)
            record = RelayedRequest(self.path, isinstance(parsed, dict) and parsed.get("stream") is True, sampling_of(parsed),
                                    None if turns is None else digest(turns), None if turns is None else digest(turns[:2]),
                                    len(turns or []), last_role(parsed), len(body), time.time())
            with relay.lock:
                relay.requests.append(record)
            headers = {name: value for name, value in self.headers.items() if name.lower() not in HOP_HEADERS}
            headers["accept-encoding"] = "identity"  # the relay reads the events it cuts
            engine = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=3600)
            try:
                engine.request(self.command, self.path, body=body or None, headers=headers)
                answer = engine.getresponse()
                record.status = answer.status
                streamed = answer.getheader("content-type", "").startswith("text/event-stream")
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in HOP_HEADERS:
                        self.send_header(name, value)
                if not streamed:
                    data = answer.read()
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                self.stream(answer, record, relay.claim_cut(record))
            except (BrokenPipeError, ConnectionResetError):
                record.client_left = True  # the client hung up mid-answer; the engine's side closes below
            finally:
                record.ended = time.time()
                engine.close()

        def stream(self, answer: http.client.HTTPResponse, record: RelayedRequest, cut: bool) -> None:
            parser = SSEParser()
            while data := answer.read1(65536):
                for event in parser.feed(data):
                    output = carries_output(event.json())
                    if cut and output and record.content_events >= relay.cut.after_content_events:
                        record.cut = True
                        self.break_off(event.raw[: min(relay.cut.inside_event_bytes, len(event.raw) - 1)])
                        return
                    record.content_events += output
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event.raw), event.raw))
                    self.wfile.flush()
            rest = parser.finish()
            if rest:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(rest), rest))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def break_off(self, last: bytes = b"") -> None:
            """As a killed replica: `last` (the part of an event that left before), the connection closed, the chunked body never ended."""
            with contextlib.suppress(OSError):
                if last:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(last), last))
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    return Handler


@contextlib.contextmanager
def cut_relay(upstream: str, cut: Cut | None) -> Iterator[CutRelay]:
    """A relay on a free loopback port before `upstream`, cutting as `cut` says (None: never), for the block."""
    relay = CutRelay(upstream.rstrip("/"), cut, free_port())
    with serving(_handler(relay), relay.port, "cut-relay"):
        yield relay
