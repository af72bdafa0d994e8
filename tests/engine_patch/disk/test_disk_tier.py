"""The disk tier under the RAM cache, in process, with the tiny test model.

A "restart" is a new DiskTier and a new, empty RAM cache on the same
directory. Every bad state is made for real on disk (a cut file, a flipped
byte, a leftover temporary file, a read-only folder, a second tier writing
into the same directory, a disk that fills up: a real tmpfs whose free space
another program takes between the budget check and the write, so the kernel
refuses the write halfway with ENOSPC). One more full-disk test fails a write
with ENOSPC by hand, for machines where a tmpfs cannot be mounted.
"""

import contextlib
import errno
import json
import logging
import os
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.disk import snapshot_directory
from stable_prefix.engine_patch.disk.disk_tier import DiskTier
from stable_prefix.engine_patch.disk.persisted_entry import lane_record
from stable_prefix.engine_patch.disk.snapshot_file import load_arrays, read_header, write_snapshot
from stable_prefix.engine_patch.disk.tiered_cache import TieredCache
from tests.support.models import OTHER_SEED_MODEL, TEST_MODEL, require_model
from tests.support.small_filesystem import fill, tmpfs

RAM_BUDGET = 10**8
VOCAB = 1000


@pytest.fixture(scope="module")
def model():
    return load_model(require_model(TEST_MODEL))[0]


@pytest.fixture(scope="module")
def other_model():
    return load_model(require_model(OTHER_SEED_MODEL))[0]


@pytest.fixture
def directory(tmp_path):
    return tmp_path / "kv"


@pytest.fixture
def open_tier(directory):
    """Start a disk tier for a model, as a server does once it has loaded it; all are closed at the end."""
    opened = []

    def start(model, model_dir=TEST_MODEL, **options):
        tier = DiskTier(options.pop("directory", directory), **options)
        opened.append(tier)
        tier.model_loaded(model, model_dir)
        assert tier.identity_for(model, wait=120) is not None
        return tier

    yield start
    for tier in opened:
        tier.close(timeout=5)


def tokens(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, length).tolist()


def prefill(model, cache, new_tokens: list[int]) -> np.ndarray:
    """Prefill as mlx-lm does (states of all but the last token, then its logits alone), the last logits."""
    if len(new_tokens) > 1:
        model(mx.array(new_tokens[:-1])[None], cache=cache)
        mx.eval([layer.state for layer in cache])
    logits = model(mx.array(new_tokens[-1:])[None], cache=cache)
    return np.array(logits[0, -1].astype(mx.float32))


def serve(cache, model, prompt: list[int]) -> tuple[int, np.ndarray]:
    """One request as CachedGeneration runs it: fetch, prefill the rest, store. Returns (reused, last logits)."""
    fetched = cache.fetch(model, prompt)
    last = prefill(model, fetched.prompt_cache, prompt[fetched.reused :])
    cache.store(prompt, fetched.prompt_cache, len(prompt), model=model)
    return fetched.reused, last


def cold_logits(model, prompt: list[int]) -> np.ndarray:
    return prefill(model, make_prompt_cache(model), prompt)


def tiered(tier) -> TieredCache:
    return TieredCache(RamTier(budget_bytes=RAM_BUDGET), tier)


def written(tier, model, prompt) -> TieredCache:
    cache = tiered(tier)
    serve(cache, model, prompt)
    assert tier.flush(timeout=60)
    return cache


def lanes_on_one_head(head_length: int, lanes: int) -> list[list[int]]:
    """The prompts of `lanes` instances (subagents) that share their first `head_length` tokens, then 100 of their own."""
    head = tokens(1, head_length)
    return [head + tokens(10 + instance, 100) for instance in range(lanes)]


def snapshot_files(directory):
    return sorted(path for path in directory.rglob("*.kv") if not path.name.startswith("."))


# --- a restarted server starts warm -------------------------------------------


def test_after_a_restart_the_longest_disk_prefix_is_restored_and_computes_what_a_full_prefill_does(model, open_tier):
    conversation = tokens(1, 400)
    written(open_tier(model), model, conversation)
    next_turn = conversation + tokens(2, 30)
    tier = open_tier(model)
    reused, restored = serve(tiered(tier), model, next_turn)
    assert reused == 400
    np.testing.assert_allclose(restored, cold_logits(model, next_turn), atol=1e-4)
    stats = tier.stats()
    assert stats["disk_hits"] == 1 and stats["disk_tokens_loaded"] == 400 and stats["disk_errors"] == 0
    assert stats["disk_load_seconds"] > 0 and stats["disk_bytes_loaded"] > 0


