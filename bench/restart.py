"""`make bench`, restart scenario: a restarted engine starts warm from its disk snapshots.

    python -m stable_prefix.bench.restart            # -> bench/results/restart.{json,md}
    python -m stable_prefix.bench.restart --quick    # smaller session, 0.25 GiB state -> build/bench-quick/

1. First life: the product (patched engine with a fresh `--prefix-cache-dir`,
   behind the addon) replays the first requests of the session's first
   conversation. Once its snapshots are on disk, the engine is killed (SIGKILL).
2. Restored: a new engine on the same directory gets the first requests of the
   session's second conversation (a new conversation: same system + tools,
   another git status), with no warm-up: what a user's first requests after a
   restart see.
3. Cold: the same requests on a new engine with an empty directory.
The anchor, vllm-mlx `--continuous-batching` as shipped behind the addon, keeps
its prefix cache in `~/.cache/vllm-mlx` and writes it only on a clean shutdown:
it gets the same scenario with a clean shutdown (SIGTERM) instead of SIGKILL,
and HOME is a fresh folder for each of its lives, so nothing carries over from
other runs.

4. Restore throughput: a KV state shaped like Qwen3-Coder-30B-A3B's (48 layers x
   4 KV heads x head dim 128, fp16: 96 KiB per token) of at least 1 GiB is
   snapshotted, written and loaded through the disk tier's own code (the RAM
   snapshot, `DiskTier.submit` and its writer, `longest_restorable_prefix`, `load`: header,
   `mx.load`, a CRC-32 per tensor, layers rebuilt), from the page cache and from
   the device (the file's pages dropped first with posix_fadvise).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stable_prefix.bench.clients.replay import LogFollower, Measured, cache_stats
from stable_prefix.bench.clients.stack import BATCHED_ANCHOR, PRODUCT, Configuration, cpu_description, started
from stable_prefix.bench.measure.restart_report import markdown
from stable_prefix.bench.run import model_description
from stable_prefix.bench.workload.session import MAIN_LANE, Request, generate_session
from stable_prefix.servers import REPO_ROOT

DEFAULT_MODEL = REPO_ROOT / "build" / "tiny-model"
FULL_SCALE, QUICK_SCALE = 0.2, 0.04
ANCHOR = dataclasses.replace(
    BATCHED_ANCHOR, key="batched+addon", title="vllm-mlx 0.6.0 --continuous-batching as shipped, behind the addon (saves its cache on a clean shutdown)"
)
# What a restart costs shows in the first token: replies stay short here (bench.run measures whole turns).
MAX_TOKENS = 8
# Qwen3-Coder-30B-A3B's KV layout: the projection in the issue and the README is for it.
QWEN3_CODER_30B = {"layers": 48, "kv_heads": 4, "head_dim": 128, "dtype_bytes": 2}
PROJECTED_PREFIX_TOKENS = 20_000
# A Mac's internal SSD reads 3-7 GB/s sequentially (base models less): 3 GB/s is the assumption.
ASSUMED_MAC_SSD_GB_PER_S = 3.0


SCENARIOS = {
    "resume": "the interrupted conversation's next requests",
    "new_conversation": "a new conversation's first requests (same system + tools, another git status)",
}


@dataclass(frozen=True)
class Contender:
    """A configuration and how it keeps state across a restart."""

    config: Configuration
    shutdown: str  # how its first life ends
    state: str  # "disk-dir": --prefix-cache-dir STATE; "home": HOME=STATE (vllm-mlx's ~/.cache)

    def start(self, model_dir: Path, log_dir: Path, state: Path):
        if self.state == "disk-dir":
            return started(self.config, model_dir, log_dir, engine_flags=["--prefix-cache-dir", str(state)])
        return started(self.config, model_dir, log_dir, engine_env={"HOME": str(state)})


PRODUCT_CONTENDER = Contender(PRODUCT, "SIGKILL once its snapshots are on disk", "disk-dir")
ANCHOR_CONTENDER = Contender(ANCHOR, "SIGTERM (a clean shutdown: it saves its cache then)", "home")


def scenario_requests(requests: list[Request], before: int, after: int) -> tuple[list[Request], dict[str, list[Request]]]:
    """The first conversation up to the restart, and what each scenario sends after it.

    The restart falls before the first main-lane request at or after `before`,
    so the resumed conversation starts with the main agent's next turn (the
    figure the scenario is about) and no fan-out group is cut in two.
    """
    first = [request for request in requests if request.conversation == 0]
    second = [request for request in requests if request.conversation == 1]
    while before < len(first) and first[before].lane != "main":
        before += 1
    return first[:before], {"resume": first[before : before + min(after, 2)], "new_conversation": second[:after]}


def wait_for_disk_writes(server_url: str, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stats = cache_stats(server_url) or {}
        if stats.get("disk_writes_pending") == 0:
            return stats
        if time.monotonic() > deadline:
            raise TimeoutError(f"{server_url}: snapshot writes still pending after {timeout:.0f}s")
        time.sleep(0.2)


def stats_change(before: dict | None, after: dict | None, key: str) -> float | None:
    return None if before is None or after is None or key not in after else after[key] - before[key]


# vllm-mlx --continuous-batching reports reuse only in its log.
_BATCHED_FETCH = re.compile(r"\[cache_fetch\] request=\S+ (HIT|MISS) prompt_tokens=(\d+)(?: cached=(\d+))?")


def batched_reuse(lines: list[str]) -> tuple[int, int] | None:
    """(prompt tokens, reused tokens) from the batched engine's `[cache_fetch]` line, if one was logged."""
    for line in lines:
        if fetch := _BATCHED_FETCH.search(line):
            return int(fetch[2]), int(fetch[3] or 0)
    return None


