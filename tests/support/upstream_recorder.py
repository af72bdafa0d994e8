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
first event with output, `sse_events.carries_output`: vllm-mlx sends
`message_start` before it prefills, so the first byte says nothing about
prefill), the conversation the request names (`lanes.session_id`) and the
response body as text (what the engine answered, to compare answers).
Responses stream through untouched.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from mitmproxy import ctx, http

from stable_prefix.addons.lanes import session_id
from stable_prefix.addons.sse_events import EventStream, merge_usage


class UpstreamRecorder:
    def load(self, loader) -> None:
        loader.add_option("record_path", str, "", "JSON-lines file that receives one record per exchange")

    def request(self, flow: http.HTTPFlow) -> None:
        flow.metadata["recorder_started"] = time.monotonic()

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        flow.metadata["recorder_first_byte"] = time.monotonic()
        chunks: list[bytes] = []
        events = EventStream(clock=time.monotonic)
        flow.metadata["recorder_chunks"] = chunks
        flow.metadata["recorder_events"] = events

        def keep_a_copy(chunk: bytes) -> bytes:
            chunks.append(chunk)
            events.feed(chunk)
            return chunk

        flow.response.stream = keep_a_copy

    def response(self, flow: http.HTTPFlow) -> None:
        body = b"".join(flow.metadata.get("recorder_chunks", []))
        events = flow.metadata.get("recorder_events")
        try:
            request_body = json.loads(flow.request.content or b"null")
        except ValueError:
            request_body = {"unparsed_bytes": len(flow.request.content or b"")}
        usage: dict = {}
        if flow.response.headers.get("content-type", "").startswith("text/event-stream") and events is not None:
            usage = events.usage
        else:
            try:
                merge_usage(usage, json.loads(body or b"null"))
            except ValueError:
                pass
        first_token = events.first_output_at if events is not None else None
        started = flow.metadata.get("recorder_started", time.monotonic())
        record = {
            "method": flow.request.method,
            "path": flow.request.path,
            "request_bytes": len(flow.request.content or b""),
            "request": request_body,
            "status": flow.response.status_code,
            "usage": usage,
            "session": session_id(flow.request.headers),
            "response_body": body.decode("utf-8", "replace"),
            "ttfb_s": round(flow.metadata.get("recorder_first_byte", started) - started, 3),
            "ttft_s": round(first_token - started, 3) if first_token is not None else None,
            "total_s": round(time.monotonic() - started, 3),
        }
        with Path(ctx.options.record_path).open("a") as record_file:
            record_file.write(json.dumps(record) + "\n")


addons = [UpstreamRecorder()]
