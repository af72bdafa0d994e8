"""Drafting for one server: its mode, its verify-cost curve and decision, its sessions and counters.

Both engine attachments hold one `Drafting`: they call `prepare(model)` when
the model is loaded (in `auto` this measures the curve), `session(prompt)`
for every request (None when no draft could pay here, so an engine that
cannot gain proposes and shadows nothing), `plan(rows)` before each decode
step, and count every forward through `stats`. `/v1/cache/stats` shows
`figures()`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stable_prefix.engine_patch.cache.per_model import PerModel

from .cost_gate import MIN_GAIN, MODES, RowOutlook, StepPlan, VerifyCostCurve, break_even_acceptance, nominal_curve, plan_rows_alone, plan_step
from .draft_session import DraftSession
from .json_string_view import json_string_view
from .suffix_proposer import FrozenTokens, JoinedLanes, SuffixProposer

logger = logging.getLogger("engine_patch")

# Other lanes a session drafts from (the most recently stored entries).
MAX_OTHER_LANES = 16


class DraftStats:
    """Counters, written by the engine thread only (plain integers: a reader on another thread sees a recent value)."""

    def __init__(self) -> None:
        self.decode_steps = 0  # target forwards while decoding, once per sequence in each
        self.decode_tokens = 0  # tokens those sequences emitted
        self.verify_steps = 0  # of the steps, those with a draft to verify
        self.draft_proposed = 0
        self.draft_accepted = 0
        # Greedy tokens a wider forward nearly tied on, decided by a one-token forward (verification.py's margin rule).
        self.near_ties = 0
        # Those a row of a recurrent model in a batch had to take from the wider forward (drafted_decode.py says why).
        self.near_ties_taken_wide = 0
        self.bypassed: dict[str, int] = {}

    def step(self, sequences: int = 1, drafted: int = 0) -> None:
        """A forward fed `sequences` sequences, `drafted` of them with a draft."""
        self.decode_steps += sequences
        self.verify_steps += drafted

    def emitted(self, tokens: int = 1) -> None:
        self.decode_tokens += tokens

    def judged(self, proposed: int, accepted: int) -> None:
        self.draft_proposed += proposed
        self.draft_accepted += accepted

    def decided_alone(self, tokens: int = 1) -> None:
        self.near_ties += tokens

    def near_tie_taken_wide(self) -> None:
        self.near_ties_taken_wide += 1

    def bypass(self, reason: str) -> None:
        self.bypassed[reason] = self.bypassed.get(reason, 0) + 1

    def figures(self) -> dict[str, Any]:
        per_token = self.decode_steps / self.decode_tokens if self.decode_tokens else None
        return {
            "decode_steps": self.decode_steps,
            "decode_tokens": self.decode_tokens,
            "decode_steps_per_token": round(per_token, 4) if per_token is not None else None,
            "draft_verify_steps": self.verify_steps,
            "draft_proposed": self.draft_proposed,
            "draft_accepted": self.draft_accepted,
            "draft_near_ties": self.near_ties,
            "draft_near_ties_taken_wide": self.near_ties_taken_wide,
            "draft_bypassed": dict(self.bypassed),
        }


class Drafting:
    def __init__(self, mode: str = "auto", lanes: Callable[[], Sequence[np.ndarray]] = list, min_gain: float = MIN_GAIN,
                 proposer: Callable[..., Any] = SuffixProposer):
        if mode not in MODES:
            raise ValueError(f"--draft {mode!r}: choose {', '.join(MODES)}")
        self.mode = mode
        self.lanes = lanes
        self.proposer = proposer  # (prompt, other lanes, quoted prompt) -> an object with extend(tokens) and propose(count)
        self.min_gain = min_gain if mode == "auto" else 0.0
        self.stats = DraftStats()
        self.curve: VerifyCostCurve | None = nominal_curve() if mode == "on" else None
        self._prepared = PerModel()  # the models measured (held weakly: a later model at a freed one's address is measured too)
        self._lock = threading.Lock()
        self._frozen: dict[int, tuple[np.ndarray, FrozenTokens]] = {}
        self._break_even: tuple[VerifyCostCurve, float | None] | None = None

    # --- the decision ------------------------------------------------------------

    def prepare(self, model: Any) -> None:
        """In `auto`, measure this model's verify-cost curve (once per model object) and log the decision."""
        with self._lock:
            if self.mode != "auto" or model in self._prepared:
                return
            self._prepared.set(model, True)
        from .verify_cost import measure_verify_cost

        try:
            self.curve = measure_verify_cost(model)
        except Exception as error:  # a failed measurement must not stop the server: it decodes without drafts
            logger.warning("engine_patch: measuring the verify cost failed (%r); no drafting", error)
            return
        logger.info("engine_patch: drafting (auto): %s", self.decision()["reason"])

    @property
    def pays_somewhere(self) -> bool:
        """Whether any acceptance makes a draft pay on the curve (else no request drafts or shadows)."""
        return self._lowest_break_even() is not None

    def might_pay(self, acceptance: float) -> bool:
        """Whether a row with this acceptance could be worth a draft at all (a cheap check before any lookup)."""
        lowest = self._lowest_break_even()
        return lowest is not None and acceptance >= lowest

    def _lowest_break_even(self) -> float | None:
        if self.curve is None or self.mode == "off":
            return None
        if self._break_even is None or self._break_even[0] is not self.curve:
            needed = [alpha for alpha in break_even_acceptance(self.curve, self.min_gain).values() if alpha is not None]
            self._break_even = (self.curve, min(needed) if needed else None)
        return self._break_even[1]

    def plan(self, rows: Sequence[RowOutlook]) -> StepPlan:
        if not rows or self.curve is None or self.mode == "off":
            return StepPlan(1, [0] * len(rows))
        if self.mode == "on":
            return plan_rows_alone(rows, self.curve)
        return plan_step(rows, self.curve, self.min_gain)

    def decision(self) -> dict[str, Any]:
        """What the mode decided and why, with the curve it used."""
        if self.mode == "off":
            return {"mode": "off", "drafting": "off", "reason": "--draft off"}
        if self.curve is None:
            return {"mode": self.mode, "drafting": "off", "reason": "the verify-cost curve is measured when the model is loaded: not yet"}
        needed = break_even_acceptance(self.curve, self.min_gain)
        paying = {drafted: alpha for drafted, alpha in needed.items() if alpha is not None}
        if paying:
            best = min(paying, key=paying.get)
            drafting = "per request, from its acceptance" if self.mode == "auto" else "on"
            reason = f"a draft pays once a request's acceptance reaches {paying[best]:.2f} (drafting {best} tokens)"
        else:
            drafting, reason = "off", "verifying k drafted tokens costs about k steps here: no acceptance makes a draft pay"
        return {"mode": self.mode, "drafting": drafting, "reason": reason, "verify_cost": self.curve.describe(),
                "break_even_acceptance": {str(drafted): alpha for drafted, alpha in needed.items()}, "min_gain": self.min_gain}

    # --- requests ----------------------------------------------------------------

    def session(self, prompt: Sequence[int], bypass: str | None = None, tokenizer: Any = None) -> DraftSession | None:
        """A request's session; None when no draft could pay here (nothing is proposed or shadowed).

        With the request's `tokenizer`, its prompt is also a source as a JSON string quotes it
        (`json_string_view.py`: what an Edit's or a Write's arguments repeat).
        """
        if not self.pays_somewhere:
            return None
        if bypass is not None:
            self.stats.bypass(bypass)
            return DraftSession(self.proposer(prompt), self.stats, bypass)
        return DraftSession(self.proposer(prompt, self._other_lanes(), self._quoted(prompt, tokenizer)), self.stats)

    def _other_lanes(self) -> JoinedLanes | None:
        """The prefix cache's lanes as one source; each lane's index is built once while it stays in the cache."""
        try:
            arrays = list(self.lanes())[-MAX_OTHER_LANES:]
        except Exception as error:  # another lane's tokens are a bonus: never a reason to fail a request
            logger.debug("engine_patch: other lanes unavailable for drafting (%r)", error)
            return None
        # Keyed by identity, each array kept beside its index so its id cannot be reused while it is held.
        self._frozen = {id(array): self._frozen.get(id(array)) or (array, FrozenTokens(array)) for array in arrays}
        return JoinedLanes([frozen for _, frozen in self._frozen.values()]) if arrays else None

    def _quoted(self, prompt: Sequence[int], tokenizer: Any) -> FrozenTokens | None:
        if tokenizer is None:
            return None
        try:
            return FrozenTokens(json_string_view(tokenizer, prompt))
        except Exception as error:  # a tokenizer without decode/encode as expected: the view is a bonus too
            logger.debug("engine_patch: no JSON-string view of the prompt for drafting (%r)", error)
            return None

    def figures(self) -> dict[str, Any]:
        return {**self.stats.figures(), "draft_mode": self.mode, "draft_decision": self.decision()}
