"""vLLM for a team: tokens two replicas prefill for a Claude Code-shaped session, from vLLM's own counters.

    python -m stable_prefix.bench.servers_vllm [--scale 0.1] [--out bench/results/servers]   (needs `make vllm routers`)

The session's first conversation (`workload/session.py`, 2.1.332's shape: main turns, a title, three Explore instances
at once, a general-purpose subagent), sent request by request, in the same run to:

  straight     one replica, without the proxy (what a vLLM user runs today)
  one          one replica through the proxy (`up --server vllm`)
  key          two replicas behind vllm-router, its consistent hash on our key (`up --upstream`, the team options)
  round_robin  the same two, vllm-router's round robin
  prefix       the same two, vllm-router's own cache-aware policy (its prompt-text tree)

Every replica is `up --server vllm`'s command (`model_servers/vllm.py`); between configurations each replica's prefix
cache is emptied (`/reset_prefix_cache`, vLLM's dev mode). What a configuration prefilled is, summed over its
replicas, `vllm:prompt_tokens_total` less `vllm:prefix_cache_hits_total`: vLLM's figures, not ours. Which replica served
a request is the one whose prompt counter moved.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import requests

from stable_prefix import routers
from stable_prefix.bench.measure.vllm_team_report import write_report
from stable_prefix.bench.workload.session import Request, generate_session
from stable_prefix.model_servers import vllm
from stable_prefix.servers import REPO_ROOT, Server, free_port, http_ok, mitmdump_command, running
from stable_prefix.stack import TEAM_PROXY_OPTIONS, StackOptions

SERVED_MODEL = "tiny"
MODEL = REPO_ROOT / "build" / "tiny-model-test"
# Each replica's KV pool: ~4M tokens of the tiny model, and 1 GiB of host memory (two replicas on a shared CI machine).
REPLICA_KV_BYTES = "1G"
# The session's replies are its own (a replay); a few tokens of decoding answer each request.
REPLY_TOKENS = 8
DEFAULT_SCALE = 0.1
STARTUP_TIMEOUT_S = 900.0
CONFIGURATIONS = ("straight", "one", "key", "round_robin", "prefix")
COUNTERS = ("prompt_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total")
_COUNTER = re.compile(r"^vllm:(\w+)\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


# --- replicas ---------------------------------------------------------------------------------------


def replica_command(port: int, model: Path = MODEL, *flags: str) -> list[str]:
    """`up --server vllm MODEL`'s server command, served as SERVED_MODEL, its KV pool REPLICA_KV_BYTES."""
    options = StackOptions(model=str(model), served_model_name=SERVED_MODEL,
                           engine_args=("--kv-cache-memory-bytes", REPLICA_KV_BYTES, *flags))
    return vllm.SERVER.command(options, port)


@contextlib.contextmanager
def running_replicas(count: int, log_dir: Path, model: Path = MODEL, env: dict[str, str] | None = None,
                     flags: Sequence[str] = ()) -> Iterator[list[Server]]:
    """`count` vLLM replicas, started at once (each loads for about a minute on a CPU), stopped on exit."""
    # vLLM's CPU build binds its worker to the first cores it finds: every replica on one machine would share core 0.
    # And it sends usage statistics home unless told not to.
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_NO_USAGE_STATS": "1", **(env or {})}
    with contextlib.ExitStack() as stack:
        starts = []
        for index in range(count):
            port = free_port()
            starts.append(running(f"vllm-{chr(ord('a') + index)}", replica_command(port, model, *flags), port=port, log_dir=log_dir,
                                  ready=lambda port=port: http_ok(f"http://127.0.0.1:{port}{vllm.SERVER.ready_path}"),
                                  startup_timeout=STARTUP_TIMEOUT_S, env=env))
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(start.__enter__) for start in starts]
        failures = []
        for start, future in zip(starts, futures, strict=True):
            if future.exception() is None:
                stack.push(start.__exit__)
            else:
                failures.append(future.exception())
        if failures:
            raise failures[0]
        yield [future.result() for future in futures]


