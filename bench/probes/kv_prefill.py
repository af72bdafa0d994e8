"""What prefill costs a real-shape preset on this machine: tokens/s of one chunk at a given context.

    python -m stable_prefix.bench.probes.kv_prefill --model build/tiny-kv-qwen3-coder-30b --contexts 2048,8192

Attention over a long context at a real model's KV shape is what a tiny hidden
size cannot make cheap: this says how large a session the bytes bench can send
through real servers here (`bench/kv_bytes.py --servers`). The cache is brought
to the context without prefilling all of it: one real chunk is prefilled, its
attention layers' K and V are repeated up to the context (so the values are the
model's), then the next chunk is timed (the first timing after a warm-up chunk).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.utils import load_model


def tokens_per_s(model, context: int, chunk: int) -> float:
    tokens = mx.random.randint(0, 150_000, (1, chunk), key=mx.random.key(context))
    cache = make_prompt_cache(model)
    model(tokens, cache=cache)
    mx.eval([layer.state for layer in cache])
    repeats = max(1, (context - 2 * chunk) // chunk)
    for layer in cache:
        if type(layer) is KVCache:
            keys, values = layer.keys[..., :chunk, :], layer.values[..., :chunk, :]
            layer.update_and_fetch(mx.concatenate([keys] * repeats, axis=2), mx.concatenate([values] * repeats, axis=2))
    mx.eval([layer.state for layer in cache])
    model(tokens, cache=cache)  # warm-up at this context
    mx.eval([layer.state for layer in cache])
    started = time.perf_counter()
    model(tokens, cache=cache)
    mx.eval([layer.state for layer in cache])
    return chunk / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.probes.kv_prefill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--contexts", default="2048,8192", help="comma-separated contexts: the tokens the cache holds when the timed chunk starts")
    parser.add_argument("--chunk", type=int, default=256, help="tokens in the timed chunk")
    args = parser.parse_args(argv)
    model, _ = load_model(args.model)
    for context in (int(value) for value in args.contexts.split(",")):
        print(json.dumps({"model": str(args.model), "context": context, "chunk": args.chunk, "tokens_per_s": round(tokens_per_s(model, context, args.chunk), 2)}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
