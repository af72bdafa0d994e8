"""`make bench-team`: a team of K users, each through their own proxy, into two replicas behind a router.

    python -m stable_prefix.bench.team                # -> bench/results/team/latest.{json,md}
    python -m stable_prefix.bench.team --quick        # fewer requests per user -> build/bench-team-quick/
    python -m stable_prefix.bench.team --configs key-haproxy,alone --users 3 --limit 8 --out /tmp/t

Each user replays a Claude Code-shaped session of their own (`bench.workload.session`, one seed per user:
their own project, tools text and git status, so their heads differ) with its fan-out of three
concurrent Explore instances, titles and a `/clear` into a new conversation. All users run at
once, each through their own real `mitmdump` with our addons (the key on every request under
`KEY_HEADER`), into two patched engines (the product's default engine mode) that share one
`--prefix-cache-dir`, behind a real router (`stable_prefix/routers.py`):

- consistent hashing on our key (smg, HAProxy), with the head key (one key per lane head: a
  user's fan-out instances and new conversations stay where their head is) and with a per-lane
  key (each instance a key of its own): the routing-key decision;
- round-robin, and smg's prefix-text policy (`cache_aware`);
- one replica alone, no router (what the two replicas are compared with);
- the key configuration with one replica SIGKILLed mid-run and restarted later (failover).

Every configuration gets fresh replicas and an empty shared directory. Where each request was
served is read from the replicas' own logs: the patched engine logs `prefix cache HIT|MISS: N
prompt tokens, R reused` for every request it plans, and the request's streamed usage carries the
same two numbers; a pair found in exactly one replica's log places it there, any other is
unknown (counted, never guessed). Tokens prefilled are the engines' own (each request's usage:
what its engine received). Two replicas on one 2-core machine do not double the compute: tokens
prefilled and placement are the point here, times secondary.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stable_prefix.addons.lanes import AGENT_ID_HEADER
from stable_prefix.addons.stream_recovery import recovered_in_log
from stable_prefix.bench.clients.agent_clients import CLIENTS, AgentClient, loss_kind
from stable_prefix.bench.clients.replay import Measured, Replayer, steps, warm_up
from stable_prefix.bench.clients.stack import (
    ADDON_SCRIPTS,
    PRODUCT,
    QUEUE_CONCURRENT_REQUESTS,
    SERVED_MODEL_NAME,
    UNBUFFERED,
    clear_cache,
    cpu_description,
    engine_command,
    proxy_options,
    stop_servers_on_sigterm,
)
from stable_prefix.bench.measure.metrics import Row, mark_cold_and_warm, paired_ratio, summarize
from stable_prefix.bench.run import model_description
from stable_prefix.bench.workload.session import Request, generate_session
from stable_prefix.servers import REPO_ROOT, Server, free_port, http_ok, mitmdump_command, running

DEFAULT_MODEL = REPO_ROOT / "build" / "tiny-model-bench"
DEFAULT_OUT, QUICK_OUT = REPO_ROOT / "bench" / "results" / "team", REPO_ROOT / "build" / "bench-team-quick"
DEFAULT_LOGS = REPO_ROOT / "build" / "bench-team-logs"
# The QUICK size of make bench (a ~2.1K-token main prefix): prefill, not the prompt's size, is what moves.
SCALE = 0.04
# Of each user's session, what a router must place (sized for this machine): the first conversation's
# opening with its title beside it, the fan-out group of three Explore instances and the main turn after
# it (0-13), the lone general-purpose subagent (17, 18), and the new conversation after /clear with its
# title beside it and its next turn (24-26). Each request is whole on its own (its history inside), so
# the ones left out change no prompt of these.
SESSION_REQUESTS = (*range(14), 17, 18, 24, 25, 26)
DEFAULT_USERS, QUICK_LIMIT = 4, 8
# Short greedy replies: what the routers and caches do shows in prefill; the same prompt decodes the
# same reply on every configuration, so times still compare at equal output length.
MAX_TOKENS = 8
# What the proxies send the key under: smg's header (HAProxy is configured to hash the same one).
KEY_HEADER = "x-smg-routing-key"
HEALTH_INTERVAL_S = 1.0
# The failover: replica B is SIGKILLed once this share of all requests has been answered, and
# started again (same port, same directory, no warm-up) once this share has.
KILL_AT, RESTART_AT = 0.35, 0.6
# Once KILL_AT is reached, the kill waits (at most KILL_WAIT_S) for replica B to be decoding a reply, so that a
# stream is cut mid-reply (the others in flight where they are): read from its /v1/status.
KILL_WAIT_S, KILL_AFTER_DECODED_TOKENS = 30.0, 2
# HAProxy's bounded load: no replica takes more than this percent of the average load (its active requests).
BOUNDED_LOAD_FACTOR = 150
BALANCE_LIMIT, ALONE_LIMIT, ROUND_ROBIN_LIMIT, MOVED_REUSE_TARGET = 1.5, 1.05, 0.5, 0.90
_PLANNED = re.compile(r"prefix cache (?:HIT|MISS): (\d+) prompt tokens, (\d+) reused")
_DISK_LOAD = re.compile(r"disk cache: loaded (\d+) tokens")


@dataclass(frozen=True)
class TeamConfiguration:
    key: str
    title: str
    router: str | None  # a kind of stable_prefix/routers.py; None: the users' proxies go to one replica directly
    policy: str = "key"  # key (consistent hashing on our key), round_robin, prefix (the router's prefix-text policy)
    key_scope: str = "head"  # head: one key per lane head; lane: one per lane (each subagent instance its own)
    failover: bool = False  # replica B is SIGKILLed mid-run and started again later
    shared_dir: bool = True  # the replicas share one --prefix-cache-dir (False: each its own)
    client: str = "claude"  # every user's client behaves as this agent does (bench/clients/agent_clients.py): its protocol, its resends
    balance_factor: int | None = None  # HAProxy's hash-balance-factor (bounded-load consistent hashing); None: unbounded

    @property
    def replicas(self) -> int:
        return 1 if self.router is None else 2


CONFIGURATIONS = (
    TeamConfiguration("key-smg", "consistent hashing on our head key, smg", "smg"),
    TeamConfiguration("key-haproxy", "consistent hashing on our head key, HAProxy", "haproxy"),
    TeamConfiguration("lane-key-smg", "consistent hashing on a per-lane key, smg", "smg", key_scope="lane"),
    TeamConfiguration("round-robin", "round-robin, smg", "smg", policy="round_robin"),
    # What the shared directory is worth to a router that ignores the cache.
    TeamConfiguration("round-robin-own-dirs", "round-robin, smg, each replica its own --prefix-cache-dir", "smg", policy="round_robin", shared_dir=False),
    TeamConfiguration("prefix-smg", "smg's prefix-text policy (cache_aware)", "smg", policy="prefix"),
    TeamConfiguration("alone", "one replica alone, no router", None),
    TeamConfiguration("key-haproxy-bounded", f"consistent hashing on our head key, HAProxy, bounded load (hash-balance-factor {BOUNDED_LOAD_FACTOR})",
                      "haproxy", balance_factor=BOUNDED_LOAD_FACTOR),
    TeamConfiguration("failover-haproxy", "head key, HAProxy; replica B SIGKILLed mid-run, restarted later; users as Claude Code", "haproxy",
                      failover=True),
    *(TeamConfiguration(f"failover-{client.key}", f"the failover, users as {client.name} ({client.protocol})", "haproxy", failover=True, client=client.key)
      for client in CLIENTS.values() if client.key != "claude"),
)
# Alone, the key and the failover first: the comparisons every target needs; the failover reads key-haproxy.
FAILOVER_CONFIGS = ",".join(["failover-haproxy", *(f"failover-{key}" for key in CLIENTS if key != "claude")])
DEFAULT_CONFIGS = f"alone,key-haproxy,{FAILOVER_CONFIGS},key-haproxy-bounded,key-smg,lane-key-smg,round-robin,prefix-smg,round-robin-own-dirs"
QUICK_CONFIGS = f"alone,key-haproxy,key-haproxy-bounded,key-smg,{FAILOVER_CONFIGS}"
ALONE = "alone"


def configuration(key: str) -> TeamConfiguration:
    for candidate in CONFIGURATIONS:
        if candidate.key == key:
            return candidate
    raise ValueError(f"team configuration {key!r}: unknown; choose from {', '.join(c.key for c in CONFIGURATIONS)}")


def with_balance_factor(config: TeamConfiguration, factor: int) -> TeamConfiguration:
    """A bounded-load configuration with another factor than BOUNDED_LOAD_FACTOR (the others as they are)."""
    if config.balance_factor is None or factor == config.balance_factor:
        return config
    return dataclasses.replace(config, balance_factor=factor, title=config.title.replace(str(config.balance_factor), str(factor)))


def team_sessions(users: int, limit: int | None, scale: float = SCALE) -> dict[str, list[Request]]:
    """{user: the first `limit` of their session's SESSION_REQUESTS}; user n replays seed n (their own project and heads)."""
    return {f"u{n}": [generate_session(seed=n, scale=scale)[index] for index in SESSION_REQUESTS][:limit] for n in range(1, users + 1)}


def key_options(config: TeamConfiguration) -> dict[str, object]:
    """The proxy options that put our key on each request (none where no router reads one)."""
    if config.router is None:
        return {}
    # strict_router_body: what a team's proxy before smg sends (the bench's bodies carry nothing it drops); "true", as
    # mitmproxy spells a bool on its command line ("True" leaves every option of the script unset, silently).
    return {"lane_routing_header": KEY_HEADER, "routing_key_scope": config.key_scope, "strict_router_body": "true"}


# -- the replicas ---------------------------------------------------------------------------


@dataclass
class Replica:
    """One patched engine on a fixed port; each start is a life with its own log (a kill ends one)."""

    name: str
    port: int
    command: list[str]
    env: dict[str, str]
    log_dir: Path
    stack: contextlib.ExitStack
    lives: list[Server] = field(default_factory=list)
    replay_starts_at: int = 0  # the first life's log offset after its warm-up

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        name = self.name if not self.lives else f"{self.name}-life{len(self.lives) + 1}"
        ready = lambda: http_ok(f"{self.url}/v1/models")  # noqa: E731
        self.lives.append(self.stack.enter_context(running(name, self.command, port=self.port, log_dir=self.log_dir, ready=ready, env=self.env, startup_timeout=600)))

    def kill(self) -> None:
        process = self.lives[-1].process
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def warmed_up(self) -> None:
        """One small request, then an emptied cache (RAM and the shared directory); the replay starts here."""
        warm_up(self.url, SERVED_MODEL_NAME)
        clear_cache(PRODUCT.engine, self.url)
        self.replay_starts_at = self.lives[0].log_path.stat().st_size

    def replay_log_lines(self) -> list[str]:
        """What every life of it logged after the warm-up."""
        lines = []
        for number, life in enumerate(self.lives):
            data = life.log_path.read_bytes()[self.replay_starts_at if number == 0 else 0 :]
            lines += data.decode(errors="replace").splitlines()
        return lines


@dataclass
class TeamStack:
    replicas: list[Replica]
    proxies: dict[str, Server]
    router: Server | None


@contextlib.contextmanager
def team_stack(config: TeamConfiguration, users: list[str], model_dir: Path, log_dir: Path) -> Iterator[TeamStack]:
    """The replicas (one shared, empty `--prefix-cache-dir`, or one each), the router, and one proxy per user;
    everything stops on exit, also on error or Ctrl-C."""
    with contextlib.ExitStack() as stack:
        def cache_dir() -> str:
            return stack.enter_context(tempfile.TemporaryDirectory(prefix=f"stable-prefix-team-{config.key}-cache-"))

        shared_dir = cache_dir()
        replicas = []
        for letter in "AB"[: config.replicas]:
            home = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"stable-prefix-team-{config.key}-{letter}-home-"))
            port = free_port()
            command = engine_command(PRODUCT, model_dir, port, ["--prefix-cache-dir", shared_dir if config.shared_dir else cache_dir()])
            env = {**UNBUFFERED, **QUEUE_CONCURRENT_REQUESTS, "HOME": home}
            replicas.append(Replica(f"{config.key}-replica-{letter}", port, command, env, log_dir, stack))
        for replica in replicas:
            replica.start()
        for replica in replicas:
            replica.warmed_up()
        router = None
        upstream = replicas[0].url
        if config.router is not None:
            from stable_prefix.routers import running_router  # the routers' own harness (make routers)

            router = stack.enter_context(
                running_router(config.router, [replica.url for replica in replicas], policy=config.policy, key_header=KEY_HEADER,
                               log_dir=log_dir, health_interval_s=HEALTH_INTERVAL_S, balance_factor=config.balance_factor)
            )
            upstream = router.url
        proxies = {}
        for user in users:
            port = free_port()
            command = mitmdump_command(list(ADDON_SCRIPTS), upstream, port, {**proxy_options(), **key_options(config)})
            proxies[user] = stack.enter_context(running(f"{config.key}-proxy-{user}", command, port=port, log_dir=log_dir, env=UNBUFFERED))
        yield TeamStack(replicas, proxies, router)


