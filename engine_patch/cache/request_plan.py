"""What one request does with the prefix cache, whichever engine runs it.

Both engine attachments (SimpleEngine's `stream_generate` seam and the
continuous-batching scheduler's) serve a request the same way:

1. `plan`: restore the longest stored prefix of its prompt and decide where a
   model with positional layers (recurrent state, sliding windows) must be
   checkpointed while the rest of the prompt is prefilled (see
   `prompt_boundaries.py`), and where the next turn stops repeating it;
2. `checkpoint`: at each of those positions, snapshot the positional layers of
   the live cache (the engine prefills up to there, its own way);
3. `finish`: keep the state the request ended with, with its checkpoints.

Which models the cache serves is decided here too, once per model. Any fault
while restoring, checkpointing or storing is counted and logged, and the
request goes on uncached (restore) or stores nothing (snapshot): never a wrong
answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from .cache_layers import UnsupportedCache, check_snapshot_support, has_recurrent_state, positional_indices, snapshot
from .per_model import PerModel
from .prefix_index import common_prefix_length
from .prompt_boundaries import checkpoint_positions, generation_prompt_start, message_start_ids, min_branch_tokens
from .ram_tier import Checkpoint, Fetched
from .tier import CacheTier

logger = logging.getLogger("engine_patch")

MAX_HEADS_REMEMBERED = 8


@dataclass(eq=False)
class RequestPlan:
    """One request's use of the cache: what was restored and what to snapshot on the way."""

    tokens: list[int]
    fetched: Fetched
    # The next turn of this conversation repeats the prompt up to here (for a
    # positional model the start of the generation prompt; else all of it).
    prompt_length: int
    # Where to snapshot the positional layers, strictly after `reused` (empty for rewindable models).
    checkpoint_at: list[int] = field(default_factory=list)
    head_length: int | None = None
    checkpoints: list[Checkpoint] = field(default_factory=list)
    model: Any = field(default=None, repr=False)  # whose state it is: stored under that model (for the request's life only)

    @property
    def reused(self) -> int:
        return self.fetched.reused

    @property
    def prompt_cache(self) -> list[Any]:
        return self.fetched.prompt_cache

    def checkpoints_up_to(self, position: int) -> list[Checkpoint]:
        """Every checkpoint valid for a state of the first `position` tokens (restored ones included)."""
        return [c for c in self.fetched.inherited + self.checkpoints if c.position <= position]


