"""A loopback upstream that answers like an LLM server, slowly, and records.

Every `POST` body is kept (with its headers and arrival time) so a test can
assert what the proxy forwarded. `/v1/messages` with `"stream": true` gets an
Anthropic-style event stream, `/v1/chat/completions` an OpenAI one, one event
per chunk with `event_delay` seconds between events; the time each event was
sent is recorded, so a test can prove the client saw the first event before
the last one left the upstream (i.e. the proxy streamed, not buffered).
Usage carries `cache_read_input_tokens` / `cached_tokens` like the patched
engine does. Other requests get a small JSON answer. Bodies may come chunked
(`transfer-encoding: chunked`, as the proxy forwards a chunked upload) and
gzip-, deflate- or br-encoded; a body it cannot read is recorded all the same.
`x-test-break-after: N` makes it die mid-stream like a killed engine: the
connection is dropped after N events, with no end of the chunked body.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from mitmproxy.net import encoding

from stable_prefix.addons.sse_events import format_event
from tests.support.processes import LOOPBACK, free_port, serving

CACHED_TOKENS = 1234


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    raw_body: bytes
    at: float

    def body(self) -> bytes:
        """The body with its content-encoding undone."""
        return encoding.decode(self.raw_body, self.headers.get("content-encoding", "identity"))

    def json(self):
        return json.loads(self.body())


@dataclass
class SlowUpstream:
    port: int
    event_delay: float
    received: list[Received] = field(default_factory=list)
    event_times: list[list[float]] = field(default_factory=list)  # per streamed answer

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def anthropic_events(words: list[str]) -> list[tuple[str, dict]]:
    events = [
        ("message_start", {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 40, "cache_read_input_tokens": CACHED_TOKENS, "output_tokens": 1}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}}) for word in words]
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": len(words)}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


def openai_events(words: list[str]) -> list[tuple[None, dict | str]]:
    chunks = [(None, {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": word}}]}) for word in words]
    usage = {"prompt_tokens": 1274, "completion_tokens": len(words), "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS}}
    return chunks + [(None, {"object": "chat.completion.chunk", "choices": [], "usage": usage}), (None, "[DONE]")]


def read_request_body(rfile, headers) -> bytes:
    """The request body, whole: by content-length, or chunk by chunk."""
    if "chunked" not in headers.get("transfer-encoding", "").lower():
        return rfile.read(int(headers.get("content-length", 0)))
    body = bytearray()
    while size := int(rfile.readline().split(b";")[0].strip() or b"0", 16):
        body += rfile.read(size)
        rfile.readline()  # the CRLF after the chunk
    while rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers, then the empty line
        pass
    return bytes(body)


def _handler(upstream: SlowUpstream):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):
            pass

        def do_GET(self):
            self._send_json({"object": "list", "data": [{"id": "served-model"}]})

        def do_POST(self):
            raw = read_request_body(self.rfile, self.headers)
            received = Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, raw, time.time())
            upstream.received.append(received)
            try:
                streamed = json.loads(received.body()).get("stream") is True
            except (ValueError, AttributeError, RecursionError):
                streamed = False
            route = self.path.split("?")[0]
            if streamed and route.endswith("/v1/messages"):
                self._stream(anthropic_events(["Hello", " from", " the", " upstream."]))
            elif streamed and route.endswith("/v1/chat/completions"):
                self._stream(openai_events(["Hello", " there."]))
            else:
                self._send_json({"type": "message", "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}})

        def _send_json(self, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            times: list[float] = []
            upstream.event_times.append(times)
            break_after = int(self.headers.get("x-test-break-after", len(events) + 1))
            for index, (name, data) in enumerate(events):
                if index == break_after:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if index:
                    time.sleep(upstream.event_delay)
                chunk = format_event(data, name)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                times.append(time.time())
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


@contextlib.contextmanager
def slow_sse_upstream(event_delay: float = 0.15) -> Iterator[SlowUpstream]:
    upstream = SlowUpstream(port=free_port(), event_delay=event_delay)
    with serving(_handler(upstream), upstream.port, "slow-sse-upstream"):
        yield upstream
