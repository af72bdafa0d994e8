"""A lane written over lanes on disk whose whole prompt it repeats keeps their checkpoints inside the prefix
they share, as RAM does (#36): another server's lane may hold one this server's RAM never had."""

import numpy as np
import pytest

from stable_prefix.engine_patch.cache.ram_tier import MAX_CHECKPOINTS
from stable_prefix.engine_patch.disk.lane_write_plan import WritePlan
from stable_prefix.engine_patch.disk.persisted_entry import BlockPiece, CheckpointRecord, LaneRecord
from stable_prefix.engine_patch.disk.snapshot_directory import BLOCK, STATE, SnapshotDirectory
from tests.support.disk_stand_ins import a_file

SHARED = 280  # the tokens both lanes begin with: the older lane's prompt and a part of its answer


def lane(name: str, tokens: np.ndarray, prompt_length: int, blocks: list[BlockPiece], checkpoints: list[CheckpointRecord], end_state: str) -> LaneRecord:
    return LaneRecord(name, tokens, prompt_length, 2, [1], blocks, checkpoints, end_state, 1, 0.0, 0)


@pytest.fixture
def folder(directory):
    return directory.path / "model"


def put_on_disk(directory: SnapshotDirectory, folder, kind: str, *keys: str) -> None:
    for key in keys:
        path = directory.place(folder, kind, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 100)


def older_lane(checkpoints=((100, True, "head"), (200, False, "middle"), (290, False, "in-its-answer"))) -> LaneRecord:
    """Another server's lane on disk: 300 tokens, 250 of them prompt."""
    return lane("older", np.arange(300), 250, [BlockPiece("b1", 0, 256, 256), BlockPiece("b2", 256, 512, 44)],
                [CheckpointRecord(key, position, pinned) for position, pinned, key in checkpoints], "older-end")


def new_lane(checkpoints=()) -> LaneRecord:
    """This server's next turn of that conversation: the first SHARED tokens, then its own."""
    tokens = np.concatenate([np.arange(SHARED), np.arange(1000, 1040)])
    return lane("", tokens, 310, [BlockPiece("b1", 0, 256, 256), BlockPiece("b3", 256, 512, 64)],
                [CheckpointRecord(key, position, False) for position, key in checkpoints], "new-end")


def plan(directory, folder, record, lanes) -> WritePlan:
    return WritePlan(directory, folder, record, {"b3": a_file()}, {"new-end": a_file()}, lanes)


def test_a_lane_replacing_one_on_disk_keeps_its_checkpoints_inside_their_shared_prefix(directory, folder):
    put_on_disk(directory, folder, BLOCK, "b1", "b2")
    put_on_disk(directory, folder, STATE, "head", "middle", "in-its-answer", "older-end")
    written = plan(directory, folder, new_lane(), [older_lane()])
    assert [(c.position, c.key, c.pinned) for c in written.record.checkpoints] == [(100, "head", True), (200, "middle", False)]
    assert {directory.place(folder, STATE, "head"), directory.place(folder, STATE, "middle")} <= written.protected
    assert not {"head", "middle"} & set(written.new_states)  # named, not written again


def test_its_own_checkpoint_at_a_position_comes_before_an_inherited_one(directory, folder):
    put_on_disk(directory, folder, BLOCK, "b1", "b2")
    put_on_disk(directory, folder, STATE, "head", "middle", "older-end", "mine")
    written = plan(directory, folder, new_lane(checkpoints=[(200, "mine")]), [older_lane()])
    assert [c.key for c in written.record.checkpoints] == ["head", "mine"]


def test_a_checkpoint_whose_state_is_no_longer_on_disk_is_not_inherited(directory, folder):
    put_on_disk(directory, folder, BLOCK, "b1", "b2")
    put_on_disk(directory, folder, STATE, "head", "older-end")  # "middle" evicted by another server meanwhile
    written = plan(directory, folder, new_lane(), [older_lane()])
    assert [c.key for c in written.record.checkpoints] == ["head"]


def test_a_lane_whose_prompt_the_new_one_does_not_repeat_hands_over_nothing(directory, folder):
    put_on_disk(directory, folder, BLOCK, "b1", "b2")
    put_on_disk(directory, folder, STATE, "head", "middle", "older-end")
    other = older_lane()
    other.prompt_length = 295  # its prompt goes past where the new lane parts from it: not replaced
    assert plan(directory, folder, new_lane(), [other]).record.checkpoints == []


def test_no_more_checkpoints_are_inherited_than_ram_keeps(directory, folder):
    many = [(10 * (i + 1), False, f"c{i}") for i in range(MAX_CHECKPOINTS + 4)]
    put_on_disk(directory, folder, BLOCK, "b1", "b2")
    put_on_disk(directory, folder, STATE, "older-end", *(key for _, _, key in many))
    assert len(plan(directory, folder, new_lane(), [older_lane(many)]).record.checkpoints) == MAX_CHECKPOINTS