class PrefixPlanner:
    """Serves requests from a cache tier (`tier.py`: RAM alone, or RAM over disk), one model family rule for every engine."""

    def __init__(self, cache: CacheTier):
        self.cache = cache
        # Per model object (held weakly: cache/per_model.py): why its cache cannot be snapshotted (None: it can),
        # whether it has positional layers to checkpoint, and the earliest branch point inside the first
        # message worth its state (`prompt_boundaries.min_branch_tokens`: recurrent state costs more).
        self._support: PerModel[tuple[str | None, bool, int]] = PerModel()
        # Requests that went uncached on purpose, by reason.
        self.bypassed: dict[str, int] = {}
        # Recently seen chat heads (text -> token ids), least recent first.
        self._head_tokens: dict[str, np.ndarray] = {}

    def supports(self, model: Any) -> bool:
        """Whether this model's cache can be snapshotted (decided once per model, logged if not)."""
        return self._support.setdefault(model, lambda: self._check(model))[0] is None

    @staticmethod
    def _check(model: Any) -> tuple[str | None, bool, int]:
        try:
            prompt_cache = make_prompt_cache(model)
            check_snapshot_support(prompt_cache)
            return None, bool(positional_indices(prompt_cache)), min_branch_tokens(has_recurrent_state(prompt_cache))
        except UnsupportedCache as reason:
            logger.warning("prefix cache disabled for %s: %s", type(model).__name__, reason)
            return str(reason), False, 0

    def is_positional(self, model: Any) -> bool:
        return self.supports(model) and self._support.get(model)[1]

    def unsupported_reasons(self) -> list[str]:
        return [reason for reason, *_ in self._support.values() if reason]

    def bypass(self, reason: str) -> None:
        """Count a request that runs uncached on purpose."""
        self.bypassed[reason] = self.bypassed.get(reason, 0) + 1

    def plan(self, model: Any, tokenizer: Any, tokens: list[int], head_text: Callable[[], str | None] | None = None) -> RequestPlan | None:
        """Restore what the cache holds of `tokens`; None (the fault counted) if restoring failed."""
        try:
            fetched = self.cache.fetch(model, tokens)
        except Exception as error:  # a cache fault must never fail the request
            self.fallback("restore", error, "this request runs uncached")
            return None
        logger.info(
            "prefix cache %s: %d prompt tokens, %d reused, %d to prefill",
            "HIT" if fetched.reused else "MISS", len(tokens), fetched.reused, len(tokens) - fetched.reused,
        )
        if not self.is_positional(model):
            return RequestPlan(tokens, fetched, prompt_length=len(tokens), model=model)
        start_ids = message_start_ids(tokenizer)
        head_length = self._head_length(tokenizer, tokens, head_text)
        positions = checkpoint_positions(tokens, start_ids, after=fetched.reused, head_length=head_length, diverges_at=fetched.common_prefix,
                                         min_branch_tokens=self._support.get(model)[2])
        # The next turn repeats the prompt up to its generation prompt (not its
        # thinking tail): an entry is superseded once another repeats that.
        return RequestPlan(tokens, fetched, generation_prompt_start(tokens, start_ids), positions, head_length, model=model)

    def checkpoint(self, plan: RequestPlan, prompt_cache: list[Any], position: int) -> None:
        """Snapshot the positional layers of `prompt_cache`, which holds exactly the first `position` tokens."""
        layers, nbytes = snapshot(prompt_cache, positional_indices(prompt_cache))
        plan.checkpoints.append(Checkpoint(position, layers, nbytes, pinned=position == plan.head_length))

    def finish(self, plan: RequestPlan, tokens: list[int], prompt_cache: list[Any], prompt_length: int | None = None,
               *, ends_request: bool | None = None) -> None:
        """Keep `prompt_cache`, the state of `tokens` (the prompt and what was generated), with the plan's checkpoints.

        When the request has ended with a cache no one feeds any more, that cache itself is kept live for the
        next request sharing its prefix (`live_lane.py`). `ends_request` says so; by default it is so when
        `prompt_cache` is the very cache the plan restored (SimpleEngine's request, over); a batch's state
        (a sequence still running, another object) is never kept.
        """
        try:
            self.cache.store(tokens, prompt_cache, plan.prompt_length if prompt_length is None else prompt_length, plan.checkpoints_up_to(len(tokens)),
                             model=plan.model)
        except Exception as error:  # the answer is already out; only reuse is lost
            self.fallback("snapshot", error, "nothing stored for this request")
            return
        if ends_request if ends_request is not None else prompt_cache is plan.prompt_cache:
            self.cache.keep_live(tokens, prompt_cache, model=plan.model)

    def fallback(self, stage: str, error: BaseException, consequence: str) -> None:
        logger.warning("prefix cache %s failed (%r); %s", stage, error, consequence)
        self.cache.record_fallback(f"{stage}: {error!r}")

    def _head_length(self, tokenizer: Any, tokens: list[int], head_text: Callable[[], str | None] | None) -> int | None:
        try:
            text = head_text() if head_text else None
        except Exception:  # the probe renders the template; any failure just means no head checkpoint
            return None
        if not text:
            return None
        # Lanes share a handful of heads of ~20K tokens: encode each once.
        head = self._head_tokens.pop(text, None)
        if head is None:
            head = np.asarray(prompt_token_ids(tokenizer, text), dtype=np.int64)
        self._head_tokens[text] = head
        while len(self._head_tokens) > MAX_HEADS_REMEMBERED:
            self._head_tokens.pop(next(iter(self._head_tokens)))
        # The last token or two of a text prefix may merge differently; keep what agrees.
        return common_prefix_length(head, np.asarray(tokens, dtype=np.int64)) or None


def prompt_token_ids(tokenizer: Any, prompt: Any) -> list[int]:
    """The token ids mlx-lm would prefill for `prompt` (same special-token rule)."""
    if isinstance(prompt, str):
        bos_token = getattr(tokenizer, "bos_token", None)
        add_special_tokens = bos_token is None or not prompt.startswith(bos_token)
        return list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
    if isinstance(prompt, mx.array):
        return [int(token) for token in prompt.tolist()]
    return [int(token) for token in prompt]
