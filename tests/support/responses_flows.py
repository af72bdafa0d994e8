"""A client's Responses API request and the engine's whole answer, built by hand for mitmproxy's test harness."""

import json

from mitmproxy import http
from mitmproxy.test import tflow, tutils

USAGE = {"input_tokens": 900, "output_tokens": 3, "total_tokens": 903, "input_tokens_details": {"cached_tokens": 880}}


def responses_flow(body, headers=None, path="/v1/responses"):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    pairs = [(b"content-type", b"application/json")] + [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    request = tutils.treq(host="127.0.0.1", port=8000, method=b"POST", path=path.encode(), headers=http.Headers(pairs), content=content)
    request.timestamp_start, request.timestamp_end = 100.0, 100.1
    return tflow.tflow(req=request)


def response_object(response_id, text="Hello."):
    return {"id": response_id, "object": "response", "status": "completed", "usage": USAGE,
            "output": [{"type": "message", "id": f"msg_{response_id}", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}]}


def json_answer(addons, flow, payload):
    flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"application/json"),)), content=json.dumps(payload).encode())
    for addon in addons:
        addon.responseheaders(flow)
        addon.response(flow)
