"""The RAM tier: a token-prefix KV cache for several lanes at once, bounded in bytes, each block held once.

After a request, the model's cache holds the state of every token it has seen
(prompt and generated). `RamTier.store` keeps it as an entry (a lane);
`RamTier.fetch` finds the stored prefix sharing the most leading tokens
with a new prompt and returns a fresh, independent cache holding exactly those
tokens, so only the rest of the prompt needs a prefill.

An entry's plain attention state (every rewindable layer) is a list of KV
blocks (`kv_blocks.py`): content-addressed pieces of a few hundred tokens,
held once in a `BlockStore` whatever number of lanes refer to them. A store
copies only the blocks the store does not hold yet (a turn's new tokens); a
restore concatenates the blocks it needs into the live cache, trimmed to the
restorable length (one copy, as a restore always did).

Models with positional layers (recurrent state, sliding windows:
Qwen3.5/Qwen3-Next, Nemotron-H, gpt-oss, Gemma 3) can only be restored where a
snapshot of those layers was taken: each entry keeps small checkpoints of the
positional layers at chosen prompt positions (taken by the generation wrapper,
see `cached_generation.py`) and their state at its end; a restore picks the
longest checkpoint inside the common prefix and takes the blocks up to it. A
checkpoint may be shared by several lanes (a new conversation restored from
another's head keeps referring to it) and is counted once in the byte budget.

Which lane serves a prompt, and which lanes a new one replaces, is
`prefix_index.py`'s rule, the same for the disk tier.

Eviction is by lane: one-shot lanes first (stored once and never used since: a
title request, a subagent's only call), then the least recently used; a block
is freed when no lane refers to it, so a block many lanes share goes last.

Why not mlx-lm's `LRUPromptCache`: its trie is keyed by the model object and
token list per entry, deep-copies on every fetch and holds every entry whole;
here one engine serves one model, a Claude Code session has a handful of lanes
(main agent, subagents, title requests) whose prompts each grow turn by turn
and share long heads, and what matters is an exact byte budget, each token's
state held once, and the longest common prefix with *any* lane, including a
partial one (a conversation that was edited or whose last reply rendered
differently), which trimming the attention state gives for free.

The last request's own cache is kept too (`live_lane.py`): the next request
sharing its prefix takes it over in place instead of restoring from the blocks.

Snapshots and blocks are taken and restored by `cache_layers.py`, the one
module that touches mlx-lm's per-layer cache internals.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from .cache_layers import (
    block_prefix,
    cached_token_count,
    copy_block,
    eval_blocks,
    positional_indices,
    restore_from_blocks,
    reuse_live,
    snapshot,
    snapshot_nbytes,
    state_nbytes,
)
from .kv_blocks import BLOCK_TOKENS, Block, BlockRef, BlockStore, block_keys, covering, new_segments, reusable_refs
from .live_lane import LiveLane, LiveLanes
from .per_model import PerModel
from .prefix_index import best_match, common_prefix_length, placement

logger = logging.getLogger("engine_patch")

# Checkpoints one entry keeps at most (the heads new conversations and
# subagent calls share, where the next turn resumes, branch points).
MAX_CHECKPOINTS = 6


@dataclass(eq=False)
class Checkpoint:
    """The positional layers' state after exactly `position` prompt tokens (None at rewindable layers)."""

    position: int
    layers: list[Any]
    nbytes: int
    # The chat's system + tools head: what vllm-mlx as shipped would reuse, so never dropped.
    pinned: bool = False
    # Who this checkpoint is, across a restart: the disk tier writes a shared
    # checkpoint once, and every lane's manifest names it by this key, so the
    # lanes a restarted server loads share one object again (`RamTier.admit`).
    key: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(eq=False)
