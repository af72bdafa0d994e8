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
"""

from __future__ import annotations

from collections import OrderedDict

from stable_prefix.addons.responses_input import as_items

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
