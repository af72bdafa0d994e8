"""Faults of the disk tier made for real on disk, through real patched servers with the tiny test model.

The patched servers run the default engine mode. Every answer is compared, text and token count, with the
same engine as vllm-mlx ships it with no prefix cache (nothing to restore from), and every fault must cost
reuse only: a counted, logged reason, never a request.
- a small filesystem whose free-space margin leaves nothing to write: the stats say so (the effective budget
  and why), and no snapshot is written;
- a disk out of room for a new file (a tmpfs out of inodes: the kernel's ENOSPC) while a snapshot is written,
  and writes resuming once room returns;
- snapshot files truncated or with a flipped bit, found by the next server after a SIGKILL;
- a read-only cache directory;
- two servers sharing one directory at once, and a lane moved to the second when the first is killed;
- the model folder changed under the same name: a snapshot of the old weights is never used.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.engines import SHIPPED_DEFAULT_MODE, engine, kill_9
from tests.support.llm_client import cache_stats, send
from tests.support.models import OTHER_SEED_MODEL, TEST_MODEL
from tests.support.small_filesystem import tmpfs, use_up_inodes

pytestmark = pytest.mark.server

SYSTEM = "You are a careful coding agent. Answer briefly and cite the file you read."


def conversation(lane: str, turns: int) -> list[dict]:
    messages = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"[{lane}] step {turn}: what does module {lane}_{turn}.py export?"})
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": f"It exports {lane}_{turn}_main and a helper."})
    return messages


def body(messages: list[dict], stream: bool = False) -> dict:
    return {"model": "tiny", "max_tokens": 10, "temperature": 0, "stream": stream,
            "system": [{"type": "text", "text": SYSTEM}], "messages": messages}


def answer_of(url: str, messages: list[dict], stream: bool = False):
    return send(url, "/v1/messages", body(messages, stream))


def same_answer(patched, shipped) -> bool:
    """Text and token count (compare like with like: vllm-mlx counts a streamed answer's tokens differently)."""
    return patched.text == shipped.text and patched.usage["output_tokens"] == shipped.usage["output_tokens"]


def wait_until_written(url: str, writes: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = cache_stats(url)
        if stats["disk_writes"] + stats["disk_errors"] + stats["disk_writes_skipped"] >= writes and stats["disk_writes_pending"] == 0:
            return stats
        assert time.monotonic() < deadline, f"writes not finished after {timeout:.0f}s: {stats}"
        time.sleep(0.2)


def snapshot_files(directory, kind: str = "kv"):
    """The lanes' manifests (or, by suffix, their blocks)."""
    return sorted(path for path in directory.rglob(f"*.{kind}") if not path.name.startswith("."))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    with engine(tmp_path_factory.mktemp("shipped"), "shipped", *SHIPPED_DEFAULT_MODE) as server:
        yield server


@pytest.fixture(scope="module")
def shipped_other_weights(tmp_path_factory):
    with engine(tmp_path_factory.mktemp("shipped-seed1"), "shipped-seed1", *SHIPPED_DEFAULT_MODE, model=OTHER_SEED_MODEL) as server:
        yield server


def killed_after(directory, log_dir, lanes: list[str], model=TEST_MODEL) -> None:
    """A server answers one turn of each lane, has its snapshots on disk, and is killed with SIGKILL."""
    with engine(log_dir, "first-life", "--prefix-cache-dir", str(directory), model=model) as server:
        for lane in lanes:
            answer_of(server.url, conversation(lane, 1))
        wait_until_written(server.url, len(lanes))
        kill_9(server)


# --- a full disk ---------------------------------------------------------------------


def test_on_a_filesystem_the_free_space_margin_leaves_nothing_of_the_stats_report_the_effective_budget_and_why(tmp_path, shipped):
    with tmpfs(tmp_path / "small", "64m") as mount:
        with engine(tmp_path, "small-disk", "--prefix-cache-dir", str(mount / "kv"), "--prefix-cache-disk-bytes", "20GiB") as server:
            answered = answer_of(server.url, conversation("main", 1))
            stats = wait_until_written(server.url, 1)
            log = server.log_text()
        assert same_answer(answered, answer_of(shipped.url, conversation("main", 1)))
        assert stats["disk_budget_bytes"] == 20 * 2**30  # what was asked for
        assert stats["disk_effective_budget_bytes"] == 0  # what a write may use: 64 MiB minus a 1 GiB margin
        assert stats["disk_budget_limited_by"].startswith("the free space: ") and "kept free" in stats["disk_budget_limited_by"]
        assert stats["disk_writes"] == 0 and stats["disk_writes_skipped"] == 1 and snapshot_files(mount) == []
        assert "does not fit the disk budget (0.0 MiB now, set by the free space" in log


def test_a_disk_with_no_room_for_a_new_file_loses_the_write_not_the_request_and_recovers(tmp_path, shipped):
    # 2 GiB of tmpfs passes the free-space margin; its inodes run out (the kernel's ENOSPC on a new file).
    with tmpfs(tmp_path / "no-inodes", "2g", inodes=64) as mount:
        with engine(tmp_path, "full-disk", "--prefix-cache-dir", str(mount / "kv")) as server:
            answer_of(server.url, conversation("first", 1))
            assert wait_until_written(server.url, 1)["disk_writes"] == 1
            placeholders = use_up_inodes(mount)
            on_a_full_disk = answer_of(server.url, conversation("second", 1), stream=True)
            full = wait_until_written(server.url, 2)
            for path in placeholders:
                path.unlink()
            answer_of(server.url, conversation("third", 1))
            recovered = wait_until_written(server.url, 3)
        assert same_answer(on_a_full_disk, answer_of(shipped.url, conversation("second", 1), stream=True))
        assert full["disk_errors"] == 1 and "No space left on device" in full["disk_last_error"]
        assert recovered["disk_writes"] == 2 and recovered["disk_errors"] == 1
        assert not [path for path in mount.rglob(".tmp-*")]


# --- damaged files --------------------------------------------------------------------


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_bit_in_the_middle(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["kv", "kvblock"], ids=["manifest", "block"])
@pytest.mark.parametrize("damage", [truncate, flip_a_bit_in_the_middle], ids=["truncated", "bit-flipped"])
def test_a_damaged_file_found_after_a_kill_9_is_refused_counted_deleted_and_answered_as_uncached(tmp_path, shipped, damage, kind):
    directory = tmp_path / "kv"
    killed_after(directory, tmp_path, ["main"])
    # The lane's manifest, or its prompt's block (its reply sits in a smaller block of its own).
    path = max(snapshot_files(directory, kind), key=lambda file: file.stat().st_size)
    damage(path)
    with engine(tmp_path, "after-damage", "--prefix-cache-dir", str(directory)) as server:
        restarted = answer_of(server.url, conversation("main", 2), stream=True)
        stats = cache_stats(server.url)
        log = server.log_text()
    assert same_answer(restarted, answer_of(shipped.url, conversation("main", 2), stream=True))
    assert restarted.usage["cache_read_input_tokens"] == 0
    assert stats["disk_errors"] == 1 and stats["disk_hits"] == 0 and not path.exists()
    assert "disk cache" in log and "WARNING" in log


# --- a read-only directory ---------------------------------------------------------------


def test_a_read_only_cache_directory_still_serves_its_snapshots_and_answers_as_uncached(tmp_path, shipped):
    directory = tmp_path / "kv"
    killed_after(directory, tmp_path, ["main"])
    (path,) = snapshot_files(directory)
    folders = [directory, path.parent]
    if any(subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode for folder in folders):
        pytest.skip("cannot make a folder read-only for root here (chattr +i failed)")
    try:
        with engine(tmp_path, "read-only", "--prefix-cache-dir", str(directory)) as server:
            restored = answer_of(server.url, conversation("main", 2))
            stats = wait_until_written(server.url, 1)
    finally:
        for folder in folders:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert same_answer(restored, answer_of(shipped.url, conversation("main", 2)))
    assert stats["disk_hits"] == 1 and restored.usage["cache_read_input_tokens"] > 0
    assert stats["disk_errors"] >= 1 and stats["disk_writes"] == 0
    assert snapshot_files(directory) == [path]


# --- two servers on one directory --------------------------------------------------------


def test_two_servers_sharing_one_directory_at_once_keep_one_budget_whole_files_and_exact_answers(tmp_path, shipped):
    directory = tmp_path / "kv"
    budget = 128 * 1024  # two or three snapshots of this model: the two servers must evict for each other
    with engine(tmp_path, "first", "--prefix-cache-dir", str(directory), "--prefix-cache-disk-bytes", str(budget)) as first, \
         engine(tmp_path, "second", "--prefix-cache-dir", str(directory), "--prefix-cache-disk-bytes", str(budget)) as second:
        requests_sent = [(server, lane, turns) for turns in (1, 2) for lane in ("a", "b", "c")
                         for server in (first, second)]
        with ThreadPoolExecutor(max_workers=2) as pool:  # both servers write at the same time
            answers = list(pool.map(lambda job: answer_of(job[0].url, conversation(f"{job[0].name}-{job[1]}", job[2])), requests_sent))
        stats = [wait_until_written(server.url, 6) for server in (first, second)]
        # a lane the first server answered, continued on the second: from the first one's file or cold, never wrong
        crossed = answer_of(second.url, conversation("first-a", 3))
    for (server, lane, turns), answered in zip(requests_sent, answers):
        assert same_answer(answered, answer_of(shipped.url, conversation(f"{server.name}-{lane}", turns))), (server.name, lane, turns)
    assert same_answer(crossed, answer_of(shipped.url, conversation("first-a", 3)))
    assert all(s["disk_errors"] == 0 for s in stats)
    assert max(s["disk_bytes"] for s in stats) <= budget
    assert sum(s["disk_evictions"] for s in stats) >= 1


def test_a_lane_moved_after_its_replica_is_killed_finds_every_block_the_dead_one_wrote(tmp_path, shipped):
    """Two replicas on one directory: the first serves three turns and is killed with SIGKILL; the second,
    running all along, takes the lane's next turn from the blocks the first one wrote."""
    directory = tmp_path / "kv"
    with engine(tmp_path, "replica-a", "--prefix-cache-dir", str(directory)) as first, \
         engine(tmp_path, "replica-b", "--prefix-cache-dir", str(directory)) as second:
        turns = [answer_of(first.url, conversation("moved", count)) for count in (1, 2, 3)]
        on_disk = wait_until_written(first.url, 3)
        kill_9(first)
        moved = answer_of(second.url, conversation("moved", 4))
        stats = cache_stats(second.url)
    assert same_answer(moved, answer_of(shipped.url, conversation("moved", 4)))
    last_prompt = turns[-1].usage["input_tokens"] + turns[-1].usage["cache_read_input_tokens"]
    assert moved.usage["cache_read_input_tokens"] >= last_prompt - 2
    assert stats["disk_hits"] == 1 and stats["disk_tokens_loaded"] == moved.usage["cache_read_input_tokens"]
    assert 0 < stats["disk_blocks_loaded"] <= on_disk["disk_blocks"]
    assert stats["disk_errors"] == 0 and stats["disk_blocks_missing"] == 0


# --- the model changed under the same name ---------------------------------------------


def test_a_model_folder_whose_weights_changed_under_the_same_name_never_gets_the_old_weights_snapshots(
        tmp_path, shipped_other_weights):
    model_folder = tmp_path / "models" / "tiny"
    shutil.copytree(TEST_MODEL, model_folder)
    directory = tmp_path / "kv"
    killed_after(directory, tmp_path, ["main"], model=model_folder)
    old_files = snapshot_files(directory)
    shutil.copy2(OTHER_SEED_MODEL / "model.safetensors", model_folder / "model.safetensors")  # same path, same name
    with engine(tmp_path, "new-weights", "--prefix-cache-dir", str(directory), model=model_folder) as server:
        answered = answer_of(server.url, conversation("main", 2))
        stats = cache_stats(server.url)
    assert same_answer(answered, answer_of(shipped_other_weights.url, conversation("main", 2)))
    assert answered.usage["cache_read_input_tokens"] == 0
    assert stats["disk_loads"] == 0 and stats["disk_hits"] == 0 and stats["disk_errors"] == 0
    assert all(path.exists() for path in old_files)  # another identity's files: left to the shared budget
