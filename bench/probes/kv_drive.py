"""Drive an engine's prefix cache in process with a session's real token sequences, at a real model's KV shape.

The cache object is the engine's own, built as engine_patch installs it (a
`PrefixPlanner` over `TieredCache(RamTier, DiskTier)`), and it is served
request by request as the batched engine serves it: `plan` restores the longest
stored prefix, the positional layers are checkpointed where the plan says, the
rest of the prompt and the reply are "prefilled", and the finished sequence's
exact-size cache (as mlx-lm's `BatchKVCache.extract` leaves it) is stored. Only
the forward pass is not run: each prefill fills mlx-lm's own cache objects
(from the model's `make_prompt_cache`) with random arrays of the shapes and
dtypes a real forward pass leaves there (probed once with a two-token forward),
so store, restore, write and budget work move the real bytes.

`--layers` runs the model with fewer layers than its preset: every byte the
cache holds, writes or evicts is per layer (KV per token, checkpoints, padding),
so a run at 1/k of the layers with 1/k of the budgets makes the same decisions
and moves 1/k of the bytes; the bench multiplies back (`bench/kv_bytes.py`).

This script runs under any checkout's interpreter (`kv_bytes --engine-tree`):
it imports the engine from the checkout whose venv runs it, and only plain
modules of its own folder by path.

    python bench/probes/kv_drive.py --tokens T.npz --model build/tiny-kv-qwen3-coder-30b --layers 4 \\
        --ram-bytes 1431655765 --disk-bytes 1789569706 --disk-dir /tmp/kv --out run.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache
from mlx_lm.utils import load_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_session_file import SessionFile  # noqa: E402  (this folder's plain module: see the docstring)

from stable_prefix.engine_patch.cache.ram_tier import RamTier  # noqa: E402
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner  # noqa: E402
from stable_prefix.engine_patch.disk.disk_tier import DiskTier  # noqa: E402
from stable_prefix.engine_patch.disk.model_identity import ModelIdentity  # noqa: E402
from stable_prefix.engine_patch.disk.tiered_cache import TieredCache  # noqa: E402

# Tokens of random data the prefills take their slices from (the values never matter, the sizes do).
POOL_TOKENS = 4096


@dataclass(frozen=True)
class LayerShape:
    """What a forward pass leaves in one layer's cache: K and V of (heads, head dim) per token, or fixed arrays."""

    kv: tuple[int, int, Any] | None  # (kv heads, head dim, dtype)
    arrays: list[tuple[tuple[int, ...], Any]]  # (shape, dtype) of each recurrent/convolution array

    @property
    def bytes_per_token(self) -> int:
        return 0 if self.kv is None else 2 * self.kv[0] * self.kv[1] * self.kv[2].size

    @property
    def fixed_bytes(self) -> int:
        return sum(int(np.prod(shape)) * dtype.size for shape, dtype in self.arrays)


def model_with_layers(model_dir: Path, layers: int | None) -> tuple[Any, dict]:
    """The preset's architecture with `layers` layers (its own count by default), weights never read."""
    config = json.loads((model_dir / "config.json").read_text())
    if layers is not None:
        config["num_hidden_layers"] = layers
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    model.set_dtype(getattr(mx, config.get("torch_dtype", "float16")))
    return model, config


def probed_shapes(model: Any) -> list[LayerShape]:
    """Each layer's cache shapes after a real two-token forward pass."""
    probe = make_prompt_cache(model)
    model(mx.array([[1, 2]]), cache=probe)
    shapes = []
    for layer in probe:
        if type(layer) is KVCache:
            shapes.append(LayerShape((layer.keys.shape[1], layer.keys.shape[3], layer.keys.dtype), []))
        elif isinstance(layer, ArraysCache):
            shapes.append(LayerShape(None, [(tuple(array.shape), array.dtype) for array in layer.cache]))
        else:
            raise SystemExit(f"error: a {type(layer).__name__} layer: the bytes bench fills KVCache and ArraysCache layers only")
    return shapes


