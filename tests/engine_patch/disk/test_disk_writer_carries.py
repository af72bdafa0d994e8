"""A queued write carries only what it will put on disk (#37): a hybrid turn goes to disk up to its checkpoint
where the next turn resumes, so its end state and its reply's blocks are never prepared only to be dropped.

The entry is a real one: a turn of the tiny Qwen3.5-shaped model through the cached generation over RAM.
The writer's thread is stopped first, so the queued write stays where the test reads it.
"""

import threading
from concurrent.futures import Future

import mlx_lm
import pytest

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.disk.disk_faults import DiskCounters, DiskFaults
from stable_prefix.engine_patch.disk.disk_index import DiskIndex
from stable_prefix.engine_patch.disk.disk_writer import DiskWriter
from stable_prefix.engine_patch.disk.persisted_entry import record_of
from stable_prefix.engine_patch.vllm_mlx.simple.cached_generation import CachedGeneration
from tests.support.family_chat import FAMILY_MODELS, ORIGINAL_STREAM_GENERATE, chat_head, prompt, served
from tests.support.models import require_model


@pytest.fixture(scope="module")
def entry():
    """A hybrid lane's first turn as RAM keeps it: blocks of its prompt and its reply, checkpoints, its end state."""
    model, tokenizer = mlx_lm.load(str(require_model(FAMILY_MODELS["qwen3_5"])))
    cache = RamTier(budget_bytes=256 * 2**20)
    served(CachedGeneration(ORIGINAL_STREAM_GENERATE, cache), model, tokenizer, prompt(tokenizer, "main", 1), chat_head(tokenizer))
    return cache.newest_entry()


@pytest.fixture
def stopped_writer(directory):
    faults = DiskFaults(DiskCounters(), threading.Condition())
    writer = DiskWriter(directory, DiskIndex(directory, faults, list), faults, 4, lambda path, prepared: None)
    writer.close(timeout=1)
    return writer


def test_a_hybrid_turn_s_write_carries_its_prompt_s_blocks_and_checkpoints_but_not_its_end_state(entry, stopped_writer):
    record, own_end_state = record_of(entry)
    assert own_end_state and entry.prompt_length in entry.checkpoint_positions  # a turn whose end the disk drops
    stopped_writer.submit(Future(), entry)
    queued = stopped_writer._queue[0]
    assert set(queued.states) == {c.key for c in entry.checkpoints if c.position <= entry.prompt_length}
    assert record.end_state not in queued.states
    assert set(queued.blocks) == {ref.block.key for ref in entry.blocks if ref.start < entry.prompt_length}
    assert len(queued.blocks) < len({ref.block.key for ref in entry.blocks})  # the reply's block stays behind
