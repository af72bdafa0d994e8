"""What the addons leave on a flow: their notes in `flow.metadata`, the client's own headers, lines in `flow.comment`.

`flow.metadata[FLOW_NOTES]` holds what the proxy learned about a request:
api, client_body (bytes as sent), changes (the normalizer), answered_by_proxy
(the forward proxy), lane and diagnosis (JSON; the diagnosis); `capture.py`
and the slot lanes read it. It must stay serializable (`mitmdump -w`).
Notes for the user go to the log and into `flow.comment`, where mitmweb shows them.
"""

from __future__ import annotations

from mitmproxy import http

# flow.metadata key under which the proxy's addons leave their notes on a flow.
FLOW_NOTES = "stable_prefix"
# flow.metadata key: the client's values of the headers the routing key replaced (None: it sent none).
CLIENT_ROUTING_HEADERS = "stable_prefix_client_routing_headers"


def client_headers(flow: http.HTTPFlow) -> http.Headers:
    """The request's headers as the client sent them: the routing key's headers put back."""
    replaced = flow.metadata.get(CLIENT_ROUTING_HEADERS)
    if not replaced:
        return flow.request.headers
    headers = flow.request.headers.copy()
    for name, value in replaced.items():
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    return headers


def append_comment(flow: http.HTTPFlow, line: str) -> None:
    flow.comment = f"{flow.comment}\n{line}" if flow.comment else line


def prepend_comment(flow: http.HTTPFlow, line: str) -> None:
    flow.comment = f"{line}\n{flow.comment}" if flow.comment else line
