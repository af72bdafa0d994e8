"""Whether a drafted step pays, and how wide it should be: expected tokens per unit of forward time.

A forward of w tokens costs `curve.cost(w)` one-token forwards: about w where
decode is compute-bound (this project's x86 CPU: 4 tokens 3.8x, 8 tokens
6.6x on SmolLM2-135M), little more than 1 where it is bound by reading the
weights (an Apple GPU). A row whose drafts are confirmed with probability
alpha each emits, for k drafted tokens, 1 + alpha + ... + alpha^k tokens per
step on average (a geometric run; `expected_tokens`). So a step of width S
over B rows, each drafting k_i <= S - head_i, yields sum_i E(alpha_i, k_i)
tokens for cost(B * S), against B tokens for cost(B) without drafts. The
widest step that maximises the ratio is taken, and only if it beats plain
decoding by `MIN_GAIN` (the proposer's lookups and the step's bookkeeping are
not in the curve); else the step runs as mlx-lm's own. The curve is by
tokens in one forward: B rows of S tokens cost about what one row of B * S does.

Modes: `off` never drafts; `auto` decides with the curve this machine
measured (`verify_cost.py`), for the whole step; `on` drafts on every row
whatever the step costs, each row's length chosen from its own acceptance on
a nominal weights-bound curve for one sequence (each extra token in a forward
costing `NOMINAL_EXTRA_TOKEN_COST` of a step): what a Mac would draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MODES = ("auto", "on", "off")
# The longest draft a step verifies (9 tokens per row in one forward).
MAX_DRAFT = 8
# What a drafted step must gain over plain decoding, on the curve, to be taken.
MIN_GAIN = 0.05
# `on`: one more token in a forward costs this share of a one-token step (decode bound by reading weights).
NOMINAL_EXTRA_TOKEN_COST = 0.1


@dataclass(frozen=True)
class VerifyCostCurve:
    """A forward of w tokens (one sequence) costs `relative[w]` forwards of one token."""

    relative: dict[int, float]
    source: str  # how the figures were had: measured on this machine (which widths), or nominal
    extrapolated_from: int | None = None  # widths above this were extrapolated linearly

    def cost(self, tokens: int) -> float:
        known = sorted(self.relative)
        if tokens in self.relative:
            return self.relative[tokens]
        if tokens < known[-1]:
            below = max(width for width in known if width < tokens)
            above = min(width for width in known if width > tokens)
            share = (tokens - below) / (above - below)
            return self.relative[below] + share * (self.relative[above] - self.relative[below])
        # Past the widths measured: the last slope goes on (never below flat).
        last, before = known[-1], known[-2] if len(known) > 1 else known[-1]
        slope = max(0.0, (self.relative[last] - self.relative[before]) / max(1, last - before))
        return self.relative[last] + slope * (tokens - last)

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "relative_cost_by_tokens": {str(width): round(cost, 3) for width, cost in sorted(self.relative.items())},
            "extrapolated_above": self.extrapolated_from,
        }


def nominal_curve() -> VerifyCostCurve:
    widths = range(1, MAX_DRAFT + 2)
    return VerifyCostCurve({w: 1 + NOMINAL_EXTRA_TOKEN_COST * (w - 1) for w in widths},
                           f"nominal: decode bound by reading the weights, each extra token {NOMINAL_EXTRA_TOKEN_COST} of a step")


def expected_tokens(acceptance: float, drafted: int) -> float:
    """Tokens a row emits per step drafting `drafted` tokens, each confirmed with probability `acceptance`."""
    return sum(acceptance**index for index in range(drafted + 1))


@dataclass(frozen=True)
class RowOutlook:
    """What one sequence brings to the next step."""

    acceptance: float
    available: int  # draft tokens it could verify (the proposer's, capped by the request)
    head: int = 1  # tokens it must feed anyway: its next token, after any left unfed by a rollback


@dataclass(frozen=True)
class StepPlan:
    width: int  # tokens per row in the forward (1: a plain step)
    drafts: list[int] = field(default_factory=list)  # draft tokens per row
    gain: float = 1.0  # expected tokens per unit time against plain decoding


def plan_step(rows: Sequence[RowOutlook], curve: VerifyCostCurve, min_gain: float = MIN_GAIN) -> StepPlan:
    """The step's width and each row's draft length that maximise expected tokens per unit of time."""
    count = len(rows)
    plain_rate = count / curve.cost(count)
    narrowest = max(row.head for row in rows)
    if narrowest > MAX_DRAFT + 1:
        return StepPlan(narrowest, [0] * count)  # tokens left unfed by rollbacks: fed together, nothing drafted
    best: StepPlan | None = None
    for width in range(narrowest, MAX_DRAFT + 2):
        drafts = [max(0, min(row.available, width - row.head)) for row in rows]
        if width > narrowest and sum(drafts) == 0:
            break  # wider steps would only pad
        tokens = sum(expected_tokens(row.acceptance, drafted) for row, drafted in zip(rows, drafts))
        gain = tokens / curve.cost(count * width) / plain_rate
        if best is None or gain > best.gain:
            best = StepPlan(width, drafts, gain)
    if narrowest == 1 and best.width > 1 and best.gain <= 1 + min_gain:
        return StepPlan(1, [0] * count, 1.0)
    return best


def plan_rows_alone(rows: Sequence[RowOutlook], curve: VerifyCostCurve) -> StepPlan:
    """`on`: each row drafts what would pay for it alone on `curve`, whatever the rows beside it cost."""
    drafts = [plan_step([row], curve, min_gain=0.0).drafts[0] for row in rows]
    width = max(row.head + drafted for row, drafted in zip(rows, drafts))
    return StepPlan(width, drafts)


def break_even_acceptance(curve: VerifyCostCurve, min_gain: float = MIN_GAIN) -> dict[int, float | None]:
    """Per draft length k, the acceptance from which one sequence drafting k tokens beats plain decoding (None: never)."""
    needed = {}
    for drafted in range(1, MAX_DRAFT + 1):
        target = (1 + min_gain) * curve.cost(drafted + 1)
        if expected_tokens(1.0, drafted) <= target:
            needed[drafted] = None
            continue
        low, high = 0.0, 1.0
        for _ in range(40):
            middle = (low + high) / 2
            low, high = (middle, high) if expected_tokens(middle, drafted) <= target else (low, middle)
        needed[drafted] = round(high, 3)
    return needed
