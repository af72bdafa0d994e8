"""A token-prefix KV cache for several lanes at once, bounded in bytes.

After a request, the model's cache holds the state of every token it has seen
(prompt and generated). `PrefixCache.store` keeps a compact snapshot of it;
`PrefixCache.fetch` finds the stored prefix sharing the most leading tokens with
a new prompt and returns a fresh, independent cache holding exactly those
tokens, so only the rest of the prompt needs a prefill.

Models whose layers are all plain KV caches are rewound to any common prefix
by trimming. Models with positional layers (recurrent state, sliding windows:
Qwen3.5/Qwen3-Next, Nemotron-H, gpt-oss, Gemma 3) can only be restored where
a snapshot of those layers was taken: each entry shares one snapshot of its
big attention state and keeps small checkpoints of the positional layers at
chosen prompt positions (taken by the generation wrapper, see
`cached_generation.py`); a restore picks the longest checkpoint inside the
common prefix and trims the attention layers to it. A checkpoint may be
shared by several lanes (a new conversation restored from another's head
keeps referring to it) and is counted once in the byte budget.

Why not mlx-lm's `LRUPromptCache`: its trie is keyed by the model object and
token list per entry and deep-copies on every fetch; here one engine serves one
model, a Claude Code session has a handful of lanes (main agent, subagents,
title requests) whose prompts each grow turn by turn, and what matters is an
exact byte budget and the longest common prefix with *any* lane, including a
partial one (a conversation that was edited or whose last reply rendered
differently), which trimming the attention state gives for free.

Snapshots are taken and restored by `cache_layers.py`, the one module that
touches mlx-lm's per-layer cache internals.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from .cache_layers import cached_token_count, positional_indices, restore, snapshot, snapshot_nbytes, state_nbytes, trim

# Checkpoints one entry keeps at most (the heads new conversations and
# subagent calls share, where the next turn resumes, branch points).
MAX_CHECKPOINTS = 6


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    mismatches = np.flatnonzero(a[:n] != b[:n])
    return int(mismatches[0]) if len(mismatches) else n


@dataclass(eq=False)
class Checkpoint:
    """The positional layers' state after exactly `position` prompt tokens (None at rewindable layers)."""

    position: int
    layers: list[Any]
    nbytes: int
    # The chat's system + tools head: what vllm-mlx as shipped would reuse, so never dropped.
    pinned: bool = False
    # Who this checkpoint is, across a restart: the disk tier writes a shared
    # checkpoint into each entry's file, and the copies that come back with
    # the same key become one object again (`PrefixCache.admit`).
    key: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class CachedPrefix:
    """One lane's state. `layers` and each checkpoint's `layers` are lists of
    frozen cache objects from cache_layers.snapshot (None where a checkpoint
    holds no rewindable layer); the positional layers of `layers` may be the
    very objects of the last checkpoint, and a checkpoint may belong to
    several entries: serialize by object identity."""

    tokens: np.ndarray
    layers: list[Any]  # every layer's state after all of `tokens`
    nbytes: int
    prompt_length: int  # the rest of `tokens` was generated
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def restorable_length(self, limit: int, positional: bool) -> int:
        """The longest prefix of at most `limit` tokens this entry can restore exactly."""
        return restorable_length(len(self.tokens), [c.position for c in self.checkpoints], limit, positional)


def restorable_length(token_count: int, checkpoint_positions: list[int], limit: int, positional: bool) -> int:
    """The longest prefix of at most `limit` tokens an entry of `token_count` tokens can restore exactly.

    Rewindable models: any prefix (by trimming). Positional ones: a checkpoint
    position or the entry's end. The one rule for RAM entries and disk files.
    """
    if not positional:
        return min(limit, token_count)
    positions = [position for position in checkpoint_positions if position <= limit]
    if token_count <= limit:
        positions.append(token_count)
    return max(positions, default=0)


