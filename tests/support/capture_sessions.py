"""Capture folders written by the real addons in process, for the session page's tests: a scripted session
(`tests/fixtures/claude_code.py`'s bodies, growing a turn at a time, with the system text changed at a chosen
request: a known break), each answered as a stream whose usage and time to first token the test chooses.

`strip_billing.py` and `capture.py` see each flow as mitmdump would call them (request, responseheaders,
the stream's chunks, response), so the records hold the proxy's own lane, diagnosis, usage and TTFT.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons.capture import Capture
from stable_prefix.addons.strip_billing import StripBilling
from tests.fixtures import claude_code

# The scripted break: the git status in the main agent's system text changes (a file appears).
GIT_STATUS, CHANGED_GIT_STATUS = "M src/app.py", "M src/app.py\n?? notes.txt"


@dataclass(frozen=True)
class Exchange:
    body: dict
    usage: dict | None  # what the server's stream reports (None: nothing, reuse unknown)
    ttft_s: float | None  # the scripted time to first token (None: the answer is not streamed)


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


def write_session(directory: Path, exchanges: list[Exchange], *, name: str = "s") -> Path:
    """The capture folder of `exchanges`, sent in order through strip_billing and capture; returns it."""
    strip, capture = StripBilling(), Capture()
    with taddons.context(strip, capture) as tctx:
        tctx.configure(capture, capture_dir=str(directory), capture_session=name)
        for exchange in exchanges:
            headers = http.Headers(((b"content-type", b"application/json"),))
            request = tutils.treq(host="127.0.0.1", method=b"POST", path=b"/v1/messages", headers=headers, content=json.dumps(exchange.body).encode())
            flow = tflow.tflow(req=request)
            strip.request(flow)
            capture.request(flow)
            if exchange.ttft_s is None:
                flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"application/json"),)),
                                             content=json.dumps({"type": "message", "usage": exchange.usage or {}}).encode())
                strip.responseheaders(flow)
                capture.responseheaders(flow)
            else:
                flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"text/event-stream"),)), content=b"")
                strip.responseheaders(flow)
                capture.responseheaders(flow)
                flow.request.timestamp_end = time.time() - exchange.ttft_s  # the answer's first output comes "now"
                for chunk in anthropic_stream(exchange.usage):
                    flow.response.stream(chunk)
            strip.response(flow)
            capture.response(flow)
    return directory / name


def scripted_session(directory: Path, *, main_turns: int = 8, break_at: int = 5, subagent_turns: int = 3) -> Path:
    """A main lane of `main_turns` requests whose system text changes at its request `break_at`, and a
    subagent lane; usage as a prefix cache reports it (a kept prefix reuses all but the new turn, the break
    and each lane's first request reuse nothing), TTFT growing with what was prefilled."""
    exchanges = []
    for turn in range(1, main_turns + 1):
        prompt = 400 + 150 * turn
        reused = 0 if turn in (1, break_at) else prompt - 150
        git_status = CHANGED_GIT_STATUS if turn >= break_at else GIT_STATUS
        exchanges.append(Exchange(claude_code.main_request(turn, git_status=git_status), {"input_tokens": prompt - reused, "cache_read_input_tokens": reused,
                                                                      "output_tokens": 2}, 0.05 + (prompt - reused) / 2000))
        if turn <= subagent_turns:
            prompt = 300 + 120 * turn
            reused = 0 if turn == 1 else prompt - 120
            exchanges.append(Exchange(claude_code.subagent_request("explore", turn), {"input_tokens": prompt - reused, "cache_read_input_tokens": reused, "output_tokens": 2},
                                      0.04 + (prompt - reused) / 2000))
    return write_session(directory, exchanges)
