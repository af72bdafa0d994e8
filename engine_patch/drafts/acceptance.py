"""How often a request's drafts are right, lately: the basis of its draft length and of the gate.

Each draft judged is a run of Bernoulli trials: every confirmed token a
success, the first disagreement a failure, the tokens after it unobserved.
The estimate is successes / trials, both decayed at every trial (about the
last ten count: a reply that turns from prose to a copied block, or back, is
noticed within a draft or two), starting from a prior of four successes in
five trials: an agent's replies copy more often than not, and a wrong prior
is forgotten within a draft (on the drafts bench's greedy answers, simulated:
forward passes per token 0.16 -> 0.15 on Edits, 0.87 -> 0.85 on chat).

Where no draft is verified (the gate is off, or the request may not draft),
the same trials come from *shadow* drafts: the proposer's guess at a
position, compared with the tokens the model then produced there. That costs
a lookup per step and no forward pass, so a machine where verifying is cheap
learns a request's acceptance before it pays for its first draft.
"""

from __future__ import annotations

from collections.abc import Sequence

DECAY_PER_TRIAL = 0.9
PRIOR_SUCCESSES, PRIOR_TRIALS = 4.0, 5.0


class AcceptanceTracker:
    def __init__(self) -> None:
        self.successes = PRIOR_SUCCESSES
        self.trials = PRIOR_TRIALS
        self.drafts_judged = 0
        self._shadow: list[int] = []  # a shadow draft still being compared
        self._shadow_confirmed = 0

    @property
    def rate(self) -> float:
        """The estimated chance that the next draft token is confirmed."""
        return self.successes / self.trials

    def judged(self, proposed: int, accepted: int) -> None:
        """A draft of `proposed` tokens had its first `accepted` confirmed."""
        if proposed <= 0:
            return
        outcomes = [1.0] * accepted + ([0.0] if accepted < proposed else [])
        for outcome in outcomes:
            self.successes = self.successes * DECAY_PER_TRIAL + outcome
            self.trials = self.trials * DECAY_PER_TRIAL + 1
        self.drafts_judged += 1

    # --- shadow drafts: judged against what the model produced without them ---

    @property
    def shadowing(self) -> bool:
        return bool(self._shadow)

    def shadow(self, draft: Sequence[int]) -> None:
        """Remember what the proposer would have drafted at the current position."""
        self._shadow, self._shadow_confirmed = list(draft), 0

    def produced(self, tokens: Sequence[int]) -> None:
        """Tokens the model produced (without a draft) since the last call: judge the shadow draft with them."""
        for token in tokens:
            if not self._shadow:
                return
            if token == self._shadow[self._shadow_confirmed]:
                self._shadow_confirmed += 1
                if self._shadow_confirmed < len(self._shadow):
                    continue
            self.judged(len(self._shadow), self._shadow_confirmed)
            self._shadow = []