class CachedPrefix:
    """One lane's state: the rewindable layers as blocks, the positional ones at its end and at checkpoints.

    `layers` holds the positional layers' state after all of `tokens` (None at
    rewindable layers); they may be the very objects of the last checkpoint,
    and a checkpoint may belong to several entries: serialize by object identity.
    """

    tokens: np.ndarray
    blocks: list[BlockRef]  # the rewindable layers' state of `tokens`, in order
    layers: list[Any]
    nbytes: int  # bytes of `layers` no checkpoint holds (blocks and checkpoints are counted once, apart)
    prompt_length: int  # the rest of `tokens` was generated
    checkpoints: list[Checkpoint] = field(default_factory=list)
    turns: int = 1  # requests of this lane so far: 1 + those of the entries it replaced
    hits: int = 0  # requests that restored from it
    model: str | None = None  # the model whose state it is (`RamTier.model_key`); None: a caller naming none

    @property
    def checkpoint_positions(self) -> list[int]:
        return [c.position for c in self.checkpoints]

    @property
    def positional(self) -> bool:
        return any(layer is not None for layer in self.layers)

    @property
    def one_shot(self) -> bool:
        """Stored once and never used since (a title request, a subagent's only call): evicted first."""
        return self.turns == 1 and self.hits == 0


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
    # Restores served by the hot lane kept live (`live_lane.py`): nothing copied.
    live_reuses: int = 0
    live_tokens_reused: int = 0
    live_bytes_not_restored: int = 0  # the KV bytes a block restore would have copied
    live_fallbacks: int = 0  # a kept lane found changed: restored from the blocks instead
    last_live_fallback_reason: str | None = None


