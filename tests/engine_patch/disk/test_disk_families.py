"""The disk tier with a tiny model of every family, in process.

A first life serves three requests of two lanes (main turn 1, a subagent's
turn 1, main turn 3) with the cached stream_generate over a RAM cache and a
disk tier; its entries (end states and checkpoints) go to disk. A restart is
a new RAM cache and a new disk tier on a copy of that directory. Greedy tokens
are compared with mlx-lm's own uncached generation.
"""

from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from stable_prefix.engine_patch.cache.cache_layers import positional_indices
from stable_prefix.engine_patch.cache.kv_blocks import BLOCK_TOKENS
from stable_prefix.engine_patch.cache.prefix_index import common_prefix_length
from stable_prefix.engine_patch.cache.ram_tier import RamTier, footprint
from stable_prefix.engine_patch.disk.disk_tier import DiskTier
from stable_prefix.engine_patch.disk.persisted_entry import LaneRecord, lane_record, state_keys, with_tokens
from stable_prefix.engine_patch.disk.snapshot_directory import BLOCK, STATE, SnapshotDirectory
from stable_prefix.engine_patch.disk.snapshot_file import read_header
from stable_prefix.engine_patch.disk.tiered_cache import TieredCache
from stable_prefix.engine_patch.vllm_mlx.simple.cached_generation import CachedGeneration
from tests.support.family_chat import FAMILY_MODELS, ORIGINAL_STREAM_GENERATE, chat_head, greedy, prompt, resume_position, served
from tests.support.family_models import fresh_family_model
from tests.support.models import require_model

RAM_BUDGET = DISK_BUDGET = 256 * 2**20
FIRST_LIFE = [("main", 1), ("subagent", 1), ("main", 3)]
# qwen2's disk tier has its own tests (test_disk_tier.py); the hybrid stays in the fast loop.
SLOW_FAMILIES = ("qwen2", "gpt_oss", "gemma3_text", "nemotron_h")


@dataclass
class Life:
    """One server's life in process: a RAM cache over a disk tier, and the cached generation."""

    generation: CachedGeneration
    cache: TieredCache
    tier: DiskTier


@dataclass
class Family:
    name: str
    model_dir: Path
    model: object
    tokenizer: object
    positional: bool
    head: str | None  # the system + tools head, as the server's chat path finds it


@pytest.fixture(scope="module", params=["qwen3_5", *(pytest.param(f, marks=pytest.mark.slow) for f in SLOW_FAMILIES)])
def family(request) -> Family:
    model_dir = require_model(FAMILY_MODELS[request.param])
    model, tokenizer = fresh_family_model(request.param)  # its own: the disk tier identifies it
    return Family(request.param, model_dir, model, tokenizer, bool(positional_indices(make_prompt_cache(model))), chat_head(tokenizer))


def start_life(family: Family, directory: Path, ram_budget: int = RAM_BUDGET, disk_budget: int = DISK_BUDGET,
               block_tokens: int = BLOCK_TOKENS) -> Life:
    """What a server does once it has loaded the model: a RAM cache over a disk tier on `directory`."""
    tier = DiskTier(directory, disk_budget)
    tier.model_loaded(family.model, family.model_dir)
    assert tier.identity_for(family.model, wait=120) is not None
    cache = TieredCache(RamTier(budget_bytes=ram_budget, block_tokens=block_tokens), tier)
    return Life(CachedGeneration(ORIGINAL_STREAM_GENERATE, cache), cache, tier)


@pytest.fixture
def lives():
    """Start lives (each closed at the end of the test)."""
    started: list[Life] = []

    def start(*args) -> Life:
        started.append(start_life(*args))
        return started[-1]

    yield start
    for life in started:
        life.tier.close(timeout=10)


def live_through(life: Life, family: Family, requests) -> None:
    for lane, turns in requests:
        served(life.generation, family.model, family.tokenizer, prompt(family.tokenizer, lane, turns), family.head)
    assert life.tier.flush(timeout=60)


@dataclass
class FirstLife:
    directory: Path  # what it left on disk (its writes done, as a killed server leaves it once written)
    ram_bytes: int  # what its RAM cache held at the end
    largest_ram_lane: int  # the bytes of its largest lane in RAM (its blocks, end state and checkpoints)


@pytest.fixture(scope="module")
def first_life(family, tmp_path_factory) -> FirstLife:
    directory = tmp_path_factory.mktemp(f"kv-{family.name}")
    life = start_life(family, directory)
    live_through(life, family, FIRST_LIFE)
    life.tier.close()
    assert life.tier.stats()["disk_errors"] == 0
    largest = max(footprint(entry) for entry in life.cache.ram.entries.values())
    return FirstLife(directory, life.cache.ram.stats()["bytes"], largest)


