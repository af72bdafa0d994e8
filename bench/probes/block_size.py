"""Which KV block size: restore speed, files per lane, and what blocks cost in writes and RAM, per size.

    python -m stable_prefix.bench.probes.block_size [--out bench/results/block_size] [--quick]

In process, through the cache's own code (RamTier, DiskTier, TieredCache), with a synthetic model
(mlx-lm's KVCache layers, random keys and values for each new token: no weights, no forward pass):

1. Speed at a real KV shape (Qwen3-Coder-30B-A3B: 48 layers x 4 KV heads x 128 x fp16 = 96 KiB per token).
   A lane of 8,192 tokens is stored (copied into blocks), restored from RAM into a live cache whose
   next 2,048-token prefill chunk is written (what a warm turn does first), written to disk and loaded
   back from the page cache. Against the whole-lane snapshot of the code before blocks (shared with the
   finished request's buffer, restored as a view that the first chunk copies), and one block per lane
   (a lane's disk files as before: one). Sizes interleaved, medians of the repeats; each restore and
   load timed on its second run (the first warms MLX's allocator, as in a running server).
2. A long session at a tiny KV shape (ratios depend on token counts only): a system + tools head, one
   main conversation of TURNS turns (replies 50-400 tokens, tool results 100-4,000, log-uniform, seeded;
   each reply re-rendered by the next prompt with its last token changed), three Explore subagents
   sharing the head, a fork carrying the main conversation, a title request per conversation. Per size:
   disk bytes written over the new token states' bytes (the manifests' share apart: at this tiny shape a
   block key weighs as much as a few tokens' KV), RAM held over the unique tokens' bytes, files on disk
   per lane, tokens held unused in partly used blocks.

Timings on a shared CPU are noisy; the token-count figures are exact.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from stable_prefix.engine_patch.cache import cache_layers
from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.disk.disk_tier import DiskTier
from stable_prefix.engine_patch.disk.model_identity import ModelIdentity
from stable_prefix.engine_patch.disk.tiered_cache import TieredCache

SIZES = (64, 128, 256, 512)
REAL_SHAPE = {"layers": 48, "kv_heads": 4, "head_dim": 128}  # Qwen3-Coder-30B-A3B, fp16
TINY_SHAPE = {"layers": 2, "kv_heads": 1, "head_dim": 32}
FIRST_CHUNK = 2048
WHOLE_LANE = 2**30  # one block per lane: a lane's disk files as before blocks (one file), for comparison
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "block_size"


@dataclass
class SyntheticModel:
    """Stands for a model: mlx-lm's KVCache layers, random keys and values for every new token."""

    layers: int
    kv_heads: int
    head_dim: int
    _drawn: dict[int, mx.array] = field(default_factory=dict)

    @property
    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 2

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in range(self.layers)]

    def feed(self, cache: list[KVCache], count: int) -> None:
        """Append `count` tokens' keys and values to every layer, evaluated (a prefill step's effect on the cache).

        The values are drawn once per count (drawing them is slower than what is measured)."""
        if count <= 0:
            return
        if count not in self._drawn:
            self._drawn[count] = mx.random.normal((1, self.kv_heads, count, self.head_dim)).astype(mx.float16)
            mx.eval(self._drawn[count])
        for layer in cache:
            layer.update_and_fetch(self._drawn[count], self._drawn[count])
        mx.eval([part for layer in cache for part in (layer.keys, layer.values)])


def tier_for(model: SyntheticModel, directory: Path) -> DiskTier:
    tier = DiskTier(directory, budget_bytes=2**40, free_space=lambda path: (2**50, 2**51))
    tier.bind(model, ModelIdentity("b" * 64, {"synthetic": "block size bench"}))
    return tier


# --- 1. speed at a real shape -------------------------------------------------------------


def timed(function) -> tuple[float, Any]:
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def steady(function) -> float:
    """The time of `function`'s second run (the first one warms MLX's allocator, as a running server has it)."""
    function()
    gc.collect()
    return timed(function)[0]


def before_blocks(model: SyntheticModel, live: list[KVCache], tokens: int) -> dict[str, float]:
    """The code before blocks: the entry shared the finished request's buffers (no copy to store); a
    restore was a view of them, which the first prefill chunk copied into a new buffer."""

    def restore_and_first_chunk():
        model.feed(cache_layers.restore(live), FIRST_CHUNK)

    return {"store_s": 0.0, "restore_s": steady(restore_and_first_chunk)}