# -- the replay -----------------------------------------------------------------------------


class Progress:
    """Answered requests across all users; the failover waits on it."""

    def __init__(self, total: int):
        self.total, self.answered = total, 0
        self.changed = threading.Condition()

    def add(self, count: int) -> None:
        with self.changed:
            self.answered += count
            self.changed.notify_all()

    def wait_for(self, share: float, stop: threading.Event) -> bool:
        """Until `share` of all requests is answered (True), or `stop` is set (False)."""
        with self.changed:
            while self.answered < share * self.total and not stop.is_set():
                self.changed.wait(0.5)
            return not stop.is_set()


def decoding(replica: Replica) -> bool:
    """Whether the replica is decoding a reply (past its first tokens), by its own /v1/status."""
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"{replica.url}/v1/status", timeout=2) as answer:
            running = json.load(answer).get("requests") or []
        return any(r.get("phase") == "generation" and r.get("completion_tokens", 0) >= KILL_AFTER_DECODED_TOKENS for r in running)
    return False


def replay_team(stack: TeamStack, sessions: dict[str, list[Request]], *, failover: bool, max_tokens: int | str,
                client: AgentClient) -> tuple[dict[str, list[Measured]], dict[str, Any]]:
    """All users at once, one thread each (each user's own fan-out in threads of its own), each as `client`
    (its protocol, and what it does when a stream is cut); with `failover`, replica B is killed while it
    decodes a reply once `KILL_AT` of the requests are answered, and restarted at `RESTART_AT`."""
    progress = Progress(sum(len(requests) for requests in sessions.values()))
    results: dict[str, list[Measured]] = {user: [] for user in sessions}
    started = time.perf_counter()
    events: dict[str, Any] = {}
    finished = threading.Event()

    def run_user(user: str) -> None:
        replayer = Replayer(stack.proxies[user].url, reuse_sources=("usage",), max_tokens=max_tokens, on_answered=lambda request: progress.add(1),
                            protocol=client.protocol, client=client, model=None if client.protocol == "anthropic" else SERVED_MODEL_NAME)
        replayer.sender.started = started  # every user's times on one clock
        for step in steps(sessions[user]):
            results[user] += replayer.step(step)

    def fail_and_return(replica: Replica) -> None:
        if not progress.wait_for(KILL_AT, finished):
            return
        deadline = time.monotonic() + KILL_WAIT_S
        while not decoding(replica) and time.monotonic() < deadline and not finished.is_set():
            time.sleep(0.02)
        events["killed_while_decoding"] = decoding(replica)
        replica.kill()
        events["killed_at_s"], events["answered_at_kill"] = time.perf_counter() - started, progress.answered
        if not progress.wait_for(RESTART_AT, finished):
            return
        events["restart_began_s"] = time.perf_counter() - started
        replica.start()
        events["restarted_at_s"], events["answered_at_restart"] = time.perf_counter() - started, progress.answered

    threads = [threading.Thread(target=run_user, args=(user,), name=f"user-{user}") for user in sessions]
    failure = threading.Thread(target=fail_and_return, args=(stack.replicas[1],), name="failover") if failover else None
    for thread in [*threads, *([failure] if failure else [])]:
        thread.start()
    for thread in threads:
        thread.join()
    finished.set()
    if failure:
        failure.join()
    events["wall_s"] = time.perf_counter() - started
    return results, events


