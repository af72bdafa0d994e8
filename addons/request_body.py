"""Which flows the addons may touch, and their JSON bodies in and out.

The rule for everything that is not clearly ours: forward it byte for byte.
`read_json_body` says why a request is left alone; only a body that was
actually changed is written back (`write_json_body`), re-encoded with the
request's own content-encoding and with a correct content-length.

What "readable" means (`parse_json`): strict UTF-8, strict JSON (no NaN or
Infinity, no number that overflows to one, no key twice in one object: a
re-encoded body would silently keep only the last), nested at most
`MAX_NESTING` deep (every later step walks the body; Python's recursion limit
must never be what stops a request). Anything else passes untouched.

Body I/O only: a small addon that reads a body imports this and nothing of
the rules or the diagnosis (the rules over a whole request are `normalizer.py`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from mitmproxy import http

from stable_prefix.addons.request_shape import Api, api_for

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
