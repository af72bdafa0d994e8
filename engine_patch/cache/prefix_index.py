"""Which stored lane serves a prompt, and which lanes a new one replaces: one rule for RAM and disk.

Both tiers keep lanes (a RAM entry, a manifest on disk) described by the same
three things: their token ids, how many of them were prompt (the rest was
generated) and the positions of their checkpoints. This module decides, from
those alone (no KV bytes):

- `best_match`: the lane restoring the most of a prompt. A model of plain
  attention layers restores any prefix of a lane by trimming; a model with
  positional layers (recurrent state, sliding windows) only a checkpoint or
  the lane's end inside the common prefix (`restorable_length`). At least one
  prompt token is always left to prefill: generation needs its logits.
- `placement`: whether a new lane is already held (a lane restores every
  position it would) and, if not, which lanes it replaces: those whose whole
  prompt it repeats. The next turn of a conversation re-renders the previous
  reply in its own way, so only the prompt part of an older turn is worth
  keeping, and the new lane holds it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class Lane(Protocol):
    tokens: np.ndarray
    prompt_length: int

    @property
    def checkpoint_positions(self) -> Sequence[int]: ...


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    mismatches = np.flatnonzero(a[:n] != b[:n])
    return int(mismatches[0]) if len(mismatches) else n


def restorable_length(token_count: int, checkpoint_positions: Iterable[int], limit: int, positional: bool) -> int:
    """The longest prefix of at most `limit` tokens a lane of `token_count` tokens can restore exactly.

    Rewindable models: any prefix (by trimming). Positional ones: a checkpoint
    position or the lane's end.
    """
    if not positional:
        return min(limit, token_count)
    positions = [position for position in checkpoint_positions if position <= limit]
    if token_count <= limit:
        positions.append(token_count)
    return max(positions, default=0)


def repeats_prompt_of(lane: Lane, tokens: np.ndarray) -> bool:
    """Whether `tokens` hold the lane's whole prompt (so a lane of them replaces it)."""
    return common_prefix_length(lane.tokens, tokens) >= lane.prompt_length


@dataclass(frozen=True)
class Match:
    key: Hashable | None  # the lane restoring the most; None: none restores anything
    length: int  # prompt tokens it restores
    longest_common: int  # the longest prefix the prompt shares with any lane


def best_match(lanes: Iterable[tuple[Hashable, Lane]], prompt: np.ndarray, positional: bool) -> Match:
    """The lane restoring the most of `prompt` (all but its last token); on a tie the last one given."""
    best_key, best_length, longest_common = None, 0, 0
    for key, lane in lanes:
        common = common_prefix_length(lane.tokens, prompt)
        longest_common = max(longest_common, common)
        length = restorable_length(len(lane.tokens), lane.checkpoint_positions, min(common, len(prompt) - 1), positional)
        if length >= best_length and length > 0:
            best_key, best_length = key, length
    return Match(best_key, best_length, longest_common)


@dataclass(frozen=True)
class Placement:
    held_by: Hashable | None = None  # a lane that already restores everything the new one would
    replaces: list[Hashable] = field(default_factory=list)


def placement(lanes: Iterable[tuple[Hashable, Lane]], tokens: np.ndarray, checkpoint_positions: Sequence[int], positional: bool) -> Placement:
    """Where a new lane of `tokens` (with checkpoints at `checkpoint_positions`) goes among `lanes`."""
    wanted = [*checkpoint_positions, len(tokens)]
    replaces = []
    for key, lane in lanes:
        common = common_prefix_length(lane.tokens, tokens)
        if common >= len(tokens) and all(
            restorable_length(len(lane.tokens), lane.checkpoint_positions, position, positional) == position for position in wanted
        ):
            return Placement(held_by=key)
        if common >= lane.prompt_length:
            replaces.append(key)
    return Placement(replaces=replaces)
