"""What one write of a lane puts on disk, decided under the directory lock from what the directory holds."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from stable_prefix.engine_patch.cache.prefix_index import common_prefix_length, repeats_prompt_of, restorable_length

# RAM's rule for which checkpoints a lane keeps (duck-typed: a position and a pin), the one owner of it.
from stable_prefix.engine_patch.cache.ram_tier import _kept as kept_checkpoints

from .persisted_entry import LaneRecord, cut, state_keys
from .snapshot_directory import BLOCK, STATE, SnapshotDirectory
from .snapshot_file import PreparedSnapshot


class WritePlan:
    """What one write puts on disk, decided under the directory lock from what the directory holds.

    A block the lane refers to that is neither on disk nor carried by the
    write (another server evicted it after this tier last saw it) ends the
    lane at the longest prefix before it that it restores (`truncated`).
    The lanes on disk it replaces (`lanes` whose whole prompt it repeats) hand
    it their checkpoints inside the prefix they share, as RAM's entries do
    (`RamTier.store`): another server's lane may hold one this server's
    RAM never had (a branch point it saw), and would otherwise lose it.
    """

    def __init__(self, files: SnapshotDirectory, folder: Path, record: LaneRecord, blocks: dict[str, PreparedSnapshot],
                 states: dict[str, PreparedSnapshot], lanes: Iterable[LaneRecord] = ()):
        present_blocks, present_states = files.sizes(folder, BLOCK), files.sizes(folder, STATE)
        self.present_block_files, self.present_state_files = set(present_blocks), set(present_states)
        positional = bool(record.positional)
        wanted = length = written_length(record)
        for piece in record.blocks:
            if piece.start >= length:
                break  # a reply's block past where the lane goes on disk: neither needed nor carried
            if piece.key not in present_blocks and piece.key not in blocks:
                length = restorable_length(record.token_count, record.checkpoint_positions, piece.start, positional)
                break
        while length > 0 and positional and any(key not in present_states and key not in states for key in state_keys(cut(record, length))):
            length = restorable_length(record.token_count, record.checkpoint_positions, length - 1, positional)
        self.truncated = length < wanted
        self.record = cut(record, length) if length > 0 else None
        if self.record is None:
            return
        self.record = with_inherited_checkpoints(self.record, lanes, set(present_states))
        block_keys = list(dict.fromkeys(piece.key for piece in self.record.blocks))
        keys_of_states = state_keys(self.record)
        self.new_blocks = {key: blocks[key] for key in block_keys if key not in present_blocks}
        self.new_states = {key: states[key] for key in keys_of_states if key not in present_states}
        self.present_blocks = [key for key in block_keys if key in present_blocks]
        self.protected = {files.place(folder, BLOCK, key) for key in self.present_blocks}
        self.protected |= {files.place(folder, STATE, key) for key in keys_of_states if key in present_states}
        self.new_bytes = sum(file.file_bytes for file in (*self.new_blocks.values(), *self.new_states.values()))
        self.footprint = self.new_bytes + sum(present_blocks[key] for key in self.present_blocks) + sum(
            present_states[key] for key in keys_of_states if key in present_states)


def written_part(record: LaneRecord) -> LaneRecord:
    """The part of `record` a write puts on disk when nothing it needs is missing: what the writer carries
    (`DiskWriter.submit`), so a hybrid turn's end state and reply blocks are never prepared only to be dropped."""
    return cut(record, written_length(record))


def written_length(record: LaneRecord) -> int:
    """Where `record` ends on disk: a positional lane at its resume point (`resume_point`), any other at its end."""
    return resume_point(record, record.token_count) if record.positional else record.token_count


def resume_point(record: LaneRecord, length: int) -> int:
    """Where a positional lane of `length` tokens goes on disk: its checkpoint at the end of its prompt's shared
    part (the generation prompt's start, where the next turn resumes) if it has one, else its end.

    The state after the reply serves a next turn only where the reply renders back exactly as generated (no
    template that strips thinking does), and each state is a whole recurrent snapshot (73.7 MiB at the
    Qwen3-Next shape), so the disk writes one per turn; RAM keeps the end as well.
    """
    at_prompt = [c.position for c in record.checkpoints if c.position == record.prompt_length and c.position < length]
    return at_prompt[0] if at_prompt else length


def with_inherited_checkpoints(record: LaneRecord, lanes: Iterable[LaneRecord], present_states: set[str]) -> LaneRecord:
    """`record` with the checkpoints of the lanes it replaces inside the prefix it shares with each
    (their states on disk already; one per position, its own first), as many as RAM keeps: of two close
    ones the earlier goes (a request restores the longest inside its common prefix), never a pinned one."""
    if not record.positional or record.tokens is None:
        return record
    held = {c.position: c for c in record.checkpoints}
    for lane in lanes:
        if lane.tokens is None or lane.name == record.name or not repeats_prompt_of(lane, record.tokens):
            continue
        shared = min(common_prefix_length(lane.tokens, record.tokens), record.token_count - 1)  # its end is its own
        for checkpoint in lane.checkpoints:
            if checkpoint.position <= shared and checkpoint.key in present_states:
                held.setdefault(checkpoint.position, checkpoint)
    if len(held) == len(record.checkpoints):
        return record
    return replace(record, checkpoints=kept_checkpoints(sorted(held.values(), key=lambda c: c.position), record.token_count))