def measured_row(result: Measured, before: dict | None, after: dict | None, log_lines: list[str]) -> dict[str, Any]:
    prompt, reused, source = result.prompt_tokens, result.reused_tokens, result.reuse_source
    if prompt is None:  # no usage, stats or SimpleEngine log line: the replay's "0 reused" is a guess
        figures = batched_reuse(log_lines)
        prompt, reused = figures or (None, None)
        source = "server-log" if figures else None
    return {
        "index": result.request.index,
        "lane": result.request.lane,
        "prompt_tokens": prompt,
        "reused_tokens": reused,
        "reuse_source": source,
        "tokens_from_disk": stats_change(before, after, "disk_tokens_loaded"),
        "disk_load_s": stats_change(before, after, "disk_load_seconds"),
        "ttft_s": result.reply.ttft_s,
        "total_s": result.reply.total_s,
        "status": result.reply.status,
        "error": result.reply.error,
    }


def replay_measuring_disk(endpoints, requests: list[Request], label: str) -> list[dict[str, Any]]:
    rows = []
    log = LogFollower(endpoints.server_log)
    for request in requests:
        before = cache_stats(endpoints.server_url)
        (result,) = endpoints.replay([request], max_tokens=MAX_TOKENS)
        row = measured_row(result, before, cache_stats(endpoints.server_url), log.new_lines())
        rows.append(row)
        reused = "?" if row["reused_tokens"] is None else f"{row['reused_tokens']:,}"
        from_disk = "-" if row["tokens_from_disk"] is None else f"{row['tokens_from_disk']:,}"
        print(f"  {label:<26} #{row['index']:<3} {row['lane']:<20} prompt {row['prompt_tokens'] or 0:>7,} reused {reused:>7}"
              f" from disk {from_disk:>7}  TTFT {row['ttft_s'] or 0:6.2f} s", flush=True)
    return rows


