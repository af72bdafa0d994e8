"""A token-prefix KV cache for several lanes at once, bounded in bytes.

After a request, the model's KV cache holds the state of every token it has
seen (prompt and generated). `PrefixCache.store` keeps a compact snapshot of it;
`PrefixCache.fetch` finds the stored prefix sharing the most leading tokens with
a new prompt and returns a fresh, independent cache holding exactly those
tokens, so only the rest of the prompt needs a prefill.

Why not mlx-lm's `LRUPromptCache`: its trie is keyed by the model object and
token list per entry and deep-copies on every fetch; here one engine serves one
model, a Claude Code session has a handful of lanes (main agent, subagents,
title requests) whose prompts each grow turn by turn, and what matters is an
exact byte budget and the longest common prefix with *any* lane, including a
partial one (a conversation that was edited or whose last reply rendered
differently), which trimming the KV state gives for free.

Snapshots are taken and restored by `cache_layers.py`, the one module that
touches mlx-lm's per-layer cache internals.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from .cache_layers import cached_token_count, restore, snapshot, state_nbytes


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    mismatches = np.flatnonzero(a[:n] != b[:n])
    return int(mismatches[0]) if len(mismatches) else n


@dataclass
class CachedPrefix:
    tokens: np.ndarray
    layers: list[Any]
    nbytes: int
    prompt_length: int  # the rest of `tokens` was generated


@dataclass
class Fetched:
    """What a request gets back: a live cache holding `reused` prompt tokens."""

    prompt_cache: list[Any]
    reused: int


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    tokens_reused: int = 0
    tokens_prefilled: int = 0
    stores: int = 0
    evictions: int = 0
    trimmed_to_fit: int = 0
    fallbacks: int = 0
    last_fallback_reason: str | None = None


@dataclass
class PrefixCache:
    """LRU store of KV snapshots, keyed by the token sequence they hold.

    Thread-safety: fetch/store run on the engine's single generation thread;
    `clear` and `stats` may come from the server's event loop, so the entry
    table is guarded by a lock. Fetched caches are fresh objects owned by one
    request, so no other request can change what a request restored.
    """

    budget_bytes: int
    max_entries: int | None = None
    entries: OrderedDict[int, CachedPrefix] = field(default_factory=OrderedDict)
    counters: CacheStats = field(default_factory=CacheStats)
    _next_key: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def bytes_held(self) -> int:
        return sum(entry.nbytes for entry in self.entries.values())

    def fetch(self, model: Any, prompt_tokens: list[int]) -> Fetched:
        """A cache for `prompt_tokens` with the longest stored prefix restored.

        At least one prompt token is always left to prefill: generation needs
        the logits of the last prompt token, which a snapshot does not keep.
        """
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        with self._lock:
            best_key, best_length = None, 0
            for key, entry in self.entries.items():
                length = common_prefix_length(entry.tokens, prompt)
                if length >= best_length and length > 0:
                    best_key, best_length = key, length
            reused = min(best_length, len(prompt) - 1)
            if best_key is None or reused <= 0:
                self.counters.misses += 1
                self.counters.tokens_prefilled += len(prompt)
                return Fetched(make_prompt_cache(model), 0)
            entry = self.entries[best_key]
            self.entries.move_to_end(best_key)
            layers = entry.layers
        prompt_cache = restore(layers)
        surplus = len(entry.tokens) - reused
        if surplus:
            trim_prompt_cache(prompt_cache, surplus)
        with self._lock:
            self.counters.hits += 1
            self.counters.tokens_reused += reused
            self.counters.tokens_prefilled += len(prompt) - reused
        return Fetched(prompt_cache, reused)

    def store(self, tokens: list[int], prompt_cache: list[Any], prompt_length: int | None = None) -> None:
        """Keep the state of `prompt_cache`, whose first tokens are `tokens`.

        `prompt_length` says how many of `tokens` were prompt (the rest were
        generated). An entry whose whole prompt the new state repeats is
        dropped: the next turn of a conversation re-renders the reply in its
        own way, so only the prompt part of the older turn is worth keeping,
        and the new state holds it.

        The cache may hold fewer tokens than `tokens` (the last generated token
        is never fed back) or more (a token was fed but never reported): only
        the part both agree on is kept.
        """
        held = min(cached_token_count(prompt_cache), len(tokens))
        surplus = cached_token_count(prompt_cache) - held
        if surplus:
            trim_prompt_cache(prompt_cache, surplus)
        if held == 0:
            return
        bytes_per_token = state_nbytes(prompt_cache) / held
        fits = int(self.budget_bytes // bytes_per_token) if bytes_per_token else held
        if fits <= 0:
            return
        if fits < held:
            # Too big for the whole budget: keep the longest prefix that fits,
            # which still spares the next request most of its prefill.
            trim_prompt_cache(prompt_cache, held - fits)
            held = fits
            self.counters.trimmed_to_fit += 1
        new_tokens = np.asarray(tokens[:held], dtype=np.int64)
        with self._lock:
            dominated = []
            for key, entry in self.entries.items():
                shared = common_prefix_length(entry.tokens, new_tokens)
                if shared == len(new_tokens):
                    # Already held: the new state is a prefix of an entry.
                    self.entries.move_to_end(key)
                    return
                if shared >= entry.prompt_length:
                    dominated.append(key)
        layers, nbytes = snapshot(prompt_cache)
        with self._lock:
            for key in dominated:
                self.entries.pop(key, None)
            self._make_room(nbytes)
            prompt_part = held if prompt_length is None else min(prompt_length, held)
            self.entries[self._next_key] = CachedPrefix(new_tokens, layers, nbytes, prompt_part)
            self._next_key += 1
            self.counters.stores += 1

    def _make_room(self, nbytes: int) -> None:
        while self.entries and (
            self.bytes_held + nbytes > self.budget_bytes
            or (self.max_entries is not None and len(self.entries) >= self.max_entries)
        ):
            self.entries.popitem(last=False)
            self.counters.evictions += 1

    def longest_prefix(self, prompt_tokens: list[int] | np.ndarray) -> int:
        """How many leading tokens of the prompt the best entry holds, without restoring it."""
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        with self._lock:
            return max((common_prefix_length(entry.tokens, prompt) for entry in self.entries.values()), default=0)

    def newest_entry(self) -> CachedPrefix | None:
        """The entry the latest `store` added (the disk tier writes it out)."""
        with self._lock:
            return next(reversed(self.entries.values()), None)

    def record_fallback(self, reason: str) -> None:
        with self._lock:
            self.counters.fallbacks += 1
            self.counters.last_fallback_reason = reason

    def clear(self) -> int:
        with self._lock:
            dropped = len(self.entries)
            self.entries.clear()
        return dropped

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                **vars(self.counters),
                "entries": len(self.entries),
                "bytes": self.bytes_held,
                "budget_bytes": self.budget_bytes,
                "max_entries": self.max_entries,
                "entry_tokens": [len(entry.tokens) for entry in self.entries.values()],
            }

