"""Our batched decode step with one row decoding, against the singleton step Rapid-MLX keeps there.

mlx-lm's `BatchGenerator` decodes even a lone sequence through batched caches
(`BatchKVCache`: a left-padding offset per row and an array mask, where a
singleton `KVCache` lets `scaled_dot_product_attention` take its causal path);
Rapid-MLX 0.16.10 keeps singleton caches while one row decodes
(`rapid_mlx/singleton_cache_fastpath.py`, 440 lines of cache-surface patching)
and reports 167.7 -> 172.5 tokens/s at 128 tokens, 138.2 -> 146.6 at 16K on a
Mac (qwen3.5-4b). This measures, in process, the same model at the same
context both ways: one decode step on a singleton cache (as `stream_generate`
and Rapid-MLX's fast path run it) and on the same cache merged into the batched
form (as our batched engine runs it), steps alternating so the machine's load
falls on both alike, the greedy tokens of both compared, and the median
per-step ratio with its bootstrap 95% interval.

    python -m stable_prefix.bench.probes.singleton_decode --model build/tiny-qwen3_5 --context 2048 8000
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

from stable_prefix.bench.measure.metrics import median_confidence_interval

PREFILL_STEP = 2048
STEPS, WARM_UP = 60, 5


def measure(model_dir: Path, context: int) -> dict[str, object]:
    import mlx.core as mx
    import numpy as np
    from mlx_lm import load
    from mlx_lm.generate import _merge_caches
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(str(model_dir))
    ids = np.random.default_rng(0).integers(0, 150_000, context).tolist()
    singleton = make_prompt_cache(model)
    for start in range(0, len(ids) - 1, PREFILL_STEP):
        model(mx.array(ids[start : min(start + PREFILL_STEP, len(ids) - 1)])[None], cache=singleton)
        mx.eval([layer.state for layer in singleton])
    batched = _merge_caches([copy.deepcopy(singleton)])  # what BatchGenerator decodes one row with

    def step(cache, token):
        started = time.perf_counter()
        token = mx.argmax(model(token[:, None], cache=cache)[:, -1, :], axis=-1)
        mx.eval(token)
        return token, time.perf_counter() - started

    tokens = {"singleton": mx.array(ids[-1:]), "batched": mx.array(ids[-1:])}
    answers: dict[str, list[int]] = {"singleton": [], "batched": []}
    times: dict[str, list[float]] = {"singleton": [], "batched": []}
    for index in range(STEPS):
        for form, cache in (("singleton", singleton), ("batched", batched))[:: 1 if index % 2 else -1]:
            tokens[form], seconds = step(cache, tokens[form])
            answers[form].append(int(tokens[form].item()))
            times[form].append(seconds)
    ratios = [b / s for s, b in zip(times["singleton"][WARM_UP:], times["batched"][WARM_UP:])]
    return {
        "context": context,
        "singleton_ms": statistics.median(times["singleton"][WARM_UP:]) * 1000,
        "batched_ms": statistics.median(times["batched"][WARM_UP:]) * 1000,
        "batched_over_singleton": statistics.median(ratios),
        "interval": median_confidence_interval(ratios),
        "greedy_equal": answers["singleton"] == answers["batched"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.probes.singleton_decode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--context", type=int, nargs="+", default=[2048, 8000], help="cached tokens under the step (default 2048 8000)")
    args = parser.parse_args(argv)
    for figure in (measure(args.model, context) for context in args.context):
        low, high = figure["interval"] or (float("nan"), float("nan"))
        print(
            f"{args.model}, {figure['context']:,} tokens cached: decode step singleton {figure['singleton_ms']:.2f} ms, "
            f"batched (one row) {figure['batched_ms']:.2f} ms: batched/singleton {figure['batched_over_singleton']:.3f}x "
            f"[{low:.3f}, {high:.3f}] ({STEPS - WARM_UP} paired steps); greedy tokens {'equal' if figure['greedy_equal'] else 'DIFFER'}"
        )


if __name__ == "__main__":
    main()