@dataclass
class Fetched:
    """What a request gets back: a live cache holding `reused` prompt tokens.

    `common_prefix` is the longest prefix the prompt shares with any entry
    (more than `reused` when a positional model had no checkpoint there), and
    `inherited` the source entry's checkpoints inside the reused prefix, which
    stay valid for the request's own entry.
    """

    prompt_cache: list[Any]
    reused: int
    common_prefix: int = 0
    inherited: list[Checkpoint] = field(default_factory=list)


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
    """LRU store of snapshots, keyed by the token sequence they hold.

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
        return _bytes_of(self.entries.values())

    def fetch(self, model: Any, prompt_tokens: list[int]) -> Fetched:
        """A cache for `prompt_tokens` with the longest restorable stored prefix.

        At least one prompt token is always left to prefill: generation needs
        the logits of the last prompt token, which a snapshot does not keep.
        """
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        live = make_prompt_cache(model)
        positional = bool(positional_indices(live))
        with self._lock:
            best_key, best_length, longest_common = self._best_entry(prompt, positional)
            if best_key is None:
                self.counters.misses += 1
                self.counters.tokens_prefilled += len(prompt)
                return Fetched(live, 0, longest_common)
            entry = self.entries[best_key]
            self.entries.move_to_end(best_key)
            inherited = [checkpoint for checkpoint in entry.checkpoints if checkpoint.position <= best_length]
        prompt_cache = _restored(entry, best_length)
        with self._lock:
            self.counters.hits += 1
            self.counters.tokens_reused += best_length
            self.counters.tokens_prefilled += len(prompt) - best_length
        return Fetched(prompt_cache, best_length, longest_common, inherited)

    def _best_entry(self, prompt: np.ndarray, positional: bool) -> tuple[int | None, int, int]:
        """The entry restoring the most of `prompt` (all but its last token), that length,
        and the longest common prefix with any entry. Call under the lock."""
        best_key, best_length, longest_common = None, 0, 0
        for key, entry in self.entries.items():
            common = common_prefix_length(entry.tokens, prompt)
            longest_common = max(longest_common, common)
            length = entry.restorable_length(min(common, len(prompt) - 1), positional)
            if length >= best_length and length > 0:
                best_key, best_length = key, length
        return best_key, best_length, longest_common

    def restorable_prefix(self, prompt_tokens: list[int] | np.ndarray, positional: bool) -> int:
        """How many prompt tokens a fetch would reuse, without restoring anything."""
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        with self._lock:
            return self._best_entry(prompt, positional)[1]

    def store(
        self,
        tokens: list[int],
        prompt_cache: list[Any],
        prompt_length: int | None = None,
        checkpoints: list[Checkpoint] = (),
    ) -> None:
        """Keep the state of `prompt_cache`, whose first tokens are `tokens`.

        `prompt_length` says how many of `tokens` were prompt (the rest were
        generated); `checkpoints` are positional snapshots inside `tokens`. An
        entry whose whole prompt the new state repeats is dropped (its
        checkpoints inside the shared prefix move to the new entry): the next
        turn of a conversation re-renders the reply in its own way, so only
        the prompt part of the older turn is worth keeping, and the new state
        holds it.

        The cache may hold fewer tokens than `tokens` (the last generated token
        is never fed back) or more (a token was fed but never reported): only
        the part both agree on is kept. Positional layers cannot be rewound, so
        when they hold more than `tokens` says, the entry ends at its last
        checkpoint instead.
        """
        counted = cached_token_count(prompt_cache)
        positional = positional_indices(prompt_cache)
        end_state_exact = counted is not None and (counted <= len(tokens) or not positional)
        limit = min(len(tokens), counted if counted is not None else len(tokens))
        checkpoints = _unique(c for c in checkpoints if 0 < c.position <= limit)
        held = limit if end_state_exact else (checkpoints[-1].position if checkpoints else 0)
        if held == 0:
            return
        new_tokens = np.asarray(tokens[:held], dtype=np.int64)
        with self._lock:
            dominated = self._dominated_by(new_tokens, bool(positional))
            if dominated is None:
                return
        checkpoints = _kept(_unique(checkpoints + _inherited(dominated, new_tokens)), held)
        if counted is not None and counted > held:
            trim(prompt_cache, counted - held)
        length = self._fitting_length(prompt_cache, held, positional, checkpoints, end_state_exact)
        if length == 0:
            return
        if length < held:
            trim(prompt_cache, held - length)
            self.counters.trimmed_to_fit += 1
        checkpoints = [c for c in checkpoints if c.position <= length]
        end_from_checkpoint = bool(positional) and (length < held or not end_state_exact)
        rewindable = [index for index in range(len(prompt_cache)) if index not in positional]
        layers, nbytes = snapshot(prompt_cache, rewindable if end_from_checkpoint else None)
        if end_from_checkpoint:
            # The state at `length` is that checkpoint's, already counted there.
            end = checkpoints[-1]
            layers = [end.layers[index] if index in positional else layer for index, layer in enumerate(layers)]
        prompt_part = length if prompt_length is None else min(prompt_length, length)
        new_entry = CachedPrefix(new_tokens[:length], layers, nbytes, prompt_part, checkpoints)
        if _bytes_of([new_entry]) > self.budget_bytes:
            return  # a shared buffer's padding tipped it over
        self._insert(new_entry, dominated)
        with self._lock:
            self.counters.stores += 1

    def admit(self, entry: CachedPrefix) -> None:
        """Add a whole entry made elsewhere (loaded from disk), under the rules of `store`.

        Its checkpoints that RAM already holds (same key: the same checkpoint,
        written into several files) are replaced by RAM's object, so a shared
        checkpoint is held and counted once, as before the restart. An entry
        larger than the whole budget goes through `store`, which keeps the
        longest prefix that fits.
        """
        positional = bool(positional_indices(entry.layers))
        with self._lock:
            entry = _sharing_checkpoints_with(entry, self.entries.values())
            dominated = self._dominated_by(entry.tokens, positional)
            if dominated is None:
                return
        entry.checkpoints = _kept(_unique(entry.checkpoints + _inherited(dominated, entry.tokens)), len(entry.tokens))
        entry.nbytes = own_nbytes(entry.layers, entry.checkpoints)
        if _bytes_of([entry]) > self.budget_bytes:
            self.store(entry.tokens.tolist(), restore(entry.layers), entry.prompt_length, entry.checkpoints)
            return
        self._insert(entry, dominated)

    def _dominated_by(self, tokens: np.ndarray, positional: bool) -> list[CachedPrefix] | None:
        """The entries a new state of `tokens` replaces (their whole prompt is in it);
        None if an entry already holds that state. Call under the lock."""
        dominated = []
        for key, entry in self.entries.items():
            shared = common_prefix_length(entry.tokens, tokens)
            if shared == len(tokens) and (not positional or len(entry.tokens) == len(tokens)):
                # Already held: the new state is a prefix of an entry.
                self.entries.move_to_end(key)
                return None
            if shared >= entry.prompt_length:
                dominated.append(entry)
        return dominated

    def _insert(self, new_entry: CachedPrefix, dominated: list[CachedPrefix]) -> None:
        with self._lock:
            for key in [key for key, entry in self.entries.items() if any(entry is gone for gone in dominated)]:
                del self.entries[key]
            self._make_room(new_entry)
            self.entries[self._next_key] = new_entry
            self._next_key += 1

    def _fitting_length(
        self, prompt_cache: list[Any], held: int, positional: list[int], checkpoints: list[Checkpoint], end_state_exact: bool
    ) -> int:
        """The longest restorable prefix of `held` tokens whose state fits the whole budget (0: none)."""
        fixed = sum(state_nbytes([prompt_cache[index]]) for index in positional)
        per_token = (state_nbytes(prompt_cache) - fixed) / held
        if not positional:
            # Too big for the whole budget: keep the longest prefix that fits,
            # which still spares the next request most of its prefill.
            return min(held, int(self.budget_bytes // per_token)) if per_token else held
        lengths = ([held] if end_state_exact else []) + [c.position for c in reversed(checkpoints)]
        for length in lengths:
            end_bytes = fixed if length == held and end_state_exact else 0
            checkpoint_bytes = sum(c.nbytes for c in checkpoints if c.position <= length)
            if per_token * length + end_bytes + checkpoint_bytes <= self.budget_bytes:
                return length
        return 0

    def _make_room(self, new_entry: CachedPrefix) -> None:
        while self.entries and (
            _bytes_of([*self.entries.values(), new_entry]) > self.budget_bytes
            or (self.max_entries is not None and len(self.entries) >= self.max_entries)
        ):
            self.entries.popitem(last=False)
            self.counters.evictions += 1

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
                "entry_checkpoints": [[c.position for c in entry.checkpoints] for entry in self.entries.values()],
            }


def _restored(entry: CachedPrefix, length: int) -> list[Any]:
    """A live cache holding the first `length` tokens of `entry`."""
    if length == len(entry.tokens):
        return restore(entry.layers)
    checkpoint = next((c for c in entry.checkpoints if c.position == length), None)
    layers = entry.layers if checkpoint is None else [
        own if positional is None else positional for own, positional in zip(entry.layers, checkpoint.layers)
    ]
    prompt_cache = restore(layers)
    trim(prompt_cache, len(entry.tokens) - length)
    return prompt_cache


def _inherited(dominated: list[CachedPrefix], tokens: np.ndarray) -> list[Checkpoint]:
    """The checkpoints of replaced entries inside the prefix they share with `tokens` (still valid there)."""
    inherited = []
    for entry in dominated:
        shared = common_prefix_length(entry.tokens, tokens)
        inherited += [c for c in entry.checkpoints if c.position <= shared]
    return inherited


def _sharing_checkpoints_with(entry: CachedPrefix, held: Iterable[CachedPrefix]) -> CachedPrefix:
    """`entry` with each checkpoint that `held` entries already have (by key) replaced by theirs."""
    known = {c.key: c for other in held for c in other.checkpoints}
    replaced = {id(c): known[c.key] for c in entry.checkpoints
                if c.key in known and known[c.key] is not c and known[c.key].position == c.position}
    if not replaced:
        return entry
    layers = list(entry.layers)
    for checkpoint in entry.checkpoints:
        if id(checkpoint) in replaced:
            # The end state's positional layers may be this checkpoint's very objects.
            for index, layer in enumerate(checkpoint.layers):
                if layer is not None and layers[index] is layer:
                    layers[index] = replaced[id(checkpoint)].layers[index]
    checkpoints = [replaced.get(id(c), c) for c in entry.checkpoints]
    return CachedPrefix(entry.tokens, layers, own_nbytes(layers, checkpoints), entry.prompt_length, checkpoints)


def own_nbytes(layers: list[Any], checkpoints: list[Checkpoint]) -> int:
    """Bytes of an entry's end state that are not one of its checkpoints' (those count with the checkpoint)."""
    checkpoint_layers = {id(layer) for c in checkpoints for layer in c.layers if layer is not None}
    return snapshot_nbytes([layer for layer in layers if id(layer) not in checkpoint_layers])


def _unique(checkpoints) -> list[Checkpoint]:
    return sorted({id(c): c for c in checkpoints}.values(), key=lambda c: c.position)


def _kept(checkpoints: list[Checkpoint], held: int) -> list[Checkpoint]:
    """At most MAX_CHECKPOINTS of `checkpoints`, dropping the earlier of the closest pairs.

    A request restores the longest checkpoint inside its common prefix; one
    just before another (a message start and the role header after it, two
    lanes' nearby branch points) serves almost only requests the later one
    serves too. The last two (where this lane's next turn resumes) are always
    kept, and so are far-apart ones like a lane's system + tools head.
    """
    kept = [c for c in checkpoints if c.position <= held]
    while len(kept) > MAX_CHECKPOINTS:
        gaps = [(kept[i + 1].position - kept[i].position, i) for i in range(len(kept) - 2) if not kept[i].pinned]
        if not gaps:
            break
        kept.pop(min(gaps)[1])
    return kept


def _bytes_of(entries) -> int:
    """Bytes held by `entries`, each shared checkpoint counted once."""
    checkpoints = {id(c): c.nbytes for entry in entries for c in entry.checkpoints}
    return sum(entry.nbytes for entry in entries) + sum(checkpoints.values())