def rows_of(user: str, measured: list[Measured], round_number: int) -> list[Row]:
    """One row per request, in the user's sending order, marked cold/warm within the user's session."""
    rows = []
    for result in sorted(measured, key=lambda m: m.request.index):
        request, reply = result.request, result.reply
        rows.append({
            "user": user,
            "index": f"r{round_number}/{user}#{request.index}",  # what pairs a request across configurations of one round
            "request_index": request.index,
            "lane": request.lane,
            "conversation": request.conversation,
            "fan_out": f"{user}/{request.fan_out}" if request.fan_out else None,
            "beside": request.beside,
            "agent_id": request.headers.get(AGENT_ID_HEADER),
            "status": reply.status,
            "error": reply.error,
            "lost": loss_kind(reply) is not None,
            "loss": loss_kind(reply),
            # A cut its client sent again (`cut` says how it looked), or the proxy completed (`recovered_by` set later).
            "cut": reply.cut,
            "recovered_by": "agent" if reply.cut else None,
            "recovery_s": reply.recovery_s,
            "response_id": reply.response_id,
            "prompt_tokens": result.prompt_tokens,
            "reused_tokens": result.reused_tokens,
            "prefilled_tokens": None if result.reused_tokens is None else result.prompt_tokens - result.reused_tokens,
            "started_s": result.started_s,
            "ttft_s": reply.ttft_s,
            "ttft_is_total": reply.ttft_is_total,
            "total_s": reply.total_s,
            "output_tokens": reply.output_tokens,
            "stop_reason": reply.stop_reason,
            "replica": None,
        })
    return mark_cold_and_warm(rows)