def with_blocks(model: SyntheticModel, live: list[KVCache], tokens: int, size: int, directory: Path) -> dict[str, float]:
    ids = np.arange(tokens, dtype=np.int64) % 151_643
    ram = RamTier(budget_bytes=2**40, block_tokens=size)
    store_s, _ = timed(lambda: ram.store(ids.tolist(), live))

    def restore_and_first_chunk():
        fetched = ram.fetch(model, [*ids.tolist(), *range(FIRST_CHUNK)])
        assert fetched.reused == tokens
        model.feed(fetched.prompt_cache, FIRST_CHUNK)

    restore_s = steady(restore_and_first_chunk)
    tier = tier_for(model, directory)
    tier.submit(model, ram.newest_entry())
    assert tier.flush(timeout=600) and tier.counters.writes == 1, tier.counters.last_error
    match = tier.longest_restorable_prefix(model, np.append(ids, 0), positional=False)
    load_s = steady(lambda: tier.load(match))
    files = sum(1 for path in directory.rglob("*.kv*") if not path.name.startswith("."))
    result = {"store_s": store_s, "restore_s": restore_s, "write_s": tier.counters.write_seconds, "load_s": load_s,
              "files": files, "bytes_written": tier.counters.bytes_written}
    tier.close()
    return result


def speed(lane_tokens: int, repeats: int) -> dict[str, Any]:
    model = SyntheticModel(**REAL_SHAPE)
    mx.random.seed(0)
    live = model.make_cache()
    model.feed(live, lane_tokens)
    runs: dict[str, list[dict[str, float]]] = {"before blocks": [], **{str(size): [] for size in (*SIZES, WHOLE_LANE)}}
    for repeat in range(repeats):
        order = list(runs) if repeat % 2 == 0 else list(reversed(runs))
        for name in order:
            with tempfile.TemporaryDirectory() as directory:
                runs[name].append(before_blocks(model, live, lane_tokens) if name == "before blocks"
                                  else with_blocks(model, live, lane_tokens, int(name), Path(directory) / "kv"))
            gc.collect()
            print(f"  {name}: {runs[name][-1]}", flush=True)
    lane_bytes = lane_tokens * model.bytes_per_token
    table = {}
    for name, results in runs.items():
        median = {key: statistics.median(result[key] for result in results) for key in results[0]}
        table[name] = {**median, "restore_gb_per_s": lane_bytes / median["restore_s"] / 1e9,
                       **({"load_gb_per_s": median["bytes_written"] / median["load_s"] / 1e9,
                           "write_gb_per_s": median["bytes_written"] / median["write_s"] / 1e9} if "load_s" in median else {})}
    return {"shape": REAL_SHAPE, "bytes_per_token": model.bytes_per_token, "lane_tokens": lane_tokens, "repeats": repeats, "sizes": table}


# --- 2. a long session at a tiny shape -----------------------------------------------------------


class Session:
    """Requests through a RAM cache over a disk tier, counting the token states each one computes."""

    def __init__(self, model: SyntheticModel, size: int, directory: Path):
        self.model = model
        self.tier = tier_for(model, directory)
        self.cache = TieredCache(RamTier(budget_bytes=2**40, block_tokens=size), self.tier)
        self.new_states = 0
        self.lanes: dict[str, list[int]] = {}

    def request(self, lane: str, prompt: list[int], reply: list[int]) -> None:
        fetched = self.cache.fetch(self.model, prompt)
        live = fetched.prompt_cache
        # The prompt's rest is prefilled; every generated token but the last is fed back.
        self.model.feed(live, len(prompt) - fetched.reused + len(reply) - 1)
        self.new_states += len(prompt) - fetched.reused + len(reply) - 1
        self.cache.store(prompt + reply, live, len(prompt), model=self.model)
        assert self.tier.flush(timeout=600)  # every write lands: the figure is what a turn writes, not what a slow disk drops
        self.lanes[lane] = prompt + reply[:-1]


def log_uniform(rng: np.random.Generator, low: int, high: int) -> int:
    return int(np.exp(rng.uniform(np.log(low), np.log(high))))


