"""A hybrid turn writes one recurrent state to disk: its checkpoint where the next turn resumes (#37).

The state after the reply serves a next turn only where the reply renders back exactly as generated, and each
state is a whole recurrent snapshot (73.7 MiB at the Qwen3-Next shape); RAM keeps the end as well.
"""

import numpy as np

from stable_prefix.engine_patch.disk.lane_write_plan import WritePlan
from stable_prefix.engine_patch.disk.persisted_entry import BlockPiece, CheckpointRecord, LaneRecord
from tests.support.disk_stand_ins import a_file

PROMPT = 300  # where the generation prompt starts: the next turn repeats every token before it


def turn(positional: list[int], checkpoints: list[tuple[str, int]]) -> LaneRecord:
    """A turn of 400 tokens (its prompt and its reply) in two blocks, ending with state `end`."""
    return LaneRecord("", np.arange(400), PROMPT, 2, positional, [BlockPiece("b1", 0, 256, 256), BlockPiece("b2", 256, 512, 144)],
                      [CheckpointRecord(key, position, False) for key, position in checkpoints], "end" if positional else None, 1, 0.0, 0)


def written(directory, record: LaneRecord) -> WritePlan:
    states = {key: a_file() for key in ("head", "at-prompt", "end")}
    return WritePlan(directory, directory.path / "model", record, {"b1": a_file(), "b2": a_file()}, states)


def test_a_hybrid_turn_writes_one_state_where_the_next_turn_resumes(directory):
    plan = written(directory, turn([1], [("at-prompt", PROMPT)]))
    assert plan.record.token_count == PROMPT
    assert set(plan.new_states) == {"at-prompt"}
    assert not plan.truncated  # a choice, not a block lost meanwhile


def test_a_hybrid_lane_s_first_turn_keeps_its_head_checkpoint_too(directory):
    plan = written(directory, turn([1], [("head", 100), ("at-prompt", PROMPT)]))
    assert set(plan.new_states) == {"head", "at-prompt"}


def test_a_hybrid_turn_without_a_checkpoint_at_its_prompt_keeps_its_end(directory):
    plan = written(directory, turn([1], [("head", 100)]))
    assert plan.record.token_count == 400
    assert set(plan.new_states) == {"head", "end"}


def test_a_plain_attention_lane_keeps_its_reply(directory):
    plan = written(directory, turn([], []))
    assert plan.record.token_count == 400
