"""`python -m stable_prefix.engine_patch serve MODEL [our flags] [any vllm-mlx serve flags]`,
and `... warm FILE... --url URL` (pre-warm a running server with captured requests: `captures/warm.py`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from stable_prefix.engine_patch.disk.disk_tier import DEFAULT_BUDGET_BYTES, DEFAULT_DIRECTORY

from .defaults import DEFAULT_DRAFT, DEFAULT_ENGINE, DRAFT_MODES, ENGINES, parse_size

# vllm-mlx's own flag for its batched engine; `--engine batched` passes it on.
BATCHED_FLAG = "--continuous-batching"

# Share of physical memory all snapshots together may hold by default: the
# model itself and the live request's cache need the rest.
DEFAULT_BUDGET_FRACTION = 0.25

USAGE = ("usage: python -m stable_prefix.engine_patch serve MODEL [--engine simple|batched] [--prefix-cache-bytes SIZE] [--prefix-cache-entries N] "
         "[--no-prefix-cache] [--prefix-cache-dir DIR] [--prefix-cache-disk-bytes SIZE] [--no-disk-cache] [--draft auto|on|off] [vllm-mlx serve flags]\n"
         "       python -m stable_prefix.engine_patch warm FILE_OR_DIR... --url URL [--model NAME]")


def size_of(flag: str) -> Callable[[str], int]:
    return lambda text: parse_size(text, flag)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"--prefix-cache-entries: {text!r} is not a positive integer")
    return int(text)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def our_flags() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.engine_patch serve", add_help=False, allow_abbrev=False)
    parser.add_argument("--engine", choices=ENGINES, default=os.environ.get("ENGINE_PATCH_ENGINE") or None,
                        help=f"simple: one request at a time; batched: vllm-mlx's continuous batching (default: {DEFAULT_ENGINE})")
    parser.add_argument("--prefix-cache-bytes", type=size_of("--prefix-cache-bytes"), default=os.environ.get("ENGINE_PATCH_PREFIX_CACHE_BYTES"),
                        help="budget for all KV snapshots together (default: 25%% of RAM)")
    parser.add_argument("--prefix-cache-entries", type=positive_int, default=os.environ.get("ENGINE_PATCH_PREFIX_CACHE_ENTRIES"),
                        help="optional bound on the number of snapshots")
    parser.add_argument("--no-prefix-cache", action="store_true", default=os.environ.get("ENGINE_PATCH_DISABLE") == "1",
                        help="run vllm-mlx as shipped")
    parser.add_argument("--prefix-cache-dir", type=Path, default=os.environ.get("ENGINE_PATCH_PREFIX_CACHE_DIR") or DEFAULT_DIRECTORY,
                        help=f"where KV snapshots are kept across restarts (default: {DEFAULT_DIRECTORY})")
    parser.add_argument("--prefix-cache-disk-bytes", type=size_of("--prefix-cache-disk-bytes"),
                        default=os.environ.get("ENGINE_PATCH_PREFIX_CACHE_DISK_BYTES"),
                        help="budget for the snapshots on disk (default: 20GiB, never more than the free space minus a margin)")
    parser.add_argument("--no-disk-cache", action="store_true", default=env_flag("ENGINE_PATCH_NO_DISK_CACHE"),
                        help="keep snapshots in RAM only")
    parser.add_argument("--draft", choices=DRAFT_MODES, default=os.environ.get("ENGINE_PATCH_DRAFT") or DEFAULT_DRAFT,
                        help="decode with drafts from the session's own tokens: auto (where this machine's verify cost lets them pay), "
                             f"on, off (default: {DEFAULT_DRAFT})")
    return parser


def engine_mode(chosen: str | None, vllm_args: list[str]) -> str:
    """The engine `serve` runs: the one chosen, else batched if vllm-mlx's own flag asks for it, else the default."""
    if chosen is not None and chosen not in ENGINES:  # only the environment can say so: argparse checks the flag
        raise SystemExit(f"ENGINE_PATCH_ENGINE={chosen!r}: choose {' or '.join(ENGINES)}")
    if chosen == "simple" and BATCHED_FLAG in vllm_args:
        raise SystemExit(f"--engine simple contradicts {BATCHED_FLAG}: leave one out")
    if chosen:
        return chosen
    return "batched" if BATCHED_FLAG in vllm_args else DEFAULT_ENGINE


def serve(argv: list[str]) -> None:
    options, vllm_args = our_flags().parse_known_args(argv)
    if isinstance(options.prefix_cache_bytes, str):  # from the environment
        options.prefix_cache_bytes = parse_size(options.prefix_cache_bytes, "ENGINE_PATCH_PREFIX_CACHE_BYTES")
    if isinstance(options.prefix_cache_entries, str):
        options.prefix_cache_entries = positive_int(options.prefix_cache_entries)
    if options.draft not in DRAFT_MODES:  # only the environment can say so: argparse checks the flag
        raise SystemExit(f"ENGINE_PATCH_DRAFT={options.draft!r}: choose {', '.join(DRAFT_MODES)}")
    if isinstance(options.prefix_cache_disk_bytes, str):
        options.prefix_cache_disk_bytes = parse_size(options.prefix_cache_disk_bytes, "ENGINE_PATCH_PREFIX_CACHE_DISK_BYTES")
    budget = options.prefix_cache_bytes or int(psutil.virtual_memory().total * DEFAULT_BUDGET_FRACTION)
    engine = engine_mode(options.engine, vllm_args)
    if engine == "batched" and BATCHED_FLAG not in vllm_args:
        vllm_args = [*vllm_args, BATCHED_FLAG]

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Queue concurrent requests instead of answering 503: Claude Code sends a
    # title request alongside its main turn.
    os.environ.setdefault("VLLM_MLX_SIMPLE_ENGINE_LOCK_ADMISSION", "wait")
    if options.no_prefix_cache:
        logging.getLogger("engine_patch").info("engine_patch: --no-prefix-cache, running vllm-mlx as shipped")
    else:
        from .install import DiskOptions, install

        disk = None
        if not options.no_disk_cache:
            disk = DiskOptions(Path(options.prefix_cache_dir).expanduser(), options.prefix_cache_disk_bytes or DEFAULT_BUDGET_BYTES)
        install(budget_bytes=budget, max_entries=options.prefix_cache_entries, disk=disk, engine=engine, draft=options.draft)

    from vllm_mlx.cli import main as vllm_mlx_main

    sys.argv = ["vllm-mlx", "serve", *vllm_args]
    vllm_mlx_main()


def main(argv: list[str]) -> int:
    if argv and argv[0] == "serve":
        serve(argv[1:])
        return 0
    if argv and argv[0] == "warm":
        from stable_prefix.captures.warm import main as warm_main

        return warm_main(argv[1:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
