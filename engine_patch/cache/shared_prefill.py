"""Requests in flight at once that share a prefix prefill it once.

Claude Code starts the instances of a fan-out group (several Explore agents)
at the same moment: the same system prompt and tools, then each its own task.
A batching engine that looks only at its cache prefills each of them from
nothing, since none has finished when the others arrive. Here the engine keeps
the prompts it is prefilling; a new request that shares more of its prompt
with one of them than the cache can give waits until that prefill has passed
the shared part, where a stop in the other's prefill stores it in the cache
(`Prefill.share_at`), and then restores it like any other prefix.

A rewindable model (plain attention) can also take a prefix from a prompt
prefilled past it, since its state can be trimmed; a positional one (recurrent
state, sliding windows) only at a stop made in time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from .prefix_index import common_prefix_length
from .request_plan import RequestPlan

# Below this, waiting for another request's prefill costs more (a step of the
# batch, a snapshot) than prefilling the shared part again.
MIN_SHARED_TOKENS = 256


@dataclass(eq=False)
class Prefill:
    """A planned sequence: its plan, how far its prompt is prefilled, where it must stop for others.

    `uid` is None until the sequence is inserted into the batch; the stops asked
    for before that are made at its insertion.
    """

    plan: RequestPlan
    uid: int | None = None
    prefilled: int = 0  # prompt tokens its cache holds
    share_at: set[int] = field(default_factory=set)

    def __post_init__(self):
        self.tokens = np.asarray(self.plan.tokens, dtype=np.int64)
        self.prefilled = self.plan.reused

    @property
    def inserted(self) -> int:
        """Prompt tokens it is inserted with (the rest was restored)."""
        return len(self.tokens) - self.plan.reused

    def stops(self) -> list[int]:
        """Where its prefill must stop, counted from its first inserted token."""
        return sorted({position - self.plan.reused for position in (*self.plan.checkpoint_at, *self.share_at)})


class SharedPrefills:
    """The planned sequences in the batch, by uid."""

    def __init__(self):
        self.by_uid: dict[int, Prefill] = {}

    def inserted(self, prefill: Prefill, uid: int) -> None:
        prefill.uid = uid
        self.by_uid[uid] = prefill

    def pop(self, uid: int) -> Prefill | None:
        return self.by_uid.pop(uid, None)

    def clear(self) -> None:
        self.by_uid.clear()


def source_for(prefills: Iterable[Prefill], prompt: list[int] | np.ndarray, restorable: int, positional: bool) -> tuple[Prefill, int] | None:
    """The prefill that gives `prompt` the most beyond the `restorable` tokens the cache has, and how many tokens.

    None when no prefill is worth waiting for. The shared part never covers the
    prompt's last token (generation needs its logits).
    """
    prompt = np.asarray(prompt, dtype=np.int64)
    best: tuple[Prefill, int] | None = None
    for prefill in prefills:
        shared = min(common_prefix_length(prefill.tokens, prompt), len(prompt) - 1, len(prefill.tokens) - 1)
        if shared - restorable < MIN_SHARED_TOKENS:
            continue
        if positional and prefill.prefilled > shared:
            continue  # its state went past the shared part and cannot be rewound
        if best is None or shared > best[1]:
            best = (prefill, shared)
    return best
