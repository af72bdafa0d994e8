"""The addon that normalizes each API request: the rules, then what the server and a strict router need.

Which rules run is each rule's option (declared from its record in `rules/`),
plus `server_compat.py`'s (model name, max_tokens cap) and `router_compat.py`'s;
`normalize.py` runs them over a body. Here they run over a flow's request
(`normalize_request`): a request that is not ours, or whose body cannot be read,
goes byte for byte (why is logged, once per request); a body is written back
only when a rule changed it. What it did is in the flow's notes (api, client_body,
changes) and comment; the result (`NormalizedRequest`) waits in
`flow.metadata[NORMALIZED]` for the routing key and the diagnosis, which takes it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mitmproxy import ctx, http

from stable_prefix.addons import normalize, responses_input, router_compat, rules, server_compat
from stable_prefix.addons.flow_notes import FLOW_NOTES, append_comment
from stable_prefix.addons.request_body import LeftAlone, api_of, read_json_body, write_json_body
from stable_prefix.addons.request_shape import Api
from stable_prefix.addons.rules.base import Change

logger = logging.getLogger(__name__)

# flow.metadata key of the request as normalized, until the diagnosis takes it (not serializable: it never stays).
NORMALIZED = "stable_prefix_normalized"


@dataclass(frozen=True)
class NormalizedRequest:
    api: Api
    client_body: bytes  # as the client sent it (content-encoding undone)
    body: dict  # as forwarded
    changes: list[Change]
    rules: normalize.Rules  # what it went through (the diagnosis says which rule was off)


def unreadable_shape(body: dict, api: Api) -> LeftAlone | None:
    """Why a parsed body of this API is not one the rules can read, or None."""
    if api == "responses" and not isinstance(body.get("input"), (str, list)):
        kind = "missing" if "input" not in body else f"a JSON {type(body['input']).__name__}"
        return LeftAlone(f"Responses body whose input is {kind}, not a string or a list of items")
    return None


class UnreadItems:
    """Names each Responses item type no rule reads once, the first time a request carries it."""

    def __init__(self) -> None:
        self.reported: set[str] = set()

    def note(self, request: http.Request, body: dict) -> None:
        for kind in sorted(responses_input.unread_item_types(body) - self.reported):
            self.reported.add(kind)
            logger.info(f"{request.method} {request.path}: input items of type {kind!r} are not read by any rule; "
                        "they are forwarded as they are (logged once)")


def normalize_request(request: http.Request, settings: normalize.Rules, unread: UnreadItems | None = None) -> NormalizedRequest | None:
    """Apply the rules to a request in place; None (request untouched) when it
    is not ours or its body cannot be read, which is logged when unexpected."""
    api = api_of(request)
    if api is None:
        return None
    body = read_json_body(request)
    if not isinstance(body, LeftAlone):
        body = unreadable_shape(body, api) or body
    if isinstance(body, LeftAlone):
        logger.warning(f"{request.method} {request.path}: {body.reason}; passed through unchanged")
        return None
    if unread is not None and api == "responses":
        unread.note(request, body)
    client_body = request.get_content()
    changes = normalize.normalize(body, api, settings)
    if changes:
        write_json_body(request, body)
        logger.debug(f"{request.path}: " + "; ".join(map(str, changes)))
    return NormalizedRequest(api, client_body, body, changes, settings)


def rules_from_options(options) -> normalize.Rules:
    """The rules as the options set them; raises OptionsError naming a bad value."""
    switches = {rule.option.name: getattr(options, rule.option.name) for rule in rules.RULES}
    return normalize.Rules(**switches, **server_compat.settings_from_options(options),
                           strict_router_body=getattr(options, router_compat.OPTION.name))


class Normalizer:
    """The addon: each rule's option, the server's and the router's; each API request normalized as they say."""

    def __init__(self) -> None:
        self.rules = normalize.Rules()
        self.unread_items = UnreadItems()

    def load(self, loader) -> None:
        for option in (*(rule.option for rule in rules.RULES), *server_compat.OPTIONS, router_compat.OPTION):
            option.declare(loader)

    def configure(self, updated) -> None:
        self.rules = rules_from_options(ctx.options)

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        result = normalize_request(flow.request, self.rules, self.unread_items)
        if result is None:
            return
        notes = {"api": result.api, "client_body": result.client_body, "changes": [str(change) for change in result.changes]}
        if result.changes:
            append_comment(flow, "normalized: " + "; ".join(notes["changes"]))
        flow.metadata[FLOW_NOTES] = notes
        strict = [change for change in result.changes if change.rule == router_compat.STRICT_ROUTER]
        if strict:
            logger.info(f"{router_compat.OPTION.name}: " + "; ".join(map(str, strict)))
        flow.metadata[NORMALIZED] = result
