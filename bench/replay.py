"""Send a session's requests to a server, in order, streamed, and measure each one.

For every request: time to first token (the first `content_block_delta` event;
`message_start` does not count, vllm-mlx sends it before prefill starts), total
time, and how many prompt tokens the server reused. The reuse comes from the
first source that has it:

1. `usage.cache_read_input_tokens` in the streamed events (the patched engine);
   the prompt size is then `input_tokens + cache_read_input_tokens`;
2. the change of `tokens_reused` / `tokens_prefilled` in `GET /v1/cache/stats`;
3. the server's own log line (vllm-mlx 0.6.0 as shipped reports nothing in
   usage or stats, but logs `System KV cache HIT ... reusing N tokens,
   prefilling M new` or `MISS ... will prefill S system + T suffix tokens`;
   a request that logs neither reused nothing).

The replay sends the generator's bytes with two changes a user's setup makes
anyway: `max_tokens` is lowered (decode time is not what this measures) and,
when the client talks to the server directly, `model` is the served name
(behind the addon, the addon maps it).
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from stable_prefix.bench.openai_form import openai_body
from stable_prefix.bench.session import Request

MESSAGES_PATH = "/v1/messages?beta=true"  # what Claude Code requests
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"  # the OpenAI path (mlx_lm.server)
CLIENT_HEADERS = {
    "content-type": "application/json",
    "anthropic-version": "2023-06-01",
    "x-api-key": "not-used-by-a-local-server",
    "user-agent": "claude-cli/2.1.197 (external, cli)",
}

_SHIPPED_HIT = re.compile(r"System KV cache HIT \(stream_chat\): reusing (\d+) tokens, prefilling (\d+) new")
_SHIPPED_MISS = re.compile(r"System KV cache MISS \(stream_chat\): will prefill (\d+) system \+ (\d+) suffix tokens")


@dataclass
class Reply:
    status: int
    ttft_s: float | None
    total_s: float
    usage: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Measured:
    """One replayed request: the reply, and where its reuse figures came from."""

    request: Request
    reply: Reply
    prompt_tokens: int | None
    reused_tokens: int | None
    reuse_source: str | None
    diagnosis: str | None = None


class LogFollower:
    """Reads the lines a process appended to its log since the last call."""

    def __init__(self, path: Path | None):
        self.path = path
        self.offset = path.stat().st_size if path and path.exists() else 0

    def new_lines(self) -> list[str]:
        if self.path is None or not self.path.exists():
            return []
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        complete = data.rfind(b"\n") + 1  # leave a half-written line for the next call
        self.offset += complete
        return data[:complete].decode(errors="replace").splitlines()


def post_streamed(base_url: str, path: str, body: bytes, timeout: float = 1800.0, headers: dict[str, str] | None = None) -> Reply:
    """POST `body` and read the SSE answer, timing the first text delta and the end."""
    url = urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    started = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    try:
        connection.request("POST", path, body=body, headers={**CLIENT_HEADERS, **(headers or {})})
        response = connection.getresponse()
        if response.status != 200:
            detail = response.read().decode(errors="replace")[:500]
            return Reply(response.status, None, time.perf_counter() - started, error=f"HTTP {response.status}: {detail}")
        error = None
        while line := response.readline():
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            event = json.loads(line[5:])
            if ttft is None and _first_output(event):
                ttft = time.perf_counter() - started
            if event.get("type") == "error" or "error" in event:
                error = json.dumps(event.get("error"))[:500]
            event_usage = event.get("usage") or (event.get("message") or {}).get("usage")
            if isinstance(event_usage, dict):
                usage.update({key: value for key, value in event_usage.items() if value is not None})
        total = time.perf_counter() - started
        # A random-weight model may emit only tokens the server filters out: then the
        # first token is known only when the answer ends, a bound from above.
        return Reply(200, ttft if ttft is not None else total, total, usage, error)
    finally:
        connection.close()


def _first_output(event: dict) -> bool:
    """An Anthropic content delta, or an OpenAI chunk that carries generated text or a tool call."""
    if event.get("type") == "content_block_delta":
        return True
    return any((choice.get("delta") or {}).get("content") or (choice.get("delta") or {}).get("tool_calls") for choice in event.get("choices") or [])


def cache_stats(base_url: str) -> dict[str, Any] | None:
    """The patched engine's counters, or None where the server has no such endpoint shape."""
    try:
        with urllib.request.urlopen(f"{base_url}/v1/cache/stats", timeout=30) as response:
            stats = json.load(response)
    except (OSError, urllib.error.URLError, json.JSONDecodeError):
        return None
    return stats if isinstance(stats, dict) and "tokens_reused" in stats else None


