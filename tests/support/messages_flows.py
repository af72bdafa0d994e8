"""A client's Messages request and the engine's JSON answer, built by hand for mitmproxy's test harness.

The request carries the secrets a client sends (API key, token, cookie) so that a test sees them redacted, and
both sides have fixed timestamps, so a record's times are known.
"""

import json

from mitmproxy import http
from mitmproxy.test import tflow, tutils


def api_flow(body, path="/v1/messages?beta=true"):
    content = json.dumps(body).encode()
    headers = http.Headers(
        [
            (b"content-type", b"application/json"),
            (b"x-api-key", b"sk-secret-key"),
            (b"authorization", b"Bearer sk-secret-token"),
            (b"cookie", b"session=abc"),
            (b"anthropic-version", b"2023-06-01"),
        ]
    )
    request = tutils.treq(host="127.0.0.1", port=8000, method=b"POST", path=path.encode(), headers=headers, content=content)
    request.timestamp_start, request.timestamp_end = 100.0, 100.1
    return tflow.tflow(req=request)


def json_response(flow, payload, status=200):
    flow.response = tutils.tresp(status_code=status, headers=http.Headers(((b"content-type", b"application/json"),)), content=json.dumps(payload).encode())
    flow.response.timestamp_start, flow.response.timestamp_end = 100.6, 100.9