@dataclass
class RamTier:
    """LRU store of lanes, keyed by the token sequence they hold, their blocks held once.

    Thread-safety: fetch/store run on the engine's single generation thread;
    `clear` and `stats` may come from the server's event loop, so the entry
    table and the block store are guarded by a lock. Fetched caches are fresh
    objects owned by one request, so no other request can change what a request
    restored.
    """

    budget_bytes: int
    max_entries: int | None = None
    block_tokens: int = BLOCK_TOKENS
    entries: OrderedDict[int, CachedPrefix] = field(default_factory=OrderedDict)
    blocks: BlockStore = field(default_factory=BlockStore)
    counters: CacheStats = field(default_factory=CacheStats)
    _next_key: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Each model object's key (held weakly): two models in one server never restore, share or replace each other's state.
    _model_keys: PerModel[str] = field(init=False)
    # The last request's own cache, reused in place by the next request sharing its prefix (0: none kept).
    live_lane_limit: int = 1
    live: LiveLanes = field(init=False)

    def __post_init__(self) -> None:
        self.live = LiveLanes(self.live_lane_limit)
        # An unloaded model's kept cache goes with it (vllm-mlx unloads to give the memory back).
        self._model_keys = PerModel(on_forget=self._model_freed)

    def _model_freed(self, model_key: str) -> None:
        """Drop the freed model's kept caches: now if the lock is free, else at the next call that takes it
        (a finalizer may run on this very thread inside a locked section)."""
        self.live.forget_model(model_key)
        if self._lock.acquire(blocking=False):
            try:
                self.live.drop_forgotten()
            finally:
                self._lock.release()

    def model_key(self, model: Any) -> str | None:
        """The key the cache files `model`'s state under: one per loaded model object (a reloaded model starts
        cold in RAM; the disk tier, by the weights' digest, restores it). None for no model (a test of the cache alone)."""
        if model is None:
            return None
        return self._model_keys.setdefault(model, lambda: f"{type(model).__name__}-{uuid.uuid4().hex[:12]}")

    def _entries_of(self, model: str | None) -> list[tuple[int, CachedPrefix]]:
        """The entries a request of `model` may restore, extend or replace (and those stored naming no model). Call under the lock."""
        return [(key, entry) for key, entry in self.entries.items() if entry.model in (model, None)]

    @property
    def bytes_held(self) -> int:
        return self.blocks.nbytes + _own_bytes_of(self.entries.values())

    # --- restoring ------------------------------------------------------------------

    def fetch(self, model: Any, prompt_tokens: list[int]) -> Fetched:
        """A cache for `prompt_tokens` with the longest restorable stored prefix.

        At least one prompt token is always left to prefill: generation needs
        the logits of the last prompt token, which a snapshot does not keep.
        """
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        live = make_prompt_cache(model)
        positional = bool(positional_indices(live))
        model_key = self.model_key(model)
        with self._lock:
            match = best_match(self._entries_of(model_key), prompt, positional)
            if match.key is None:
                self.live.take(model_key, prompt, 0)
                self.counters.misses += 1
                self.counters.tokens_prefilled += len(prompt)
                return Fetched(live, 0, match.longest_common)
            entry = self.entries[match.key]
            self.entries.move_to_end(match.key)
            entry.hits += 1
            inherited = [checkpoint for checkpoint in entry.checkpoints if checkpoint.position <= match.length]
            refs = covering(entry.blocks, match.length)
            pieces = [(ref.block.arrays, ref.used) for ref in refs]
            positional_layers = _positional_state_at(entry, match.length)
            lane = self.live.take(model_key, prompt, match.length)
        prompt_cache = self._reused_live(lane, match.length, positional_layers, refs) if lane is not None else None
        if prompt_cache is None:
            prompt_cache = restore_from_blocks(live, pieces, match.length, len(prompt) + 1, positional_layers)
        with self._lock:
            self.counters.hits += 1
            self.counters.tokens_reused += match.length
            self.counters.tokens_prefilled += len(prompt) - match.length
        return Fetched(prompt_cache, match.length, match.longest_common, inherited)

    def _reused_live(self, lane: LiveLane, length: int, positional_layers: list[Any], refs: list[BlockRef]) -> list[Any] | None:
        """`lane`'s cache cut back to `length` tokens, in place; None (counted, logged) if it cannot serve exactly."""
        at_its_end = lane.positional_end and length == len(lane.tokens)
        try:
            prompt_cache = reuse_live(lane.prompt_cache, lane.offset, length, None if at_its_end else positional_layers)
        except Exception as error:  # a doubt about the live cache: the blocks restore exactly
            logger.warning("prefix cache: the live lane was not reused (%r); restored from the blocks", error)
            with self._lock:
                self.counters.live_fallbacks += 1
                self.counters.last_live_fallback_reason = repr(error)
            return None
        with self._lock:
            self.counters.live_reuses += 1
            self.counters.live_tokens_reused += length
            self.counters.live_bytes_not_restored += sum(ref.block.nbytes * ref.used // ref.block.token_count for ref in refs)
        return prompt_cache

    def keep_live(self, tokens: list[int], prompt_cache: list[Any], model: Any = None) -> None:
        """Keep `prompt_cache` itself, the state of `tokens`, which its request owned and no one feeds any more,
        for the next request sharing its prefix (`live_lane.py`)."""
        model_key = self.model_key(model)
        with self._lock:
            self.live.keep(tokens, prompt_cache, model_key)

    def restorable_prefix(self, prompt_tokens: list[int] | np.ndarray, positional: bool, model: Any = None) -> int:
        """How many prompt tokens a fetch by `model` would reuse, without restoring anything."""
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        model_key = self.model_key(model)
        with self._lock:
            return best_match(self._entries_of(model_key), prompt, positional).length

    # --- storing --------------------------------------------------------------------

    def store(
        self,
        tokens: list[int],
        prompt_cache: list[Any],
        prompt_length: int | None = None,
        checkpoints: list[Checkpoint] = (),
        model: Any = None,
    ) -> None:
        """Keep the state of `prompt_cache`, whose first tokens are `tokens`, computed by `model`.

        `prompt_length` says how many of `tokens` were prompt (the rest were
        generated); `checkpoints` are positional snapshots inside `tokens`. An
        entry whose whole prompt the new state repeats is dropped (its
        checkpoints inside the shared prefix move to the new entry, its blocks
        stay where the new entry uses them).

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
        model_key = self.model_key(model)
        with self._lock:
            dominated = self._dominated_by(new_tokens, [c.position for c in checkpoints if c.position <= held], bool(positional), model_key)
        if dominated is None:
            return
        checkpoints = _kept(_unique(checkpoints + _inherited(dominated, new_tokens)), held)
        length = self._fitting_length(prompt_cache, held, positional, checkpoints, end_state_exact)
        if length == 0:
            return
        if length < held:
            self.counters.trimmed_to_fit += 1
        checkpoints = [c for c in checkpoints if c.position <= length]
        if positional and (length < held or not end_state_exact):
            # The state at `length` is that checkpoint's, already counted there.
            layers = list(checkpoints[-1].layers)
        else:
            layers, _ = snapshot(prompt_cache, positional)
        prompt_part = length if prompt_length is None else min(prompt_length, length)
        new_entry = CachedPrefix(new_tokens[:length], self._blocks_of(new_tokens[:length], prompt_cache, model_key, prompt_part), layers,
                                 own_nbytes(layers, checkpoints), prompt_part, checkpoints,
                                 turns=1 + max((entry.turns for entry in dominated), default=0), model=model_key)
        if footprint(new_entry) > self.budget_bytes:
            return  # a block it shares holds more than it uses
        self._insert(new_entry, dominated)
        with self._lock:
            self.counters.stores += 1

    def _blocks_of(self, tokens: np.ndarray, prompt_cache: list[Any], model: str | None, prompt_length: int | None = None) -> list[BlockRef]:
        """The lane's blocks: those of the model's lane sharing the longest prefix with it (inside that prefix),
        then blocks of its own tokens (cut where its prompt ends too: `new_segments`), copied from `prompt_cache`
        unless the store holds them already."""
        with self._lock:
            source, common = max(((entry, common_prefix_length(entry.tokens, tokens)) for _, entry in self._entries_of(model)
                                  if entry.model == model), key=lambda found: found[1], default=(None, 0))
            refs = reusable_refs(source.blocks, common) if source is not None else []
            segments = new_segments(refs[-1].end if refs else 0, len(tokens), self.block_tokens, prompt_length)
            keys = block_keys(tokens, segments)
            held = [self.blocks.get(key, model) for key in keys]
        copied = []
        for (start, end), key, block in zip(segments, keys, held):
            if block is None:
                arrays, nbytes = copy_block(prompt_cache, start, end)
                block = Block(key, start, end, np.asarray(tokens[start:end], dtype=np.int32), arrays, nbytes, model)
                copied.append(block)
            refs.append(BlockRef(block, end - start))
        eval_blocks([block.arrays for block in copied])
        return refs

    def admit(self, entry: CachedPrefix) -> None:
        """Add a whole entry made elsewhere (loaded from disk), under the rules of `store`.

        Blocks and checkpoints RAM already holds (same key) are replaced by RAM's
        objects, so each is held and counted once, as before a restart. An entry
        larger than the whole budget keeps the longest restorable prefix that fits.
        """
        with self._lock:
            entry = _sharing_checkpoints_with(entry, [held for _, held in self._entries_of(entry.model) if held.model == entry.model])
            entry.blocks = self.blocks.canonical(entry.blocks)
            dominated = self._dominated_by(entry.tokens, entry.checkpoint_positions, entry.positional, entry.model)
        if dominated is None:
            return
        entry.checkpoints = _kept(_unique(entry.checkpoints + _inherited(dominated, entry.tokens)), len(entry.tokens))
        entry.nbytes = own_nbytes(entry.layers, entry.checkpoints)
        if footprint(entry) > self.budget_bytes:
            length = _fitting_entry_length(entry, self.budget_bytes)
            if length == 0:
                return
            entry = truncated(entry, length)
            self.counters.trimmed_to_fit += 1
        self._insert(entry, dominated)

    def _dominated_by(self, tokens: np.ndarray, checkpoint_positions: list[int], positional: bool, model: str | None) -> list[CachedPrefix] | None:
        """The entries of `model` a new state of `tokens` replaces; None if one already restores all it would.
        Call under the lock."""
        found = placement([(key, entry) for key, entry in self.entries.items() if entry.model == model], tokens, checkpoint_positions, positional)
        if found.held_by is not None:
            self.entries.move_to_end(found.held_by)
            return None
        return [self.entries[key] for key in found.replaces]

    def _insert(self, new_entry: CachedPrefix, dominated: list[CachedPrefix]) -> None:
        with self._lock:
            for key in [key for key, entry in self.entries.items() if any(entry is gone for gone in dominated)]:
                self._remove(key)
            new_entry.blocks = self.blocks.canonical(new_entry.blocks)
            self.blocks.acquire(new_entry.blocks)
            self.entries[self._next_key] = new_entry
            self._next_key += 1
            self._make_room(new_entry)

    def _remove(self, key: int) -> None:
        self.blocks.release(self.entries.pop(key).blocks)

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
        """Evict lanes (one-shot ones first, then the least recently used) until the budgets hold. Call under the lock."""
        while len(self.entries) > 1 and (
            self.bytes_held > self.budget_bytes or (self.max_entries is not None and len(self.entries) > self.max_entries)
        ):
            others = [key for key, entry in self.entries.items() if entry is not new_entry]
            victim = next((key for key in others if self.entries[key].one_shot), others[0])
            self._remove(victim)
            self.counters.evictions += 1

    # --- the rest of the interface ---------------------------------------------------

    def newest_entry(self) -> CachedPrefix | None:
        """The entry the latest `store` added (the disk tier writes it out)."""
        with self._lock:
            return next(reversed(self.entries.values()), None)

    def held_blocks(self, keys: Iterable[str], model: Any = None) -> dict[str, Block]:
        """The blocks of `keys` RAM holds for `model` (a disk load reads only the others)."""
        model_key = self.model_key(model)
        with self._lock:
            return {key: block for key in keys if (block := self.blocks.get(key, model_key)) is not None}

    def held_checkpoints(self, model: Any = None) -> dict[str, Checkpoint]:
        """Every checkpoint RAM holds for `model`, by key (a disk load reads only the others)."""
        model_key = self.model_key(model)
        with self._lock:
            return {c.key: c for entry in self.entries.values() if entry.model == model_key for c in entry.checkpoints}

    def record_fallback(self, reason: str) -> None:
        with self._lock:
            self.counters.fallbacks += 1
            self.counters.last_fallback_reason = reason

    def clear(self) -> int:
        with self._lock:
            dropped = len(self.entries)
            self.entries.clear()
            self.blocks.clear()
            self.live.clear()
        return dropped

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                **vars(self.counters),
                "entries": len(self.entries),
                "bytes": self.bytes_held,
                "budget_bytes": self.budget_bytes,
                "max_entries": self.max_entries,
                "blocks": len(self.blocks),
                "block_tokens": self.blocks.tokens,
                "block_bytes": self.blocks.nbytes,
                "block_size": self.block_tokens,
                "entry_tokens": [len(entry.tokens) for entry in self.entries.values()],
                "entry_checkpoints": [[c.position for c in entry.checkpoints] for entry in self.entries.values()],
                "live_lanes": len(self.live.lanes),
                "live_bytes": self.live.nbytes,  # outside budget_bytes: the memory the last request held while it ran
            }


def _positional_state_at(entry: CachedPrefix, length: int) -> list[Any]:
    """The positional layers' state after `length` tokens of `entry` (a restorable length: its end or a checkpoint)."""
    if length == len(entry.tokens) or not entry.positional:
        return entry.layers
    return next(c for c in entry.checkpoints if c.position == length).layers


def truncated(entry: CachedPrefix, length: int) -> CachedPrefix:
    """The first `length` tokens of `entry` (a restorable length) as an entry of their own.

    A block it uses only in part is copied down to that part, so the entry holds
    exactly its tokens' state.
    """
    if length == len(entry.tokens):
        return entry
    refs = covering(entry.blocks, length)
    last = refs[-1]
    if last.used < last.block.token_count:
        key = block_keys(entry.tokens[:length], [(last.start, length)])[0]
        arrays, nbytes = block_prefix(last.block.arrays, last.used)
        refs[-1] = BlockRef(Block(key, last.start, length, last.block.token_ids[: last.used].copy(), arrays, nbytes, entry.model), last.used)
    layers = list(_positional_state_at(entry, length))
    checkpoints = [c for c in entry.checkpoints if c.position <= length]
    return CachedPrefix(entry.tokens[:length], refs, layers, own_nbytes(layers, checkpoints), min(entry.prompt_length, length),
                        checkpoints, entry.turns, entry.hits, entry.model)


def _fitting_entry_length(entry: CachedPrefix, budget: int) -> int:
    """The longest restorable prefix of `entry` whose state (blocks cut to it, checkpoints, end) fits `budget` (0: none)."""
    block_bytes = sum(ref.block.nbytes for ref in entry.blocks)
    per_token = block_bytes / len(entry.tokens)
    if not entry.positional:
        return min(len(entry.tokens), int(budget // per_token)) if per_token else len(entry.tokens)
    for length in [len(entry.tokens), *reversed(entry.checkpoint_positions)]:
        end_bytes = entry.nbytes if length == len(entry.tokens) else 0
        checkpoint_bytes = sum(c.nbytes for c in entry.checkpoints if c.position <= length)
        if per_token * length + end_bytes + checkpoint_bytes <= budget:
            return length
    return 0


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
    return CachedPrefix(entry.tokens, entry.blocks, layers, own_nbytes(layers, checkpoints), entry.prompt_length, checkpoints,
                        entry.turns, entry.hits, entry.model)


def own_nbytes(layers: list[Any], checkpoints: list[Checkpoint]) -> int:
    """Bytes of an entry's positional end state that are not one of its checkpoints' (those count with the checkpoint)."""
    checkpoint_layers = {id(layer) for c in checkpoints for layer in c.layers if layer is not None}
    return snapshot_nbytes([layer for layer in layers if layer is not None and id(layer) not in checkpoint_layers])


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


def _own_bytes_of(entries) -> int:
    """Bytes held by `entries` besides their blocks, each shared checkpoint counted once."""
    checkpoints = {id(c): c.nbytes for entry in entries for c in entry.checkpoints}
    return sum(entry.nbytes for entry in entries) + sum(checkpoints.values())


def footprint(entry: CachedPrefix) -> int:
    """Everything `entry` keeps alive: its blocks (whole), its end state and its checkpoints."""
    return sum({id(ref.block): ref.block.nbytes for ref in entry.blocks}.values()) + _own_bytes_of([entry])
