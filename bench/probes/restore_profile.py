"""Where a RAM restore's time goes, against a memcpy of the same bytes, and what the hot lane kept live saves.

One lane of `--tokens` tokens at Qwen3-Coder-30B-A3B's KV shape (48 layers x 4 KV heads x 128, fp16: 96 KiB
per token; random values) is stored in a `RamTier` through its own code; then, round after round:

- `restore`: `RamTier.fetch` of the lane plus one token, as a warm request restores it (`restore_from_blocks`);
- its parts, as `restore_from_blocks` does them: `alloc_zero` (`mx.zeros` of every layer's buffer, evaluated:
  MLX's allocation, the zero fill and the first touch of each new page) and `copy_in` (the blocks copied into
  those buffers with memcpy through numpy views: memory now touched);
- `memcpy`: numpy's copy of the same bytes into memory written before, `memcpy_new_memory` into new memory
  (malloc's: pages the process may have had before), and `first_touch` (one byte written per 4 KiB page of an
  anonymous mapping the process never touched: the kernel mapping new pages, alone);
- `live`: `RamTier.fetch` when the lane's own cache was kept live (`keep_live`): trimmed in place, nothing copied.

All of it twice: with MLX's default buffer cache (32 MiB on a Linux CPU: every restore gets new memory from
the kernel) and with one of twice the lane (`mx.set_cache_limit`: a restore reuses what the last one freed).

    python bench/probes/restore_profile.py --tokens 8192 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import mmap
import statistics
import sys
import time

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from stable_prefix.engine_patch.cache.cache_layers import host_memory
from stable_prefix.engine_patch.cache.kv_blocks import covering
from stable_prefix.engine_patch.cache.ram_tier import RamTier

LAYERS, KV_HEADS, HEAD_DIM = 48, 4, 128
PAGE = 4096


class KVShape:
    """A model stand-in for the cache: `make_prompt_cache` asks it for its layers' caches."""

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in range(LAYERS)]


def filled(model: KVShape, tokens: int) -> list[KVCache]:
    cache = model.make_cache()
    for layer in cache:
        keys = mx.random.normal((1, KV_HEADS, tokens, HEAD_DIM)).astype(mx.float16)
        layer.update_and_fetch(keys, keys + 1)
    mx.eval([part for layer in cache for part in (layer.keys, layer.values)])
    return cache


def timed(action) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def parts_of_a_restore(tier: RamTier, tokens: int) -> tuple[float, float]:
    """`restore_from_blocks`'s two steps on the lane's blocks, timed apart: allocate and zero, then copy in."""
    entry = next(iter(tier.entries.values()))
    refs = covering(entry.blocks, tokens)
    capacity = -(-(tokens + 2) // KVCache.step) * KVCache.step
    buffers: list[tuple[mx.array, list[mx.array]]] = []

    def allocate() -> None:
        for index in range(LAYERS):
            for part in (0, 1):
                pieces = [ref.block.arrays[index][part][..., : ref.used, :] for ref in refs]
                buffers.append((mx.zeros((1, KV_HEADS, capacity, HEAD_DIM), mx.float16), pieces))
        mx.eval([buffer for buffer, _ in buffers] + [piece for _, pieces in buffers for piece in pieces])

    def copy_in() -> None:
        for buffer, pieces in buffers:
            target, start = host_memory(buffer), 0
            for piece in pieces:
                np.copyto(target[:, :, start : start + piece.shape[2], :], host_memory(piece))
                start += piece.shape[2]

    return timed(allocate), timed(copy_in)


def memcpy_parts(nbytes: int) -> tuple[float, float, float]:
    source = np.ones(nbytes, dtype=np.uint8)
    target = np.ones(nbytes, dtype=np.uint8)
    warm = timed(lambda: np.copyto(target, source))
    target.resize(0, refcheck=False)  # its memory back before the copies into new memory
    new_memory = timed(lambda: np.copyto(np.empty(nbytes, dtype=np.uint8), source))
    # Pages the kernel has never mapped for this process (an anonymous mapping: malloc may hand back freed ones).
    pages = mmap.mmap(-1, nbytes)
    first_touch = timed(lambda: np.frombuffer(pages, dtype=np.uint8)[::PAGE].fill(1))
    pages.close()
    return warm, new_memory, first_touch


def measure(tokens: int, rounds: int) -> dict:
    model = KVShape()
    nbytes = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2 * tokens
    lane, prompt = list(range(1, tokens + 1)), list(range(1, tokens + 2))
    tier = RamTier(budget_bytes=4 * nbytes, live_lane_limit=0)
    tier.store(lane, filled(model, tokens), tokens, model=model)
    live_tier = RamTier(budget_bytes=4 * nbytes)
    results: dict[str, list[float]] = {key: [] for key in ("restore", "alloc_zero", "copy_in", "memcpy", "memcpy_new_memory", "first_touch", "live")}
    for _ in range(rounds):
        results["restore"].append(timed(lambda: tier.fetch(model, prompt)))
        alloc_zero, copy_in = parts_of_a_restore(tier, tokens)
        results["alloc_zero"].append(alloc_zero)
        results["copy_in"].append(copy_in)
        for key, seconds in zip(("memcpy", "memcpy_new_memory", "first_touch"), memcpy_parts(nbytes)):
            results[key].append(seconds)
        cache = filled(model, tokens)
        live_tier.store(lane, cache, tokens, model=model)
        live_tier.keep_live(lane, cache, model=model)
        del cache
        results["live"].append(timed(lambda: live_tier.fetch(model, prompt)))
        assert live_tier.stats()["live_reuses"] == len(results["live"]), "the kept lane was not reused"
    medians = {key: statistics.median(values) for key, values in results.items()}
    return {"tokens": tokens, "bytes": nbytes, "rounds": results, "median_s": medians,
            "gb_per_s": {key: nbytes / seconds / 1e9 for key, seconds in medians.items() if seconds}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    nbytes = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2 * args.tokens
    default_limit = mx.set_cache_limit(0)
    for name, limit in (("MLX's default buffer cache (new memory each restore)", default_limit),
                        ("a buffer cache of twice the lane (the last restore's memory reused)", 2 * nbytes)):
        mx.set_cache_limit(limit)
        mx.clear_cache()
        result = measure(args.tokens, args.rounds)
        print(json.dumps({"buffer_cache": name, "cache_limit": limit, **{key: result[key] for key in ("tokens", "bytes", "median_s", "gb_per_s")}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
