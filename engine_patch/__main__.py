"""`python -m stable_prefix.engine_patch serve MODEL [our flags] [any vllm-mlx serve flags]`."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys

import psutil

# Share of physical memory all snapshots together may hold by default: the
# model itself and the live request's cache need the rest.
DEFAULT_BUDGET_FRACTION = 0.25

UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
         "g": 10**9, "gb": 10**9, "gib": 2**30}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise argparse.ArgumentTypeError(f"--prefix-cache-bytes: {text!r} is not a size (examples: 8GiB, 512MB, 1000000)")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"--prefix-cache-entries: {text!r} is not a positive integer")
    return int(text)


def our_flags() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.engine_patch serve", add_help=False, allow_abbrev=False)
    parser.add_argument("--prefix-cache-bytes", type=parse_size, default=os.environ.get("ENGINE_PATCH_PREFIX_CACHE_BYTES"),
                        help="budget for all KV snapshots together (default: 25%% of RAM)")
    parser.add_argument("--prefix-cache-entries", type=positive_int, default=os.environ.get("ENGINE_PATCH_PREFIX_CACHE_ENTRIES"),
                        help="optional bound on the number of snapshots")
    parser.add_argument("--no-prefix-cache", action="store_true", default=os.environ.get("ENGINE_PATCH_DISABLE") == "1",
                        help="run vllm-mlx as shipped")
    return parser


def main(argv: list[str]) -> None:
    if not argv or argv[0] != "serve":
        sys.exit("usage: python -m stable_prefix.engine_patch serve MODEL [--prefix-cache-bytes SIZE] "
                 "[--prefix-cache-entries N] [--no-prefix-cache] [vllm-mlx serve flags]")
    options, vllm_args = our_flags().parse_known_args(argv[1:])
    if isinstance(options.prefix_cache_bytes, str):  # from the environment
        options.prefix_cache_bytes = parse_size(options.prefix_cache_bytes)
    if isinstance(options.prefix_cache_entries, str):
        options.prefix_cache_entries = positive_int(options.prefix_cache_entries)
    budget = options.prefix_cache_bytes or int(psutil.virtual_memory().total * DEFAULT_BUDGET_FRACTION)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Queue concurrent requests instead of answering 503: Claude Code sends a
    # title request alongside its main turn.
    os.environ.setdefault("VLLM_MLX_SIMPLE_ENGINE_LOCK_ADMISSION", "wait")
    if options.no_prefix_cache:
        logging.getLogger("engine_patch").info("engine_patch: --no-prefix-cache, running vllm-mlx as shipped")
    else:
        from .install import install

        install(budget_bytes=budget, max_entries=options.prefix_cache_entries)

    from vllm_mlx.cli import main as vllm_mlx_main

    sys.argv = ["vllm-mlx", "serve", *vllm_args]
    vllm_mlx_main()


if __name__ == "__main__":
    main(sys.argv[1:])