def test_a_prompt_that_diverges_inside_a_disk_snapshot_reuses_the_common_prefix(model, open_tier):
    stored = tokens(1, 300)
    written(open_tier(model), model, stored)
    edited = stored[:120] + tokens(3, 50)
    reused, restored = serve(tiered(open_tier(model)), model, edited)
    assert reused == 120
    np.testing.assert_allclose(restored, cold_logits(model, edited), atol=1e-4)


def test_a_lookup_reads_token_ids_only(model, open_tier, monkeypatch):
    written(open_tier(model), model, tokens(1, 200))
    tier = open_tier(model)

    def no_kv_reads(*args, **kwargs):
        raise AssertionError("a lookup read KV bytes")

    monkeypatch.setattr(mx, "load", no_kv_reads)
    match = tier.longest_restorable_prefix(model, np.asarray(tokens(1, 200) + [7]), positional=False)
    assert match is not None and match.length == 200


def test_a_disk_hit_enters_the_ram_cache_and_is_loaded_once(model, open_tier):
    conversation = tokens(1, 200)
    written(open_tier(model), model, conversation)
    tier = open_tier(model)
    cache = tiered(tier)
    serve(cache, model, conversation + tokens(2, 10))
    serve(cache, model, conversation + tokens(2, 10) + tokens(3, 10))
    assert tier.stats()["disk_loads"] == 1
    assert cache.ram.stats()["hits"] == 2


def test_the_disk_is_not_read_when_ram_holds_as_much(model, open_tier):
    tier = open_tier(model)
    cache = written(tier, model, tokens(1, 200))
    serve(cache, model, tokens(1, 200) + tokens(2, 10))
    assert tier.stats()["disk_loads"] == 0


def test_another_model_never_loads_the_first_one_s_snapshots(model, other_model, open_tier, directory):
    conversation = tokens(1, 200)
    written(open_tier(model), model, conversation)
    first_files = snapshot_files(directory)
    other = open_tier(other_model, OTHER_SEED_MODEL)
    assert other.longest_restorable_prefix(other_model, np.asarray(conversation + [1]), positional=False) is None
    reused, _ = serve(tiered(other), other_model, conversation + [1])
    assert reused == 0 and other.stats()["disk_loads"] == 0
    assert other.flush(timeout=60)
    assert set(first_files) < set(snapshot_files(directory))  # its own snapshot beside the first model's, which is untouched
    assert other.identity_for(other_model).key != open_tier(model).identity_for(model).key


def test_snapshots_are_private_files_in_a_private_directory(model, open_tier, directory):
    written(open_tier(model), model, tokens(1, 50))
    assert directory.stat().st_mode & 0o777 == 0o700
    (path,) = snapshot_files(directory)
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600


# --- the same rules as in RAM: dominated states, budget, LRU --------------------


def test_a_new_snapshot_replaces_the_one_whose_prompt_it_repeats(model, open_tier, directory):
    tier = open_tier(model)
    cache = written(tier, model, tokens(1, 100))
    serve(cache, model, tokens(1, 100) + tokens(2, 20))
    assert tier.flush(timeout=60)
    (lane,) = tier.lanes(model)
    assert len(snapshot_files(directory)) == 1 and len(lane.tokens) == 120


def file_bytes_of(model, open_tier, tmp_path, length: int) -> int:
    probe = open_tier(model, directory=tmp_path / "probe")
    written(probe, model, tokens(99, length))
    return probe.stats()["disk_bytes"]


def test_the_budget_is_never_exceeded_and_the_least_recently_used_goes_first(model, open_tier, directory, tmp_path):
    size = file_bytes_of(model, open_tier, tmp_path, 150)
    tier = open_tier(model, budget_bytes=int(size * 2.5))
    lanes = [tokens(seed, 150) for seed in (11, 12, 13)]
    for lane in lanes[:2]:
        written(tier, model, lane)
        time.sleep(0.01)  # distinct mtimes
    serve(tiered(tier), model, lanes[0] + [5])  # lane 0 is used again (a disk load touches it)
    assert tier.flush(timeout=60)
    time.sleep(0.01)
    written(tier, model, lanes[2])
    stats = tier.stats()
    assert stats["disk_bytes"] <= stats["disk_budget_bytes"]
    assert stats["disk_evictions"] >= 1
    held = [lane.tokens.tolist()[:150] for lane in tier.lanes(model)]
    assert lanes[1] not in held and lanes[2] in held


