"""How fast a lane is restored into a live cache, from RAM, the page cache and the disk, against a memcpy of the same bytes.

One lane of `--tokens` tokens at a real model's KV shape (a tiny preset, `make
tiny-kv-models`; random values, `kv_drive.Filler`) is stored in the engine's
cache (`TieredCache(RamTier, DiskTier)`, as engine_patch installs it) and
written to disk; then restored, round after round, each source in turn: from
RAM, from the page cache (a new cache on the directory, its files read once
before) and from the disk (its files dropped from the page cache first). A
restore is timed from the lookup until the first prefilled token is written into
the live cache; its parts are timed too (the disk load, the copy into the live
cache). A memcpy of the same bytes (numpy's contiguous copy) runs in the same
rounds, into memory written before and into new memory. With `--prefill N`, a
warm turn's time to first token is measured too: the restore and one forward
pass of the preset over N new tokens on the restored cache.

Runs under any checkout's interpreter (`--engine-tree`, as `kv_drive.py`):

    python bench/probes/restore_speed.py --model build/tiny-kv-qwen3-coder-30b --tokens 8192 --out build/restore.json
    PYTHONPATH=build/engine-trees/OLD python bench/probes/restore_speed.py ...   # another checkout's engine, same probe
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kv_drive import (  # noqa: E402  (this folder's plain module)
    Filler,
    extracted,
    flush_disk,
    identity_for,
    memcpy_seconds,
    model_with_layers,
    new_cache,
    probed_shapes,
    restored_bytes,
)

import stable_prefix.engine_patch.disk.disk_tier as disk_tier_module  # noqa: E402


def drop_from_page_cache(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(descriptor)


def read_through(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as file:
                while file.read(1 << 24):
                    pass


def measure(args: argparse.Namespace) -> dict[str, Any]:
    model, config = model_with_layers(args.model, args.layers)
    shapes = probed_shapes(model)
    filler, identity = Filler(shapes), identity_for(config)
    lane = list(range(1, args.tokens + 1))
    prompt = lane + list(range(args.tokens + 1, args.tokens + 2 + args.prefill))  # the lane, then the turn's new tokens
    nbytes = restored_bytes(shapes, args.tokens)
    # As vllm-mlx sets it up on a Mac (Metal's buffer cache): a restore fills the memory the last live cache left.
    mx.set_cache_limit(2 * nbytes)
    rounds: dict[str, list[float]] = {key: [] for key in ("ram", "page_cache", "disk", "disk_load_page_cache", "disk_load_disk",
                                                             "memcpy", "memcpy_new_memory", "warm_ttft_ram")}
    with tempfile.TemporaryDirectory(prefix="restore-speed-", dir=args.scratch) as scratch:
        folder = Path(scratch)
        cache = new_cache(8 * nbytes + (1 << 30), folder, 8 * nbytes + (1 << 30), model, identity)
        live = make_prompt_cache(model)
        filler.feed(live, args.tokens)
        final = extracted(live)
        del live
        cache.store(lane, final, args.tokens, model=model)
        del final
        flush_disk(cache)

        def restore(from_cache) -> tuple[float, list[Any]]:
            began = time.perf_counter()
            fetched = from_cache.fetch(model, prompt)
            filler.feed(fetched.prompt_cache, 1)
            seconds = time.perf_counter() - began
            if fetched.reused < args.tokens - 256:
                raise SystemExit(f"restored {fetched.reused} of {args.tokens} tokens")
            return seconds, fetched.prompt_cache

        for _ in range(args.rounds):
            copy = memcpy_seconds(nbytes, rounds=1)
            rounds["memcpy"].append(copy["warm_s"])
            rounds["memcpy_new_memory"].append(copy["fresh_s"])
            seconds, _ = restore(cache)
            rounds["ram"].append(seconds)
            if args.prefill:
                began = time.perf_counter()
                _, live = restore(cache)
                mx.eval(model(mx.array([prompt[args.tokens : args.tokens + args.prefill]]), cache=live))
                rounds["warm_ttft_ram"].append(time.perf_counter() - began)
                del live
            for source in ("page_cache", "disk"):
                read_through(folder) if source == "page_cache" else drop_from_page_cache(folder)
                other = new_cache(8 * nbytes + (1 << 30), folder, 8 * nbytes + (1 << 30), model, identity)
                seconds, _ = restore(other)
                rounds[source].append(seconds)
                rounds[f"disk_load_{source}"].append(other.stats().get("disk_load_seconds") or 0.0)
                other.disk.close()
        cache.disk.close()
    medians = {key: statistics.median(values) for key, values in rounds.items() if values}
    return {
        "engine": disk_tier_module.__file__, "model": str(args.model), "layers": config["num_hidden_layers"], "tokens": args.tokens,
        "prefill": args.prefill, "bytes": nbytes, "rounds": rounds, "median_s": medians,
        "gb_per_s": {key: nbytes / value / 1e9 for key, value in medians.items() if not key.startswith("warm") and value},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a KV-shape preset (make tiny-kv-models)")
    parser.add_argument("--tokens", type=int, default=8192, help="the lane's tokens")
    parser.add_argument("--layers", type=int, help="run with this many layers (default: the preset's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=0, help="also time a warm turn: the restore and a forward over this many new tokens")
    parser.add_argument("--scratch", type=Path, default=Path("build"), help="where the lane's files go")
    parser.add_argument("--out", type=Path, help="the figures as JSON")
    args = parser.parse_args(argv)
    result = measure(args)
    print(json.dumps({key: result[key] for key in ("engine", "layers", "tokens", "bytes", "median_s", "gb_per_s")}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
