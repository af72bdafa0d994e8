"""How a draft is judged: the answer keeps exactly the distribution it has without drafts.

A verify step feeds `[next, d1, ..., dk]` and gets the target's distribution
p_i at every position: p_0 after `next`, p_i after `d_i`. Each position's
token is then drawn *with the request's own sampler* from p_i (after its
temperature, top-p, min-p, top-k: whatever the sampler does), giving
t_0..t_k, and the draft is accepted up to its first disagreement:

    accepted = the largest a with d_1 = t_0, ..., d_a = t_(a-1);
    the step emits d_1..d_a and then t_a.

Why this is exact. A draft here is deterministic (a function of the tokens
so far), so speculative sampling's rule for it reads: accept d with the
target's probability p(d), else draw from p with d removed, renormalised.
Drawing t ~ p and accepting iff t = d does exactly that: P(accept) = p(d),
and a rejected step emits t, which given t != d is distributed as
p(. | . != d), the renormalised rest. Each emitted token is therefore a draw
from the target's distribution given the tokens before it, which are the
emitted ones: p_i is only read while every draft token before position i was
accepted. The draws at positions after the first rejection are discarded.
The same rule serves one sequence and every row of a batch.

Greedy, bit for bit: the margin rule. With a greedy sampler t_i = argmax p_i,
the answer without drafts, but for one thing: a forward of k tokens sums in
another order than k forwards of one (other matrix tilings, another attention
kernel, a chunked scan of recurrent state), so its log-probabilities are off
in the last bits, and where the two best
tokens nearly tie its argmax can differ from the one a one-token step takes.
So a greedy token is taken from a forward of more than one token only where
its lead over the second best exceeds `margin_bound(dtype)` (`decisive`);
the run ends before the first position that is not decisive, and the engine
decides that token with a one-token forward, as decoding without drafts does.
The bound is `MARGIN_FACTOR` times the largest difference measured between a
verify's log-probabilities and one-token steps' over the same tokens
(`bench/probes/verify_error.py`: every family's tiny model cast to each
dtype and SmolLM2-135M's real weights, on the CPU; docs/engine.md has the
table), per dtype. What this leaves: where a forward
of k tokens writes the cache other than k forwards of one do in the last bits,
later one-token steps read that cache (docs/engine.md, "Exact", says where
that was measured and what it means). Sampled rows are exact in distribution
already; the rule applies to greedy samplers only (`greedy`), so it costs
them nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import make_sampler

# The largest |verify - one-token step| log-probability difference measured per dtype
# (bench/probes/verify_error.py), and the margin a greedy token needs: a multiple of it, as no
# run covers every model and machine (a wider margin only costs forward passes, never exactness).
MEASURED_ERROR = {mx.float32: 5e-5, mx.float16: 0.032, mx.bfloat16: 0.063}
MARGIN_FACTOR = 4.0


def margin_bound(dtype: mx.Dtype) -> float:
    return MARGIN_FACTOR * MEASURED_ERROR.get(dtype, MEASURED_ERROR[mx.float32])


_MLX_LM_ARGMAX = make_sampler(temp=0.0).__code__


def argmax_sampler(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def greedy(sampler: Callable[[mx.array], mx.array] | None) -> bool:
    """Whether `sampler` takes the argmax: ours, or mlx-lm's `make_sampler(temp=0)` (every call returns the same code)."""
    return sampler is argmax_sampler or getattr(sampler, "__code__", None) is _MLX_LM_ARGMAX


def decisive(logprobs: mx.array) -> mx.array:
    """Per position (last axis: the vocabulary): whether the best token leads the second by more than the bound
    (read where the argmax reads it, in the log-probabilities)."""
    best_two = mx.topk(logprobs.astype(mx.float32), 2, axis=-1)
    return mx.abs(best_two[..., 0] - best_two[..., 1]) > margin_bound(logprobs.dtype)


def decided_run(draft: Sequence[int], drawn: Sequence[int], sure: Sequence[Any] | None = None) -> tuple[int, bool]:
    """How many draft tokens are kept, and whether the token after them (`drawn[kept]`) is decided here.

    `sure[i]` says whether position i's draw may be taken from this forward (`decisive`, for a greedy
    sampler); None: every position may (a sampled row). A draft token is kept where it was drawn and
    its position is sure; the run stops before the first position that is not, which a one-token
    forward then decides.
    """
    confirmed = accepted_length(draft, drawn)
    if sure is None:
        return confirmed, True
    for position in range(confirmed + 1):
        if not sure[position]:
            return position, False
    return confirmed, True


def accepted_length(draft: Sequence[int], drawn: Sequence[int]) -> int:
    """How many leading draft tokens the target's own draws confirm (`drawn[i]` drawn after `draft[:i]`)."""
    accepted = 0
    for proposed, target in zip(draft, drawn):
        if proposed != target:
            break
        accepted += 1
    return accepted


def emitted(draft: Sequence[int], drawn: Sequence[int]) -> list[int]:
    """The tokens a verify step emits: the confirmed part of the draft, then the target's draw after it."""
    accepted = accepted_length(draft, drawn)
    return [*draft[:accepted], drawn[accepted]]
