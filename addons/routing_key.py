"""The addon that puts a lane's routing key into headers, for routers that keep a key on one replica.

With `lane_routing_header` set (smg and HAProxy read `x-smg-routing-key`,
vllm-router `x-session-id`), every normalized request gets that header (or
those) holding `lanes.routing_key` of the body as forwarded: so a lane's
requests meet the replica that holds its prefix. The client's own values of
those headers are kept in the flow's notes (`CLIENT_ROUTING_HEADERS`): the
diagnosis and the capture record read the request as the client sent it.
"""

from __future__ import annotations

import re

from mitmproxy import ctx, exceptions, http

from stable_prefix.addons.flow_notes import CLIENT_ROUTING_HEADERS
from stable_prefix.addons.lanes import ROUTING_KEY_SCOPES, routing_key
from stable_prefix.addons.normalizer import NORMALIZED

HEADER_OPTION = "lane_routing_header"
SCOPE_OPTION = "routing_key_scope"
# An HTTP header name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def routing_headers_from_option(value: str) -> tuple[str, ...]:
    """The header names of `lane_routing_header` (comma-separated); raises OptionsError naming a bad one."""
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    for name in names:
        if not _HEADER_NAME.fullmatch(name):
            raise exceptions.OptionsError(f"{HEADER_OPTION}={value!r}: {name!r} is not an HTTP header name")
    return names


class RoutingKey:
    """The addon: after the normalizer, each normalized request's routing key in the headers the option names."""

    def __init__(self) -> None:
        self.routing_headers: tuple[str, ...] = ()

    def load(self, loader) -> None:
        loader.add_option(
            HEADER_OPTION, str, "",
            "Add this header (or these, comma-separated) to forwarded requests, holding a stable key of the request's lane "
            "(32 hex digits: a hash of its system text, tools and leading context), for routers that keep a key on one "
            "replica; e.g. x-smg-routing-key (smg, HAProxy) or x-session-id (vllm-router). Empty: off.",
        )
        loader.add_option(
            SCOPE_OPTION, str, "head",
            "What the routing key names: head (system, tools and leading context: all lanes of a user, project and day "
            "that share a head, a fan-out's instances together) or lane (each subagent instance a key of its own).",
        )

    def configure(self, updated) -> None:
        self.routing_headers = routing_headers_from_option(getattr(ctx.options, HEADER_OPTION))
        scope = getattr(ctx.options, SCOPE_OPTION)
        if scope not in ROUTING_KEY_SCOPES:
            raise exceptions.OptionsError(f"{SCOPE_OPTION}={scope!r}: not one of {', '.join(ROUTING_KEY_SCOPES)}")

    def request(self, flow: http.HTTPFlow) -> None:
        result = flow.metadata.get(NORMALIZED)
        if result is None or not self.routing_headers:
            return
        key = routing_key(result.body, result.api, flow.request.headers, getattr(ctx.options, SCOPE_OPTION))
        # The diagnosis reads the client's own headers (opencode names its sessions in x-session-id).
        flow.metadata[CLIENT_ROUTING_HEADERS] = {name: flow.request.headers.get(name) for name in self.routing_headers}
        for name in self.routing_headers:
            flow.request.headers[name] = key