def mark_completed_by_proxy(rows: list[Row], proxy_logs: dict[str, str]) -> None:
    """Each user's proxy logs every stream it completed (`addons/stream_recovery.py`) with the answer's id
    and the seconds from the cut to the end: those requests were cut and recovered by the proxy."""
    completed = {(user, answer): seconds for user, log in proxy_logs.items() for answer, seconds in recovered_in_log(log).items()}
    for row in rows:
        seconds = completed.get((row["user"], row["response_id"]))
        if seconds is not None:
            row.update(cut=row["cut"] or "unseen: the proxy completed it", recovered_by="proxy", recovery_s=seconds)


def recovery_figures(rows: list[Row]) -> dict[str, Any]:
    """What a user lost when a stream was cut: recovered by the agent (it sent the request again), by the
    proxy (it completed the stream), or lost; and the seconds from the cut to the whole answer."""
    cut = [row for row in rows if row["cut"] or row["lost"]]
    seconds = sorted(row["recovery_s"] for row in cut if row["recovery_s"] is not None)
    return {
        "cut": len(cut),
        "recovered_by_agent": sum(1 for row in cut if row["recovered_by"] == "agent" and not row["lost"]),
        "recovered_by_proxy": sum(1 for row in cut if row["recovered_by"] == "proxy" and not row["lost"]),
        "lost": sum(1 for row in cut if row["lost"]),
        "cut_forms": dict(Counter(row["cut"] or row["loss"] for row in cut)),
        "recovery_s_median": statistics.median(seconds) if seconds else None,
        "recovery_s_max": seconds[-1] if seconds else None,
    }


