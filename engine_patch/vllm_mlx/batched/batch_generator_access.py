"""The one module that reaches into mlx-lm's `BatchGenerator` (0.31).

`BatchGenerator.insert_segments` guarantees that prompt processing stops at
the end of each segment and says so (`end_of_segment` in the prompt responses
of `next()`): the batched engine seam prefills each sequence to its checkpoint
positions that way, snapshotting its layers there between two steps, while
the other sequences of the batch go on decoding.

Reading one sequence's state between steps, and adding a stop to a sequence
not yet prefilled that far (a request that shares its prefix asked for it),
use the generator's private fields; `why_unsupported` says whether they are
there as read here, so a changed mlx-lm leaves the seam off instead of
guessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REQUIRED_FIELDS = ("insert_segments", "_unprocessed_sequences", "_prompt_batch", "_generation_batch", "_currently_processing")


def why_unsupported(generator: Any) -> str | None:
    missing = [name for name in REQUIRED_FIELDS if not hasattr(generator, name)]
    return f"mlx-lm's BatchGenerator has no {', '.join(missing)}" if missing else None


def segments_of(tokens: list[int], stops: Sequence[int]) -> list[list[int]]:
    """`tokens` cut at each of `stops` (positions inside it, in any order)."""
    cuts = sorted({stop for stop in stops if 0 < stop < len(tokens)})
    bounds = [0, *cuts, len(tokens)]
    return [list(tokens[start:end]) for start, end in zip(bounds, bounds[1:])]


def insert(generator: Any, prompts: list[list[int]], stops: list[Sequence[int]], **per_sequence: Any) -> list[int]:
    """`BatchGenerator.insert`, each prompt's prefill stopping at its `stops` (positions inside the prompt)."""
    return generator.insert_segments([segments_of(prompt, prompt_stops) for prompt, prompt_stops in zip(prompts, stops)], **per_sequence)


def _pending_segments(generator: Any, uid: int) -> list[list[int]] | None:
    """The live list of segments a sequence has still to prefill (None once it decodes or is gone)."""
    for sequence in generator._unprocessed_sequences:
        if sequence[0] == uid:
            return sequence[1]
    batch = generator._prompt_batch
    if uid in batch.uids:
        return generator._currently_processing[batch.uids.index(uid)][0]
    return None


def add_stop(generator: Any, uid: int, inserted: int, stop: int) -> bool:
    """Make the sequence `uid` (`inserted` tokens long) stop its prefill at `stop` too.

    True if its prefill will stop there (already a stop, or added); False if it
    is past that point, decoding, or gone.
    """
    segments = _pending_segments(generator, uid)
    if segments is None:
        return False
    position = inserted - sum(len(segment) for segment in segments)
    for index, segment in enumerate(segments):
        end = position + len(segment)
        if stop == end:
            return True
        if position < stop < end:
            segments[index : index + 1] = [segment[: stop - position], segment[stop - position :]]
            return True
        position = end
    return False


def state_of(generator: Any, uid: int) -> list[Any] | None:
    """The cache of sequence `uid` as single-sequence layers, between two steps (None if not in a batch).

    The arrays are lazy copies: only the layers a caller evaluates cost anything.
    """
    for batch in (generator._prompt_batch, generator._generation_batch):
        if uid in batch.uids:
            return batch.extract_cache(batch.uids.index(uid))
    return None


def segments_of_next_prefill(generator: Any) -> list[list[list[int]]]:
    """The live segment lists of every sequence the generator's next step may prefill.

    A superset, read before the step: the sequences in its prompt batch that
    have more than their last token left (that one starts the decode), and
    the waiting ones that may join it (up to `prefill_batch_size` in all).
    """
    in_batch = [entry[0] for entry in generator._currently_processing]
    joining = max(0, generator.prefill_batch_size - len(generator._prompt_batch))
    waiting = [sequence[1] for _, sequence in zip(range(joining), generator._unprocessed_sequences)]
    return [segments for segments in in_batch + waiting if not _only_last_token_left(segments)]


def _only_last_token_left(segments: list[list[int]]) -> bool:
    """True once a sequence has only its last prompt token left: the next step starts its decode with it."""
    return len(segments) == 1 and len(segments[0]) == 1


def live_uids(generator: Any) -> set[int]:
    """Every sequence the generator holds: waiting, prefilling or decoding."""
    uids = {sequence[0] for sequence in generator._unprocessed_sequences}
    return uids | set(generator._prompt_batch.uids) | set(generator._generation_batch.uids)
