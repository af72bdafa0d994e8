"""A mitmdump script that records what the engine actually receives, at its door.

End-to-end tests put it in a second mitmdump between our proxy and the engine,
so assertions about "what reached the engine" do not rest on the proxy's own
account of what it forwarded:

    mitmdump --mode reverse:http://127.0.0.1:ENGINE -p DOOR -s tests/support/upstream_recorder.py \
        --set record_path=upstream.jsonl

One JSON line per finished exchange: method, path, the request body as
received (parsed JSON, or its size when it is not JSON), the response status,
the usage the engine reported (from the JSON body or the SSE events), the
time to the first response byte and, for SSE, the time to the first token (the
first `content_block_delta`: vllm-mlx sends `message_start` before it prefills,
so the first byte says nothing about prefill). Responses stream through untouched.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mitmproxy import ctx, http

FIRST_TOKEN_EVENT = b"content_block_delta"


def usage_from_sse(stream: bytes) -> dict:
    """Merge the `usage` objects of Anthropic SSE events (message_start, then message_delta)."""
    usage: dict = {}
    for line in stream.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:"):
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        message = event.get("message")
        for source in (message.get("usage") if isinstance(message, dict) else None, event.get("usage")):
            if isinstance(source, dict):
                usage.update(source)
    return usage


class UpstreamRecorder:
    def load(self, loader) -> None:
        loader.add_option("record_path", str, "", "JSON-lines file that receives one record per exchange")

    def request(self, flow: http.HTTPFlow) -> None:
        flow.metadata["recorder_started"] = time.monotonic()

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        flow.metadata["recorder_first_byte"] = time.monotonic()
        chunks: list[bytes] = []
        flow.metadata["recorder_chunks"] = chunks

        def keep_a_copy(chunk: bytes) -> bytes:
            chunks.append(chunk)
            if "recorder_first_token" not in flow.metadata and FIRST_TOKEN_EVENT in chunk:
                flow.metadata["recorder_first_token"] = time.monotonic()
            return chunk

        flow.response.stream = keep_a_copy

    def response(self, flow: http.HTTPFlow) -> None:
        body = b"".join(flow.metadata.get("recorder_chunks", []))
        try:
            request_body = json.loads(flow.request.content or b"null")
        except ValueError:
            request_body = {"unparsed_bytes": len(flow.request.content or b"")}
        if flow.response.headers.get("content-type", "").startswith("text/event-stream"):
            usage = usage_from_sse(body)
        else:
            try:
                parsed = json.loads(body or b"null")
            except ValueError:
                parsed = None
            usage = parsed.get("usage", {}) if isinstance(parsed, dict) else {}
        started = flow.metadata.get("recorder_started", time.monotonic())
        record = {
            "method": flow.request.method,
            "path": flow.request.path,
            "request_bytes": len(flow.request.content or b""),
            "request": request_body,
            "status": flow.response.status_code,
            "usage": usage,
            "session": flow.request.headers.get("x-claude-code-session-id"),
            "ttfb_s": round(flow.metadata.get("recorder_first_byte", started) - started, 3),
            "ttft_s": (round(flow.metadata["recorder_first_token"] - started, 3)
                       if "recorder_first_token" in flow.metadata else None),
            "total_s": round(time.monotonic() - started, 3),
        }
        with Path(ctx.options.record_path).open("a") as record_file:
            record_file.write(json.dumps(record) + "\n")


addons = [UpstreamRecorder()]
