"""The latency our addon adds, isolated from the engine.

A loopback stub upstream answers every `/v1/messages` with a short Anthropic
SSE stream (chunked, as an engine sends it). The same request body (~90 KB, a
full-size main-lane request of the session) is sent alternately straight to the
stub and through `mitmdump`; each proxied request is paired with the direct
request just before it, and the difference is the added latency. Two figures:

- **added time to first token** (the one a user feels): the stub behaves like
  an engine. It sends its response headers and `message_start` at once, waits
  `FIRST_TOKEN_DELAY_S` (the stand-in for prefill), then the first content event,
  then the rest. Work the proxy does while the upstream prefills (the addon's
  prefix diagnosis runs in `responseheaders`) costs the user nothing.
- **added total time, instant upstream**: the stub answers everything at once;
  every microsecond the proxy spends on the request counts, wherever it is spent.

Measured for mitmdump with no script (mitmproxy's own cost; it buffers the
answer, which here is only the few bytes after the first event), our addon as
shipped, the addon without its prefix diagnosis, and the addon with capture.py.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from stable_prefix.bench.metrics import proxy_overhead_ms
from stable_prefix.bench.replay import MESSAGES_PATH, post_streamed
from stable_prefix.bench.session import MAIN_LANE, generate_session
from stable_prefix.bench.stack import ADDON_SCRIPTS, CAPTURE_SCRIPT, UNBUFFERED, proxy_options
from stable_prefix.tools.servers import LOOPBACK, free_port, mitmdump_command, running, serving

TARGET_BODY_BYTES = 90_000

FIRST_TOKEN_DELAY_S = 0.030


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


_MESSAGE_START = _event("message_start", {"type": "message_start", "message": {"id": "msg_stub", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 1, "output_tokens": 0}}})
_FIRST_TOKEN = _event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}) + _event(
    "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}}
)
_REST = b"".join((
    _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
    _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}),
    _event("message_stop", {"type": "message_stop"}),
))


class _StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small chunks must leave at once, as an engine's do

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self._chunk(_MESSAGE_START)
        delay = self.server.first_token_delay_s
        if delay:
            time.sleep(delay)
        self._chunk(_FIRST_TOKEN)
        self._chunk(_REST)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args) -> None:  # keep the benchmark's output readable
        pass


@contextlib.contextmanager
def stub_upstream() -> Iterator[ThreadingHTTPServer]:
    """A loopback stub; set `.first_token_delay_s` on it to change how it answers."""
    with serving(_StubHandler, free_port(), "proxy-overhead-stub") as server:
        server.first_token_delay_s = 0.0
        yield server


def sample_body(seed: int = 0) -> bytes:
    """The full-size main-lane request whose size is closest to TARGET_BODY_BYTES."""
    requests = [r for r in generate_session(seed, scale=0.75) if r.lane == MAIN_LANE]
    return min((r.body_bytes() for r in requests), key=lambda body: abs(len(body) - TARGET_BODY_BYTES))


def _paired(upstream: str, proxy_url: str, body: bytes, samples: int, warmup: int, log_path: Path) -> tuple[dict, dict]:
    """(added TTFT, added total time) in ms over `samples` direct/proxied pairs."""
    direct, proxied = [], []
    for attempt in range(warmup + samples):
        pair = post_streamed(upstream, MESSAGES_PATH, body), post_streamed(proxy_url, MESSAGES_PATH, body)
        for reply in pair:
            if reply.status != 200 or reply.error:
                raise RuntimeError(f"proxy overhead: stub or proxy answered {reply.status} {reply.error}; see {log_path}")
        if attempt >= warmup:
            direct.append(pair[0])
            proxied.append(pair[1])
    return (
        proxy_overhead_ms([r.ttft_s for r in direct], [r.ttft_s for r in proxied]),
        proxy_overhead_ms([r.total_s for r in direct], [r.total_s for r in proxied]),
    )


def measure(
    log_dir: Path,
    *,
    samples: int = 60,
    warmup: int = 5,
    scripts: list[str] = ADDON_SCRIPTS,
    extra_options: dict | None = None,
    first_token_delay_s: float = FIRST_TOKEN_DELAY_S,
) -> dict:
    """Added latency of mitmdump running `scripts` (none: mitmproxy's own cost):
    `added_ttft_ms` against an engine-like stub, `added_total_instant_upstream_ms`
    against one that answers at once; each {p50, p95, samples}."""
    body = sample_body()
    capture_dir = log_dir / "overhead-captures"
    with stub_upstream() as stub:
        upstream = f"http://{LOOPBACK}:{stub.server_address[1]}"
        port = free_port()
        options = {**proxy_options(), **(extra_options or {})} if scripts else {}
        if CAPTURE_SCRIPT in scripts:
            options["capture_dir"] = capture_dir
        command = mitmdump_command(scripts, upstream, port, options)
        try:
            with running("overhead-mitmdump", command, port=port, log_dir=log_dir, env=UNBUFFERED) as proxy:
                stub.first_token_delay_s = 0.0
                _, total = _paired(upstream, proxy.url, body, samples, warmup, proxy.log_path)
                stub.first_token_delay_s = first_token_delay_s
                ttft, _ = _paired(upstream, proxy.url, body, samples, warmup, proxy.log_path)
        finally:
            shutil.rmtree(capture_dir, ignore_errors=True)  # ~90 KB per request; only the cost matters
    return {"body_bytes": len(body), "first_token_delay_ms": first_token_delay_s * 1000, "added_ttft_ms": ttft, "added_total_instant_upstream_ms": total}


VARIANTS = {
    "mitmproxy_alone": {"scripts": []},
    "addon": {},
    "addon_without_diagnosis": {"extra_options": {"prefix_diagnosis": False}},
    "addon_with_capture": {"scripts": [*ADDON_SCRIPTS, CAPTURE_SCRIPT]},
}


def measure_all(log_dir: Path, samples: int) -> dict:
    """Every variant of VARIANTS: {"body_bytes", "first_token_delay_ms", variant: measure(...)}."""
    results = {name: measure(log_dir, samples=samples, **kwargs) for name, kwargs in VARIANTS.items()}
    return {"body_bytes": results["addon"]["body_bytes"], "first_token_delay_ms": results["addon"]["first_token_delay_ms"], **results}
