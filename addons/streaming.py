"""The addon that streams server-sent events instead of buffering them.

Without `flow.response.stream` set mitmproxy reads a whole answer before the
client gets a byte (and swallows SSE): a proxy for LLM traffic that buffers a
streamed answer is broken, however correct. Every `text/event-stream` answer
is streamed; a stream callable another addon set first is kept (the addons
after this one wrap it: each passes every chunk on through the one before).
"""

from __future__ import annotations

from mitmproxy import http


def is_event_stream(response: http.Response) -> bool:
    return response.headers.get("content-type", "").lower().startswith("text/event-stream")


class StreamEventStreams:
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response and is_event_stream(flow.response) and not flow.response.stream:
            flow.response.stream = True