def lives(contender: Contender, model_dir: Path, log_dir: Path, before: list[Request], scenarios: dict[str, list[Request]]) -> dict[str, Any]:
    """First life, then for each scenario a restored life (a copy of the state the first one
    left) and a cold life (empty state), each getting the scenario's requests first."""
    key = contender.config.key
    with tempfile.TemporaryDirectory(prefix="restart-") as root:
        first = Path(root) / "first-life"
        first.mkdir()
        print(f"{key}: first life, {len(before)} requests, then {contender.shutdown}", flush=True)
        with contender.start(model_dir, log_dir, first) as endpoints:
            replay_measuring_disk(endpoints, before, "first life")
            first_log = endpoints.server_log
            if contender.state == "disk-dir":
                stats = wait_for_disk_writes(endpoints.server_url)
                os.killpg(endpoints.engine.process.pid, signal.SIGKILL)
                endpoints.engine.process.wait(timeout=30)
        kept = sum(path.stat().st_size for path in first.rglob("*") if path.is_file())
        result: dict[str, Any] = {"key": key, "title": contender.config.title, "shutdown": contender.shutdown, "state_bytes": kept}
        if contender.state == "disk-dir":
            result["snapshots_on_disk"] = stats["disk_model_entries"]
        else:
            result["saved_on_shutdown"] = "Saved prefix cache" in first_log.read_text(errors="replace")
        for name, requests in scenarios.items():
            restored_state, cold_state = Path(root) / f"{name}-restored", Path(root) / f"{name}-cold"
            shutil.copytree(first, restored_state, symlinks=True)
            cold_state.mkdir()
            with contender.start(model_dir, log_dir, restored_state) as endpoints:
                restored = replay_measuring_disk(endpoints, requests, f"{name}, restored")
            with contender.start(model_dir, log_dir, cold_state) as endpoints:
                cold = replay_measuring_disk(endpoints, requests, f"{name}, cold")
            result[name] = {"restored": restored, "cold": cold}
    return result


def reusable_at_best(before: list[Request], scenarios: dict[str, list[Request]], model_dir: Path) -> dict[int, int]:
    """For each request after the restart: the longest token prefix it shares with any earlier
    request (before the restart, or earlier after it), as the addon forwards them, capped at its
    length - 1: what an ideal cache that survives restarts could reuse."""
    import numpy as np

    from stable_prefix.bench.clients.stack import SERVED_MODEL_NAME, TOOL_CALL_PARSER
    from stable_prefix.bench.run import as_received
    from stable_prefix.bench.workload.prompt_tokens import PromptRenderer
    from stable_prefix.engine_patch.cache.prefix_index import common_prefix_length

    renderer = PromptRenderer(model_dir, SERVED_MODEL_NAME, TOOL_CALL_PARSER)

    def token_ids(request: Request) -> np.ndarray:
        return np.asarray(renderer.token_ids(as_received(request.body, True)))

    before_ids = [token_ids(request) for request in before]
    best = {}
    for requests in scenarios.values():
        earlier = list(before_ids)
        for request in requests:
            prompt = token_ids(request)
            best[request.index] = min(len(prompt) - 1, max((common_prefix_length(e, prompt) for e in earlier), default=0))
            earlier.append(prompt)
    return best


def _drop_page_cache(path: Path) -> bool:
    if not hasattr(os, "posix_fadvise"):
        return False
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)
    return True