def counters(url: str) -> dict[str, float]:
    """vLLM's prefix cache counters on `url`/metrics (summed over its engines)."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    found = dict.fromkeys(COUNTERS, 0.0)
    for name, value in _COUNTER.findall(text):
        if name in found:
            found[name] += float(value)
    return found


def prefilled(before: dict[str, float], after: dict[str, float]) -> int:
    """Prompt tokens the replica computed between two readings: its prompt tokens less its prefix cache hits."""
    return round((after["prompt_tokens_total"] - before["prompt_tokens_total"]) - (after["prefix_cache_hits_total"] - before["prefix_cache_hits_total"]))


def reset_prefix_cache(url: str) -> None:
    requests.post(f"{url}/reset_prefix_cache", timeout=60).raise_for_status()


# --- a configuration ----------------------------------------------------------------------------------


@contextlib.contextmanager
def proxy(upstream: str, log_dir: Path, options: dict[str, object]) -> Iterator[Server]:
    port = free_port()
    settings = {"upstream_model": SERVED_MODEL, "max_tokens_cap": REPLY_TOKENS, **options}
    with running("proxy", mitmdump_command(["addons/strip_billing.py"], upstream, port, settings), port=port, log_dir=log_dir) as server:
        yield server


def first_conversation(scale: float) -> list[Request]:
    return [request for request in generate_session(scale=scale) if request.conversation == 0]


def send(url: str, request: Request, straight: bool) -> int:
    body = {**request.body, "stream": False, "max_tokens": REPLY_TOKENS}
    if straight:  # the proxy names the served model; straight, the client must
        body["model"] = SERVED_MODEL
    return requests.post(f"{url}/v1/messages", json=body, headers=request.headers, timeout=600).status_code


def replay(url: str, session: list[Request], replicas: list[Server], straight: bool = False) -> list[dict[str, Any]]:
    """Each request in turn; per request: its lane, status, the replica that served it, what that replica prefilled."""
    rows = []
    for request in session:
        before = [counters(replica.url) for replica in replicas]
        status = send(url, request, straight)
        after = [counters(replica.url) for replica in replicas]
        moved = [index for index in range(len(replicas)) if after[index]["prompt_tokens_total"] > before[index]["prompt_tokens_total"]]
        rows.append({"index": request.index, "lane": request.lane, "status": status, "replica": moved[0] if len(moved) == 1 else None,
                     "prompt_tokens": round(sum(a["prompt_tokens_total"] - b["prompt_tokens_total"] for a, b in zip(after, before, strict=True))),
                     "prefilled": sum(prefilled(b, a) for a, b in zip(after, before, strict=True))})
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    lanes: dict[str, set] = {}
    for row in rows:
        lanes.setdefault(row["lane"], set()).add(row["replica"])
    return {"requests": len(rows), "failed": sum(row["status"] != 200 for row in rows),
            "prompt_tokens": sum(row["prompt_tokens"] for row in rows), "prefilled": sum(row["prefilled"] for row in rows),
            "lanes": len(lanes), "lanes_on_one_replica": sum(len(places) == 1 and None not in places for places in lanes.values()),
            "requests_per_replica": [sum(row["replica"] == index for row in rows) for index in range(2)]}


def run_configuration(name: str, session: list[Request], replicas: list[Server], log_dir: Path) -> dict[str, Any]:
    for replica in replicas:
        reset_prefix_cache(replica.url)
    if name == "straight":
        rows = replay(replicas[0].url, session, replicas, straight=True)
    elif name == "one":
        with proxy(replicas[0].url, log_dir, {}) as door:
            rows = replay(door.url, session, replicas)
    else:
        with (routers.running_router("vllm-router", [replica.url for replica in replicas], policy=name, log_dir=log_dir) as router,
              proxy(router.url, log_dir, TEAM_PROXY_OPTIONS) as door):
            rows = replay(door.url, session, replicas)
    return {**summary(rows), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.servers_vllm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=DEFAULT_SCALE, help=f"the session's size (1.0: full size; default {DEFAULT_SCALE})")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "servers")
    parser.add_argument("--log-dir", type=Path, default=REPO_ROOT / "build" / "bench-servers-vllm")
    args = parser.parse_args(argv)
    session = first_conversation(args.scale)
    started = time.monotonic()
    # Dev mode: /reset_prefix_cache, so each configuration starts on empty caches.
    with running_replicas(2, args.log_dir, env={"VLLM_SERVER_DEV_MODE": "1"}) as replicas:
        results = {}
        for name in CONFIGURATIONS:
            results[name] = run_configuration(name, session, replicas, args.log_dir)
            print(f"{name}: prefilled {results[name]['prefilled']:,} of {results[name]['prompt_tokens']:,} prompt tokens, "
                  f"{results[name]['failed']} failed, {results[name]['lanes_on_one_replica']}/{results[name]['lanes']} lanes on one replica", flush=True)
    result = {"vllm": f"vllm-cpu {vllm.VLLM_CPU_VERSION}", "vllm_router": routers.VLLM_ROUTER_VERSION, "model": str(MODEL.relative_to(REPO_ROOT)),
              "scale": args.scale, "requests": len(session), "seconds": round(time.monotonic() - started), "configurations": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vllm.json").write_text(json.dumps(result, indent=1) + "\n")
    write_report(result, args.out / "vllm.md")
    print(f"wrote {args.out / 'vllm.json'} and {args.out / 'vllm.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
