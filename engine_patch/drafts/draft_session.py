"""One request's drafting: its proposer, its acceptance, and what the engine tells it after each step.

An engine asks a session, before each decode step, for the row's outlook
(how many draft tokens it could verify, how often its drafts are confirmed)
and after the step's plan for the draft itself; afterwards it reports the
tokens the step decided (`decided`) and how much of a draft the target
confirmed (`judged`). Steps without a draft report their token through
`decided` too: the session then judges a shadow draft with it, so the
request's acceptance is known before drafting is switched on for it.

A fault of the proposer (it is only ever a guess) stops drafting for the
request, logged and counted in `draft_bypassed`; the request decodes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .acceptance import AcceptanceTracker
from .cost_gate import MAX_DRAFT, RowOutlook
from .suffix_proposer import SuffixProposer

if TYPE_CHECKING:
    from .drafting import DraftStats

logger = logging.getLogger("engine_patch")


class DraftSession:
    def __init__(self, proposer: SuffixProposer, stats: DraftStats, bypass: str | None = None):
        self.proposer = proposer
        self.acceptance = AcceptanceTracker()
        self.stats = stats
        # Why this request never drafts (logits processors, ...): it still decodes, counted.
        self.bypass = bypass
        self._proposal: list[int] = []

    @property
    def may_draft(self) -> bool:
        return self.bypass is None

    def outlook(self, remaining: int, head: int = 1) -> RowOutlook:
        """This row before a step: `remaining` tokens it may still emit, `head` tokens it feeds anyway."""
        self._proposal = []
        if self.may_draft and remaining > 1:
            self._proposal = self._proposed(min(MAX_DRAFT, remaining - 1))
        return RowOutlook(self.acceptance.rate, len(self._proposal), head)

    def draft(self, length: int) -> list[int]:
        """The first `length` tokens of the proposal `outlook` found."""
        return self._proposal[:length]

    def decided(self, tokens: Sequence[int], drafted: bool = False) -> None:
        """Tokens the last step decided, in order. A step without a draft judges the shadow draft with them."""
        try:
            self.proposer.extend(tokens)
        except Exception as error:
            self._failed(error)
        if drafted:
            self.acceptance.shadow([])  # a real draft was judged at this position instead
            return
        if not self.may_draft:
            return
        self.acceptance.produced(tokens)
        if not self.acceptance.shadowing:
            shadow = self._proposed(MAX_DRAFT)
            if shadow:
                self.acceptance.shadow(shadow)

    def _proposed(self, count: int) -> list[int]:
        try:
            return self.proposer.propose(count)
        except Exception as error:
            self._failed(error)
            return []

    def _failed(self, error: BaseException) -> None:
        if self.bypass is None:
            logger.warning("engine_patch: the draft proposer failed (%r); this request decodes without drafts", error)
            self.bypass = "proposer fault"
            self.stats.bypass(self.bypass)

    def judged(self, proposed: int, accepted: int) -> None:
        """The target confirmed `accepted` of the `proposed` draft tokens of the last step."""
        self.acceptance.judged(proposed, accepted)
        self.stats.judged(proposed, accepted)