def long_session(size: int, turns: int, head_tokens: int, directory: Path, seed: int = 3) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    model = SyntheticModel(**TINY_SHAPE)
    session = Session(model, size, directory)

    def text(count: int) -> list[int]:
        return rng.integers(0, 150_000, count).tolist()

    def reply() -> list[int]:
        return text(log_uniform(rng, 50, 400))

    head = text(head_tokens)
    session.request("title", text(200), text(12))
    main = head + text(300)
    for turn in range(turns):
        answer = reply()
        session.request("main", main, answer)
        # The next prompt renders the reply again (its last token differently) and adds a tool result.
        main = main + answer[:-1] + text(1) + text(log_uniform(rng, 100, 4000))
        if turn == turns // 3:  # three Explore subagents started together, each its own task, three turns each
            for instance in range(3):
                explore = head + text(400)
                for _ in range(3):
                    answer = reply()
                    session.request(f"explore-{instance}", explore, answer)
                    explore = explore + answer[:-1] + text(1) + text(log_uniform(rng, 100, 2000))
        if turn == turns // 2:  # a fork carrying the whole main conversation, then its own two turns
            fork = main + text(80)
            for _ in range(2):
                answer = reply()
                session.request("fork", fork, answer)
                fork = fork + answer[:-1] + text(1) + text(log_uniform(rng, 100, 2000))
    stats = session.cache.stats()
    unique_tokens = trie_size(list(session.lanes.values()))
    held_tokens = sum(len(entry.tokens) for entry in session.cache.ram.entries.values())
    unused = stats["block_tokens"] - trie_size([entry.tokens.tolist() for entry in session.cache.ram.entries.values()])
    main_entry = max(session.cache.ram.entries.values(), key=lambda entry: len(entry.tokens))
    result = {
        "turns": turns,
        "main_lane_tokens": len(main_entry.tokens),
        "requests": stats["hits"] + stats["misses"],
        "new_token_states": session.new_states,
        "disk_bytes_written": stats["disk_bytes_written"],
        "written_over_new": stats["disk_bytes_written"] / (session.new_states * model.bytes_per_token),
        "block_bytes_written_over_new": stats["disk_block_bytes_written"] / (session.new_states * model.bytes_per_token),
        "manifests_over_new": (stats["disk_bytes_written"] - stats["disk_block_bytes_written"]) / (session.new_states * model.bytes_per_token),
        "manifest_bytes_written": stats["disk_bytes_written"] - stats["disk_block_bytes_written"] - stats["disk_state_bytes_written"],
        "ram_bytes": stats["bytes"],
        "ram_over_unique": stats["bytes"] / (unique_tokens * model.bytes_per_token),
        "entry_tokens_over_unique": held_tokens / unique_tokens,
        "unused_block_tokens": unused,
        "files_main_lane": len({ref.block.key for ref in main_entry.blocks}) + 1,
        "disk_blocks": stats["disk_blocks"],
        "disk_files": sum(1 for path in directory.rglob("*.kv*") if not path.name.startswith(".")),
    }
    session.tier.close()
    return result


def trie_size(sequences: list[list[int]]) -> int:
    """Distinct prefixes of `sequences` (the token states a cache holding all of them needs once)."""
    seen: set[tuple[int, int]] = set()
    nodes = {(): 0}
    count = 0
    for sequence in sequences:
        node = 0
        for token in sequence:
            key = (node, token)
            if key not in seen:
                seen.add(key)
                count += 1
                nodes[key] = count
            node = nodes[key]
    return count


# --- the report ----------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    speed_part, sessions = result["speed"], result["sessions"]
    lane_mib = speed_part["lane_tokens"] * speed_part["bytes_per_token"] / 2**20
    lines = [f"# Block size ({result['when']})", "",
             f"Speed: a {speed_part['lane_tokens']:,}-token lane at {speed_part['bytes_per_token'] // 1024} KiB per token "
             f"({lane_mib:,.0f} MiB, Qwen3-Coder-30B-A3B's KV shape), median of {speed_part['repeats']}; "
             f"restore = from RAM into a live cache plus its first {FIRST_CHUNK:,}-token chunk written.", "",
             "| block tokens | store (copy into blocks) s | restore s | restore GB/s | disk write GB/s | disk load GB/s (page cache) | files per lane |",
             "|---|---|---|---|---|---|---|"]
    for name, row in speed_part["sizes"].items():
        disk = (f"{row['write_gb_per_s']:.2f} | {row['load_gb_per_s']:.2f} | {row['files']:.0f}" if "load_s" in row else "- | - | -")
        label = "one block per lane (a lane in one file, as before blocks)" if name == str(WHOLE_LANE) else name
        lines.append(f"| {label} | {row['store_s']:.3f} | {row['restore_s']:.3f} | {row['restore_gb_per_s']:.2f} | {disk} |")
    first = next(iter(sessions.values()))
    lines += ["", f"Long session: {first['requests']} requests, a main conversation of {first['turns']} turns growing to "
              f"{first['main_lane_tokens']:,} tokens, three Explore subagents and a fork sharing its head "
              "(token counts exact, any KV shape).", "",
              "| block tokens | disk written / new token states | of which manifests | RAM held / unique tokens | unused tokens in partly used blocks | files for the main lane | block files on disk |",
              "|---|---|---|---|---|---|---|"]
    for size, row in sessions.items():
        lines.append(f"| {size} | {row['written_over_new']:.3f} | {row['manifests_over_new']:.3f} | {row['ram_over_unique']:.3f} | "
                     f"{row['unused_block_tokens']:,} | {row['files_main_lane']:,} | {row['disk_blocks']:,} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="a 2,048-token lane, 30 turns, one repeat")
    args = parser.parse_args(argv)
    lane_tokens, repeats, turns, head = (2048, 1, 30, 5000) if args.quick else (8192, 3, 120, 20_000)
    print(f"speed: a {lane_tokens:,}-token lane, {repeats} repeats", flush=True)
    result: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "speed": speed(lane_tokens, repeats), "sessions": {}}
    for size in SIZES:
        with tempfile.TemporaryDirectory() as directory:
            result["sessions"][str(size)] = long_session(size, turns, head, Path(directory) / "kv")
        print(f"session, {size}-token blocks: {result['sessions'][str(size)]}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "block_size.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "block_size.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
