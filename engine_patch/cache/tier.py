"""What serving a request needs of the cache, declared once: the interface `PrefixPlanner` is typed with.

Two tiers implement it: the RAM tier alone (`ram_tier.RamTier`) and
RAM with the disk tier under it (`disk/tiered_cache.TieredCache`, which this
room never imports: it lives a room above). Every call names the model whose
state it is, so a server holding several models never restores or files one
model's state as another's.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .ram_tier import Checkpoint, Fetched


class CacheTier(Protocol):
    def fetch(self, model: Any, prompt_tokens: list[int]) -> Fetched:
        """A cache for `prompt_tokens` with the longest restorable stored prefix (at least one token left to prefill)."""
        ...

    def restorable_prefix(self, prompt_tokens: list[int] | np.ndarray, positional: bool, model: Any) -> int:
        """How many prompt tokens a fetch by `model` would reuse now, without restoring anything."""
        ...

    def store(self, tokens: list[int], prompt_cache: list[Any], prompt_length: int | None = None,
              checkpoints: list[Checkpoint] = (), *, model: Any) -> None:
        """Keep the state of `prompt_cache`, whose first tokens are `tokens`, computed by `model`."""
        ...

    def keep_live(self, tokens: list[int], prompt_cache: list[Any], *, model: Any) -> None:
        """Keep `prompt_cache` itself (its request is over) for the next request sharing its prefix: `live_lane.py`."""
        ...

    def record_fallback(self, reason: str) -> None:
        """Count a request the cache failed (it ran uncached, or stored nothing)."""
        ...

    def stats(self) -> dict[str, Any]: ...
