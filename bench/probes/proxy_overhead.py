"""The latency our addon adds, isolated from the engine.

A loopback stub upstream answers every `/v1/messages` with a short Anthropic
SSE stream (chunked, as an engine sends it). Every proxy variant runs at once,
each its own `mitmdump` in front of the same stub. In each round the same
request body (~90 KB, a full-size main-lane request of the session) is sent
once straight to the stub and once through each proxy, in an order shuffled
anew every round (seeded), so drift in the machine's load falls on all of them
alike. Each proxied request is paired with the direct one of its round; the
difference is the added latency, reported as p50/p95 with a confidence interval
of the median, and "within noise" when that interval includes zero. The
addon's own share is paired the same way against mitmdump with no script.
Two figures:

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
import random
import shutil
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from stable_prefix.addons.sse_events import format_event
from stable_prefix.bench.clients.replay import MESSAGES_PATH, Reply, post_streamed
from stable_prefix.bench.clients.stack import ADDON_SCRIPTS, CAPTURE_SCRIPT, UNBUFFERED, proxy_options
from stable_prefix.bench.measure.metrics import paired_difference_ms
from stable_prefix.bench.workload.session import MAIN_LANE, generate_session
from stable_prefix.servers import LOOPBACK, free_port, mitmdump_command, running, serving

TARGET_BODY_BYTES = 90_000

FIRST_TOKEN_DELAY_S = 0.030



_MESSAGE_START = format_event({"type": "message_start", "message": {"id": "msg_stub", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 1, "output_tokens": 0}}}, "message_start")
_FIRST_TOKEN = format_event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, "content_block_start") + format_event(
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}}, "content_block_delta"
)
_REST = b"".join((
    format_event({"type": "content_block_stop", "index": 0}, "content_block_stop"),
    format_event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}, "message_delta"),
    format_event({"type": "message_stop"}, "message_stop"),
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


VARIANTS = {
    "mitmproxy_alone": {"scripts": []},
    "addon": {},
    "addon_without_diagnosis": {"extra_options": {"prefix_diagnosis": False}},
    "addon_with_capture": {"scripts": [*ADDON_SCRIPTS, CAPTURE_SCRIPT]},
}
FIGURES = {"added_total_instant_upstream_ms": ("total_s", 0.0), "added_ttft_ms": ("ttft_s", FIRST_TOKEN_DELAY_S)}


def _proxy_command(variant: dict, upstream: str, port: int, capture_dir: Path) -> list[str]:
    scripts = variant.get("scripts", ADDON_SCRIPTS)
    options = {**proxy_options(), **variant.get("extra_options", {})} if scripts else {}
    if CAPTURE_SCRIPT in scripts:
        options["capture_dir"] = capture_dir
    return mitmdump_command(scripts, upstream, port, options)


def _rounds(targets: dict[str, str], body: bytes, samples: int, warmup: int, rng: random.Random, log_dir: Path) -> dict[str, list[Reply]]:
    """{target: [reply, ...]}: one request to every target per round, in a shuffled order."""
    replies: dict[str, list[Reply]] = {name: [] for name in targets}
    for attempt in range(warmup + samples):
        order = list(targets)
        rng.shuffle(order)
        for name in order:
            reply = post_streamed(targets[name], MESSAGES_PATH, body)
            if reply.status != 200 or reply.error:
                raise RuntimeError(f"proxy overhead: {name} answered {reply.status} {reply.error}; see the logs in {log_dir}")
            if attempt >= warmup:
                replies[name].append(reply)
    return replies


def measure_all(log_dir: Path, samples: int, *, warmup: int = 5, seed: int = 0, variants: dict[str, dict] = VARIANTS) -> dict:
    """Added latency of each of `variants` over direct, and the addon's own share over
    mitmdump with no script: {"body_bytes", "first_token_delay_ms", "order",
    variant: {figure: paired_difference_ms(...)}, "addon_own_share": {...}}."""
    body = sample_body()
    capture_dir = log_dir / "overhead-captures"
    rng = random.Random(seed)
    results: dict = {"body_bytes": len(body), "first_token_delay_ms": FIRST_TOKEN_DELAY_S * 1000, "order": "shuffled every round"}
    try:
        with stub_upstream() as stub, contextlib.ExitStack() as stack:
            upstream = f"http://{LOOPBACK}:{stub.server_address[1]}"
            targets = {"direct": upstream}
            for name, variant in variants.items():
                port = free_port()
                proxy = stack.enter_context(running(f"overhead-{name}", _proxy_command(variant, upstream, port, capture_dir), port=port, log_dir=log_dir, env=UNBUFFERED))
                targets[name] = proxy.url
            for figure, (field, delay) in FIGURES.items():
                stub.first_token_delay_s = delay
                replies = _rounds(targets, body, samples, warmup, rng, log_dir)
                seconds = {name: [getattr(reply, field) for reply in target_replies] for name, target_replies in replies.items()}
                for name in variants:
                    results.setdefault(name, {"body_bytes": len(body), "first_token_delay_ms": FIRST_TOKEN_DELAY_S * 1000})[figure] = paired_difference_ms(
                        seconds["direct"], seconds[name]
                    )
                if {"mitmproxy_alone", "addon"} <= variants.keys():
                    results.setdefault("addon_own_share", {})[figure] = paired_difference_ms(seconds["mitmproxy_alone"], seconds["addon"])
    finally:
        shutil.rmtree(capture_dir, ignore_errors=True)  # ~90 KB per request; only the cost matters
    return results