def planned_requests(lines: list[str]) -> Counter:
    """(prompt tokens, reused tokens) of each request the engine planned, counted."""
    return Counter((int(m.group(1)), int(m.group(2))) for line in lines if (m := _PLANNED.search(line)))


def place(rows: list[Row], planned: dict[str, Counter]) -> None:
    """Set each row's `replica` where its (prompt, reused) pair is left in exactly one replica's
    planned requests (each entry used once; rows placed in order of sending); else None, unknown."""
    left = {name: Counter(counts) for name, counts in planned.items()}
    pending = [row for row in sorted(rows, key=lambda row: row["started_s"]) if row["reused_tokens"] is not None]
    while True:
        placed_one = False
        for row in pending:
            pair = (row["prompt_tokens"], row["reused_tokens"])
            holders = [name for name, counts in left.items() if counts[pair] > 0]
            if len(holders) == 1:
                row["replica"] = holders[0]
                left[holders[0]][pair] -= 1
                placed_one = True
        pending = [row for row in pending if row["replica"] is None]
        if not placed_one or not pending:
            return


def lane_key(row: Row) -> tuple[str, str]:
    return row["user"], row["lane"]


def lanes_on_one_replica(rows: list[Row]) -> dict[str, int]:
    """Lanes (per user) whose placed requests all reached one replica, of the lanes with two or more placed."""
    by_lane: dict[tuple[str, str], set[str]] = {}
    for row in rows:
        if row["replica"] is not None:
            by_lane.setdefault(lane_key(row), set()).add(row["replica"])
    counted = {lane: replicas for lane, replicas in by_lane.items() if sum(1 for row in rows if lane_key(row) == lane and row["replica"]) >= 2}
    return {"lanes": len(counted), "on_one_replica": sum(1 for replicas in counted.values() if len(replicas) == 1)}


def moved_requests(rows: list[Row]) -> list[Row]:
    """Requests that reached another replica than their lane's previous request (the lane moved)."""
    moved, last_replica = [], {}
    for row in sorted(rows, key=lambda row: row["started_s"]):
        if row["replica"] is None:
            continue
        previous = last_replica.get(lane_key(row))
        if previous is not None and previous != row["replica"]:
            moved.append(row)
        last_replica[lane_key(row)] = row["replica"]
    return moved


def share(part: int | None, whole: int | None) -> float | None:
    return None if part is None or not whole else part / whole


