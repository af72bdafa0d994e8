"""The latency our addon adds, isolated from the engine.

A loopback stub upstream answers every `/v1/messages` at once with a short
Anthropic SSE stream. The same request body (~90 KB, a full-size main-lane
request of the session) is sent alternately straight to the stub and through
`mitmdump` with our addon in front of it; each proxied request is paired with
the direct request just before it, and the difference of their total times is
the added latency.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bench.metrics import proxy_overhead_ms
from bench.replay import MESSAGES_PATH, post_streamed
from bench.session import MAIN_LANE, generate_session
from bench.stack import ADDON_SCRIPTS, UNBUFFERED, proxy_options
from tools.servers import LOOPBACK, free_port, mitmdump_command, running

TARGET_BODY_BYTES = 90_000

_EVENTS = b"".join(
    f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
    for name, data in (
        ("message_start", {"type": "message_start", "message": {"id": "msg_stub", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 1, "output_tokens": 0}}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}),
        ("message_stop", {"type": "message_stop"}),
    )
)


class _StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(_EVENTS)))
        self.end_headers()
        self.wfile.write(_EVENTS)

    def log_message(self, *args) -> None:  # keep the benchmark's output readable
        pass


@contextlib.contextmanager
def stub_upstream() -> Iterator[str]:
    server = ThreadingHTTPServer((LOOPBACK, free_port()), _StubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def sample_body(seed: int = 0) -> bytes:
    """The full-size main-lane request whose size is closest to TARGET_BODY_BYTES."""
    requests = [r for r in generate_session(seed, scale=0.75) if r.lane == MAIN_LANE]
    return min((r.body_bytes() for r in requests), key=lambda body: abs(len(body) - TARGET_BODY_BYTES))


def measure(
    log_dir: Path, *, samples: int = 60, warmup: int = 5, scripts: list[str] = ADDON_SCRIPTS, extra_options: dict | None = None
) -> dict:
    """Added latency of mitmdump running `scripts` (none: mitmproxy's own cost)."""
    body = sample_body()
    with stub_upstream() as upstream:
        port = free_port()
        options = {**proxy_options(), **(extra_options or {})} if scripts else {}
        command = mitmdump_command(scripts, upstream, port, options)
        with running("overhead-mitmdump", command, port=port, log_dir=log_dir, env=UNBUFFERED) as proxy:
            direct, proxied = [], []
            for attempt in range(warmup + samples):
                direct_reply = post_streamed(upstream, MESSAGES_PATH, body)
                proxied_reply = post_streamed(proxy.url, MESSAGES_PATH, body)
                for reply in (direct_reply, proxied_reply):
                    if reply.status != 200:
                        raise RuntimeError(f"proxy overhead: stub or proxy answered {reply.error}; see {proxy.log_path}")
                if attempt >= warmup:
                    direct.append(direct_reply.total_s)
                    proxied.append(proxied_reply.total_s)
    return {"body_bytes": len(body), **proxy_overhead_ms(direct, proxied)}
