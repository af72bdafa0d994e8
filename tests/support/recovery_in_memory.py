"""A stream recovery run without a network: the upstream's answers from memory, the client's bytes as the proxy writes them.

`streamed_flow` is a streamed request and its response's head as mitmproxy holds them, the stream turned on as
strip_billing turns it on; `stream_recovery.follow` installs its stream callable on it, and `through_proxy`
passes upstream bytes through that callable as mitmproxy does. At a cut, `recovered` drives a `Recovery` step
by step as `stream_recovery._recover` does and returns what the client reads after the cut; the recovery asks
`answered_by(...)`, which answers each request from memory (`RecordedAnswer`, delivered in pieces that split
events, tags and characters) and keeps the bodies it was sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from mitmproxy.http import Headers
from mitmproxy.test import tflow, tutils

from stable_prefix.addons.engine_errors import error_event
from stable_prefix.addons.stream_recovery import FollowedStream, Recovery
from tests.support.sse_upstream import awkward_pieces

# An answer as a network delivers it: pieces that split events, tags and characters.
ANSWER_PIECE_SIZES = (512, 3, 97, 1, 64)
CUT_REASON = "HTTP/1 protocol error: peer closed connection without sending complete message body: incomplete chunked read"


class RecordedAnswer:
    """The upstream's answer to one recovery request, from memory."""

    def __init__(self, data: bytes, status: int = 200) -> None:
        self.status = status
        self.pieces = [piece for _, piece in awkward_pieces(data, ANSWER_PIECE_SIZES)]
        self.closed = False

    async def read(self) -> bytes | None:
        return self.pieces.pop(0) if self.pieces else None

    def close(self) -> None:
        self.closed = True


def answered_by(answer: Callable[[dict], RecordedAnswer]):
    """A recovery's way to ask the upstream (`Recovery(ask=...)`): `answer` of each request's body; `.asked` keeps the bodies."""
    asked: list[dict] = []

    async def ask(request, body: bytes, insecure: bool) -> RecordedAnswer:
        asked.append(json.loads(body))
        return answer(asked[-1])

    ask.asked = asked
    return ask


def in_turn(*answers: bytes):
    """Each request gets the next of `answers`."""
    queue = list(answers)
    return answered_by(lambda body: RecordedAnswer(queue.pop(0)))


def streamed_flow(path: str, body: dict | None = None) -> tflow.HTTPFlow:
    body = body or {"model": "tiny", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 100,
                    "messages" if path != "/v1/responses" else "input": [{"role": "user", "content": "Read the file."}]}
    request = tutils.treq(method=b"POST", path=path.encode(), headers=Headers(content_type="application/json"), content=json.dumps(body).encode())
    flow = tflow.tflow(req=request, resp=tutils.tresp(headers=Headers(content_type="text/event-stream", transfer_encoding="chunked")))
    flow.response.stream = True  # as strip_billing sets it
    return flow


def through_proxy(flow: tflow.HTTPFlow, data: bytes) -> bytes:
    """What the client gets of `data` from the upstream: the flow's stream callable, or the bytes as they came."""
    stream = flow.response.stream
    if not callable(stream):
        return data
    result = stream(data)
    return result if isinstance(result, bytes) else b"".join(result)


async def recovered(followed: FollowedStream, recovery: Recovery) -> bytes:
    """What the client reads after the cut: the recovery's events, then the stream's end or the error event."""
    received = b""
    for _ in range(100_000):
        outcome = await recovery.step()
        received += b"".join(chunk for data in outcome.events for chunk in followed.to_client(data))
        if outcome.finished:
            return received + b"".join(followed.to_client(b""))
        if outcome.failed:
            return received + error_event("openai", outcome.failed)
    raise AssertionError("the recovery never ended")