def test_the_budget_never_takes_more_than_the_free_space_minus_a_margin(model, open_tier, tmp_path):
    size = file_bytes_of(model, open_tier, tmp_path, 150)
    margin = snapshot_directory.FREE_SPACE_MARGIN_BYTES

    def nearly_full(path):
        # a small filesystem whose free space leaves room for one snapshot beyond the margin
        return margin + int(size * 1.5) - sum(status.st_size for _, status in tier.files.files()), 10 * 2**30

    tier = open_tier(model, budget_bytes=10**12, free_space=nearly_full)
    for seed in (21, 22, 23):
        written(tier, model, tokens(seed, 150))
        assert tier.stats()["disk_bytes"] <= size * 1.5
    assert tier.stats()["disk_entries"] == 1


def test_a_state_larger_than_the_budget_is_not_written_and_evicts_nothing(model, open_tier, directory, tmp_path, caplog):
    size = file_bytes_of(model, open_tier, tmp_path, 50)
    tier = open_tier(model, budget_bytes=int(size * 1.5))
    written(tier, model, tokens(1, 50))
    kept = snapshot_files(directory)
    with caplog.at_level(logging.WARNING, logger="engine_patch"):
        written(tier, model, tokens(2, 200))
    assert snapshot_files(directory) == kept and tier.stats()["disk_evictions"] == 0
    assert tier.stats()["disk_writes_skipped"] == 1
    assert "does not fit the disk budget" in caplog.text


# --- writes stay off the request path -----------------------------------------


class SlowDisk:
    """A writer that waits for permission: the test decides when the disk finishes."""

    def __init__(self):
        self.started = threading.Event()
        self.release = threading.Event()

    def write(self, path, prepared):
        self.started.set()
        assert self.release.wait(timeout=60)
        write_snapshot(path, prepared)


def first_write_stuck(open_tier, model, first: list[int], **options) -> tuple[SlowDisk, DiskTier, TieredCache]:
    """A tier on a disk that finishes no write until the test releases it, `first` served and its write begun and
    stuck: (the disk, the tier, a cache over it)."""
    disk = SlowDisk()
    tier = open_tier(model, write_file=disk.write, **options)
    cache = tiered(tier)
    serve(cache, model, first)
    assert disk.started.wait(timeout=60)
    return disk, tier, cache


def test_the_next_request_does_not_wait_for_the_previous_one_s_write(model, open_tier):
    first = tokens(1, 200)
    disk, tier, cache = first_write_stuck(open_tier, model, first)
    reused, _ = serve(cache, model, first + tokens(2, 20))  # the whole next request runs meanwhile
    assert reused == 200
    assert not disk.release.is_set() and tier.stats()["disk_writes"] == 0
    disk.release.set()
    assert tier.flush(timeout=60)
    assert tier.stats()["disk_writes"] >= 1


def test_a_disk_slower_than_the_requests_drops_the_oldest_pending_write(model, open_tier, directory):
    disk, tier, cache = first_write_stuck(open_tier, model, tokens(30, 60), queue_limit=2)
    for seed in (31, 32, 33):  # three more lanes queue behind the stuck write
        serve(cache, model, tokens(seed, 60))
    assert tier.stats()["disk_writes_dropped"] == 1
    disk.release.set()
    assert tier.flush(timeout=60)
    held = {tuple(lane.tokens.tolist()) for lane in tier.lanes(model)}
    assert held == {tuple(tokens(seed, 60)) for seed in (30, 32, 33)}


def test_a_pending_write_is_superseded_by_the_next_turn_of_its_conversation(model, open_tier):
    disk, tier, cache = first_write_stuck(open_tier, model, tokens(40, 60))
    turn = tokens(41, 60)
    serve(cache, model, turn)
    serve(cache, model, turn + tokens(42, 10))
    assert tier.stats()["disk_writes_superseded"] == 1 and tier.stats()["disk_writes_dropped"] == 0
    disk.release.set()
    assert tier.flush(timeout=60)


