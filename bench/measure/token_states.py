"""Counting token states: what a session makes new, and what a cache holds once.

A *token state* is the KV (and recurrent) state after one token prefix: the
state at position p of a sequence depends on its first p + 1 tokens and on
nothing else, so two sequences share the states of their common prefix and no
other. Hence:

- the **new token states** of a request are the tokens of its sequence (the
  prompt, then the reply tokens the engine holds too) beyond the longest
  prefix it shares with any earlier request's sequence: no earlier request's
  engine ever computed them. Over a session they sum to the number of distinct
  token prefixes of all its sequences, what an ideal store writes once;
- the **unique token states** a cache holds are the distinct prefixes of the
  sequences its entries hold: what an ideal store keeps once.

Both are plain functions of token id sequences, counted exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    mismatches = np.flatnonzero(a[:n] != b[:n])
    return int(mismatches[0]) if len(mismatches) else n


def new_token_states(sequences: Sequence[np.ndarray]) -> list[int]:
    """For each sequence, in order: its length less the longest prefix it shares with any earlier one."""
    counts = []
    for index, sequence in enumerate(sequences):
        shared = max((common_prefix_length(sequence, earlier) for earlier in sequences[:index]), default=0)
        counts.append(len(sequence) - shared)
    return counts


def unique_token_states(sequences: Sequence[np.ndarray]) -> int:
    """How many distinct token prefixes the sequences have together (each shared state counted once).

    Sorted lexicographically, a sequence shares its longest prefix with one of its neighbours, so
    the union is the total length less each sequence's common prefix with the one before it.
    """
    ordered = sorted((np.asarray(sequence) for sequence in sequences if len(sequence)), key=lambda sequence: sequence.tolist())
    total = sum(len(sequence) for sequence in ordered)
    return total - sum(common_prefix_length(ordered[i - 1], ordered[i]) for i in range(1, len(ordered)))