def reuse_from_usage(usage: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt tokens, reused tokens) from Anthropic or OpenAI usage, when the server reported reuse."""
    reused = usage.get("cache_read_input_tokens")
    if isinstance(reused, int):
        return usage.get("input_tokens", 0) + reused, reused
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if isinstance(cached, int) and isinstance(usage.get("prompt_tokens"), int):
        return usage["prompt_tokens"], cached
    return None


def reuse_from_stats(before: dict | None, after: dict | None) -> tuple[int, int] | None:
    if before is None or after is None:
        return None
    reused = after["tokens_reused"] - before["tokens_reused"]
    prefilled = after.get("tokens_prefilled", 0) - before.get("tokens_prefilled", 0)
    return reused + prefilled, reused


def reuse_from_shipped_log(lines: Iterable[str]) -> tuple[int, int] | None:
    for line in lines:
        if hit := _SHIPPED_HIT.search(line):
            reused, prefilled = int(hit[1]), int(hit[2])
            return reused + prefilled, reused
        if miss := _SHIPPED_MISS.search(line):
            return int(miss[1]) + int(miss[2]), 0
    return None


def reuse_figures(
    reply: Reply, stats_before: dict | None, stats_after: dict | None, server_log_lines: list[str]
) -> tuple[tuple[int | None, int] | None, str | None]:
    """((prompt tokens or None, reused tokens), source) from the first source that has them."""
    for source, figures in (
        ("usage", reuse_from_usage(reply.usage)),
        ("stats", reuse_from_stats(stats_before, stats_after)),
        ("server-log", reuse_from_shipped_log(server_log_lines)),
    ):
        if figures is not None:
            return figures, source
    if reply.status == 200:
        # vllm-mlx as shipped logs no cache line when it bypasses its cache: nothing reused.
        return (None, 0), "server-log"
    return None, None


def for_client(request: Request, *, max_tokens: int, model: str | None, protocol: str = "anthropic") -> bytes:
    """The request bytes as this replay sends them (see module docstring)."""
    if protocol == "openai":
        return json.dumps(openai_body(request.body, max_tokens=max_tokens), ensure_ascii=False).encode()
    body = dict(request.body, max_tokens=max_tokens)
    if model is not None:
        body["model"] = model
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def replay(
    requests: list[Request],
    base_url: str,
    *,
    server_url: str | None = None,
    server_log: Path | None = None,
    proxy_log: Path | None = None,
    max_tokens: int = 8,
    model: str | None = None,
    protocol: str = "anthropic",
    on_result: Callable[[Measured], None] | None = None,
) -> list[Measured]:
    """Replay `requests` against `base_url` (a server, or the proxy in front of it).

    `server_url` and `server_log` are the engine's own address and log, for the
    stats and log fallbacks; `proxy_log` is mitmdump's output, whose diagnosis
    line for each request is kept. `protocol="openai"` sends each request in
    chat-completions form (`bench.openai_form`) to `/v1/chat/completions`.
    """
    path = CHAT_COMPLETIONS_PATH if protocol == "openai" else MESSAGES_PATH
    server_url = server_url or base_url
    server_lines, proxy_lines = LogFollower(server_log), LogFollower(proxy_log)
    results = []
    for request in requests:
        before = cache_stats(server_url)
        reply = post_streamed(base_url, path, for_client(request, max_tokens=max_tokens, model=model, protocol=protocol), headers=request.headers)
        after = cache_stats(server_url)
        figures, source = reuse_figures(reply, before, after, server_lines.new_lines())
        measured = Measured(
            request=request,
            reply=reply,
            prompt_tokens=figures[0] if figures else None,
            reused_tokens=figures[1] if figures else None,
            reuse_source=source,
            diagnosis=_diagnosis_line(proxy_lines.new_lines()),
        )
        results.append(measured)
        if on_result:
            on_result(measured)
    return results


def _diagnosis_line(lines: list[str]) -> str | None:
    """The addon's one-line diagnosis (`[time] lane main · prefix ...`) among mitmdump's output."""
    for line in lines:
        if "] lane " in line:
            return line[line.index("] lane ") + 2 :].strip()
    return None


def warm_up(server_url: str, model: str, protocol: str = "anthropic") -> None:
    """One small request, then an emptied cache: the first request after start-up pays
    one-off costs (kernel set-up, allocations) that are not what a cold turn costs."""
    body = {"model": model, "messages": [{"role": "user", "content": "warm-up"}], "max_tokens": 2, "stream": True}
    if protocol == "openai":
        del body["model"]  # mlx_lm.server serves its --model as the default
    reply = post_streamed(server_url, CHAT_COMPLETIONS_PATH if protocol == "openai" else MESSAGES_PATH, json.dumps(body).encode())
    if reply.status != 200:
        raise RuntimeError(f"warm-up request to {server_url} failed: {reply.error}")
    clear_cache(server_url)


def clear_cache(server_url: str) -> bool:
    """`DELETE /v1/cache` (vllm-mlx); False where the server has no such endpoint (mlx_lm.server)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{server_url}/v1/cache", method="DELETE"), timeout=30):
            return True
    except urllib.error.HTTPError:
        return False