class Filler:
    """Leaves a live cache as a forward pass over `count` more tokens would (random values, real shapes)."""

    def __init__(self, shapes: list[LayerShape], seed: int = 0):
        self.shapes = shapes
        self.key = mx.random.key(seed)
        self.pools: dict[tuple, mx.array] = {}

    def _random(self, shape: tuple[int, ...], dtype) -> mx.array:
        self.key, key = mx.random.split(self.key)
        return mx.random.normal(shape, key=key).astype(dtype)

    def _tokens(self, heads: int, head_dim: int, dtype, count: int) -> mx.array:
        pool = self.pools.get((heads, head_dim, dtype))
        if pool is None:
            pool = self.pools[(heads, head_dim, dtype)] = self._random((1, heads, POOL_TOKENS, head_dim), dtype)
        parts, left = [], count
        while left:
            start = int(np.random.default_rng(left).integers(0, POOL_TOKENS // 2))
            take = min(left, POOL_TOKENS - start)
            parts.append(pool[:, :, start : start + take, :])
            left -= take
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)

    def feed(self, live: list[Any], count: int) -> None:
        if count <= 0:
            return
        for layer, shape in zip(live, self.shapes):
            if shape.kv is not None:
                heads, head_dim, dtype = shape.kv
                layer.update_and_fetch(self._tokens(heads, head_dim, dtype, count), self._tokens(heads, head_dim, dtype, count))
            else:
                for index, (array_shape, dtype) in enumerate(shape.arrays):
                    layer[index] = self._random(array_shape, dtype)
        mx.eval(live_arrays(live))


def live_arrays(live: list[Any]) -> list[mx.array]:
    arrays = []
    for layer in live:
        if type(layer) is KVCache:
            arrays += [array for array in (layer.keys, layer.values) if array is not None]
        elif isinstance(layer, ArraysCache):
            arrays += [array for array in layer.cache if array is not None]
    return arrays


def extracted(live: list[Any]) -> list[Any]:
    """The finished sequence's cache as the batched engine hands it over: buffers cut to the tokens held."""
    final = []
    for layer in live:
        if type(layer) is KVCache:
            copy = KVCache()
            copy.keys, copy.values = mx.contiguous(layer.keys[..., : layer.offset, :]), mx.contiguous(layer.values[..., : layer.offset, :])
            copy.offset = layer.offset
            final.append(copy)
        else:
            copy = ArraysCache(len(layer.cache))
            copy.cache = list(layer.cache)
            final.append(copy)
    mx.eval(live_arrays(final))
    return final


def restored_bytes(shapes: list[LayerShape], reused: int) -> int:
    """The state a restore put in the cache: its tokens' K and V, and the fixed arrays of its positional layers."""
    return sum(reused * shape.bytes_per_token + shape.fixed_bytes for shape in shapes)


def scalar_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """The engine's stats without its per-entry lists (their sizes are kept as counts)."""
    return {key: value for key, value in stats.items() if isinstance(value, (int, float, str, bool, type(None)))}


def identity_for(config: dict) -> ModelIdentity:
    description = {"kv-bytes bench": json.dumps(config, sort_keys=True)}
    return ModelIdentity(hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest(), description)


def new_cache(ram_bytes: int, disk_dir: Path, disk_bytes: int, model: Any, identity: ModelIdentity) -> TieredCache:
    """The engine's cache as engine_patch.install builds it, the disk tier told the model's identity."""
    disk = DiskTier(disk_dir, disk_bytes)
    disk.bind(model, identity)
    return TieredCache(RamTier(budget_bytes=ram_bytes), disk)


def flush_disk(cache: TieredCache) -> None:
    """Wait for the disk writer: the bench models a disk that keeps up with the turns (nothing dropped)."""
    if not cache.disk.flush(timeout=3600):
        raise RuntimeError("the disk writer did not finish within an hour")


def held_entries(cache: TieredCache, identity: ModelIdentity) -> dict[str, list[dict[str, Any]] | None]:
    """What each tier holds: every entry's (lane's) token ids and checkpoint positions; None where this
    engine's cache does not show them (its stats must then count what it holds once)."""
    held: dict[str, list[dict[str, Any]] | None] = {"ram": None, "disk": None}
    ram = getattr(cache.ram, "entries", None)
    if isinstance(ram, dict) and all(hasattr(entry, "tokens") for entry in ram.values()):
        held["ram"] = [_described(entry) for entry in ram.values()]
    refreshed = getattr(cache.disk, "_refreshed_index", None)  # the disk's index: token ids from each file's header
    if refreshed is not None:
        with contextlib.suppress(Exception):
            held["disk"] = [_described(entry) for entry in refreshed(identity).values()]
    return held


def _described(entry: Any) -> dict[str, Any]:
    positions = getattr(entry, "checkpoint_positions", None)
    if positions is None:
        positions = [checkpoint.position for checkpoint in getattr(entry, "checkpoints", [])]
    return {"tokens": np.asarray(entry.tokens).tolist(), "checkpoints": sorted(int(position) for position in positions)}


def drive(args: argparse.Namespace) -> dict[str, Any]:
    session = SessionFile.load(args.tokens)
    model, config = model_with_layers(args.model, args.layers)
    tokenizer = load_tokenizer(args.model)
    shapes = probed_shapes(model)
    identity = identity_for(config)
    filler = Filler(shapes)
    # MLX reuses freed buffers as vllm-mlx sets it up on a Mac (Metal: a buffer cache up to its memory limit), so a
    # restore fills the memory the last live cache left; on Linux's CPU MLX keeps 32 MB, and every live cache would
    # be new memory that the kernel maps in as it is first written (0.2-3 GB/s on this project's VM, `memcpy_seconds`).
    mx.set_cache_limit(max(restored_bytes(shapes, len(session.sequence(index))) for index in range(len(session))))
    cache = new_cache(args.ram_bytes, args.disk_dir, args.disk_bytes, model, identity)
    planner = PrefixPlanner(cache)
    records, resume_points = [], {}
    started = time.perf_counter()
    for index in range(len(session)):
        prompt, reply, head = session.prompt(index).tolist(), session.reply(index).tolist(), session.head_text(index)
        loads = cache.stats().get("disk_loads", 0)
        began = time.perf_counter()
        plan = planner.plan(model, tokenizer, prompt, (lambda text=head: text))
        if plan is None:
            raise RuntimeError(f"request {index}: the cache failed to restore: {cache.stats().get('last_fallback_reason')}")
        live, position = plan.prompt_cache, plan.reused
        # A restore is done once the first prefilled token can be written into the restored cache: a cache
        # restored as views of the snapshot is copied there (into a buffer with room), one restored into
        # a buffer with room is not.
        filler.feed(live, 1)
        restore_s = time.perf_counter() - began
        restored = restored_bytes(shapes, plan.reused) if plan.reused else 0
        position += 1
        for checkpoint_at in plan.checkpoint_at:
            filler.feed(live, checkpoint_at - position)
            planner.checkpoint(plan, live, checkpoint_at)
            position = checkpoint_at
        filler.feed(live, len(prompt) - position)
        filler.feed(live, len(reply))  # the batched engine's cache holds every reply token (kv_session_file.sequence)
        final = extracted(live)
        del live
        plan.fetched.prompt_cache = None
        planner.finish(plan, prompt + reply, final)
        del final
        flush_disk(cache)
        resume_points[session.lane(index)] = (index, min(len(prompt) - 1, plan.prompt_length))
        records.append({
            "index": index, "reused": plan.reused, "from_disk": cache.stats().get("disk_loads", 0) > loads,
            "restore_s": restore_s, "restored_bytes": restored, "stats": scalar_stats(cache.stats()),
        })
        print(f"  #{index:<4} {session.lane(index):<28} prompt {len(prompt):>7,} reused {plan.reused:>7,}  "
              f"RAM {records[-1]['stats'].get('bytes', 0) / 2**30:6.2f} GiB  written {records[-1]['stats'].get('disk_bytes_written', 0) / 2**30:7.2f} GiB",
              flush=True)
    end_stats = cache.stats()
    positional = any(shape.kv is None for shape in shapes)
    warm_in_ram = {lane: cache.restorable_prefix(session.prompt(index), positional, model) >= point for lane, (index, point) in resume_points.items()}
    held = held_entries(cache, identity)
    cache.disk.close()
    files = sum(1 for path in args.disk_dir.rglob("*") if path.is_file())
    del cache
    return {
        "layers": config["num_hidden_layers"],
        "bytes_per_token": sum(shape.bytes_per_token for shape in shapes),
        "checkpoint_bytes": sum(shape.fixed_bytes for shape in shapes),
        "seconds": time.perf_counter() - started,
        "requests": records,
        "end_stats": {key: value for key, value in end_stats.items() if not isinstance(value, list)},
        "held": held,
        "disk_files": files,
        "lanes": {lane: {"last_request": index, "resume_point": point, "warm_in_ram": warm_in_ram[lane]} for lane, (index, point) in resume_points.items()},
        "restart": restart(args, model, identity, session, resume_points, filler, shapes),
    }


def restart(args: argparse.Namespace, model: Any, identity: ModelIdentity, session: SessionFile, resume_points: dict,
            filler: Filler, shapes: list[LayerShape]) -> dict[str, Any]:
    """New caches on the same directory (RAM empty, as after a restart), each lane's last prompt restored: first
    with the files out of the page cache (from the disk), then read once before (from the page cache), then
    again from the RAM those loads filled; and a plain memcpy of the largest lane's bytes, in the same run.

    A restore is timed as in `drive`: from the lookup until the first prefilled token is written into the
    live cache (what a warm turn waits for before its prefill)."""
    files = [path for path in args.disk_dir.rglob("*") if path.is_file()]
    restores: dict[str, Any] = {}
    warm: dict[str, bool] = {}
    for source in ("disk", "page_cache", "ram"):
        if source == "disk":
            evicted = all(_drop_from_page_cache(path) for path in files)
        elif source == "page_cache":
            for path in files:
                with path.open("rb") as file:
                    while file.read(1 << 24):
                        pass
        if source != "ram":
            cache = new_cache(args.ram_bytes, args.disk_dir, args.disk_bytes, model, identity)
        seconds, restored = 0.0, 0
        for lane, (index, point) in resume_points.items():
            loads = cache.stats().get("disk_loads", 0)
            began = time.perf_counter()
            fetched = cache.fetch(model, session.prompt(index).tolist())
            filler.feed(fetched.prompt_cache, 1)
            took = time.perf_counter() - began
            if source == "ram" and cache.stats().get("disk_loads", 0) > loads:
                continue  # RAM no longer held it (a later lane's load took its room): not a restore from RAM
            seconds += took
            restored += restored_bytes(shapes, fetched.reused) if fetched.reused else 0
            if source == "disk":
                warm[lane] = fetched.reused >= point
            del fetched
        restores[source] = {"seconds": seconds, "bytes": restored, "stats": scalar_stats(cache.stats())}
        if source == "disk":
            restores[source]["evicted_from_page_cache"] = evicted
        if source != "page_cache":
            cache.disk.close()
    largest = max((restored_bytes(shapes, point) for _, point in resume_points.values()), default=0)
    return {"warm_on_disk": warm, "stats": restores["page_cache"]["stats"], "restores": restores, "memcpy": memcpy_seconds(largest)}


def _drop_from_page_cache(path: Path) -> bool:
    """Ask the kernel to drop a file's pages (clean after the writer's fsync), so that a read goes to the disk."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (AttributeError, OSError):
        return False
    finally:
        os.close(descriptor)


def memcpy_seconds(nbytes: int, rounds: int = 3) -> dict[str, Any]:
    """A plain memcpy (numpy's copy of contiguous bytes) of `nbytes`: into memory written before (the best of
    `rounds`), and into new memory (the kernel maps and zeroes its pages as the copy first touches them)."""
    if nbytes == 0:
        return {"bytes": 0, "warm_s": None, "fresh_s": None}
    source = np.ones(nbytes, dtype=np.uint8)
    target = np.ones(nbytes, dtype=np.uint8)
    warm = []
    for _ in range(rounds):
        began = time.perf_counter()
        np.copyto(target, source)
        warm.append(time.perf_counter() - began)
    del target
    began = time.perf_counter()
    np.copyto(np.empty(nbytes, dtype=np.uint8), source)
    return {"bytes": nbytes, "warm_s": min(warm), "fresh_s": time.perf_counter() - began}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=Path, required=True, help="the session's token sequences (kv_session_file.SessionFile)")
    parser.add_argument("--model", type=Path, required=True, help="the preset whose architecture, shapes and tokenizer are used")
    parser.add_argument("--layers", type=int, help="run with this many layers (default: the preset's)")
    parser.add_argument("--ram-bytes", type=int, required=True, help="the RAM tier's budget")
    parser.add_argument("--disk-bytes", type=int, required=True, help="the disk tier's budget")
    parser.add_argument("--disk-dir", type=Path, required=True, help="the disk tier's directory (emptied by the caller)")
    parser.add_argument("--out", type=Path, required=True, help="where the figures go (JSON)")
    args = parser.parse_args(argv)
    result = drive(args)
    args.out.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
