"""Send a session's requests to a server, in order, streamed, and measure each one.

For every request: time to first token (the first event that carries generated
output, `addons.sse_events.carries_output`: `message_start` does not count,
vllm-mlx sends it before prefill starts), turn time (until the stream ends: the
whole reply, what a client waits for before it acts on it; the last token's
event comes with the end, and a server may hold back the last text it
decoded, Rapid-MLX does), the output tokens the server counted, and how many
prompt tokens it reused. The reuse comes from the
first source, in the engine's order of preference (`reuse_sources`), that has it:

- `usage`: `usage.cache_read_input_tokens` in the streamed events (the patched
  engine, Rapid-MLX), or OpenAI's `usage.prompt_tokens_details.cached_tokens`
  (mlx_lm.server);
- `stats`: the change of `tokens_reused` / `tokens_prefilled` in `GET /v1/cache/stats`;
- `server-log`: the server's own log lines: vllm-mlx 0.6.0's SimpleEngine logs
  `System KV cache HIT ... reusing N tokens, prefilling M new` or `MISS ... will
  prefill S system + T suffix tokens`; its `--continuous-batching` scheduler (and
  Rapid-MLX's, a fork of it) logs `[schedule] ... prompt_tokens=N
  tokens_to_prefill=M` once it has decided what to prefill (its `[cache_fetch]
  ... HIT` line comes earlier and still counts an exact hit that the scheduler
  then prefills in full).

A request none of them covers has unknown reuse (None), never zero.

Requests sent at the same time form one step: a `fan_out` group of concurrently
running subagent instances (each instance, same `x-claude-code-agent-id`
header, sends its requests in order, the instances at once), or a request and
the one it is sent `beside` (a title request, sent right after its
conversation's first main turn). Their reuse comes from usage, or from log
lines matched to the request by its prompt size (the caller's token-exact
rendering, else the server's own count in its usage); stats deltas cannot be told
apart under concurrency.

The replay sends the generator's bytes with the changes a user's setup makes
anyway or a fair comparison needs: `max_tokens` as the addon caps it
(`PROXY_MAX_TOKENS_CAP`, for every configuration alike; or each request's
session reply length, or a fixed number), `temperature` 0 (greedy: every engine
decodes the same reply, so turn times compare at equal output length) and,
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
from stable_prefix.addons.sse_events import EventStream, final_response, merge_usage
from stable_prefix.bench.clients.agent_clients import NOT_STREAMED, SILENT_CUT, AgentClient, loss_kind, resend_as
from stable_prefix.bench.workload.openai_form import openai_body
from stable_prefix.bench.workload.responses_form import responses_body
from stable_prefix.bench.workload.session import Request
from stable_prefix.usage import prompt_tokens_in_usage, reuse_from_usage

MESSAGES_PATH = "/v1/messages?beta=true"  # what Claude Code requests
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"  # the OpenAI path (mlx_lm.server)
RESPONSES_PATH = "/v1/responses"  # the Responses API (Codex CLI)
PATHS = {"anthropic": MESSAGES_PATH, "openai": CHAT_COMPLETIONS_PATH, "responses": RESPONSES_PATH}
CLIENT_HEADERS = {
    "content-type": "application/json",
    "anthropic-version": "2023-06-01",
    "x-api-key": "not-used-by-a-local-server",
    "user-agent": "claude-cli/2.1.197 (external, cli)",
}

_SHIPPED_HIT = re.compile(r"System KV cache HIT \(stream_chat\): reusing (\d+) tokens, prefilling (\d+) new")
_SHIPPED_MISS = re.compile(r"System KV cache MISS \(stream_chat\): will prefill (\d+) system \+ (\d+) suffix tokens")
_BATCHED_SCHEDULE = re.compile(r"\[schedule\] request=\S+ uid=\S+ prompt_tokens=(\d+) tokens_to_prefill=(\d+)")
# What the bench's addon lowers max_tokens to (its `max_tokens_cap`); the replay sends every
# configuration, direct ones too, the same: Claude Code asks for 32,000.
PROXY_MAX_TOKENS_CAP = 8192
GREEDY = 0.0  # temperature
# --max-tokens: "proxy" (the client's max_tokens as the addon caps it), "session" (each
# request's reply length in the session: for models whose replies never end), or a number.
MAX_TOKENS_POLICIES = ("proxy", "session")
REUSE_SOURCES = ("usage", "stats", "server-log")


@dataclass
class Reply:
    status: int
    ttft_s: float | None
    total_s: float  # the turn time: until the stream ended
    usage: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    # No event with generated output reached the client (a random-weight model may
    # emit only tokens the server filters out): ttft_s is then the total time, an
    # upper bound, and says so here.
    ttft_is_total: bool = False
    stop_reason: str | None = None  # Anthropic's stop_reason or OpenAI's finish_reason ("end_turn"/"stop", "max_tokens"/"length", ...)
    response_id: str | None = None  # the answer's id as the client read it
    # When the first answer was cut and the client sent the request again (`agent_clients`): how the cut
    # looked (`agent_clients.loss_kind`), and the seconds from the cut to the end of the answer sent again.
    cut: str | None = None
    recovery_s: float | None = None

    @property
    def output_tokens(self) -> int | None:
        """The output tokens the server counted (Anthropic `output_tokens`, OpenAI `completion_tokens`)."""
        for key in ("output_tokens", "completion_tokens"):
            if isinstance(self.usage.get(key), int):
                return self.usage[key]
        return None


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
    max_tokens: int | None = None  # what the replay asked for


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


def post_streamed(
    base_url: str, path: str, body: bytes, timeout: float = 1800.0, headers: dict[str, str] | None = None, on_sent: Callable[[], None] | None = None
) -> Reply:
    """POST `body` and read the SSE answer, timing the first output event (`sse_events.carries_output`)
    and the end; `on_sent` is called once the request is on its way."""
    url = urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    started = time.perf_counter()
    try:
        connection.request("POST", path, body=body, headers={**CLIENT_HEADERS, **(headers or {})})
        if on_sent:
            on_sent()
        response = connection.getresponse()
    except (OSError, http.client.HTTPException) as error:
        # A refused or dropped connection is this request's failure (a lost request), not the replay's end.
        connection.close()
        return Reply(0, None, time.perf_counter() - started, error=f"connection failed: {error!r}")
    try:
        if response.status != 200:
            detail = response.read().decode(errors="replace")[:500]
            return Reply(response.status, None, time.perf_counter() - started, error=f"HTTP {response.status}: {detail}")
        events = EventStream(clock=time.perf_counter)
        stop_reason = answer_id = None
        while chunk := response.read1(65536):
            for event in events.feed(chunk):
                stop_reason = _stop_reason(event.json()) or stop_reason
                answer_id = answer_id or response_id_of(event.json())
        total = time.perf_counter() - started
        ttft = None if events.first_output_at is None else events.first_output_at - started
        error = None if events.error is None else json.dumps(events.error)[:500]
        return Reply(200, ttft if ttft is not None else total, total, events.usage, error, ttft_is_total=ttft is None, stop_reason=stop_reason,
                     response_id=answer_id)
    except (OSError, http.client.HTTPException) as error:
        return Reply(200, None, time.perf_counter() - started, error=f"{SILENT_CUT}{error!r}")
    finally:
        connection.close()


def post_whole(base_url: str, path: str, body: bytes, timeout: float = 1800.0, headers: dict[str, str] | None = None) -> Reply:
    """POST `body` (a request not streamed) and read its JSON answer."""
    url = urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    started = time.perf_counter()
    try:
        connection.request("POST", path, body=body, headers={**CLIENT_HEADERS, **(headers or {})})
        response = connection.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as error:
        return Reply(0, None, time.perf_counter() - started, error=f"connection failed: {error!r}")
    finally:
        connection.close()
    total = time.perf_counter() - started
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if response.status != 200 or not isinstance(answer, dict):
        return Reply(response.status, None, total, error=f"HTTP {response.status}: {data[:500].decode(errors='replace')}")
    usage: dict = {}
    merge_usage(usage, answer)
    return Reply(200, total, total, usage, stop_reason=_stop_reason(answer) or _stop_reason({"type": "message_delta", "delta": answer}),
                 response_id=answer.get("id"))


def response_id_of(payload: Any) -> str | None:
    """The answer's id where an event carries it: an OpenAI chunk, Anthropic's message_start, a Responses response event."""
    if not isinstance(payload, dict):
        return None
    for holder in (payload, payload.get("message"), payload.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("id"), str):
            return holder["id"]
    return None


def _stop_reason(payload: Any) -> str | None:
    """Why the reply ended, where this event (or a whole answer) says: Anthropic's message_delta, an OpenAI
    chunk's (or completion's) finish_reason, a Responses stream's last event (its response's status)."""
    if not isinstance(payload, dict):
        return None
    if payload.get("type") == "message_delta":
        return (payload.get("delta") or {}).get("stop_reason")
    final = final_response(payload) or (payload if payload.get("object") == "response" else None)
    if final is not None:
        return final.get("status") if final.get("status") in ("completed", "incomplete") else None
    choices = payload.get("choices")
    if isinstance(choices, list):
        return next((choice["finish_reason"] for choice in choices if isinstance(choice, dict) and choice.get("finish_reason")), None)
    return None


def cache_stats(base_url: str) -> dict[str, Any] | None:
    """The patched engine's counters, or None where the server has no such endpoint shape."""
    try:
        with urllib.request.urlopen(f"{base_url}/v1/cache/stats", timeout=30) as response:
            stats = json.load(response)
    except (OSError, urllib.error.URLError, json.JSONDecodeError):
        return None
    return stats if isinstance(stats, dict) and "tokens_reused" in stats else None


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
    reply: Reply, stats_before: dict | None, stats_after: dict | None, from_log: tuple[int, int] | None, sources: tuple[str, ...] = REUSE_SOURCES
) -> tuple[tuple[int, int] | None, str | None]:
    """((prompt tokens, reused tokens), source) from the first of `sources` that has them;
    (None, None) when none does: unknown, not zero."""
    if reply.status != 200:
        return None, None
    found = {"usage": lambda: reuse_from_usage(reply.usage), "stats": lambda: reuse_from_stats(stats_before, stats_after), "server-log": lambda: from_log}
    for source in sources:
        if (figures := found[source]()) is not None:
            return figures, source
    return None, None


