"""Report reused prompt tokens in responses, the way each protocol's clients read them.

Anthropic: `usage.cache_read_input_tokens` is the part of the prompt read from
cache and `usage.input_tokens` the rest (Claude Code adds the two for its
context meter). OpenAI: `usage.prompt_tokens_details.cached_tokens`, with
`prompt_tokens` staying the whole prompt. Responses API:
`usage.input_tokens_details.cached_tokens`, with `input_tokens` staying the
whole prompt (vllm-mlx 0.6.0 always says 0 there); in a stream the usage is in
the final event's response object (`response.completed`).

The numbers are filled in by an ASGI middleware around vllm-mlx's app, so every
route and response shape of any vllm-mlx version gets them without patching
each place that builds a usage object.
"""

from __future__ import annotations

import json
from typing import Any

from stable_prefix.engine_patch.cache.request_reuse import RequestReuse, begin_request, end_request

ANTHROPIC_PATHS = frozenset({"/v1/messages"})
OPENAI_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
RESPONSES_PATHS = frozenset({"/v1/responses"})


def add_anthropic_reuse(usage: dict[str, Any], reuse: RequestReuse) -> None:
    if isinstance(usage.get("input_tokens"), int) and usage["input_tokens"] > 0:
        usage["input_tokens"] = max(0, usage["input_tokens"] - reuse.reused)
    elif "input_tokens" not in usage and reuse.prompt_tokens is not None:
        # vllm-mlx's final stream event has no input count; Anthropic's has.
        usage["input_tokens"] = reuse.prompt_tokens - reuse.reused
    usage["cache_read_input_tokens"] = reuse.reused


def add_openai_reuse(usage: dict[str, Any], reuse: RequestReuse) -> None:
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        details = usage["prompt_tokens_details"] = {}
    details["cached_tokens"] = reuse.reused


def add_responses_reuse(usage: dict[str, Any], reuse: RequestReuse) -> None:
    details = usage.get("input_tokens_details")
    if not isinstance(details, dict):
        details = usage["input_tokens_details"] = {}
    details["cached_tokens"] = reuse.reused


def add_reuse_to_payload(payload: Any, path: str, reuse: RequestReuse) -> bool:
    """Add the reuse to every usage object in one response or stream event."""
    if not isinstance(payload, dict):
        return False
    usages = []
    if isinstance(payload.get("usage"), dict):
        usages.append(payload["usage"])
    for holder in ("message", "response"):  # Anthropic's message_start event; a Responses stream's final event
        nested = payload.get(holder)
        if isinstance(nested, dict) and isinstance(nested.get("usage"), dict):
            usages.append(nested["usage"])
    add = add_anthropic_reuse if path in ANTHROPIC_PATHS else add_responses_reuse if path in RESPONSES_PATHS else add_openai_reuse
    for usage in usages:
        add(usage, reuse)
    return bool(usages)


class SseUsageRewriter:
    """Rewrites the usage in complete SSE events; never holds a complete event back."""

    def __init__(self, path: str, reuse: RequestReuse):
        self.path = path
        self.reuse = reuse
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        self.pending += chunk
        cut = max(self.pending.rfind(b"\n\n"), self.pending.rfind(b"\r\n\r\n"))
        if cut < 0:
            return b""
        end = cut + (4 if self.pending[cut : cut + 4] == b"\r\n\r\n" else 2)
        complete, self.pending = self.pending[:end], self.pending[end:]
        return self._rewrite(complete)

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return self._rewrite(rest)

    def _rewrite(self, events: bytes) -> bytes:
        if self.reuse.reused is None or b'"usage"' not in events:
            return events
        lines = events.split(b"\n")
        for index, line in enumerate(lines):
            if not line.startswith(b"data:") or b'"usage"' not in line:
                continue
            body = line[5:].strip()
            try:
                payload = json.loads(body)
            except ValueError:
                continue
            if add_reuse_to_payload(payload, self.path, self.reuse):
                lines[index] = b"data: " + json.dumps(payload, separators=(",", ":")).encode()
        return b"\n".join(lines)


class GenerationMiddleware:
    """ASGI middleware that acts on POSTs to the generation endpoints in `paths` (`handle`) and passes the rest."""

    paths: frozenset[str] = ANTHROPIC_PATHS | OPENAI_PATHS | RESPONSES_PATHS

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and scope.get("method") == "POST" and path in self.paths:
            await self.handle(scope, receive, send, path)
        else:
            await self.app(scope, receive, send)

    async def handle(self, scope, receive, send, path: str) -> None:
        raise NotImplementedError


class ReuseUsageMiddleware(GenerationMiddleware):
    """One `RequestReuse` per generation request, reported in its usage."""

    async def handle(self, scope, receive, send, path: str) -> None:
        reuse, token = begin_request()
        response = _UsageRewritingSend(send, path, reuse)
        try:
            await self.app(scope, receive, response.send)
        finally:
            end_request(token)


class _UsageRewritingSend:
    def __init__(self, send, path: str, reuse: RequestReuse):
        self._send = send
        self.path = path
        self.reuse = reuse
        self.mode = "passthrough"
        self.held_start: dict | None = None
        self.json_body = b""
        self.sse: SseUsageRewriter | None = None

    async def send(self, message):
        if message["type"] == "http.response.start":
            content_type = _header(message, b"content-type")
            if content_type.startswith(b"text/event-stream"):
                self.mode = "sse"
                self.sse = SseUsageRewriter(self.path, self.reuse)
            elif content_type.startswith(b"application/json"):
                self.mode = "json"
                self.held_start = message  # sent with the body, whose length changes
                return
            await self._send(message)
            return
        if message["type"] != "http.response.body" or self.mode == "passthrough":
            await self._send(message)
            return
        more_body = message.get("more_body", False)
        if self.mode == "sse":
            body = self.sse.feed(message.get("body", b""))
            if not more_body:
                body += self.sse.flush()
            await self._send({**message, "body": body})
            return
        self.json_body += message.get("body", b"")
        if more_body:
            return
        body = self._rewrite_json(self.json_body)
        headers = [(name, value) for name, value in self.held_start.get("headers", []) if name.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**self.held_start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    def _rewrite_json(self, body: bytes) -> bytes:
        if self.reuse.reused is None:
            return body
        try:
            payload = json.loads(body)
        except ValueError:
            return body
        if not add_reuse_to_payload(payload, self.path, self.reuse):
            return body
        return json.dumps(payload).encode()


def _header(message: dict, name: bytes) -> bytes:
    for key, value in message.get("headers", []):
        if key.lower() == name:
            return value.lower()
    return b""