@pytest.fixture
def restarted_dir(first_life, tmp_path) -> Path:
    """A copy of what the first life left, for one test to change."""
    return Path(shutil.copytree(first_life.directory, tmp_path / "kv"))


_cold: dict[tuple[str, str], list[int]] = {}


def cold(family: Family, text: str) -> list[int]:
    if (family.name, text) not in _cold:
        _cold[family.name, text] = greedy(ORIGINAL_STREAM_GENERATE, family.model, family.tokenizer, text)
    return _cold[family.name, text]


def answer_as_cold(life: Life, family: Family, text: str):
    warm, reuse = served(life.generation, family.model, family.tokenizer, text, family.head)
    assert warm == cold(family, text)
    return reuse


def snapshot_files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*.kv") if not path.name.startswith("."))


def lane_of(path: Path) -> LaneRecord:
    """The lane a manifest describes, with its blocks' token ids (its model: the folder it is in)."""
    folder = path.parent.parent
    header = read_header(path, folder.name, "lane")
    record = lane_record(path.stem, header.metadata, header.file_bytes)
    return with_tokens(record, {piece.key: read_header(SnapshotDirectory.place(folder, BLOCK, piece.key), folder.name, "block").tokens
                                for piece in record.blocks})


def files_of_lane(path: Path) -> set[Path]:
    """A lane's manifest and every block and state it refers to."""
    record, folder = lane_of(path), path.parent.parent
    return ({path} | {SnapshotDirectory.place(folder, BLOCK, piece.key) for piece in record.blocks}
            | {SnapshotDirectory.place(folder, STATE, key) for key in state_keys(record)})


def file_of_lane(family: Family, directory: Path, lane: str) -> Path:
    lane_tokens = np.asarray(family.tokenizer.encode(prompt(family.tokenizer, lane, 1), add_special_tokens=False))
    return max(snapshot_files(directory), key=lambda path: common_prefix_length(lane_of(path).tokens, lane_tokens))


# --- a restarted server starts warm, for every family ----------------------------


def test_after_a_restart_the_next_turn_is_restored_from_disk_and_answers_as_cold(family, lives, restarted_dir):
    life = lives(family, restarted_dir)
    reuse = answer_as_cold(life, family, prompt(family.tokenizer, "main", 5))
    assert reuse.reused >= resume_position(family.tokenizer, prompt(family.tokenizer, "main", 3))
    stats = life.tier.stats()
    assert stats["disk_hits"] == 1 and stats["disk_loads"] == 1 and stats["disk_errors"] == 0


def test_a_lane_of_many_small_blocks_comes_back_after_a_restart_and_answers_as_cold(family, lives, tmp_path):
    """16-token blocks: the restored lane is many block files, the last one used in part."""
    live_through(lives(family, tmp_path / "kv", RAM_BUDGET, DISK_BUDGET, 16), family, FIRST_LIFE)
    restarted = lives(family, tmp_path / "kv", RAM_BUDGET, DISK_BUDGET, 16)
    reuse = answer_as_cold(restarted, family, prompt(family.tokenizer, "main", 5))
    assert reuse.reused >= resume_position(family.tokenizer, prompt(family.tokenizer, "main", 3))
    assert restarted.tier.stats()["disk_blocks_loaded"] >= reuse.reused // 16 and restarted.tier.stats()["disk_errors"] == 0


def test_after_a_restart_a_new_conversation_reuses_the_shared_head_and_answers_as_cold(family, lives, restarted_dir):
    life = lives(family, restarted_dir)
    text = prompt(family.tokenizer, "new", 1)
    reuse = answer_as_cold(life, family, text)
    head = common_prefix_length(*(np.asarray(family.tokenizer.encode(t, add_special_tokens=False))
                                  for t in (text, prompt(family.tokenizer, "main", 1))))
    assert reuse.reused >= head - 1 > 0, "the new conversation did not reuse the system + tools head from disk"
    assert life.tier.stats()["disk_hits"] == 1