# --- bad state on disk ------------------------------------------------------------


def cut(path):
    path.write_bytes(path.read_bytes()[:-100])


def flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def garble_header(path):
    data = path.read_bytes()
    path.write_bytes(data[:8] + b"#" * 16 + data[24:])


def append_bytes(path):
    path.write_bytes(path.read_bytes() + b"\0" * 8)


DAMAGE = [cut, flip_last_byte, garble_header, append_bytes]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_a_damaged_snapshot_is_deleted_counted_and_the_request_runs_without_it(model, open_tier, directory, damage, caplog):
    broken, neighbour = tokens(1, 150), tokens(2, 150)
    tier = open_tier(model)
    written(tier, model, broken)
    (broken_path,) = snapshot_files(directory)
    written(tier, model, neighbour)
    damage(broken_path)
    restarted = open_tier(model)
    with caplog.at_level(logging.WARNING, logger="engine_patch"):
        reused, answer = serve(tiered(restarted), model, broken + [3])
    assert reused == 0
    np.testing.assert_allclose(answer, cold_logits(model, broken + [3]), atol=1e-4)
    assert restarted.stats()["disk_errors"] == 1 and "disk cache" in caplog.text
    assert not broken_path.exists()
    reused, _ = serve(tiered(restarted), model, neighbour + [3])  # the neighbour is intact
    assert reused == 150


def test_a_write_that_crashed_midway_leaves_a_temporary_file_the_next_start_removes(model, open_tier, directory):
    tier = open_tier(model)
    written(tier, model, tokens(1, 100))
    (path,) = snapshot_files(directory)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    host = snapshot_directory.HOST
    crashed = path.parent / f".tmp-{host}-{dead_pid}-{'0' * 32}.kv"
    crashed.write_bytes(path.read_bytes()[:500])
    in_flight = path.parent / f".tmp-{host}-{os.getppid()}-{'1' * 32}.kv"  # a live process's write
    in_flight.write_bytes(b"partial")
    restarted = open_tier(model)
    serve(tiered(restarted), model, tokens(1, 100) + [4])
    assert not crashed.exists() and in_flight.exists()
    assert restarted.stats()["disk_temp_files_removed"] == 1 and restarted.stats()["disk_errors"] == 0
    assert restarted.stats()["disk_hits"] == 1


def test_a_full_disk_loses_the_write_not_the_request(model, open_tier, directory):
    def disk_full(path, prepared):
        with open(path, "wb") as file:
            file.write(prepared.header)
        raise OSError(errno.ENOSPC, "No space left on device")

    tier = open_tier(model, write_file=disk_full)
    cache = written(tier, model, tokens(1, 100))
    reused, _ = serve(cache, model, tokens(1, 100) + [5])
    assert reused == 100  # RAM still serves it
    assert tier.flush(timeout=60)
    assert tier.stats()["disk_errors"] == 2 and "No space left" in tier.stats()["disk_last_error"]
    assert snapshot_files(directory) == [] and list(directory.rglob(".tmp-*")) == []  # no temporary file left behind


def test_a_disk_that_fills_up_during_a_write_loses_that_write_for_real_and_recovers_when_space_returns(model, open_tier, tmp_path):
    with tmpfs(tmp_path / "small-disk", "4m") as mount:
        filled = []

        def another_program_fills_the_disk_first(path, prepared):
            if not filled:
                filled.append(fill(mount, leave_bytes=16 * 1024))
            write_snapshot(path, prepared)  # the real write, onto a full filesystem

        # The budget check is told there is room (the disk filled after it); the write itself is the kernel's.
        tier = open_tier(model, directory=mount / "kv", free_space=lambda path: (2**40, 2**41),
                         write_file=another_program_fills_the_disk_first)
        conversation = tokens(1, 600)
        cache = written(tier, model, conversation)
        stats = tier.stats()
        assert stats["disk_errors"] == 1 and "No space left on device" in stats["disk_last_error"] and stats["disk_writes"] == 0
        assert [path.name for path in (mount / "kv").rglob("*.kv*")] == []  # its temporary files removed, even on a full disk
        reused, answer = serve(cache, model, conversation + [5])
        assert reused == 600  # RAM still serves it
        np.testing.assert_allclose(answer, cold_logits(model, conversation + [5]), atol=1e-4)
        filled[0].unlink()  # the other program's file is deleted: the next write lands
        assert tier.flush(timeout=60)
        serve(cache, model, tokens(2, 600))
        assert tier.flush(timeout=60) and tier.stats()["disk_writes"] >= 1
        restarted_reuse, _ = serve(tiered(open_tier(model, directory=mount / "kv")), model, tokens(2, 600) + [5])
        assert restarted_reuse == 600


