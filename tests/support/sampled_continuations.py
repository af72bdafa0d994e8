"""The exact distribution of a short sampled continuation, and a chi-square test of samples against it.

For a sampler at temperature 1 that keeps some tokens (mlx-lm's `apply_top_k` or
`apply_min_p`, as `make_sampler` chains them), the probability of each continuation of
`depth` tokens is the product of the renormalised kept probabilities along it, computed
here from the model's own logits (one forward per prefix). Drawing many continuations
with drafts and testing them against these probabilities checks that drafting leaves
the distribution alone, position by position.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np


def continuation_probabilities(model, prompt: Sequence[int], kept: Callable[[mx.array], mx.array], depth: int, end_tokens: Sequence[int] = ()
                               ) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], int]]:
    """P(continuation) for every continuation of `depth` tokens sampled at temperature 1 from the tokens
    `kept(logprobs)` leaves finite (one that draws an end token stops there), and the most likely next token
    after every shorter prefix (what a draft of the target's mode proposes)."""
    probabilities: dict[tuple[int, ...], float] = {(): 1.0}
    most_likely: dict[tuple[int, ...], int] = {}
    for _ in range(depth):
        grown: dict[tuple[int, ...], float] = {}
        for prefix, probability in probabilities.items():
            if prefix and prefix[-1] in end_tokens:
                grown[prefix] = probability
                continue
            logits = _decoded_logits(model, prompt, prefix)
            values = np.array(kept(logits - mx.logsumexp(logits, axis=-1, keepdims=True)))[0]
            top = np.flatnonzero(np.isfinite(values))
            weights = np.exp(values[top] - values[top].max())
            weights /= weights.sum()
            most_likely[prefix] = int(top[np.argmax(weights)])
            for token, weight in zip(top, weights):
                grown[(*prefix, int(token))] = probability * float(weight)
        probabilities = grown
    return probabilities, most_likely


def _decoded_logits(model, prompt: Sequence[int], prefix: tuple[int, ...]) -> mx.array:
    """The logits after `prefix` computed as decoding computes them: the prompt but its last token prefilled,
    then one token per forward (float rounding then matches the answers sampled without drafts)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    logits = model(mx.array(prompt[-1:])[None], cache=cache)
    for token in prefix:
        logits = model(mx.array([token])[None], cache=cache)
    return logits[0, -1:].astype(mx.float32)


def modes_after(most_likely: dict[tuple[int, ...], int], depth: int) -> Callable[[tuple[int, ...], int], list[int]]:
    """Drafts of the target's most likely tokens after what was generated (confirmed about as often as they are likely)."""

    def continuation(generated: tuple[int, ...], count: int) -> list[int]:
        chain = list(generated)
        while len(chain) < depth and tuple(chain) in most_likely:
            chain.append(most_likely[tuple(chain)])
        return chain[len(generated) :]

    return continuation


# Cells expected fewer times than this are pooled into one (the chi-square approximation needs counts).
MIN_EXPECTED = 5


def chi_square_p_value(samples: Sequence[tuple[int, ...]], probabilities: dict[tuple[int, ...], float]) -> float:
    """The p-value of a chi-square goodness-of-fit test of `samples` against `probabilities` (a sample
    outside their support gets p = 0); rare cells are pooled."""
    counts = Counter(samples)
    if any(sample not in probabilities for sample in counts):
        return 0.0
    total = len(samples)
    common = {cell: p for cell, p in probabilities.items() if total * p >= MIN_EXPECTED}
    observed = [counts.get(cell, 0) for cell in common]
    expected = [total * p for p in common.values()]
    pooled = 1.0 - sum(common.values())
    if total * pooled > 1e-9:
        observed.append(total - sum(observed))
        expected.append(total * pooled)
    statistic = sum((seen - wanted) ** 2 / wanted for seen, wanted in zip(observed, expected))
    return chi_square_survival(statistic, len(expected) - 1)


def chi_square_survival(statistic: float, degrees: int) -> float:
    """P(X >= statistic) for X chi-square with `degrees` degrees of freedom (the lower incomplete gamma's series)."""
    shape, half = degrees / 2, statistic / 2
    if half <= 0:
        return 1.0
    term = total = 1.0 / math.exp(math.lgamma(shape + 1))
    for index in range(1, 1000):
        term *= half / (shape + index)
        total += term
        if term < total * 1e-15:
            break
    lower = math.exp(shape * math.log(half) - half) * total
    return max(0.0, 1.0 - lower)