def configuration_result(config: TeamConfiguration, rows: list[Row], replicas: list[Replica], events: dict[str, Any]) -> dict[str, Any]:
    lines = {replica.name.rsplit("-", 1)[-1]: replica.replay_log_lines() for replica in replicas}
    planned = {name: planned_requests(replica_lines) for name, replica_lines in lines.items()}
    place(rows, planned)
    served = {name: sum(counts.values()) for name, counts in planned.items()}
    summary = summarize(rows)
    result: dict[str, Any] = {
        "key": config.key, "title": config.title, "router": config.router, "policy": config.policy, "client": config.client,
        "balance_factor": config.balance_factor,
        "key_scope": config.key_scope if config.router else None, "failover": config.failover,
        "requests": len(rows),
        "requests_lost": sum(row["lost"] for row in rows),
        "lost_by_kind": dict(Counter(row["loss"] for row in rows if row["lost"])),
        "lost": [{"index": row["index"], "lane": row["lane"], "status": row["status"], "loss": row["loss"], "error": row["error"]} for row in rows if row["lost"]],
        "recovery": recovery_figures(rows),
        "tokens_prefilled": summary["tokens_prefilled"],
        "tokens_reused": summary["tokens_reused"],
        "prompt_tokens": summary["prompt_tokens"],
        "reuse_unknown_requests": summary["reuse_unknown_requests"],
        "warm_ttft_median_s": summary["warm_ttft_median_s"],
        "warm_turn_median_s": summary["warm_turn_median_s"],
        "cold_ttft_median_s": summary["cold_ttft_median_s"],
        "fan_out_wall_s": summary["fan_out_wall_s"],
        "lanes": {lane: {k: figures[k] for k in ("requests", "warm_ttft_median_s", "warm_turn_median_s", "cold_ttft_median_s")}
                  for lane, figures in summary["lanes"].items()},
        # From each replica's own log: the requests it planned and the tokens it prefilled.
        "replicas": {name: {"requests": served[name], "tokens_prefilled": sum((p - r) * n for (p, r), n in planned[name].items()),
                            "disk_loads": sum(1 for line in lines[name] if _DISK_LOAD.search(line))} for name in planned},
        "placement_unknown": sum(1 for row in rows if row["replica"] is None),
        "balance": (max(served.values()) / min(served.values())) if len(served) == 2 and min(served.values()) else None,
        "lanes_on_one_replica": lanes_on_one_replica(rows),
        "events": events,
    }
    if config.failover:
        moved = moved_requests(rows)
        restart = events.get("restarted_at_s")
        result["moved"] = {
            "requests": len(moved),
            "after_kill": sum(1 for row in moved if restart is None or row["started_s"] < events.get("restart_began_s", 0)),
            "prompt_tokens": sum(row["prompt_tokens"] for row in moved),
            "reused_tokens": sum(row["reused_tokens"] for row in moved),
            "reuse_of_prompt": share(sum(row["reused_tokens"] for row in moved), sum(row["prompt_tokens"] for row in moved)),
            "lowest_reuse_of_prompt": min((share(row["reused_tokens"], row["prompt_tokens"]) for row in moved), default=None),
            "rows": [row["index"] for row in moved],
        }
    return result


def moved_against_undisturbed(against: dict[str, Any] | None) -> str:
    """What the same requests reused without the kill, as the target's detail."""
    if not against or not against["requests"]:
        return ""
    return (f"; the same requests in {against['configuration']} (no kill) reused {against['reused_without']} of {against['prompt_tokens_without']} "
            f"({share(against['reused_without'], against['prompt_tokens_without']):.1%}): the moved lanes kept "
            f"{against['share_of_undisturbed_reuse']:.1%} of their undisturbed reuse")


def compare_moved(failover: dict[str, Any], rows: dict[str, list[Row]], undisturbed: str) -> dict[str, Any] | None:
    """The moved requests' reuse against the same requests' in the same configuration without the kill."""
    if undisturbed not in rows:
        return None
    theirs = {row["index"].split("/", 1)[1]: row for row in rows[undisturbed]}
    pairs = [(row, theirs.get(row["index"].split("/", 1)[1])) for row in rows[failover["key"]] if row["index"] in failover["moved"]["rows"]]
    known = [(mine, other) for mine, other in pairs if other and other["reused_tokens"] is not None]
    with_failover, without = sum(mine["reused_tokens"] for mine, _ in known), sum(other["reused_tokens"] for _, other in known)
    return {
        "configuration": undisturbed,
        "requests": len(known),
        "prompt_tokens_without": sum(other["prompt_tokens"] for _, other in known),
        "reused_with_failover": with_failover,
        "reused_without": without,
        "share_of_undisturbed_reuse": share(with_failover, without),
    }


# -- the run --------------------------------------------------------------------------------


def run_configuration(config: TeamConfiguration, sessions: dict[str, list[Request]], model_dir: Path, log_dir: Path, round_number: int, max_tokens: int | str) -> tuple[dict[str, Any], list[Row]]:
    print(f"[{config.key}] starting {config.replicas} replica(s){', ' + config.router if config.router else ''} and {len(sessions)} proxies", flush=True)
    with team_stack(config, list(sessions), model_dir, log_dir) as stack:
        print(f"[{config.key}] replaying {sum(map(len, sessions.values()))} requests of {len(sessions)} users at once", flush=True)
        measured, events = replay_team(stack, sessions, failover=config.failover, max_tokens=max_tokens, client=CLIENTS[config.client])
        rows = [row for user, results in measured.items() for row in rows_of(user, results, round_number)]
        mark_completed_by_proxy(rows, {user: proxy.log_text() for user, proxy in stack.proxies.items()})
        result = configuration_result(config, rows, stack.replicas, events)
    print(f"[{config.key}] {events['wall_s']:.0f} s: prefilled {result['tokens_prefilled']}, replicas {json.dumps(result['replicas'])}, "
          f"lost {result['requests_lost']}, recovered {json.dumps(result['recovery'])}", flush=True)
    return result, rows


