"""One streamed `/v1/messages` request, read to its end or abandoned on purpose, with its answer text.

The soak and the load scenario need what `replay.post_streamed` does not keep
(the answer's text, whether the stream ended properly) and clients that give
up: `give_up="before-first-token"` closes the connection once the request is
sent, `"mid-stream"` after the first event that carries output.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from stable_prefix.addons.sse_events import EventStream
from stable_prefix.bench.clients.replay import CLIENT_HEADERS, MESSAGES_PATH

GIVE_UP_MODES = (None, "before-first-token", "mid-stream")


@dataclass
class StreamedAnswer:
    status: int | None
    text: str = ""
    usage: dict = field(default_factory=dict)
    ttft_s: float | None = None
    total_s: float = 0.0
    complete: bool = False  # the stream ended with message_stop and no error event
    gave_up: str | None = None
    error: str | None = None

    @property
    def output_tokens(self) -> int | None:
        return self.usage.get("output_tokens")


def text_of(events) -> str:
    return "".join(event["delta"].get("text", "") for event in events
                   if event.get("type") == "content_block_delta" and isinstance(event.get("delta"), dict))


def post_messages(base_url: str, body: dict, headers: dict[str, str] | None = None, give_up: str | None = None,
                  timeout: float = 900.0) -> StreamedAnswer:
    """POST a streamed Anthropic request; read it all unless `give_up` says when to hang up."""
    url = urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    started = time.perf_counter()
    answer = StreamedAnswer(status=None, gave_up=give_up)
    try:
        connection.request("POST", MESSAGES_PATH, body=json.dumps(body).encode(), headers={**CLIENT_HEADERS, **(headers or {})})
        if give_up == "before-first-token":
            return answer
        response = connection.getresponse()
        answer.status = response.status
        if response.status != 200:
            answer.error = f"HTTP {response.status}: {response.read().decode(errors='replace')[:300]}"
            return answer
        stream, events = EventStream(clock=time.perf_counter), []
        while chunk := response.read1(65536):
            for event in stream.feed(chunk):
                payload = event.json()
                if isinstance(payload, dict):
                    events.append(payload)
            if give_up == "mid-stream" and stream.first_output_at is not None:
                return answer
        answer.text, answer.usage = text_of(events), stream.usage
        answer.ttft_s = None if stream.first_output_at is None else stream.first_output_at - started
        answer.error = None if stream.error is None else json.dumps(stream.error)[:300]
        answer.complete = bool(events) and events[-1].get("type") == "message_stop" and stream.error is None
        return answer
    except (OSError, http.client.HTTPException) as error:
        answer.error = f"{type(error).__name__}: {error}"
        return answer
    finally:
        answer.total_s = time.perf_counter() - started
        connection.close()
