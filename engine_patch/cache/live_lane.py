"""The hot lane kept live: the cache a request ended with, handed as it is to the next request sharing its prefix.

A warm request restored from blocks copies its whole prefix into new arrays
(`cache_layers.restore_from_blocks`): at real sizes gigabytes a turn, when the
lane that continues is almost always the one that just ended. So when a
request ends with a cache it owned from its restore on, that cache (mlx-lm's
per-layer objects, not a copy) is kept here too, and a later request whose
restorable prefix (`prefix_index.py`'s rule, as for the blocks: never more)
lies inside its tokens takes it over: the rewindable layers are trimmed back
to that prefix in place and positional ones (recurrent state, sliding windows,
which cannot be rewound) stay as they are when the prefix ends exactly where
the lane ended, or are restored from the entry's checkpoint there. Nothing of
the prefix is copied.

Why this is safe: the RAM tier's blocks and checkpoints are copies taken at
`store`, and MLX never writes into an array another one shares (its in-place
updates only donate a buffer nobody else holds), so what the next request
writes into the live cache cannot reach them. A lane is handed to one request
and forgotten here (it is that request's now); it comes back when that request
ends. A cache whose token count changed since it was kept (someone fed it) is
not used: the request restores from the blocks, the reason counted and logged.

Bound: at most `limit` lanes (one by default), outside the RAM tier's byte
budget. A request that does not take a lane drops the oldest beyond `limit - 1`,
so with one lane nothing is held while another lane's request runs beyond what
that request holds itself: the memory a request needs while it runs. A model freed (unloaded) takes its
lanes with it (`RamTier._model_freed`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cache_layers import cached_token_count, positional_indices, state_nbytes
from .prefix_index import common_prefix_length


@dataclass(eq=False)
class LiveLane:
    """A request's cache as it ended, and what its layers hold."""

    tokens: np.ndarray  # the tokens whose state its rewindable layers hold
    prompt_cache: list[Any]
    model: str | None
    offset: int  # its token count when kept: any other count means it was fed since
    positional_end: bool  # its positional layers hold the state after exactly `tokens` (not a token more)
    nbytes: int


class LiveLanes:
    """The last `limit` requests' caches, newest last. Call every method under the RAM tier's lock."""

    def __init__(self, limit: int = 1):
        self.limit = limit
        self.lanes: list[LiveLane] = []
        # Keys of models freed since (appended by a finalizer, without the lock: a deque's append is atomic).
        self._forgotten: collections.deque[str] = collections.deque()

    def forget_model(self, model: str) -> None:
        """`model` was freed (unloaded): its lanes go at the next `drop_forgotten` (any call below makes one)."""
        self._forgotten.append(model)

    def drop_forgotten(self) -> None:
        gone = set()
        while self._forgotten:
            gone.add(self._forgotten.popleft())
        if gone:
            self.lanes = [lane for lane in self.lanes if lane.model not in gone]

    def keep(self, tokens: list[int], prompt_cache: list[Any], model: str | None) -> None:
        """Keep `prompt_cache`, the state of `tokens` (prompt and generated), for the next request sharing it."""
        self.drop_forgotten()
        if self.limit <= 0:
            return
        counted = cached_token_count(prompt_cache)
        if counted is None or counted == 0:
            return
        held = min(counted, len(tokens))
        positional_end = counted <= len(tokens) or not positional_indices(prompt_cache)
        self.lanes = [lane for lane in self.lanes if lane.prompt_cache is not prompt_cache]
        self.lanes.append(LiveLane(np.asarray(tokens[:held], dtype=np.int64), prompt_cache, model, counted, positional_end,
                                   state_nbytes(prompt_cache)))
        del self.lanes[: -self.limit]

    def take(self, model: str | None, prompt: np.ndarray, length: int) -> LiveLane | None:
        """The newest lane of `model` whose tokens start with `prompt[:length]`, no longer kept here; None if none
        (then the oldest lanes beyond `limit - 1` are dropped: the request about to run brings its own cache)."""
        self.drop_forgotten()
        for index in range(len(self.lanes) - 1, -1, -1):
            lane = self.lanes[index]
            if length > 0 and lane.model == model and common_prefix_length(lane.tokens, prompt[:length]) >= length:
                return self.lanes.pop(index)
        del self.lanes[: max(0, len(self.lanes) - (self.limit - 1))]
        return None

    def clear(self) -> None:
        self.lanes.clear()

    @property
    def nbytes(self) -> int:
        self.drop_forgotten()
        return sum(lane.nbytes for lane in self.lanes)
