"""Which flows the addons may touch, their JSON bodies in and out, and the
rules applied to a whole request (`normalize_request`).

The rule for everything that is not clearly ours: forward it byte for byte.
`read_json_body` says why a request is left alone (and `normalize_request`
logs it, once per request); only a body that was actually changed is written
back (`write_json_body`), re-encoded with the request's own content-encoding
and with a correct content-length. A Responses body whose `input` is neither a
string nor a list is left alone too; items of a type no rule reads stay as they
are, and each such type is named once in the log (`UnreadItems`), not on every
request.

What "readable" means (`parse_json`): strict UTF-8, strict JSON (no NaN or
Infinity, no number that overflows to one, no key twice in one object: a
re-encoded body would silently keep only the last), nested at most
`MAX_NESTING` deep (every later step walks the body; Python's recursion limit
must never be what stops a request). Anything else passes untouched.

(This lives here, not in the script `strip_billing.py`: mitmproxy loads
scripts without registering them in sys.modules, where dataclasses look.)
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mitmproxy import http

from stable_prefix.addons import normalize, responses_input
from stable_prefix.addons.diagnosis import PromptSnapshot
from stable_prefix.addons.request_shape import Api, api_for
from stable_prefix.addons.rules.base import Change

logger = logging.getLogger(__name__)

# flow.metadata key under which strip_billing leaves its notes on a flow.
FLOW_NOTES = "stable_prefix"
# flow.metadata key: the client's values of the headers the routing key replaced (None: it sent none).
CLIENT_ROUTING_HEADERS = "stable_prefix_client_routing_headers"

# Anthropic's own API: stripping there can break billing or auth, so hands off.
ANTHROPIC_DOMAINS = ("anthropic.com", "claude.ai")
# Real request bodies nest about a dozen levels (a tool's JSON schema is the
# deepest part); the diagnosis, the capture record and the re-encoding all
# recurse over the body, well within Python's limit of 1,000 frames at this depth.
MAX_NESTING = 128


@dataclass(frozen=True)
class LeftAlone:
    """Why a request on one of our paths was forwarded untouched."""

    reason: str


class UnreadableJson(ValueError):
    """Bytes `parse_json` does not read as a JSON value; the message says why."""


def _no_constants(name: str) -> Any:
    raise UnreadableJson(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnreadableJson(f"number {text[:40]} is out of range")
    return value


def _object_without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict:
    result = dict(pairs)
    if len(result) < len(pairs):
        seen: set[str] = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise UnreadableJson(f"key {repeated[:80]!r} appears twice in one object")
    return result


def _nested_deeper_than(value: Any, limit: int) -> bool:
    level, depth = [value], 1
    while level:
        if depth > limit:
            return True
        deeper = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, (dict, list)):
                    deeper.append(child)
        level, depth = deeper, depth + 1
    return False


def parse_json(content: bytes) -> Any:
    """The JSON value of `content`, or UnreadableJson saying why it is not one we read."""
    try:
        text = content.decode("utf-8")
        value = json.loads(text, parse_constant=_no_constants, parse_float=_finite_float, object_pairs_hook=_object_without_repeated_keys)
    except UnicodeDecodeError as error:
        raise UnreadableJson(f"not UTF-8 ({error})") from None
    except RecursionError:
        raise UnreadableJson(f"nested deeper than {MAX_NESTING} levels") from None
    except UnreadableJson:
        raise
    except ValueError as error:  # json.JSONDecodeError, and an integer too long to convert
        raise UnreadableJson(str(error)) from None
    if isinstance(value, (dict, list)) and _nested_deeper_than(value, MAX_NESTING):
        raise UnreadableJson(f"nested deeper than {MAX_NESTING} levels")
    return value


def is_anthropic_host(request: http.Request) -> bool:
    hosts = {request.host.lower(), request.pretty_host.lower()}
    return any(host == domain or host.endswith("." + domain) for host in hosts for domain in ANTHROPIC_DOMAINS)


def api_of(request: http.Request) -> Api | None:
    """The API of a request we may normalize, or None (other paths, methods, Anthropic's host)."""
    if is_anthropic_host(request):
        return None
    return api_for(request.method, request.path)


def read_json_body(request: http.Request) -> dict | LeftAlone:
    try:
        content = request.get_content(strict=True)
    except ValueError as error:  # content-encoding we cannot decode
        return LeftAlone(f"body has content-encoding {request.headers.get('content-encoding')!r} that cannot be decoded ({error})")
    if not content:
        return LeftAlone("body is empty")
    content_type = request.headers.get("content-type", "")
    if content_type and "json" not in content_type.lower():
        return LeftAlone(f"content-type is {content_type!r}, not JSON, so the body was not read")
    try:
        body = parse_json(content)
    except UnreadableJson as error:
        return LeftAlone(f"body is not valid JSON ({error})")
    if not isinstance(body, dict):
        return LeftAlone(f"body is a JSON {type(body).__name__}, not an object")
    return body


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


def utf8_json(text: str) -> bytes:
    """JSON text as UTF-8. A lone surrogate (`"\\ud83d"`, half an emoji cut by
    a client) is valid JSON but has no UTF-8 form: it is written back as a
    `\\u` escape, never as invalid bytes. Surrogates occur only inside JSON
    strings, where that escape means the same character."""
    return text.encode("utf-8", "backslashreplace")


def encode_json(body: dict) -> bytes:
    # Compact, non-ASCII kept as is: the way Claude Code (JSON.stringify) sends it.
    return utf8_json(json.dumps(body, ensure_ascii=False, separators=(",", ":")))


def write_json_body(request: http.Request, body: dict) -> None:
    # `content` (not raw_content) re-applies the content-encoding and sets content-length.
    request.content = encode_json(body)


@dataclass(frozen=True)
class NormalizedRequest:
    api: Api
    client_body: bytes  # as the client sent it (content-encoding undone)
    body: dict  # as forwarded
    changes: list[Change]

    def client_snapshot(self, headers: Mapping[str, str] | None = None) -> PromptSnapshot:
        """The client's prompt, for the diagnosis (parsed again from the bytes
        it sent: the rules edited the parsed body in place); `headers` name
        the subagent instance and session."""
        return PromptSnapshot.of(json.loads(self.client_body), self.api, headers)


def normalize_request(request: http.Request, rules: normalize.Rules, unread: UnreadItems | None = None) -> NormalizedRequest | None:
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
    changes = normalize.normalize(body, api, rules)
    if changes:
        write_json_body(request, body)
        logger.debug(f"{request.path}: " + "; ".join(map(str, changes)))
    return NormalizedRequest(api, client_body, body, changes)


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
