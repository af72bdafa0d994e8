"""Send a session's requests to a server, in order, streamed, and measure each one.

For every request: time to first token (the first event that carries generated
output, `addons.sse_events.carries_output`: `message_start` does not count,
vllm-mlx sends it before prefill starts), total time, and how many prompt tokens the server reused. The reuse
comes from the first source that has it:

1. `usage.cache_read_input_tokens` in the streamed events (the patched engine),
   or OpenAI's `usage.prompt_tokens_details.cached_tokens` (mlx_lm.server);
2. the change of `tokens_reused` / `tokens_prefilled` in `GET /v1/cache/stats`;
3. the server's own log lines: vllm-mlx 0.6.0's SimpleEngine logs `System KV
   cache HIT ... reusing N tokens, prefilling M new` or `MISS ... will prefill
   S system + T suffix tokens`; its `--continuous-batching` scheduler logs
   `[schedule] ... prompt_tokens=N tokens_to_prefill=M` once it has decided
   what to prefill (its `[cache_fetch] ... HIT` line comes earlier and still
   counts an exact hit that the scheduler then prefills in full).

A request none of them covers has unknown reuse (None), never zero.

Requests that share a `fan_out` id are one group of concurrently running
subagent instances: each instance (same `x-claude-code-agent-id` header) sends
its requests in order, the instances at the same time. Their reuse comes from
usage, or from log lines matched to the request by its prompt size (when the
caller knows it); stats deltas cannot be told apart under concurrency.

The replay sends the generator's bytes with two changes a user's setup makes
anyway: `max_tokens` is lowered (decode time is not what this measures) and,
when the client talks to the server directly, `model` is the served name
(behind the addon, the addon maps it).
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from stable_prefix.addons.lanes import AGENT_ID_HEADER
from stable_prefix.addons.sse_events import EventStream
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
_BATCHED_SCHEDULE = re.compile(r"\[schedule\] request=\S+ uid=\S+ prompt_tokens=(\d+) tokens_to_prefill=(\d+)")


@dataclass
class Reply:
    status: int
    ttft_s: float | None
    total_s: float
    usage: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    # No event with generated output reached the client (a random-weight model may
    # emit only tokens the server filters out): ttft_s is then the total time, an
    # upper bound, and says so here.
    ttft_is_total: bool = False


@dataclass
class Measured:
    """One replayed request: the reply, and where its reuse figures came from."""

    request: Request
    reply: Reply
    prompt_tokens: int | None
    reused_tokens: int | None
    reuse_source: str | None
    diagnosis: str | None = None
    started_s: float = 0.0  # when it was sent, seconds after the replay started


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
    """POST `body` and read the SSE answer, timing the first output event (`sse_events.carries_output`) and the end."""
    url = urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    started = time.perf_counter()
    try:
        connection.request("POST", path, body=body, headers={**CLIENT_HEADERS, **(headers or {})})
        response = connection.getresponse()
        if response.status != 200:
            detail = response.read().decode(errors="replace")[:500]
            return Reply(response.status, None, time.perf_counter() - started, error=f"HTTP {response.status}: {detail}")
        events = EventStream(clock=time.perf_counter)
        while chunk := response.read1(65536):
            events.feed(chunk)
        total = time.perf_counter() - started
        ttft = None if events.first_output_at is None else events.first_output_at - started
        error = None if events.error is None else json.dumps(events.error)[:500]
        return Reply(200, ttft if ttft is not None else total, total, events.usage, error, ttft_is_total=ttft is None)
    finally:
        connection.close()


def cache_stats(base_url: str) -> dict[str, Any] | None:
    """The patched engine's counters, or None where the server has no such endpoint shape."""
    try:
        with urllib.request.urlopen(f"{base_url}/v1/cache/stats", timeout=30) as response:
            stats = json.load(response)
    except (OSError, urllib.error.URLError, json.JSONDecodeError):
        return None
    return stats if isinstance(stats, dict) and "tokens_reused" in stats else None