def targets(results: dict[str, dict[str, Any]], users: int) -> list[dict[str, Any]]:
    """Issue 22's targets, each met, not met, or unknown (a configuration that did not run)."""
    found = []

    def target(name: str, value: float | None, limit: float, met: bool | None, detail: str) -> None:
        found.append({"target": name, "value": value, "limit": limit, "met": met, "detail": detail})

    alone = results.get(ALONE)
    for key in ("key-smg", "key-haproxy", "key-haproxy-bounded", "lane-key-smg"):
        if key not in results:
            continue
        prefilled = results[key]["tokens_prefilled"]
        if alone:
            ratio = share(prefilled, alone["tokens_prefilled"])
            target(f"{key}: tokens prefilled <= {ALONE_LIMIT}x one replica alone", ratio, ALONE_LIMIT, None if ratio is None else ratio <= ALONE_LIMIT,
                   f"{prefilled} against {alone['tokens_prefilled']}")
        for spread in ("round-robin", "round-robin-own-dirs"):
            if spread in results:
                ratio = share(prefilled, results[spread]["tokens_prefilled"])
                target(f"{key}: tokens prefilled <= {ROUND_ROBIN_LIMIT}x {spread}", ratio, ROUND_ROBIN_LIMIT,
                       None if ratio is None else ratio <= ROUND_ROBIN_LIMIT, f"{prefilled} against {results[spread]['tokens_prefilled']}")
        balance = results[key]["balance"]
        if users >= 4:
            target(f"{key}: no replica serves more than {BALANCE_LIMIT}x the other's requests", balance, BALANCE_LIMIT,
                   None if balance is None else balance <= BALANCE_LIMIT, json.dumps({k: v["requests"] for k, v in results[key]["replicas"].items()}))
    failover = results.get("failover-haproxy")
    if failover:
        moved = failover["moved"]
        target(f"failover: the moved lanes reuse >= {MOVED_REUSE_TARGET:.0%} of their prompt", moved["reuse_of_prompt"], MOVED_REUSE_TARGET,
               None if moved["reuse_of_prompt"] is None else moved["reuse_of_prompt"] >= MOVED_REUSE_TARGET,
               f"{moved['requests']} moved requests: {moved['reused_tokens']} of {moved['prompt_tokens']} prompt tokens reused"
               + moved_against_undisturbed(moved.get("against_undisturbed")))
    for key, result in results.items():
        if result["failover"]:
            recovery = result["recovery"]
            target(f"{key}: 0 turns lost when a replica dies mid-reply (users as {CLIENTS[result['client']].name})", recovery["lost"], 0,
                   recovery["lost"] == 0, f"{recovery['cut']} cut: {recovery['recovered_by_agent']} recovered by the agent, "
                   f"{recovery['recovered_by_proxy']} by the proxy, {recovery['lost']} lost; forms {json.dumps(recovery['cut_forms'])}")
    lost = sum(result["requests_lost"] for result in results.values())
    target("0 requests lost (every configuration)", lost, 0, lost == 0, json.dumps({key: result["requests_lost"] for key, result in results.items()}))
    return found


def key_decision(results: dict[str, dict[str, Any]], rows: dict[str, list[Row]]) -> dict[str, Any] | None:
    """Head key against per-lane key, both through smg: tokens prefilled, balance, warm TTFT (paired)."""
    head, lane = results.get("key-smg"), results.get("lane-key-smg")
    if not head or not lane:
        return None
    return {
        "head": "key-smg", "lane": "lane-key-smg",
        "tokens_prefilled": {"head": head["tokens_prefilled"], "lane": lane["tokens_prefilled"]},
        "balance": {"head": head["balance"], "lane": lane["balance"]},
        "warm_ttft_median_s": {"head": head["warm_ttft_median_s"], "lane": lane["warm_ttft_median_s"]},
        "fan_out_wall_s": {"head": head["fan_out_wall_s"], "lane": lane["fan_out_wall_s"]},
        "paired_warm_ttft_head_over_lane": paired_ratio(rows["key-smg"], rows["lane-key-smg"], "ttft_s")["all"],
        "paired_warm_turn_head_over_lane": paired_ratio(rows["key-smg"], rows["lane-key-smg"], "total_s")["all"],
    }


def commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
    return None


