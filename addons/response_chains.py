"""What a Responses server holds behind a `previous_response_id`, as far as the proxy saw it.

A Responses client may send only its new items and name the response it
continues (`previous_response_id`); the server then puts that response's
history in front of them. vllm-mlx 0.6.0 does so from an in-memory store
(`store` true, the default; at most 1,000 responses, lost on a restart): the
stored request's input items (not its `instructions`, which each request sends
anew) and the response's output, then the new items; so the engine, and its
prefix cache, sees the whole conversation. A `store: false` response is kept
nowhere, and a request naming it is answered 404.

The diagnosis must compare what the engine sees, so the proxy keeps the same
history for the responses it forwarded (`remember`: the request's items as
forwarded, its own chain resolved, plus the response's output items; nothing
for a request whose own history it could not resolve) and reads
a chained request with it (`resolved`). Paths in such a request's diagnosis
count the held items first. A response the proxy did not see (forwarded
before it started, or held past `RESPONSES_KEPT`) cannot be resolved: prompt
order then names it (`previous_response_id`), and a break there has the cause
`history held by the server`.

`FollowResponseChains` is the addon that fills them, as the answers pass.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from mitmproxy import http

from stable_prefix.addons.flow_notes import FLOW_NOTES
from stable_prefix.addons.responses_input import as_items
from stable_prefix.addons.sse_events import EventStream
from stable_prefix.addons.streaming import is_event_stream

# How many responses' histories are kept (each about the size of its request body).
RESPONSES_KEPT = 64


class ResponseChains:
    def __init__(self, kept: int = RESPONSES_KEPT) -> None:
        self.kept = kept
        self._held: OrderedDict[str, list] = OrderedDict()

    def resolved(self, body: dict) -> dict:
        """The body with the history its `previous_response_id` names in front
        of its input (and the id gone); the body itself when it names none, or
        one the proxy does not hold."""
        previous = body.get("previous_response_id")
        history = self._held.get(previous) if isinstance(previous, str) else None
        if history is None:
            return body
        self._held.move_to_end(previous)
        resolved = {key: value for key, value in body.items() if key != "previous_response_id"}
        resolved["input"] = history + as_items(body.get("input"))
        return resolved

    def remember(self, forwarded_body: dict, response: dict | None) -> None:
        """A response has come back for `forwarded_body`: hold what the server
        holds for it, unless the request said `store: false`."""
        if forwarded_body.get("store") is False or not isinstance(response, dict) or not isinstance(response.get("id"), str):
            return
        resolved = self.resolved(forwarded_body)
        if isinstance(resolved.get("previous_response_id"), str):
            return  # its own history is unknown here: holding the rest would pass a part for the whole
        output = response.get("output") if isinstance(response.get("output"), list) else []
        self._held[response["id"]] = as_items(resolved.get("input")) + output
        while len(self._held) > self.kept:
            self._held.popitem(last=False)


class FollowResponseChains:
    """The addon: follows each diagnosed Responses answer as it passes (its id and output items, out of the
    events of a streamed one) and holds its history in `chains`, which the diagnosis reads."""

    def __init__(self, chains: ResponseChains | None = None) -> None:
        self.chains = chains if chains is not None else ResponseChains()
        # Responses answers being streamed, by flow id (flow.metadata must stay serializable).
        self.answers: dict[str, EventStream] = {}

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        notes = flow.metadata.get(FLOW_NOTES) or {}
        # Only a diagnosed request's: the histories serve the diagnosis (which runs first in this hook).
        if notes.get("api") == "responses" and "diagnosis" in notes and flow.response and is_event_stream(flow.response):
            flow.response.stream = self._follow_answer(flow, flow.response.stream)

    def response(self, flow: http.HTTPFlow) -> None:
        """A Responses answer is complete: hold its history for a request that continues it."""
        answer = self.answers.pop(flow.id, None)
        if flow.metadata.get(FLOW_NOTES, {}).get("api") != "responses" or flow.response is None or flow.response.status_code != 200:
            return
        try:
            forwarded = json.loads(flow.request.get_content(strict=False) or b"")
            response = answer.response if answer is not None else json.loads(flow.response.get_content(strict=False) or b"")
        except ValueError:
            return
        if isinstance(forwarded, dict) and isinstance(response, dict):
            self.chains.remember(forwarded, response)

    def error(self, flow: http.HTTPFlow) -> None:
        self.answers.pop(flow.id, None)

    def _follow_answer(self, flow: http.HTTPFlow, previous):
        """A stream callable that reads the events as the server sent them and
        passes each chunk on (through `previous`, another addon's, if any)."""
        answer = self.answers[flow.id] = EventStream()
        previous = previous if callable(previous) else None

        def follow(chunk: bytes):
            answer.feed(chunk)
            return previous(chunk) if previous else chunk

        return follow
