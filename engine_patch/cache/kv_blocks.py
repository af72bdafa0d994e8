"""KV blocks held once: the rewindable layers' state in content-addressed pieces of a few hundred tokens.

A lane's plain attention state (every `KVCache` layer; the attention layers of
hybrids and of sliding-window models too) is a list of blocks. A block holds,
per rewindable layer, the keys and values of the tokens [start, end), copied out
of the live cache (a slice would keep the whole live buffer alive), and those
tokens' ids. Its key is a digest of every token id up to its end and of its
start (`KeyChain`), so two blocks with one key hold the KV of the same tokens
after the same prefix, and a lane's token ids can be checked against its
blocks' keys: a head shared by
lanes, a fork carrying a whole conversation, the previous turn a new one
extends, are each held once, in RAM (`BlockStore`, with reference counts) and
on disk (one file per key).

Where a lane's blocks start and end (`new_segments`): a new lane takes the
blocks of the lane it shares the longest prefix with, as far as they lie inside
that prefix (the last one possibly in part: `BlockRef.used`), and cuts its own
tokens at multiples of `BLOCK_TOKENS`, where its prompt ends and at its end.
So a turn adds only blocks for its new tokens, a conversation's blocks are the
same in every lane that restored it, and the reply's tokens the next turn
renders differently are freed with the turn (no block holds them for a lane
that does not use them).

The block size is chosen by measurement (docs/engine.md, "Blocks"): restore
speed, files per lane on disk, and what a partly used block holds unused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

BLOCK_TOKENS = 256
KEY_ROOT = b"stable-prefix kv block 1"


@dataclass(eq=False)
class Block:
    """The rewindable layers' keys and values for tokens [start, end) (None at positional layers), and those tokens' ids."""

    key: str
    start: int
    end: int
    token_ids: np.ndarray  # int32, end - start of them
    arrays: list[Any]
    nbytes: int
    model: str | None = None  # the model whose KV it is (per_model.py): blocks of two models are never one

    @property
    def token_count(self) -> int:
        return self.end - self.start

    @property
    def store_key(self) -> tuple[str | None, str]:
        return self.model, self.key


@dataclass(frozen=True, eq=False)
class BlockRef:
    """The first `used` tokens of a block, as one piece of a lane."""

    block: Block
    used: int

    @property
    def start(self) -> int:
        return self.block.start

    @property
    def end(self) -> int:
        return self.block.start + self.used


class KeyChain:
    """The digest of a lane's token ids so far, from which the key of a block starting there follows."""

    def __init__(self) -> None:
        self._hasher = hashlib.blake2b(KEY_ROOT, digest_size=16)
        self.length = 0

    def extend(self, token_ids: np.ndarray) -> None:
        self._hasher.update(_bytes_of(token_ids))
        self.length += len(token_ids)

    def key_of_next(self, token_ids: np.ndarray) -> str:
        """The key of a block holding `token_ids` right after the tokens so far."""
        hasher = self._hasher.copy()
        hasher.update(_bytes_of(token_ids))
        return hashlib.blake2b(hasher.digest() + self.length.to_bytes(8, "little"), digest_size=16).hexdigest()


def block_keys(tokens: np.ndarray, segments: list[tuple[int, int]]) -> list[str]:
    """The key of each segment [start, end) of `tokens` (back to back, in order), in one pass."""
    chain, keys = KeyChain(), []
    chain.extend(tokens[: segments[0][0]] if segments else tokens[:0])
    for start, end in segments:
        keys.append(chain.key_of_next(tokens[start:end]))
        chain.extend(tokens[start:end])
    return keys


def _bytes_of(token_ids: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(token_ids, dtype="<i4").view(np.uint8)


def reusable_refs(refs: list[BlockRef], common: int) -> list[BlockRef]:
    """The pieces of `refs` inside the first `common` tokens.

    A block that straddles `common` is used in part when at least half of it is
    inside (the reply of the previous turn, re-rendered a little differently):
    the rest stays alive unused while this lane holds it. Below half, the lane
    copies those tokens into a block of its own.
    """
    kept = []
    for ref in refs:
        if ref.end <= common:
            kept.append(ref)
            continue
        inside = common - ref.start
        if inside > 0 and 2 * inside >= ref.block.token_count:
            kept.append(BlockRef(ref.block, inside))
        break
    return kept


def new_segments(start: int, end: int, block_tokens: int = BLOCK_TOKENS, prompt_end: int | None = None) -> list[tuple[int, int]]:
    """[start, end) cut at the multiples of `block_tokens` inside it, and where the prompt ends.

    The reply after `prompt_end` is what the next turn renders back in its own
    way (its thinking dropped, a tool call re-serialized) and shares only in
    part: in blocks of its own, the part it does not share is freed with this
    turn's lane, instead of staying alive unused inside a block that also holds
    prompt tokens the next turn keeps (RAM 1.14x the unique tokens on a long
    session of short turns before).
    """
    cuts = sorted({start, *range((start // block_tokens + 1) * block_tokens, end, block_tokens), end,
                   *([prompt_end] if prompt_end is not None and start < prompt_end < end else [])})
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def covering(refs: list[BlockRef], length: int) -> list[BlockRef]:
    """The pieces of `refs` holding the first `length` tokens (the last one cut there)."""
    kept = []
    for ref in refs:
        if ref.start >= length:
            break
        kept.append(ref if ref.end <= length else BlockRef(ref.block, length - ref.start))
    return kept


class BlockStore:
    """Every block some lane refers to, once, with how many lanes refer to it.

    Not thread-safe on its own: the prefix cache calls it under its lock.
    """

    def __init__(self) -> None:
        # By (model, key): the key names the tokens (and is what the disk tier files a block by, in the model's
        # folder); the same tokens' KV of another model is another block.
        self._blocks: dict[tuple[str | None, str], Block] = {}
        self._references: dict[tuple[str | None, str], int] = {}
        self.nbytes = 0
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, key: str, model: str | None = None) -> Block | None:
        return self._blocks.get((model, key))

    def canonical(self, refs: list[BlockRef]) -> list[BlockRef]:
        """`refs` with each block the store holds under the same key replaced by the store's object."""
        return [ref if self._blocks.get(ref.block.store_key, ref.block) is ref.block else BlockRef(self._blocks[ref.block.store_key], ref.used)
                for ref in refs]

    def acquire(self, refs: Iterable[BlockRef]) -> None:
        for ref in refs:
            block = ref.block
            if block.store_key not in self._blocks:
                self._blocks[block.store_key] = block
                self._references[block.store_key] = 0
                self.nbytes += block.nbytes
                self.tokens += block.token_count
            self._references[block.store_key] += 1

    def release(self, refs: Iterable[BlockRef]) -> None:
        for ref in refs:
            key = ref.block.store_key
            self._references[key] -= 1
            if self._references[key] == 0:
                block = self._blocks.pop(key)
                del self._references[key]
                self.nbytes -= block.nbytes
                self.tokens -= block.token_count

    def clear(self) -> None:
        self._blocks.clear()
        self._references.clear()
        self.nbytes = self.tokens = 0