def run(config_keys: list[str], users: int, limit: int | None, model_dir: Path, log_dir: Path, rounds: int = 1, max_tokens: int | str = MAX_TOKENS,
        on_result: Callable[[dict[str, Any]], None] | None = None, balance_factor: int = BOUNDED_LOAD_FACTOR) -> dict[str, Any]:
    """Every configuration of `config_keys` on fresh stacks, in that order, then (rounds=2) in the reverse order;
    `on_result` gets the result so far after each configuration; `balance_factor`: the bounded-load configuration's."""
    configs = [with_balance_factor(configuration(key), balance_factor) for key in config_keys]
    sessions = team_sessions(users, limit)
    began = datetime.datetime.now(datetime.UTC)
    runs: dict[str, list[dict[str, Any]]] = {}
    rows: dict[str, list[Row]] = {}
    for round_number in range(1, rounds + 1):
        for config in configs if round_number % 2 else list(reversed(configs)):
            result, config_rows = run_configuration(config, sessions, model_dir, log_dir, round_number, max_tokens)
            runs.setdefault(config.key, []).append(result)
            rows.setdefault(config.key, []).extend(config_rows)
            if on_result:
                on_result(assembled(runs, rows, sessions, began, model_dir, max_tokens, rounds, config_keys))
    return assembled(runs, rows, sessions, began, model_dir, max_tokens, rounds, config_keys)


def assembled(runs: dict[str, list[dict[str, Any]]], rows: dict[str, list[Row]], sessions: dict[str, list[Request]], began: datetime.datetime,
              model_dir: Path, max_tokens: int | str, rounds: int, config_keys: list[str]) -> dict[str, Any]:
    """The result of the configurations run so far: each one's first round, with what compares it to others."""
    first = {key: config_runs[0] for key, config_runs in runs.items()}
    for key, config_runs in runs.items():
        if key != ALONE and ALONE in rows:
            first[key]["paired_against_alone"] = {
                "warm_ttft": paired_ratio(rows[key], rows[ALONE], "ttft_s")["all"],
                "warm_turn": paired_ratio(rows[key], rows[ALONE], "total_s")["all"],
            }
        first[key]["rounds"] = [{k: run_result[k] for k in ("tokens_prefilled", "requests_lost", "balance", "warm_ttft_median_s")} for run_result in config_runs]
    if "failover-haproxy" in first:
        first["failover-haproxy"]["moved"]["against_undisturbed"] = compare_moved(first["failover-haproxy"], rows, "key-haproxy")
    users = len(sessions)
    return {
        "generated_at": began.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": {"cpu": cpu_description(), "platform": platform.platform()},
        "model": model_description(model_dir),
        "team": {"users": users, "requests_per_user": {user: len(requests) for user, requests in sessions.items()},
                 "session_requests": [request.index for request in next(iter(sessions.values()))], "scale": SCALE,
                 "max_tokens": max_tokens, "key_header": KEY_HEADER, "health_interval_s": HEALTH_INTERVAL_S, "kill_at": KILL_AT, "restart_at": RESTART_AT,
                 "rounds": rounds, "order": config_keys},
        "configurations": first,
        "key_decision": key_decision(first, rows),
        "targets": targets(first, users),
        "rows": dict(rows),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.team", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_LIMIT} requests per user, configurations {QUICK_CONFIGS} -> {QUICK_OUT}")
    parser.add_argument("--configs", help=f"comma-separated keys (default {DEFAULT_CONFIGS})")
    parser.add_argument("--users", type=int, default=DEFAULT_USERS, help="K, the users replayed at once (default %(default)s)")
    parser.add_argument("--limit", type=int, help=f"requests per user (default all {len(SESSION_REQUESTS)}; --quick {QUICK_LIMIT})")
    parser.add_argument("--rounds", type=int, default=1, help="1: each configuration once; 2: the order, then reversed (default %(default)s)")
    parser.add_argument("--balance-factor", type=int, default=BOUNDED_LOAD_FACTOR,
                        help="HAProxy's hash-balance-factor in key-haproxy-bounded, percent of the average load (default %(default)s)")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, help=f"results folder (default {DEFAULT_OUT}; --quick {QUICK_OUT})")
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS, help="the servers' logs (default %(default)s)")
    args = parser.parse_args(argv)
    if args.users < 1:
        parser.error(f"--users {args.users}: at least one user")
    return args


def main(argv: list[str] | None = None) -> int:
    from stable_prefix.bench.measure import team_report

    args = parse_args(argv)
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    keys = (args.configs or (QUICK_CONFIGS if args.quick else DEFAULT_CONFIGS)).split(",")
    for key in keys:
        configuration(key)  # an unknown key fails before anything starts
    limit = args.limit or (QUICK_LIMIT if args.quick else None)
    with stop_servers_on_sigterm():
        # The report so far is written after each configuration: a run stopped early keeps what it measured.
        result = run(keys, args.users, limit, args.model, args.logs, rounds=args.rounds, on_result=lambda partial: team_report.write(partial, out),
                     balance_factor=args.balance_factor)
    for path in team_report.write(result, out):
        print(f"wrote {path}")
    print(team_report.markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
