"""Measure what a forward of w tokens costs against one token, for a loaded model on this machine.

The curve decides whether drafting pays (`cost_gate.py`). It is measured the
way a drafted decode step runs: w tokens on top of a short cache (all logits
and the cache state evaluated), widths interleaved over a few rounds so the
machine's load falls on all alike; per width the fastest round counts (other
processes only ever add time), and a wider forward is never taken as cheaper
than a narrower one. On a compute-bound machine the first widths already show
a forward costing about as many steps as it has tokens; the rest of the curve
is then extrapolated from them rather than measured (this CPU would otherwise
spend tens of seconds of a real model's time at start for a figure that
cannot change the decision).
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from .cost_gate import MAX_DRAFT, VerifyCostCurve

CONTEXT_TOKENS = 32
ROUNDS = 3
# Stop after the first widths when each costs at least this share of its token count (compute-bound).
COMPUTE_BOUND_SHARE = 0.75
FIRST_WIDTHS = (1, 2, 4)


def measure_verify_cost(model: Any, widths: range = range(1, MAX_DRAFT + 2), rounds: int = ROUNDS, stop_early: bool = True) -> VerifyCostCurve:
    """The relative cost of a `w`-token forward for each width (1 first: the unit)."""
    cache = make_prompt_cache(model)
    tokens = [token % 1000 + 100 for token in range(CONTEXT_TOKENS + max(widths))]
    _forward(model, cache, tokens[:CONTEXT_TOKENS])
    if stop_early:
        first = _timed(model, cache, tokens, list(FIRST_WIDTHS), rounds)
        relative = {width: first[width] / first[1] for width in FIRST_WIDTHS}
        if all(relative[width] >= COMPUTE_BOUND_SHARE * width for width in FIRST_WIDTHS[1:]):
            slope = (relative[FIRST_WIDTHS[-1]] - 1) / (FIRST_WIDTHS[-1] - 1)
            relative.update({width: 1 + slope * (width - 1) for width in widths if width not in relative})
            return VerifyCostCurve(relative, f"measured at {', '.join(map(str, FIRST_WIDTHS))} tokens; compute-bound, the rest extrapolated",
                                   extrapolated_from=FIRST_WIDTHS[-1])
    seconds = _timed(model, cache, tokens, list(widths), rounds)
    return VerifyCostCurve({width: seconds[width] / seconds[1] for width in widths}, f"measured at 1..{widths[-1]} tokens")


def _timed(model: Any, cache: list[Any], tokens: list[int], widths: list[int], rounds: int) -> dict[int, float]:
    for width in widths:  # kernels built, buffers allocated
        _forward(model, cache, tokens[:width])
    samples: dict[int, list[float]] = {width: [] for width in widths}
    for round_index in range(rounds):
        for width in widths[:: 1 if round_index % 2 == 0 else -1]:
            started = time.perf_counter()
            _forward(model, cache, tokens[:width])
            samples[width].append(time.perf_counter() - started)
    fastest = {width: min(times) for width, times in samples.items()}
    for narrower, wider in zip(widths, widths[1:]):
        fastest[wider] = max(fastest[wider], fastest[narrower])
    return fastest


def _forward(model: Any, cache: list[Any], tokens: list[int]) -> None:
    logits = model(mx.array(tokens)[None], cache=cache)
    mx.eval(logits, [layer.state for layer in cache])
