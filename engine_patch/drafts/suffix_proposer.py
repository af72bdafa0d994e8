"""Drafts from tokens the session already has: the longest earlier match of what was just generated.

An agent's reply copies a lot: an Edit's `old_string` repeats lines it just
read, a Write repeats a file with one change, tool-call JSON repeats paths and
argument names, a report quotes what a grep returned. So the tokens that follow
the end of the sequence so far are often the tokens that followed the same
few tokens somewhere earlier: in this request's prompt, in its reply so far,
or in another lane's conversation (a subagent quoting what the main agent
read). The proposer finds the occurrence whose preceding tokens agree longest
with the sequence's end (at least `MIN_MATCH` of them, looked back up to
`MAX_MATCH`), prefers the most recent one on a tie, and proposes the tokens
that followed it. The request's own tokens come first (its prompt and reply,
and its prompt as a JSON string quotes it: `json_string_view.py`); other
lanes only when those have no match: they share a session's scaffolding (the
same system prompt, the same tool-call openings), which agrees longer than
what the request itself is copying and would draft another lane's file.

Lookups are vectorised: each source keeps its token array sorted once
(immutable sources: the prompt, other lanes) or an index of positions per
token (the reply, which grows), and a lookup compares the candidates'
preceding tokens with the sequence's end, `MAX_MATCH` array comparisons in
all, whatever the sources' lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Tokens of agreement needed before a continuation is proposed: one token
# (a space, a newline) matches everywhere and predicts little.
MIN_MATCH = 2
# How far back agreement is measured: past this, longer agreement ranks no higher.
MAX_MATCH = 16
# Candidates examined per source and lookup (the most recent ones).
MAX_CANDIDATES = 4096


class FrozenTokens:
    """An immutable token array with its occurrences of each token, found by binary search."""

    def __init__(self, tokens: Sequence[int] | np.ndarray):
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self._order = np.argsort(self.tokens, kind="stable")
        self._sorted = self.tokens[self._order]

    def __len__(self) -> int:
        return len(self.tokens)

    def positions_of(self, token: int) -> np.ndarray:
        """Where `token` occurs, in increasing order."""
        low, high = np.searchsorted(self._sorted, [token, token + 1])
        return self._order[low:high]


class GrowingTokens:
    """A sequence that grows at its end (a prompt, then a reply token by token), with the positions of each token."""

    def __init__(self, prompt: Sequence[int]):
        self._prompt = FrozenTokens(prompt)
        self._buffer = np.empty(max(64, 2 * len(prompt)), dtype=np.int64)
        self._buffer[: len(prompt)] = self._prompt.tokens
        self._length = len(prompt)
        self._added: dict[int, list[int]] = {}  # positions of each token after the prompt

    def __len__(self) -> int:
        return self._length

    @property
    def tokens(self) -> np.ndarray:
        return self._buffer[: self._length]

    def append(self, tokens: Sequence[int]) -> None:
        needed = self._length + len(tokens)
        if needed > len(self._buffer):
            grown = np.empty(max(needed, 2 * len(self._buffer)), dtype=np.int64)
            grown[: self._length] = self.tokens
            self._buffer = grown
        for token in tokens:
            self._buffer[self._length] = token
            self._added.setdefault(int(token), []).append(self._length)
            self._length += 1

    def positions_of(self, token: int) -> np.ndarray:
        added = self._added.get(int(token), ())
        return np.concatenate([self._prompt.positions_of(token), np.asarray(added, dtype=np.int64)])


class JoinedLanes:
    """Several lanes as one source, a separator (-1, never a token) after each: one lookup for all of them.

    Each lane's occurrence index is built once (`FrozenTokens`) and kept by the
    caller while the lane stays in the cache; joining is a concatenation.
    """

    def __init__(self, lanes: Sequence[FrozenTokens]):
        self.lanes = list(lanes)
        separator = np.full(1, -1, dtype=np.int64)
        self.tokens = np.concatenate([part for lane in self.lanes for part in (lane.tokens, separator)]) if self.lanes else np.zeros(0, np.int64)
        self._starts = np.cumsum([0] + [len(lane) + 1 for lane in self.lanes])[:-1]

    def __len__(self) -> int:
        return len(self.tokens)

    def positions_of(self, token: int) -> np.ndarray:
        found = [lane.positions_of(token) + start for lane, start in zip(self.lanes, self._starts)]
        return np.concatenate(found) if found else np.zeros(0, np.int64)


class SuffixProposer:
    """Proposes the continuation of one sequence from its own tokens, then from other lanes'."""

    def __init__(self, prompt: Sequence[int], other_lanes: JoinedLanes | None = None, quoted: FrozenTokens | None = None):
        self.sequence = GrowingTokens(prompt)
        self.own = [self.sequence, *([quoted] if quoted is not None and len(quoted) else [])]
        self.other_lanes = [other_lanes] if other_lanes is not None and len(other_lanes) else []

    def extend(self, tokens: Sequence[int]) -> None:
        """Tokens decided after the sequence so far (the reply as it grows)."""
        self.sequence.append(tokens)

    def propose(self, count: int) -> list[int]:
        """Up to `count` tokens likely to follow the sequence (none when no earlier match is long enough)."""
        end = self.sequence.tokens
        if count <= 0 or len(end) < MIN_MATCH:
            return []
        best_length, best_source, best_position = 0, None, -1
        for sources in (self.own, self.other_lanes):
            # In order: on equal agreement the first source's most recent occurrence wins.
            for source in sources:
                length, position = _longest_match(source, end)
                if length > best_length:
                    best_length, best_source, best_position = length, source, position
            if best_length >= MIN_MATCH:
                break
        if best_length < MIN_MATCH:
            return []
        continuation = best_source.tokens[best_position + 1 : best_position + 1 + count]
        ends = np.flatnonzero(continuation < 0)  # another lane starts there
        return [int(token) for token in continuation[: ends[0] if len(ends) else len(continuation)]]


def _longest_match(source: FrozenTokens | JoinedLanes | GrowingTokens, end: np.ndarray) -> tuple[int, int]:
    """The position in `source` whose preceding tokens agree longest with `end`'s last ones, and that agreement.

    A candidate must have a token after it (something to propose) and, in the
    sequence itself, lie before its last token.
    """
    tokens = source.tokens
    candidates = source.positions_of(int(end[-1]))
    candidates = candidates[candidates < len(tokens) - 1]
    candidates = candidates[-MAX_CANDIDATES:]
    if len(candidates) == 0:
        return 0, -1
    depth = min(MAX_MATCH, len(end))
    back = np.arange(depth)
    earlier = candidates[:, None] - back[None, :]
    agrees = (earlier >= 0) & (tokens[np.maximum(earlier, 0)] == end[len(end) - 1 - back][None, :])
    agreement = np.cumprod(agrees, axis=1).sum(axis=1)
    best = int(agreement.max())
    # The most recent candidate among the longest agreements.
    position = int(candidates[np.flatnonzero(agreement == best)[-1]])
    return best, position
