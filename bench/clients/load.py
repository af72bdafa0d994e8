"""The load scenario: many concurrent clients through the proxy, some of them giving up on purpose.

`clients` threads send requests drawn at random from the bench sessions'
lanes at two sizes through one `stable-prefix up` stack for `duration_s`; a
share of them hang up before the first token or mid-stream. Then:
- every completed answer must equal what its request gets alone from an
  uncached engine (greedy; the body the proxy forwarded, from the captures);
- no request lost (every one not abandoned ends with `message_stop`, no error)
  or answered twice (the proxy forwarded each at most once, by its id);
- the proxy's and the engine's memory, sampled every few seconds, stay bounded;
- how long requests waited: the engine's queue-wait figures (log and
  `/v1/cache/stats`) and the clients' times to first token.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from dataclasses import dataclass, field

from stable_prefix.bench.clients.reference_answers import CaptureIndex, ReferenceAnswers, same_answer
from stable_prefix.bench.clients.stream_client import StreamedAnswer, post_messages
from stable_prefix.bench.clients.up_stack import StackSettings, start_life
from stable_prefix.bench.measure.resources import engine_stats, process_figures
from stable_prefix.bench.workload.soak_requests import comparable, request_pool

SAMPLE_EVERY_S = 5.0


@dataclass
class LoadSettings:
    clients: int = 16
    duration_s: float = 300.0
    give_up_share: float = 0.2  # half before the first token, half mid-stream
    scales: tuple[float, ...] = (0.03, 0.08)
    seeds: range = range(100, 103)
    seed: int = 0


@dataclass
class Sent:
    user_id: str
    lane: str
    answer: StreamedAnswer
    client: int


@dataclass
class LoadResult:
    sent: list[Sent] = field(default_factory=list)
    proxy_rss: list[tuple[float, int]] = field(default_factory=list)
    engine_rss: list[tuple[float, int]] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    checked: int = 0
    mismatched: list[str] = field(default_factory=list)
    forwarded_twice: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def _client(number: int, pool, settings: LoadSettings, proxy_url: str, deadline: float, result: LoadResult, lock: threading.Lock) -> None:
    rng = random.Random(settings.seed * 1000 + number)
    sent = 0
    while time.monotonic() < deadline:
        request = rng.choice(pool)
        user_id = f"load-{number:02d}-{sent:04d}"
        sent += 1
        roll = rng.random()
        give_up = None if roll >= settings.give_up_share else ("before-first-token" if roll < settings.give_up_share / 2 else "mid-stream")
        answer = post_messages(proxy_url, comparable(request.body, user_id), request.headers, give_up=give_up)
        with lock:
            result.sent.append(Sent(user_id, request.lane, answer, number))


def _sampler(life, deadline: float, result: LoadResult) -> None:
    started = time.monotonic()
    while time.monotonic() < deadline:
        result.proxy_rss.append((time.monotonic() - started, process_figures(life.proxy_pid).rss_bytes))
        result.engine_rss.append((time.monotonic() - started, process_figures(life.engine_pid).rss_bytes))
        time.sleep(SAMPLE_EVERY_S)


def run_load(stack: StackSettings, settings: LoadSettings, reference: ReferenceAnswers) -> LoadResult:
    pool = request_pool(settings.scales, settings.seeds)
    life = start_life(stack, number=0)
    result, lock = LoadResult(), threading.Lock()
    try:
        started = time.monotonic()
        deadline = started + settings.duration_s
        threads = [threading.Thread(target=_client, args=(n, pool, settings, life.proxy_url, deadline, result, lock), daemon=True)
                   for n in range(settings.clients)]
        threads.append(threading.Thread(target=_sampler, args=(life, deadline, result), daemon=True))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result.wall_s = time.monotonic() - started
        result.stats = engine_stats(life.engine_url)
        _verify(result, CaptureIndex(life.capture_dir), reference)
    finally:
        life.stop()
    return result


def _verify(result: LoadResult, captures: CaptureIndex, reference: ReferenceAnswers) -> None:
    for sent in result.sent:
        if sent.answer.gave_up:
            forwarded = captures.forwarded(sent.user_id, wait_s=0)
            if len(forwarded) > 1:
                result.forwarded_twice.append(sent.user_id)
            continue
        if not sent.answer.complete:
            result.lost.append(f"{sent.user_id}: {sent.answer.error or 'stream ended without message_stop'}")
            continue
        forwarded = captures.forwarded(sent.user_id)
        if len(forwarded) != 1:
            (result.forwarded_twice if forwarded else result.lost).append(f"{sent.user_id}: forwarded {len(forwarded)} times")
            continue
        result.checked += 1
        if not same_answer(sent.answer, reference.answer(forwarded[0])):
            result.mismatched.append(sent.user_id)


def summary(result: LoadResult, settings: LoadSettings) -> dict:
    completed = [s for s in result.sent if s.answer.complete]
    gave_up = [s for s in result.sent if s.answer.gave_up]
    ttfts = sorted(s.answer.ttft_s for s in completed if s.answer.ttft_s is not None)
    stats = result.stats
    admitted = stats.get("requests_admitted") or 0
    return {
        "clients": settings.clients,
        "duration_s": round(result.wall_s, 1),
        "requests": len(result.sent),
        "completed": len(completed),
        "gave_up_before_first_token": sum(s.answer.gave_up == "before-first-token" for s in gave_up),
        "gave_up_mid_stream": sum(s.answer.gave_up == "mid-stream" for s in gave_up),
        "lanes": sorted({s.lane for s in result.sent}),
        "lost": result.lost,
        "forwarded_twice": result.forwarded_twice,
        "compared_with_uncached": result.checked,
        "mismatched": result.mismatched,
        "ttft_s_median": round(statistics.median(ttfts), 2) if ttfts else None,
        "ttft_s_p95": round(ttfts[int(0.95 * (len(ttfts) - 1))], 2) if ttfts else None,
        "engine_queue_wait_s_mean": round(stats.get("queue_wait_seconds_total", 0) / admitted, 2) if admitted else None,
        "engine_queue_wait_s_max": round(stats.get("queue_wait_seconds_max", 0), 2),
        "engine_prefills_stopped": stats.get("prefills_stopped"),
        "proxy_rss_mib_first_last_max": _first_last_max(result.proxy_rss),
        "engine_rss_mib_first_last_max": _first_last_max(result.engine_rss),
    }


def _first_last_max(series: list[tuple[float, int]]) -> list[float] | None:
    if not series:
        return None
    values = [value / 2**20 for _, value in series]
    return [round(values[0], 1), round(values[-1], 1), round(max(values), 1)]