@contextlib.contextmanager
def read_only(*folders):
    """Make folders read-only for this process, root included (chattr +i)."""
    if os.geteuid() != 0:
        for folder in folders:
            folder.chmod(0o500)
        undo = [lambda folder=folder: folder.chmod(0o700) for folder in folders]
    else:
        if any(subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode for folder in folders):
            pytest.skip("cannot make a folder read-only for root here (chattr +i failed)")
        undo = [lambda folder=folder: subprocess.run(["chattr", "-i", str(folder)], check=True) for folder in folders]
    try:
        yield
    finally:
        for step in undo:
            step()


def test_a_read_only_directory_still_serves_its_snapshots_and_counts_the_failed_writes(model, open_tier, directory):
    conversation = tokens(1, 100)
    written(open_tier(model), model, conversation)
    (path,) = snapshot_files(directory)
    with read_only(directory, path.parent):
        tier = open_tier(model)
        cache = tiered(tier)
        reused, _ = serve(cache, model, conversation + tokens(2, 10))
        assert tier.flush(timeout=60)
        assert reused == 100 and tier.stats()["disk_hits"] == 1
        assert tier.stats()["disk_errors"] >= 1 and tier.stats()["disk_writes"] == 0
    assert snapshot_files(directory) == [path]


def test_a_directory_that_cannot_be_created_leaves_the_ram_cache_working(model, open_tier, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    tier = open_tier(model, directory=blocker / "kv")
    cache = written(tier, model, tokens(1, 50))
    reused, _ = serve(cache, model, tokens(1, 50) + [6])
    assert reused == 50 and tier.stats()["disk_errors"] >= 1


# --- two servers on one directory ---------------------------------------------------


def test_two_servers_on_one_directory_share_snapshots_and_one_budget(model, open_tier, directory, tmp_path):
    size = file_bytes_of(model, open_tier, tmp_path, 120)
    first, second = open_tier(model, budget_bytes=int(size * 2.5)), open_tier(model, budget_bytes=int(size * 2.5))
    first_cache, second_cache = tiered(first), tiered(second)
    for seed in (51, 52, 53, 54):  # both write at once, alternately
        serve(first_cache, model, tokens(seed, 120))
        serve(second_cache, model, tokens(seed + 10, 120))
    assert first.flush(timeout=60) and second.flush(timeout=60)
    assert first.stats()["disk_bytes"] <= int(size * 2.5)
    key = first.identity_for(model).key
    for kind, suffix in (("lane", "*.kv"), ("block", "*.kvblock")):  # every file the two left is whole
        for path in (path for path in directory.rglob(suffix) if not path.name.startswith(".")):
            load_arrays(path, read_header(path, key, kind))
    newest = tokens(64, 120)  # the second server's last state: the first one finds it
    reused, _ = serve(tiered(first), model, newest + [1])
    assert reused == 120 and first.stats()["disk_errors"] == 0 and second.stats()["disk_errors"] == 0


def test_a_snapshot_evicted_by_another_server_between_lookup_and_load_is_a_miss(model, open_tier, directory):
    conversation = tokens(1, 100)
    written(open_tier(model), model, conversation)
    reader, evicter = open_tier(model), open_tier(model)
    match = reader.longest_restorable_prefix(model, np.asarray(conversation + [1]), positional=False)
    assert match is not None
    evicter.clear()
    assert reader.load(match) is None
    reused, _ = serve(tiered(reader), model, conversation + [1])
    assert reused == 0 and reader.stats()["disk_errors"] == 0


def test_clearing_deletes_this_model_s_snapshots_and_a_write_in_flight(model, other_model, open_tier, directory):
    written(open_tier(other_model, OTHER_SEED_MODEL), other_model, tokens(1, 60))
    disk = SlowDisk()
    tier = open_tier(model, write_file=disk.write)
    written_before = snapshot_files(directory)
    cache = tiered(tier)
    serve(cache, model, tokens(2, 60))
    assert disk.started.wait(timeout=60)
    with ThreadPoolExecutor(1) as pool:
        clearing = pool.submit(cache.clear, ("disk",))  # waits for the directory lock the write holds
        disk.release.set()
        assert clearing.result(timeout=60)["disk_entries_dropped"] in (0, 1)  # the write discarded, or landed and deleted
    assert tier.flush(timeout=60)
    assert snapshot_files(directory) == written_before  # the other model's snapshot stays; nothing of the cleared write
    assert cache.ram.stats()["entries"] == 1  # RAM was not asked to clear


def test_clearing_waits_for_the_directory_lock_another_servers_write_holds(model, open_tier, directory):
    tier = open_tier(model)
    written(tier, model, tokens(1, 100))
    other_server = snapshot_directory.SnapshotDirectory(directory, 10**9)
    with ThreadPoolExecutor(1) as pool:
        with other_server.lock():  # as a write holds it, from its budget check to its last rename
            clearing = pool.submit(tier.clear)
            done, _ = wait([clearing], timeout=2)
            assert not done and snapshot_files(directory), "the clear deleted files under another server's write"
        assert clearing.result(timeout=60) == 1
    assert snapshot_files(directory) == []


# --- blocks held once on disk ---------------------------------------------------------


BYTES_PER_TOKEN = 256  # the test model: 2 layers x 1 KV head x 32 x (keys, values) x fp16


def block_files(directory):
    return sorted(path for path in directory.rglob("*.kvblock") if not path.name.startswith("."))


def test_a_many_turn_conversation_writes_each_token_s_kv_once(model, open_tier):
    """A turn writes only its new blocks: the KV written is the KV computed (with each block's token ids),
    whatever the conversation's length; a manifest adds a key per block of its lane."""
    tier = open_tier(model)
    cache = tiered(tier)
    rng = np.random.default_rng(5)
    prompt, computed, manifest_bytes = tokens(1, 900), 0, 0
    for turn in range(30):
        reply = tokens(100 + turn, int(rng.integers(20, 120)))
        fetched = cache.fetch(model, prompt)
        prefill(model, fetched.prompt_cache, prompt[fetched.reused :] + reply[:-1])
        cache.store(prompt + reply, fetched.prompt_cache, len(prompt), model=model)
        computed += len(prompt) - fetched.reused + len(reply) - 1
        lane = cache.ram.newest_entry()
        manifest_bytes += 64 * len(lane.blocks) + 2048  # a key per block, the rest
        assert tier.flush(timeout=60)
        # The next prompt renders the reply again (its last token otherwise) and adds a tool result.
        prompt = prompt + reply[:-1] + tokens(200 + turn, 1) + tokens(300 + turn, int(rng.integers(40, 400)))
    stats = tier.stats()
    assert stats["disk_writes"] == 30 and stats["disk_errors"] == 0
    assert stats["disk_block_bytes_written"] <= 1.05 * computed * BYTES_PER_TOKEN
    assert stats["disk_bytes_written"] - stats["disk_block_bytes_written"] <= manifest_bytes
    assert stats["disk_model_entries"] == 1


def test_lanes_sharing_a_head_write_it_once_and_count_it_reused(model, open_tier, directory):
    tier = open_tier(model)
    cache = tiered(tier)
    for prompt in lanes_on_one_head(1024, lanes=3):
        serve(cache, model, prompt)
        assert tier.flush(timeout=60)
    stats = tier.stats()
    assert stats["disk_model_entries"] == 3 and stats["disk_blocks_reused"] == 2 * 4  # the head's four blocks
    assert stats["disk_block_bytes_written"] <= (1024 + 3 * 100) * BYTES_PER_TOKEN * 1.05  # with their token ids
    assert stats["disk_blocks"] == 4 + 3 and stats["disk_block_tokens"] == 1024 + 3 * 100


def delete(path):
    path.unlink()


BLOCK_DAMAGE = [cut, flip_last_byte, garble_header, append_bytes, delete]


@pytest.mark.parametrize("damage", BLOCK_DAMAGE, ids=[d.__name__ for d in BLOCK_DAMAGE])
def test_a_damaged_or_missing_block_ends_the_lane_before_it_and_the_answer_is_right(model, open_tier, directory, damage, caplog):
    conversation = tokens(1, 700)  # blocks [0, 256), [256, 512), [512, 700)
    tier = open_tier(model)
    written(tier, model, conversation)
    (lane,) = snapshot_files(directory)
    second = next(path for path in block_files(directory) if path.stem == lane_blocks(tier, model, lane)[1])
    damage(second)
    restarted = open_tier(model)
    with caplog.at_level(logging.INFO, logger="engine_patch"):
        reused, answer = serve(tiered(restarted), model, conversation + [3])
    assert reused == 256  # the prefix before the bad block
    np.testing.assert_allclose(answer, cold_logits(model, conversation + [3]), atol=1e-4)
    stats = restarted.stats()
    if damage is delete:
        assert stats["disk_blocks_missing"] == 1 and stats["disk_errors"] == 0 and "is gone" in caplog.text
    else:
        assert stats["disk_errors"] == 1 and not second.exists() and "restore the prefix before it" in caplog.text


def lane_blocks(tier, model, manifest) -> list[str]:
    header = read_header(manifest, tier.identity_for(model).key, "lane")
    return [piece.key for piece in lane_record(manifest.stem, header.metadata, header.file_bytes).blocks]


class CrashBeforeTheManifest:
    """A write that dies after its blocks are renamed into place and before its manifest is (kill -9 there)."""

    def write(self, path, prepared):
        if path.name.endswith(".kv"):
            raise OSError(errno.EIO, "killed before the manifest")
        write_snapshot(path, prepared)


def test_blocks_whose_manifest_never_landed_are_never_served_and_are_collected(model, open_tier, directory):
    lost = tokens(1, 600)
    written(open_tier(model, write_file=CrashBeforeTheManifest().write), model, lost)
    orphans = block_files(directory)
    assert len(orphans) == 3 and snapshot_files(directory) == []
    restarted = open_tier(model)
    starts = {path: int(read_header(path, restarted.identity_for(model).key, "block").metadata["start"]) for path in orphans}
    reused, _ = serve(tiered(restarted), model, lost + [1])
    assert reused == 0
    assert restarted.flush(timeout=60)
    # The restarted server's write finds the first two blocks by key (writes only its own last one, [512, 601)),
    # and the orphan [512, 600), which no lane names, is collected.
    assert restarted.stats()["disk_blocks_written"] == 1 and restarted.stats()["disk_blocks_reused"] == 2
    assert set(orphans) & set(block_files(directory)) == {path for path, start in starts.items() if start < 512}


def test_two_servers_writing_the_same_blocks_at_once_write_each_once(model, open_tier, directory):
    first, second = open_tier(model), open_tier(model)
    conversation = tokens(1, 800)
    caches = [tiered(first), tiered(second)]
    with ThreadPoolExecutor(max_workers=2) as pool:  # both finish the same request, then write at once
        list(pool.map(lambda cache: serve(cache, model, conversation), caches))
    assert first.flush(timeout=60) and second.flush(timeout=60)
    stats = [first.stats(), second.stats()]
    assert sum(s["disk_blocks_written"] for s in stats) == 4 and len(block_files(directory)) == 4
    assert sum(s["disk_writes"] for s in stats) == 1 and sum(s["disk_writes_skipped"] for s in stats) == 1
    assert all(s["disk_errors"] == 0 for s in stats)
    key = first.identity_for(model).key
    for path in block_files(directory):
        load_arrays(path, read_header(path, key, "block"))


def test_two_servers_on_one_directory_never_hold_more_than_the_budget_at_any_write(model, open_tier, directory, tmp_path):
    size = file_bytes_of(model, open_tier, tmp_path, 300)
    budget = 2 * size
    high_water = []

    def write_and_measure(path, prepared):
        write_snapshot(path, prepared)
        high_water.append(sum(file.stat().st_size for file in directory.rglob("*") if file.is_file() and ".kv" in file.name))

    servers = [open_tier(model, budget_bytes=budget, write_file=write_and_measure) for _ in range(2)]
    caches = [tiered(server) for server in servers]
    head = tokens(1, 256)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for seed in range(6):
            list(pool.map(lambda cache, own: serve(cache, model, head + tokens(own, 44)), caches, (100 + seed, 200 + seed)))
    assert all(server.flush(timeout=60) for server in servers)
    assert high_water and max(high_water) <= budget
    assert sum(server.stats()["disk_evictions"] for server in servers) >= 1


def test_a_lane_whose_write_was_dropped_is_written_whole_by_its_next_turn(model, open_tier, directory):
    disk, tier, cache = first_write_stuck(open_tier, model, tokens(30, 60), queue_limit=1)
    dropped = tokens(31, 400)
    serve(cache, model, dropped)
    serve(cache, model, tokens(32, 60))  # the dropped lane's write goes
    assert tier.stats()["disk_writes_dropped"] == 1
    serve(cache, model, dropped + tokens(33, 50))  # its next turn
    disk.release.set()
    assert tier.flush(timeout=60)
    reused, _ = serve(tiered(open_tier(model)), model, dropped + tokens(33, 50) + [1])
    assert reused == 450


def test_a_lane_moved_to_another_server_finds_every_block_the_first_one_wrote(model, open_tier):
    """Two replicas on one directory: the second one, already running, takes over a lane the first one served."""
    first, second = open_tier(model), open_tier(model)
    conversation = tokens(1, 300)
    first_cache = tiered(first)
    for turn in range(3):
        conversation = conversation + tokens(10 + turn, 250)
        serve(first_cache, model, conversation)
    assert first.flush(timeout=60)
    blocks_written = first.stats()["disk_blocks"]
    moved = conversation + tokens(20, 40)
    reused, answer = serve(tiered(second), model, moved)
    assert reused == len(conversation)
    np.testing.assert_allclose(answer, cold_logits(model, moved), atol=1e-4)
    assert second.stats()["disk_blocks_loaded"] == blocks_written == 7  # 1,050 tokens, three turns of cuts


def test_a_load_reads_only_the_blocks_ram_does_not_hold(model, open_tier):
    head = tokens(1, 512)
    written(open_tier(model), model, head + tokens(2, 300))
    tier = open_tier(model)
    cache = tiered(tier)
    serve(cache, model, head + tokens(3, 20))  # RAM holds the head (loaded from disk: two blocks and part of a third)
    loaded_before = tier.stats()["disk_blocks_loaded"]
    cache.ram.clear()
    serve(cache, model, head + tokens(3, 20) + [5])
    reused, _ = serve(cache, model, head + tokens(2, 300) + [7])
    assert reused == 812
    assert tier.stats()["disk_loads"] >= 2 and tier.stats()["disk_blocks_loaded"] - loaded_before <= 4


def test_files_of_the_whole_lane_formats_are_removed_at_start_with_a_log_line(model, open_tier, directory, caplog):
    written(open_tier(model), model, tokens(1, 50))
    old_folder = directory / ("e" * 32)
    old_folder.mkdir()
    for index in range(3):
        header = json.dumps({"tokens": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]},
                             "__metadata__": {"format": "stable-prefix-kv", "format_version": "2"}}).encode()
        header += b" " * (-len(header) % 8)
        (old_folder / f"{index:032x}.kv").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    (old_folder / "notes.kv").write_text("not one of ours")
    with caplog.at_level(logging.WARNING, logger="engine_patch"):
        tier = open_tier(model)
    assert sorted(path.name for path in old_folder.iterdir()) == ["notes.kv"]
    assert tier.stats()["disk_legacy_files_removed"] == 3 and "removed 3 snapshot files of older formats" in caplog.text
    reused, _ = serve(tiered(tier), model, tokens(1, 50) + [2])
    assert reused == 50


def test_the_stats_count_blocks_tokens_and_warm_lanes_per_tier(model, open_tier):
    tier = open_tier(model)
    cache = tiered(tier)
    for prompt in lanes_on_one_head(300, lanes=2):
        serve(cache, model, prompt)
    assert tier.flush(timeout=60)
    stats = cache.stats()
    assert stats["entries"] == 2 and stats["disk_model_entries"] == 2  # warm lanes, per tier
    # The head's first block is shared; the second lane copies [256, 300) into its own [256, 400).
    assert stats["blocks"] == stats["disk_blocks"] == 3
    assert stats["block_tokens"] == stats["disk_block_tokens"] == 256 + 144 + 144
    assert stats["bytes"] == stats["block_tokens"] * BYTES_PER_TOKEN
    assert stats["disk_bytes_written"] == stats["disk_block_bytes_written"] + stats["disk_state_bytes_written"] + (
        stats["disk_bytes"] - sum(path.stat().st_size for path in block_files(tier.directory)))