def reuse_from_usage(usage: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt tokens, reused tokens) from Anthropic, OpenAI or Responses API usage, when the server reported reuse."""
    reused = usage.get("cache_read_input_tokens")
    if isinstance(reused, int):
        return usage.get("input_tokens", 0) + reused, reused
    for total, details in (("prompt_tokens", "prompt_tokens_details"), ("input_tokens", "input_tokens_details")):
        cached = (usage.get(details) or {}).get("cached_tokens")
        if isinstance(cached, int) and isinstance(usage.get(total), int):
            return usage[total], cached
    return None


def reuse_from_stats(before: dict | None, after: dict | None) -> tuple[int, int] | None:
    if before is None or after is None:
        return None
    reused = after["tokens_reused"] - before["tokens_reused"]
    prefilled = after.get("tokens_prefilled", 0) - before.get("tokens_prefilled", 0)
    return reused + prefilled, reused


def reuse_in_log(lines: Iterable[str]) -> list[tuple[int, int]]:
    """(prompt tokens, reused tokens) of every request vllm-mlx 0.6.0 logged, in log order."""
    found = []
    for line in lines:
        if hit := _SHIPPED_HIT.search(line):
            found.append((int(hit[1]) + int(hit[2]), int(hit[1])))
        elif miss := _SHIPPED_MISS.search(line):
            found.append((int(miss[1]) + int(miss[2]), 0))
        elif scheduled := _BATCHED_SCHEDULE.search(line):
            prompt, prefilled = int(scheduled[1]), int(scheduled[2])
            found.append((prompt, prompt - prefilled))
    return found


def reuse_from_log(lines: Iterable[str]) -> tuple[int, int] | None:
    """The one request a sequential replay's new log lines are about."""
    found = reuse_in_log(lines)
    return found[0] if found else None


def reuse_matching_prompt(entries: list[tuple[int, int]], prompt_tokens: int | None) -> tuple[int, int] | None:
    """Among log entries of concurrent requests, the one of a `prompt_tokens`-token
    prompt; None (unknown) when no entry, or entries that disagree, have that size."""
    matching = {entry for entry in entries if entry[0] == prompt_tokens}
    return matching.pop() if len(matching) == 1 else None


def reuse_figures(
    reply: Reply, stats_before: dict | None, stats_after: dict | None, from_log: tuple[int, int] | None
) -> tuple[tuple[int, int] | None, str | None]:
    """((prompt tokens, reused tokens), source) from the first source that has them;
    (None, None) when none does: unknown, not zero."""
    if reply.status != 200:
        return None, None
    for source, figures in (
        ("usage", reuse_from_usage(reply.usage)),
        ("stats", reuse_from_stats(stats_before, stats_after)),
        ("server-log", from_log),
    ):
        if figures is not None:
            return figures, source
    return None, None


def for_client(request: Request, *, max_tokens: int, model: str | None, protocol: str = "anthropic") -> bytes:
    """The request bytes as this replay sends them (see module docstring)."""
    if protocol == "openai":
        return json.dumps(openai_body(request.body, max_tokens=max_tokens), ensure_ascii=False).encode()
    body = dict(request.body, max_tokens=max_tokens)
    if model is not None:
        body["model"] = model
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


