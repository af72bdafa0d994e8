"""The RAM prefix cache with the disk tier under it, behind the interface both implement (`cache/tier.py`).

A request first asks both tiers how much of its prompt they can restore (the
disk from its index, without reading KV bytes; both by the same rule,
`prefix_index.py`, so a positional model's lane with no checkpoint inside the
common prefix is never loaded). If a disk lane restores more, the prefix it
restores is loaded (only the blocks and checkpoints RAM does not hold) and
admitted to the RAM cache (same budget, LRU and replacement rules; a block or
checkpoint RAM already holds is shared, not doubled); the request is then
served from RAM. Every entry the RAM cache keeps is also queued for the disk,
whose writer works off the request path and writes only what the directory
does not hold yet.

A disk fault never reaches the request: the disk tier counts and logs it and
the request takes what RAM has.

Every call names the model: RAM files each model's entries and blocks apart
(`RamTier.model_key`), the disk tier each model's lanes in the folder of its
weights' digest, and a store goes to the folder of the model that computed it,
whichever model the last request used (several models in one server:
`--models-config`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from stable_prefix.engine_patch.cache.cache_layers import positional_indices
from stable_prefix.engine_patch.cache.ram_tier import Checkpoint, Fetched, RamTier

from .disk_tier import DiskTier


class TieredCache:
    def __init__(self, ram: RamTier, disk: DiskTier | None = None):
        self.ram = ram
        self.disk = disk

    def fetch(self, model: Any, prompt_tokens: list[int]) -> Fetched:
        ram_reuse = self._load_if_longer(model, prompt_tokens) if self.disk is not None else None
        fetched = self.ram.fetch(model, prompt_tokens)
        if ram_reuse is not None and fetched.reused > ram_reuse:
            self.disk.record_hit(fetched.reused)
        return fetched

    def _load_if_longer(self, model: Any, prompt_tokens: list[int]) -> int | None:
        """Load the disk's best entry into RAM if it restores more of the prompt than RAM alone.

        Returns what RAM alone would have reused when an entry was loaded, else None.
        """
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        positional = bool(positional_indices(make_prompt_cache(model)))
        try:
            match = self.disk.longest_restorable_prefix(model, prompt, positional)
        except Exception as error:
            self.disk.count_error("looking up the disk index", error)
            return None
        ram_reuse = self.ram.restorable_prefix(prompt, positional, model)
        if match is None or match.length <= ram_reuse:
            return None
        loaded = self.disk.load(match, functools.partial(self.ram.held_blocks, model=model), self.ram.held_checkpoints(model))
        if loaded is None:
            return None
        loaded.entry.model = self.ram.model_key(model)
        for ref in loaded.entry.blocks:
            ref.block.model = loaded.entry.model  # those read from disk (RAM's own are this model's already)
        self.ram.admit(loaded.entry)
        return ram_reuse

    def restorable_prefix(self, prompt_tokens: list[int] | np.ndarray, positional: bool, model: Any) -> int:
        """How many prompt tokens RAM would restore now for `model` (the disk's entries reach RAM when a request loads them)."""
        return self.ram.restorable_prefix(prompt_tokens, positional, model)

    def store(self, tokens: list[int], prompt_cache: list[Any], prompt_length: int | None = None, checkpoints: list[Checkpoint] = (),
              *, model: Any) -> None:
        stores = self.ram.counters.stores
        self.ram.store(tokens, prompt_cache, prompt_length, checkpoints, model)
        if self.disk is None or model is None or self.ram.counters.stores == stores:
            return
        entry = self.ram.newest_entry()
        try:
            self.disk.submit(model, entry)
        except Exception as error:
            self.disk.count_error("queueing a snapshot for the disk", error)

    def keep_live(self, tokens: list[int], prompt_cache: list[Any], *, model: Any) -> None:
        """The live cache stays in RAM alone (the disk has the lane's blocks from `store`)."""
        self.ram.keep_live(tokens, prompt_cache, model)

    def record_fallback(self, reason: str) -> None:
        self.ram.record_fallback(reason)

    def clear(self, tiers: tuple[str, ...] = ("ram", "disk")) -> dict[str, int]:
        dropped = {}
        if "ram" in tiers:
            dropped["entries_dropped"] = self.ram.clear()
        if "disk" in tiers and self.disk is not None:
            dropped["disk_entries_dropped"] = self.disk.clear()
        return dropped

    def stats(self) -> dict[str, Any]:
        disk = self.disk.stats() if self.disk is not None else {"disk_enabled": False}
        return {**self.ram.stats(), **disk}
