"""A loopback stand-in for vllm-mlx that replays our recorded-shape fixtures.

The request names the fixture in the `x-test-fixture` header (the SDKs send it
through `extra_headers`). Streamed requests (`"stream": true`) get the `.sse`
file sent with chunked encoding in deliberately awkward pieces (1, 7, 2, 13...
bytes: splits inside events, tags and UTF-8 characters) with a small delay
between them, as a network would deliver it. `x-test-pause-before` names a
piece of text; the server waits `x-test-pause-seconds` before sending the byte
where it starts, so a test can see what reached the client before it.
Non-streamed requests get the `.json` file whole. Every request body is kept in
`requests` for tests that check what the proxy forwarded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.support.processes import LOOPBACK, free_port, serving

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "streams"
AWKWARD_PIECE_SIZES = (1, 7, 2, 13, 3, 31, 5, 64)


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


@dataclass
class Upstream:
    port: int
    requests: list[RecordedRequest] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def awkward_pieces(data: bytes, sizes: tuple[int, ...] = AWKWARD_PIECE_SIZES) -> Iterator[tuple[int, bytes]]:
    """(offset, piece) covering `data` in pieces of cycling sizes."""
    offset = 0
    for size in itertools.cycle(sizes):
        if offset >= len(data):
            return
        yield offset, data[offset : offset + size]
        offset += size


def _handler(upstream: Upstream, delay: float):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # keep pytest output clean
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            upstream.requests.append(RecordedRequest(self.path, dict(self.headers), body))
            fixture = self.headers.get("x-test-fixture", "")
            streamed = json.loads(body or b"{}").get("stream", False)
            path = FIXTURES / fixture
            if not fixture or "/" in fixture or not path.exists():
                return self._send(404, "application/json", json.dumps({"error": f"no fixture {fixture!r}"}).encode())
            if not streamed:
                return self._send(200, "application/json", path.read_bytes())
            self._stream(path.read_bytes())

        def _send(self, status: int, content_type: str, data: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, data: bytes) -> None:
            pause_text = self.headers.get("x-test-pause-before", "").encode()
            pause_at = data.find(pause_text) if pause_text else -1
            pause_seconds = float(self.headers.get("x-test-pause-seconds", "0"))
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for offset, piece in awkward_pieces(data):
                if pause_at >= 0 and offset <= pause_at < offset + len(piece):
                    head, piece = piece[: pause_at - offset], piece[pause_at - offset :]
                    self._chunk(head)
                    time.sleep(pause_seconds)
                self._chunk(piece)
                time.sleep(delay)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, piece: bytes) -> None:
            if piece:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()

    return Handler


@contextlib.contextmanager
def sse_upstream(delay: float = 0.002) -> Iterator[Upstream]:
    upstream = Upstream(port=free_port())
    with serving(_handler(upstream, delay), upstream.port, "sse-upstream"):
        yield upstream
