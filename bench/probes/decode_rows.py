"""What one batched decode step costs with 1, 2 and 3 rows in flight, for a model on this machine.

A fan-out group (three subagent instances at once) decodes its replies as one
batch: on a GPU a step of three rows costs about what one row does (decode
reads the weights once for all rows), so the group's wall time is about its
longest instance's. Whether that holds on a machine is a property of its
matrix multiply, not of any engine: MLX's CPU backend on Linux calls the
reference BLAS its wheel ships, whose cost grows with the rows. This measures,
in process, the tiny model's decode step on the batched cache form mlx-lm's
`BatchGenerator` decodes with (`_merge_caches` of prefilled rows), for 1..N
rows, steps of every width alternating so the machine's load falls on all
alike, and prints per width the median step, the step per row, and the
median of step(N rows) / (N x step(1 row)) with its bootstrap 95% interval:
1.0 means batching buys nothing in decode, 1/N that it is free.

It also times the output projection alone (hidden x vocabulary) at each
width: the tiny models keep Qwen's whole vocabulary, so that matmul is most
of their step, and no change to an engine's decode loop (a compiled step, a
singleton cache) can take it away.

    python -m stable_prefix.bench.probes.decode_rows --model build/tiny-qwen3_5 --rows 3
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

from stable_prefix.bench.measure.metrics import median_confidence_interval

PREFILL_STEP = 2048
STEPS, WARM_UP = 40, 5


def measure(model_dir: Path, context: int, rows: int) -> list[dict[str, object]]:
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np
    from mlx_lm import load
    from mlx_lm.generate import _merge_caches
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(str(model_dir))
    rng = np.random.default_rng(0)
    singletons = []
    for _ in range(rows):
        ids = rng.integers(0, 150_000, context).tolist()
        cache = make_prompt_cache(model)
        for start in range(0, len(ids), PREFILL_STEP):
            model(mx.array(ids[start : start + PREFILL_STEP])[None], cache=cache)
            mx.eval([layer.state for layer in cache])
        singletons.append(cache)
    widths = list(range(1, rows + 1))
    batched = {width: _merge_caches([copy.deepcopy(cache) for cache in singletons[:width]]) for width in widths}
    tokens = {width: mx.array(rng.integers(0, 150_000, width).tolist()) for width in widths}
    # The tied embedding is the output projection (every tiny model ties them).
    head = next(module.weight for _, module in model.named_modules() if isinstance(module, nn.Embedding))
    steps: dict[int, list[float]] = {width: [] for width in widths}
    projections: dict[int, list[float]] = {width: [] for width in widths}
    for index in range(STEPS):
        for width in widths[:: 1 if index % 2 else -1]:
            started = time.perf_counter()
            tokens[width] = mx.argmax(model(tokens[width][:, None], cache=batched[width])[:, -1, :], axis=-1)
            mx.eval(tokens[width])
            steps[width].append(time.perf_counter() - started)
            hidden = mx.random.normal((width, head.shape[1])).astype(head.dtype)
            mx.eval(hidden)
            started = time.perf_counter()
            mx.eval(hidden @ head.T)
            projections[width].append(time.perf_counter() - started)
    one = steps[1][WARM_UP:]
    figures = []
    for width in widths:
        mine = steps[width][WARM_UP:]
        ratios = [step / (width * single) for step, single in zip(mine, one)]
        figures.append({
            "rows": width,
            "step_ms": statistics.median(mine) * 1000,
            "step_per_row_ms": statistics.median(mine) * 1000 / width,
            "over_rows_times_one": statistics.median(ratios),
            "interval": median_confidence_interval(ratios) if width > 1 else None,
            "output_projection_ms": statistics.median(projections[width][WARM_UP:]) * 1000,
        })
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.probes.decode_rows", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--context", type=int, default=2048, help="cached tokens under each row (default 2048)")
    parser.add_argument("--rows", type=int, default=3, help="the widest batch (default 3: a fan-out group)")
    args = parser.parse_args(argv)
    for figure in measure(args.model, args.context, args.rows):
        low, high = figure["interval"] or (None, None)
        interval = f" [{low:.2f}, {high:.2f}]" if low is not None else ""
        print(
            f"{args.model}, {figure['rows']} row(s) of {args.context:,} cached tokens: step {figure['step_ms']:.1f} ms, "
            f"{figure['step_per_row_ms']:.1f} ms per row, output projection alone {figure['output_projection_ms']:.1f} ms; step / ({figure['rows']} x one row's) "
            f"{figure['over_rows_times_one']:.2f}x{interval} ({STEPS - WARM_UP} paired steps)"
        )


if __name__ == "__main__":
    main()