def test_a_checkpoint_two_lanes_shared_comes_back_as_one_object_counted_once(family, lives, restarted_dir):
    if not family.positional:
        pytest.skip("a model of rewindable layers only has no checkpoints")
    life = lives(family, restarted_dir)
    loaded = []
    for lane, turns in (("main", 5), ("subagent", 3)):
        tokens = np.asarray(family.tokenizer.encode(prompt(family.tokenizer, lane, turns), add_special_tokens=False))
        loaded.append(life.tier.load(life.tier.longest_restorable_prefix(family.model, tokens, positional=True)).entry)
    shared_keys = {c.key for c in loaded[0].checkpoints} & {c.key for c in loaded[1].checkpoints}
    assert shared_keys, "the first life's lanes shared no checkpoint"
    alone = []
    for entry in loaded:
        ram = RamTier(budget_bytes=RAM_BUDGET)
        ram.admit(entry)
        alone.append(ram.stats()["bytes"])
    together = RamTier(budget_bytes=RAM_BUDGET)
    for entry in loaded:
        together.admit(entry)
    held = [c for entry in together.entries.values() for c in entry.checkpoints]
    assert len({id(c) for c in held}) == len({c.key for c in held}), "a shared checkpoint came back as two objects"
    shared_bytes = sum(c.nbytes for c in loaded[0].checkpoints if c.key in shared_keys)
    shared_blocks = {ref.block.key: ref.block.nbytes for ref in loaded[0].blocks}.items() & {
        ref.block.key: ref.block.nbytes for ref in loaded[1].blocks}.items()
    assert together.stats()["bytes"] == sum(alone) - shared_bytes - sum(nbytes for _, nbytes in shared_blocks) > 0


def test_a_file_with_no_checkpoint_inside_the_common_prefix_is_never_loaded(family, lives, restarted_dir):
    """A prompt that leaves every file just before its first checkpoint: a positional model can
    restore nothing of the shared tokens (so nothing is read), a rewindable one all of them."""
    life = lives(family, restarted_dir)
    lanes = [lane_of(path) for path in snapshot_files(restarted_dir)]
    positions = [p for lane in lanes for p in lane.checkpoint_positions]
    shared = min(positions) - 1 if family.positional else 60
    assert shared > 20
    tokens = lanes[0].tokens[:shared].tolist()
    prompt_tokens = tokens + [token for token in range(1000, 1040) if token != lanes[0].tokens[shared]]
    fetched = life.cache.fetch(family.model, prompt_tokens)
    if family.positional:
        assert fetched.reused == 0 and life.tier.stats()["disk_loads"] == 0
    else:
        assert fetched.reused == shared and life.tier.stats()["disk_loads"] == 1


def test_a_damaged_checkpoint_is_refused_counted_and_the_answer_is_cold(family, lives, restarted_dir):
    if not family.positional:
        pytest.skip("a model of rewindable layers only has no checkpoints")
    path = first_checkpoint_file(file_of_lane(family, restarted_dir, "main"))
    flip_a_byte_of_its_arrays(path)
    life = lives(family, restarted_dir)
    answer_as_cold(life, family, prompt(family.tokenizer, "main", 5))
    stats = life.tier.stats()
    assert stats["disk_errors"] == 1 and "checksum" in stats["disk_last_error"]
    assert not path.exists()


def first_checkpoint_file(manifest: Path) -> Path:
    """The state file of the lane's first checkpoint (one its end state is not)."""
    record = lane_of(manifest)
    key = next(c.key for c in record.checkpoints if c.key != record.end_state)
    return SnapshotDirectory.place(manifest.parent.parent, STATE, key)


def flip_a_byte_of_its_arrays(path: Path) -> None:
    data = bytearray(path.read_bytes())
    (header_length,) = struct.unpack("<Q", data[:8])
    data[8 + header_length] ^= 0x40
    path.write_bytes(bytes(data))


def test_the_byte_budgets_on_disk_and_in_ram_hold_across_a_restart(family, lives, first_life, tmp_path):
    """Budgets that hold the newest main-lane entry but not both lanes: older files and entries are evicted."""
    lanes = [files_of_lane(path) for path in snapshot_files(first_life.directory)]
    largest = max(sum(path.stat().st_size for path in files) for files in lanes)
    every_file = sum(path.stat().st_size for path in set().union(*lanes))
    disk_budget = largest + (every_file - largest) // 2
    ram_budget = first_life.largest_ram_lane + (first_life.ram_bytes - first_life.largest_ram_lane) // 2
    life = lives(family, tmp_path / "kv", ram_budget, disk_budget)
    for lane, turns in FIRST_LIFE:
        answer_as_cold(life, family, prompt(family.tokenizer, lane, turns))
        assert life.cache.ram.stats()["bytes"] <= ram_budget
    assert life.tier.flush(timeout=60)
    stats = life.tier.stats()
    assert stats["disk_bytes"] <= disk_budget and stats["disk_evictions"] >= 1
    assert life.cache.ram.stats()["evictions"] >= 1
    restarted = lives(family, tmp_path / "kv", ram_budget, disk_budget)
    answer_as_cold(restarted, family, prompt(family.tokenizer, "main", 5))
    assert restarted.tier.stats()["disk_hits"] == 1
    assert restarted.cache.ram.stats()["bytes"] <= ram_budget
    assert restarted.tier.flush(timeout=60) and restarted.tier.stats()["disk_bytes"] <= disk_budget
