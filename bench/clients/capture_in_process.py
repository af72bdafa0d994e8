"""A capture folder written by the real addons in process, no server: each request goes through
strip_billing.py and capture.py as mitmdump would call them (request, responseheaders, the stream's chunks,
response), answered by a stream whose usage and time to first token the caller chooses. For the session
page's tests and its load-time probe, where the records' figures must be known in advance.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons.capture import Capture
from stable_prefix.addons.llama_slots import LlamaSlots
from stable_prefix.addons.stream_recovery import StreamRecovery
from stable_prefix.addons.strip_billing import proxy_addons


@dataclass(frozen=True)
class Exchange:
    body: dict  # an Anthropic `/v1/messages` body
    usage: dict | None  # what the server's answer reports (None: nothing, so reuse is unknown)
    ttft_s: float | None  # the time to first token to record (None: the answer is not streamed)
    headers: dict[str, str] = field(default_factory=dict)


def anthropic_stream(usage: dict | None) -> list[bytes]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "local", **({"usage": usage} if usage else {})}
    events = [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Looked."}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]


def _hook(addons: list, name: str, flow: http.HTTPFlow) -> None:
    """One hook on each addon that has it, in the list's order, as mitmproxy calls it."""
    for addon in addons:
        if hasattr(addon, name):
            getattr(addon, name)(flow)


def _answer(flow: http.HTTPFlow, exchange: Exchange, strip: list, capture: Capture) -> None:
    if exchange.ttft_s is None:
        flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"application/json"),)),
                                     content=json.dumps({"type": "message", "usage": exchange.usage or {}}).encode())
        _hook(strip, "responseheaders", flow)
        capture.responseheaders(flow)
        return
    flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"text/event-stream"),)), content=b"")
    _hook(strip, "responseheaders", flow)
    capture.responseheaders(flow)
    flow.request.timestamp_end = time.time() - exchange.ttft_s  # the first output, just below, comes that long after
    for chunk in anthropic_stream(exchange.usage):
        flow.response.stream(chunk)


def write_session(directory: Path, exchanges: list[Exchange], *, name: str = "s") -> Path:
    """The capture folder `directory/name` holding `exchanges`, sent in order (a folder that exists is continued)."""
    # strip_billing.py's addons but llama.cpp's slot lanes and the stream recovery (no upstream to pin or to ask again).
    strip, capture = [addon for addon in proxy_addons() if not isinstance(addon, (LlamaSlots, StreamRecovery))], Capture()
    with taddons.context(*strip, capture) as tctx:
        tctx.configure(capture, capture_dir=str(directory), capture_session=name)
        for exchange in exchanges:
            headers = http.Headers(((b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in exchange.headers.items())))
            request = tutils.treq(host="127.0.0.1", method=b"POST", path=b"/v1/messages", headers=headers, content=json.dumps(exchange.body).encode())
            flow = tflow.tflow(req=request)
            _hook(strip, "request", flow)
            capture.request(flow)
            _answer(flow, exchange, strip, capture)
            _hook(strip, "response", flow)
            capture.response(flow)
    return directory / name