class Replayer:
    """Replays a session against one stack, a step at a time (`steps`), so several
    stacks can take turns on the same machine.

    `base_url` is where requests go (a server, or the proxy in front of it);
    `server_url` and `server_log` are the engine's own address and log, for the
    stats and log fallbacks; `proxy_log` is mitmdump's output, whose diagnosis
    line for each request is kept. `protocol="openai"` sends each request in
    chat-completions form (`bench.openai_form`) to `/v1/chat/completions`.
    `prompt_tokens_of(request)`, the prompt size the engine will see, lets the
    log lines of a fan-out group's concurrent requests be told apart.
    """

    def __init__(
        self,
        base_url: str,
        *,
        server_url: str | None = None,
        server_log: Path | None = None,
        proxy_log: Path | None = None,
        max_tokens: int = 8,
        model: str | None = None,
        protocol: str = "anthropic",
        prompt_tokens_of: Callable[[Request], int | None] | None = None,
    ):
        self.sender = _Sender(base_url, CHAT_COMPLETIONS_PATH if protocol == "openai" else MESSAGES_PATH, max_tokens, model, protocol)
        self.server_url = server_url or base_url
        self.server_lines, self.proxy_lines = LogFollower(server_log), LogFollower(proxy_log)
        self.prompt_tokens_of = prompt_tokens_of

    def step(self, step: list[Request]) -> list[Measured]:
        """Send one step: a single request, or a fan-out group concurrently."""
        if len(step) == 1 and step[0].fan_out is None:
            before = cache_stats(self.server_url)
            started_s, reply = self.sender.send(step[0])
            after = cache_stats(self.server_url)
            figures, source = reuse_figures(reply, before, after, reuse_from_log(self.server_lines.new_lines()))
            return [_measured(step[0], reply, figures, source, started_s, _diagnosis_line(self.proxy_lines.new_lines()))]
        measured = _replay_concurrently(step, self.sender, self.server_lines, self.prompt_tokens_of)
        self.proxy_lines.new_lines()  # the addon's lines of concurrent requests cannot be told apart
        return measured


def replay(requests: list[Request], base_url: str, *, on_result: Callable[[Measured], None] | None = None, **options) -> list[Measured]:
    """Replay `requests` against `base_url`, step by step (`Replayer` for the options)."""
    replayer = Replayer(base_url, **options)
    results: list[Measured] = []
    for step in steps(requests):
        for result in replayer.step(step):
            results.append(result)
            if on_result:
                on_result(result)
    return results


def steps(requests: list[Request]) -> list[list[Request]]:
    """The session in sending order: single requests, and each fan-out group as one step."""
    grouped: list[list[Request]] = []
    for request in requests:
        if request.fan_out is not None and grouped and grouped[-1][0].fan_out == request.fan_out:
            grouped[-1].append(request)
        else:
            grouped.append([request])
    return grouped


def instances(group: list[Request]) -> list[list[Request]]:
    """A fan-out group's subagent instances (by `x-claude-code-agent-id`), each in its own order."""
    by_agent: dict[str, list[Request]] = {}
    for request in group:
        by_agent.setdefault(request.headers.get(AGENT_ID_HEADER, f"request-{request.index}"), []).append(request)
    return list(by_agent.values())


class _Sender:
    def __init__(self, base_url: str, path: str, max_tokens: int, model: str | None, protocol: str):
        self.base_url, self.path, self.max_tokens, self.model, self.protocol = base_url, path, max_tokens, model, protocol
        self.started = time.perf_counter()

    def send(self, request: Request) -> tuple[float, Reply]:
        body = for_client(request, max_tokens=self.max_tokens, model=self.model, protocol=self.protocol)
        started_s = time.perf_counter() - self.started
        return started_s, post_streamed(self.base_url, self.path, body, headers=request.headers)


def _replay_concurrently(
    group: list[Request], sender: _Sender, server_lines: LogFollower, prompt_tokens_of: Callable[[Request], int | None] | None
) -> list[Measured]:
    sent: dict[int, tuple[float, Reply]] = {}

    def run_instance(requests: list[Request]) -> None:
        for request in requests:
            sent[request.index] = sender.send(request)

    threads = [threading.Thread(target=run_instance, args=(instance,), name=f"fan-out-{n}") for n, instance in enumerate(instances(group))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    logged = reuse_in_log(server_lines.new_lines())
    measured = []
    for request in group:
        started_s, reply = sent[request.index]
        from_log = reuse_matching_prompt(logged, prompt_tokens_of(request)) if prompt_tokens_of else None
        figures, source = reuse_figures(reply, None, None, from_log)
        measured.append(_measured(request, reply, figures, source, started_s, None))
    return measured


def _measured(request: Request, reply: Reply, figures: tuple[int, int] | None, source: str | None, started_s: float, diagnosis: str | None) -> Measured:
    return Measured(
        request=request,
        reply=reply,
        prompt_tokens=figures[0] if figures else None,
        reused_tokens=figures[1] if figures else None,
        reuse_source=source,
        diagnosis=diagnosis,
        started_s=started_s,
    )


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