def max_tokens_policy(value: int | str) -> int | str:
    """`value` as a max_tokens policy: "proxy", "session" or a positive number (also given as text)."""
    if value in MAX_TOKENS_POLICIES:
        return value
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        if int(value) > 0:
            return int(value)
    raise ValueError(f"max_tokens {value!r}: choose {' or '.join(MAX_TOKENS_POLICIES)}, or a positive number of tokens")


def max_tokens_for(request: Request, policy: int | str) -> int:
    """The max_tokens the replay sends with `request` under `policy` (see MAX_TOKENS_POLICIES)."""
    if policy == "proxy":
        return min(request.body["max_tokens"], PROXY_MAX_TOKENS_CAP)
    if policy == "session":
        return max(1, request.reply_tokens)
    return policy


def for_client(request: Request, *, max_tokens: int, model: str | None, protocol: str = "anthropic") -> bytes:
    """The request bytes as this replay sends them (see module docstring)."""
    body = dict(request.body, max_tokens=max_tokens, temperature=GREEDY)
    if protocol in ("openai", "responses"):
        converted = openai_body(body, max_tokens=max_tokens) if protocol == "openai" else responses_body(body, max_tokens=max_tokens)
        if model is not None:  # else none: mlx_lm.server serves its own
            converted["model"] = model
        return json.dumps(converted, ensure_ascii=False).encode()
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
    chat-completions form (`bench.workload.openai_form`) to `/v1/chat/completions`.
    `max_tokens` is a policy of `max_tokens_for`. `reuse_sources` is the
    engine's order of preference among usage, stats and its log.
    `prompt_tokens_of(request)`, the prompt size the engine will see (None where
    it is not rendered: then the size its usage reports), lets the log lines of
    concurrent requests be told apart. `on_answered(request)` is called as each
    request's answer ends (within a step too: the team bench's failover counts them).
    """

    def __init__(
        self,
        base_url: str,
        *,
        server_url: str | None = None,
        server_log: Path | None = None,
        proxy_log: Path | None = None,
        max_tokens: int | str = "proxy",
        model: str | None = None,
        protocol: str = "anthropic",
        prompt_tokens_of: Callable[[Request], int | None] | None = None,
        reuse_sources: tuple[str, ...] = REUSE_SOURCES,
        on_answered: Callable[[Request], None] | None = None,
        client: AgentClient | None = None,
    ):
        self.sender = _Sender(base_url, PATHS[protocol], max_tokens, model, protocol, on_answered, client)
        self.server_url = server_url or base_url
        self.server_lines, self.proxy_lines = LogFollower(server_log), LogFollower(proxy_log)
        self.prompt_tokens_of = prompt_tokens_of
        self.reuse_sources = reuse_sources

    def step(self, step: list[Request]) -> list[Measured]:
        """Send one step: a single request, or requests sent at the same time (a fan-out group, a title beside its main turn)."""
        if len(step) == 1:
            # Stats are read only where they are a source: behind a router, this URL is not one engine's.
            reads_stats = "stats" in self.reuse_sources
            before = cache_stats(self.server_url) if reads_stats else None
            started_s, reply = self.sender.send(step[0])
            after = cache_stats(self.server_url) if reads_stats else None
            figures, source = reuse_figures(reply, before, after, reuse_from_log(self.server_lines.new_lines()), self.reuse_sources)
            return [self._measured(step[0], reply, figures, source, started_s, _diagnosis_line(self.proxy_lines.new_lines()))]
        measured = self._concurrently(step)
        self.proxy_lines.new_lines()  # the addon's lines of concurrent requests cannot be told apart
        return measured

    def _concurrently(self, step: list[Request]) -> list[Measured]:
        """Each instance (`instances`) in a thread of its own; a request sent `beside` another
        goes out once that one has been sent."""
        sent: dict[int, tuple[float, Reply]] = {}
        on_its_way = {request.index: threading.Event() for request in step}

        def run_instance(requests: list[Request]) -> None:
            for request in requests:
                if request.beside in on_its_way:
                    on_its_way[request.beside].wait()
                try:
                    sent[request.index] = self.sender.send(request, on_sent=on_its_way[request.index].set)
                finally:
                    on_its_way[request.index].set()  # also when it could not be sent

        threads = [threading.Thread(target=run_instance, args=(instance,), name=f"concurrent-{n}") for n, instance in enumerate(instances(step))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        logged = reuse_in_log(self.server_lines.new_lines())
        measured = []
        for request in step:
            started_s, reply = sent[request.index]
            size = (self.prompt_tokens_of(request) if self.prompt_tokens_of else None) or prompt_tokens_in_usage(reply.usage)
            figures, source = reuse_figures(reply, None, None, reuse_matching_prompt(logged, size), self.reuse_sources)
            measured.append(self._measured(request, reply, figures, source, started_s, None))
        return measured

    def _measured(
        self, request: Request, reply: Reply, figures: tuple[int, int] | None, source: str | None, started_s: float, diagnosis: str | None
    ) -> Measured:
        return Measured(
            request=request,
            reply=reply,
            prompt_tokens=figures[0] if figures else None,
            reused_tokens=figures[1] if figures else None,
            reuse_source=source,
            diagnosis=diagnosis,
            started_s=started_s,
            max_tokens=max_tokens_for(request, self.sender.max_tokens),
        )


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
    """The session in sending order: single requests; each fan-out group, and each request
    with the one sent beside it, as one step."""
    grouped: list[list[Request]] = []
    for request in requests:
        joins_fan_out = request.fan_out is not None and grouped and grouped[-1][0].fan_out == request.fan_out
        joins_beside = request.beside is not None and grouped and any(earlier.index == request.beside for earlier in grouped[-1])
        if joins_fan_out or joins_beside:
            grouped[-1].append(request)
        else:
            grouped.append([request])
    return grouped


def instances(group: list[Request]) -> list[list[Request]]:
    """The senders of a step's requests: a subagent instance (by `x-claude-code-agent-id`) sends its
    requests in order; any other request is a sender of its own."""
    by_agent: dict[str, list[Request]] = {}
    for request in group:
        by_agent.setdefault(request.headers.get(AGENT_ID_HEADER, f"request-{request.index}"), []).append(request)
    return list(by_agent.values())


class _Sender:
    def __init__(self, base_url: str, path: str, max_tokens: int | str, model: str | None, protocol: str,
                 on_answered: Callable[[Request], None] | None = None, client: AgentClient | None = None):
        self.base_url, self.path, self.model, self.protocol, self.on_answered = base_url, path, model, protocol, on_answered
        self.client = client
        self.max_tokens = max_tokens_policy(max_tokens)  # a bad policy fails here, not mid-replay
        self.started = time.perf_counter()

    def send(self, request: Request, on_sent: Callable[[], None] | None = None) -> tuple[float, Reply]:
        body = for_client(request, max_tokens=max_tokens_for(request, self.max_tokens), model=self.model, protocol=self.protocol)
        started_s = time.perf_counter() - self.started
        reply = post_streamed(self.base_url, self.path, body, headers=request.headers, on_sent=on_sent)
        resend = resend_as(self.client, reply) if self.client else None
        if resend is not None:
            reply = self._sent_again(request, body, reply, streamed=resend != NOT_STREAMED)
        if self.on_answered:
            self.on_answered(request)
        return started_s, reply

    def _sent_again(self, request: Request, body: bytes, cut: Reply, *, streamed: bool) -> Reply:
        """What an agent that sends a cut request again does (at once: its own back-off is not modelled): the
        whole answer it then reads, timed from the first request's start, and how long after the cut it had it."""
        cut_at = time.perf_counter()
        if streamed:
            again = post_streamed(self.base_url, self.path, body, headers=request.headers)
        else:
            again = post_whole(self.base_url, self.path, json.dumps({**json.loads(body), "stream": False}).encode(), headers=request.headers)
        again.cut, again.recovery_s = loss_kind(cut), time.perf_counter() - cut_at
        again.total_s += cut.total_s
        again.ttft_s = None if again.ttft_s is None else again.ttft_s + cut.total_s
        return again


def _diagnosis_line(lines: list[str]) -> str | None:
    """The addon's one-line diagnosis (`[time] lane main · prefix ...`) among mitmdump's output."""
    for line in lines:
        if "] lane " in line:
            return line[line.index("] lane ") + 2 :].strip()
    return None


def warm_up(server_url: str, model: str, protocol: str = "anthropic") -> None:
    """One small request: the first request after start-up pays one-off costs (kernel
    set-up, allocations) that are not what a cold turn costs. The caller empties the
    engine's cache afterwards (`stack.Endpoints.warm_up`)."""
    body = {"model": model, "messages": [{"role": "user", "content": "warm-up"}], "max_tokens": 2, "stream": True}
    if protocol == "openai":
        del body["model"]  # mlx_lm.server serves its --model as the default
    reply = post_streamed(server_url, CHAT_COMPLETIONS_PATH if protocol == "openai" else MESSAGES_PATH, json.dumps(body).encode())
    if reply.status != 200:
        raise RuntimeError(f"warm-up request to {server_url} failed: {reply.error}")
