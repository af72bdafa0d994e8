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
With a greedy sampler t_i = argmax p_i, so the answer is token for token the
one decoding without drafts gives (up to the floating-point summation order of
a k-token forward against k one-token ones).

The same rule serves one sequence and every row of a batch.
"""

from __future__ import annotations

from collections.abc import Sequence


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