def restore_throughput(directory: Path, gib: float, repeats: int = 3) -> dict[str, Any]:
    """Write and load a Qwen3-Coder-30B-A3B-shaped state of `gib` GiB through the disk tier (its blocks and manifest)."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import KVCache

    from stable_prefix.engine_patch.cache.ram_tier import RamTier
    from stable_prefix.engine_patch.disk.disk_tier import DiskTier
    from stable_prefix.engine_patch.disk.model_identity import ModelIdentity

    shape = QWEN3_CODER_30B
    bytes_per_token = shape["layers"] * 2 * shape["kv_heads"] * shape["head_dim"] * shape["dtype_bytes"]
    tokens = math.ceil(gib * 2**30 / bytes_per_token)
    print(f"restore throughput: {tokens:,} tokens x {bytes_per_token // 1024} KiB = {tokens * bytes_per_token / 2**30:.2f} GiB, Qwen3-Coder-30B-A3B layout", flush=True)
    mx.random.seed(0)
    live = []
    for _ in range(shape["layers"]):  # as a finished request leaves its cache
        layer = KVCache()
        keys = mx.random.normal((1, shape["kv_heads"], tokens, shape["head_dim"])).astype(mx.float16)
        layer.update_and_fetch(keys, keys * 0.5)
        mx.eval(layer.keys, layer.values)
        live.append(layer)
    token_ids = np.arange(tokens, dtype=np.int64) % 151_643
    ram = RamTier(budget_bytes=2 * tokens * bytes_per_token)
    ram.store(token_ids.tolist(), live)  # cut into blocks, as the engine keeps it
    del live
    entry = ram.newest_entry()
    owner = object()  # stands for the model: the state is synthetic, its identity too
    tier = DiskTier(directory, budget_bytes=8 * 2**30)
    tier.bind(owner, ModelIdentity("0" * 64, {"synthetic": "Qwen3-Coder-30B-A3B-shaped KV state"}))
    started_at = time.perf_counter()
    tier.submit(owner, entry)
    submit_s = time.perf_counter() - started_at
    if not tier.flush(timeout=600) or tier.counters.writes != 1:
        raise RuntimeError(f"the {gib} GiB state was not written: {tier.counters.last_error}")
    write_s = tier.counters.write_seconds
    file_bytes = tier.counters.bytes_written
    paths = [p for p in directory.rglob("*.kv*") if not p.name.startswith(".")]
    loads: dict[str, list[float]] = {"page_cache": [], "device": []}
    for source in loads:
        for _ in range(repeats):
            if source == "device" and not all(_drop_page_cache(path) for path in paths):
                break
            match = tier.longest_restorable_prefix(owner, np.append(token_ids, 0), positional=False)
            loaded = tier.load(match)
            if loaded is None:
                raise RuntimeError(f"the state did not load: {tier.counters.last_error}")
            loads[source].append(loaded.seconds)
            if source == "page_cache" and len(loads[source]) == 1:
                exact = all(mx.array_equal(a, b).item() for written, read in zip(entry.blocks, loaded.entry.blocks)
                            for a, b in zip(written.block.arrays[-1], read.block.arrays[-1]))
            del loaded
            gc.collect()
    tier.close()
    best = {source: min(times) if times else None for source, times in loads.items()}
    gb_per_s = {source: None if seconds is None else file_bytes / seconds / 1e9 for source, seconds in best.items()}
    projected_bytes = PROJECTED_PREFIX_TOKENS * bytes_per_token
    pipeline = gb_per_s["page_cache"]
    return {
        "layout": {**shape, "bytes_per_token": bytes_per_token},
        "tokens": tokens,
        "file_bytes": file_bytes,
        "submit_s": submit_s,
        "write_s": write_s,
        "write_gb_per_s": file_bytes / write_s / 1e9,
        "load_s": loads,
        "load_s_best": best,
        "load_gb_per_s": gb_per_s,
        "loaded_state_equals_written": exact,
        "projection": {
            "tokens": PROJECTED_PREFIX_TOKENS,
            "bytes": projected_bytes,
            "assumed_ssd_gb_per_s": ASSUMED_MAC_SSD_GB_PER_S,
            "pipeline_gb_per_s_measured_here": pipeline,
            # An upper bound: the read at the assumed SSD speed, then the whole pipeline again as
            # measured here from the page cache (which includes a copy), with no overlap.
            "seconds": projected_bytes / 1e9 / ASSUMED_MAC_SSD_GB_PER_S + projected_bytes / 1e9 / pipeline,
        },
    }


def headline(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The scenario's first main-lane request: cold vs restored."""
    pairs = [(r, c) for r, c in zip(rows["restored"], rows["cold"]) if r["lane"] == MAIN_LANE]
    if not pairs:
        return None
    restored, cold = pairs[0]
    ratio = None if not restored["ttft_s"] or not cold["ttft_s"] else restored["ttft_s"] / cold["ttft_s"]
    return {"index": restored["index"], "prompt_tokens": restored["prompt_tokens"], "reusable_at_best": restored.get("reusable_at_best"),
            "cold_ttft_s": cold["ttft_s"], "restored_ttft_s": restored["ttft_s"], "restored_over_cold": ratio,
            "restored_reused_tokens": restored["reused_tokens"], "cold_reused_tokens": cold["reused_tokens"],
            "tokens_from_disk": restored["tokens_from_disk"]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.restart", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"scale {QUICK_SCALE}, a 0.25 GiB state, no anchor")
    parser.add_argument("--scale", type=float, help=f"session scale (default {FULL_SCALE})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--before", type=int, default=8, help="requests of the first conversation before the restart (at least: it comes before a main-lane request)")
    parser.add_argument("--after", type=int, default=4, help="requests of the new conversation after it (the resumed one gets 2)")
    parser.add_argument("--state-gib", type=float, help="size of the state for the throughput (default 1.0; 0.25 with --quick; 0: skip)")
    parser.add_argument("--no-anchor", action="store_true", help="skip vllm-mlx --continuous-batching")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, help="output directory (default bench/results, or build/bench-quick with --quick)")
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / "build" / "bench-logs")
    args = parser.parse_args(argv)
    args.scale = args.scale or (QUICK_SCALE if args.quick else FULL_SCALE)
    args.state_gib = args.state_gib if args.state_gib is not None else (0.25 if args.quick else 1.0)
    args.out = args.out or REPO_ROOT / ("build/bench-quick" if args.quick else "bench/results")
    args.no_anchor = args.no_anchor or args.quick
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.model / "config.json").exists():
        raise SystemExit(f"model {args.model}: no config.json; run `make tiny-model` first")
    started_at = time.time()
    before, scenarios = scenario_requests(generate_session(args.seed, args.scale), args.before, args.after)
    contenders = [PRODUCT_CONTENDER] if args.no_anchor else [PRODUCT_CONTENDER, ANCHOR_CONTENDER]
    configurations = [lives(contender, args.model, args.logs, before, scenarios) for contender in contenders]
    best = reusable_at_best(before, scenarios, args.model)
    for config in configurations:
        for name in SCENARIOS:
            for row in config[name]["restored"] + config[name]["cold"]:
                row["reusable_at_best"] = best[row["index"]]
        config["headline"] = {name: headline(config[name]) for name in SCENARIOS}
    throughput = None
    if args.state_gib > 0:
        with tempfile.TemporaryDirectory(prefix="restore-throughput-", dir=REPO_ROOT / "build") as directory:
            throughput = restore_throughput(Path(directory) / "kv", args.state_gib)
    result = {
        "schema": 1,
        "generated_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started_at)),
        "duration_s": round(time.time() - started_at, 1),
        "command": shlex.join(["python", "-m", "stable_prefix.bench.restart", *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{cpu_description()}, {platform.system()}",
        "model": str(args.model.relative_to(REPO_ROOT) if args.model.is_relative_to(REPO_ROOT) else args.model),
        "model_description": model_description(args.model)["description"],
        "scale": args.scale,
        "requests_before": len(before),
        "scenarios": {name: {"what": SCENARIOS[name], "requests": [request.index for request in requests]} for name, requests in scenarios.items()},
        "configurations": configurations,
        "throughput": throughput,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "restart.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "restart.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {args.out / 'restart.json'} and {args.out / 'restart.md'} in {result['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
