"""The disk tier through real patched servers with the tiny model on 127.0.0.1.

One server answers the first turn of a conversation and is killed with
SIGKILL once its snapshot is on disk; servers started afterwards on the same
directory answer the next turn. Greedy answers are compared token for token
(text and count) with vllm-mlx as shipped, which has no cache to restore.
The same restart with the Qwen3.5-shaped hybrid, whose files hold checkpoints
of its recurrent layers, and both models on the continuous-batching engine,
close the module.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from stable_prefix.addons.capture import RECORD_FORMAT
from tests.support.llm_client import cache_stats, send
from tests.support.models import OTHER_SEED_MODEL, REPO_ROOT, TEST_MODEL, require_model
from tests.support.processes import VENV_BIN, free_port, http_ok, running

pytestmark = pytest.mark.server

SYSTEM = "You are the main coding agent. Work step by step and call tools when you need facts."
TOOLS = [{"name": "read_file", "description": "Read a file.", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
FIRST_TURN = [{"role": "user", "content": "What does src/app.py do? Read it first."}]
NEXT_TURN = FIRST_TURN + [
    {"role": "assistant", "content": [
        {"type": "text", "text": "Let me read it."},
        {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "src/app.py"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "def handler(request):\n    return service(request)\n"}]},
]
NEW_CONVERSATION = [{"role": "user", "content": "Start over: list the tests that cover the handler."}]
# Gated DeltaNet + attention: restorable only at its checkpoints (ram_tier.py).
HYBRID_MODEL = REPO_ROOT / "build" / "tiny-qwen3_5"


def body(messages: list[dict], stream: bool = False, max_tokens: int = 12) -> dict:
    return {"model": "tiny", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "system": [{"type": "text", "text": SYSTEM}], "tools": TOOLS, "messages": copy.deepcopy(messages)}


def engine(log_dir, name: str, *flags: str, model=TEST_MODEL, env: dict[str, str] | None = None):
    port = free_port()
    command = [sys.executable, "-m", "stable_prefix.engine_patch", "serve", str(require_model(model)), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", "tiny", *flags]
    return running(name, command, port=port, log_dir=log_dir, env={"ENGINE_PATCH_NO_DISK_CACHE": "0", **(env or {})},
                   ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models"))


def wait_for_disk_writes(url: str, writes: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = cache_stats(url)
        if stats["disk_writes"] >= writes and stats["disk_writes_pending"] == 0:
            return stats
        assert time.monotonic() < deadline, f"snapshots not on disk after {timeout:.0f}s: {stats}"
        time.sleep(0.2)


def kill_9(server) -> None:
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


def prompt_tokens(usage: dict) -> int:
    return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)


def killed_after_one_turn(tmp_path_factory, model=TEST_MODEL, *flags: str):
    """A directory holding what a server left when it was killed with SIGKILL after one turn."""
    directory = tmp_path_factory.mktemp("kv")
    with engine(tmp_path_factory.mktemp("first-life"), "first-life", "--prefix-cache-dir", str(directory), *flags, model=model) as server:
        send(server.url, "/v1/messages", body(FIRST_TURN))
        wait_for_disk_writes(server.url, 1)
        kill_9(server)
    return directory


def next_turn_then_new_conversation(server):
    """A restarted server's first requests: the next turn (from disk), then a new conversation."""
    next_turn = send(server.url, "/v1/messages", body(NEXT_TURN, stream=True))
    stats_after_next_turn = cache_stats(server.url)
    new_conversation = send(server.url, "/v1/messages", body(NEW_CONVERSATION))
    return next_turn, stats_after_next_turn, new_conversation


@pytest.fixture(scope="module")
def snapshot_dir(tmp_path_factory):
    return killed_after_one_turn(tmp_path_factory)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    with engine(tmp_path_factory.mktemp("shipped"), "shipped", "--no-prefix-cache") as server:
        yield server


@pytest.fixture(scope="module")
def restarted(tmp_path_factory, snapshot_dir):
    with engine(tmp_path_factory.mktemp("restarted"), "restarted", "--prefix-cache-dir", str(snapshot_dir),
                "--prefix-cache-disk-bytes", "64MiB") as server:
        yield server


@pytest.fixture(scope="module")
def restored_answers(restarted):
    return next_turn_then_new_conversation(restarted)


def test_after_a_kill_9_and_a_restart_the_next_turn_is_restored_from_disk_and_answers_as_cold(restored_answers, shipped):
    restored, stats, _ = restored_answers
    cold = send(shipped.url, "/v1/messages", body(NEXT_TURN, stream=True))
    assert restored.text == cold.text and restored.usage["output_tokens"] == cold.usage["output_tokens"]
    assert stats["disk_hits"] == 1 and stats["disk_errors"] == 0
    assert restored.usage["cache_read_input_tokens"] > prompt_tokens(restored.usage) // 2


def test_a_new_conversation_after_a_restart_reuses_the_system_and_tools_head(restored_answers, shipped):
    _, _, restored = restored_answers
    cold = send(shipped.url, "/v1/messages", body(NEW_CONVERSATION))
    assert restored.text == cold.text and restored.usage["output_tokens"] == cold.usage["output_tokens"]
    assert restored.usage["cache_read_input_tokens"] > 0


def test_stats_report_the_disk_tier(restored_answers, restarted, snapshot_dir):
    stats = cache_stats(restarted.url)
    for name in ("disk_hits", "disk_bytes", "disk_entries", "disk_writes", "disk_errors"):
        assert isinstance(stats[name], int), name
    assert isinstance(stats["disk_load_seconds"], float) and stats["disk_load_seconds"] > 0
    assert stats["disk_enabled"] is True and stats["disk_dir"] == str(snapshot_dir)
    assert stats["disk_budget_bytes"] == 64 * 2**20
    assert 0 < stats["disk_bytes"] <= stats["disk_budget_bytes"]


def test_another_model_on_the_same_directory_never_loads_the_first_one_s_snapshots(tmp_path, snapshot_dir):
    first_model_files = sorted(snapshot_dir.rglob("*.kv"))
    # the directory given by the environment variable this time
    with engine(tmp_path, "other-model", model=OTHER_SEED_MODEL, env={"ENGINE_PATCH_PREFIX_CACHE_DIR": str(snapshot_dir)}) as server:
        answer = send(server.url, "/v1/messages", body(NEXT_TURN))
        stats = wait_for_disk_writes(server.url, 1)
    assert answer.usage["cache_read_input_tokens"] == 0
    assert stats["disk_loads"] == 0 and stats["disk_hits"] == 0 and stats["disk_errors"] == 0
    assert all(path.exists() for path in first_model_files)


def test_delete_clears_the_tier_it_names(restarted, snapshot_dir):
    send(restarted.url, "/v1/messages", body(NEXT_TURN))
    wait_for_disk_writes(restarted.url, 1)
    assert requests.delete(restarted.url + "/v1/cache?tier=disks", timeout=30).status_code == 400
    ram_only = requests.delete(restarted.url + "/v1/cache?tier=ram", timeout=30).json()
    assert ram_only["entries_dropped"] >= 1 and "disk_entries_dropped" not in ram_only
    loads = cache_stats(restarted.url)["disk_loads"]
    again = send(restarted.url, "/v1/messages", body(NEXT_TURN))
    assert again.usage["cache_read_input_tokens"] > 0 and cache_stats(restarted.url)["disk_loads"] == loads + 1
    wait_for_disk_writes(restarted.url, 0)
    disk_only = requests.delete(restarted.url + "/v1/cache?tier=disk", timeout=30).json()
    assert disk_only["disk_entries_dropped"] >= 1 and "entries_dropped" not in disk_only
    stats = cache_stats(restarted.url)
    assert stats["entries"] >= 1 and stats["disk_model_entries"] == 0


# --- the warm command ---------------------------------------------------------


def capture_record(path, request: dict) -> None:
    client = {**request, "model": "claude-opus-4-1", "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1"}, *request["system"]]}
    path.write_text(json.dumps({"format": RECORD_FORMAT, "lane": "main", "request": {"api": "anthropic", "path": "/v1/messages"},
                                "client_body": client, "forwarded_body": request}))


def test_the_warm_command_prefills_captured_requests_so_the_real_ones_start_warm(tmp_path):
    capture, raw = tmp_path / "0001-main.json", tmp_path / "subagent.json"
    capture_record(capture, body(NEXT_TURN, max_tokens=64))
    raw.write_text(json.dumps(body(NEW_CONVERSATION, max_tokens=64)))
    with engine(tmp_path, "warmed", "--no-disk-cache") as server:
        result = subprocess.run([str(VENV_BIN / "stable-prefix"), "warm", str(capture), str(raw), "--url", server.url],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert result.stdout.count("warmed ") == 2
        for request in (body(NEXT_TURN), body(NEW_CONVERSATION)):
            answer = send(server.url, "/v1/messages", request)
            assert answer.usage["cache_read_input_tokens"] == prompt_tokens(answer.usage) - 1


def test_the_warm_command_names_each_file_it_could_not_send_and_fails(tmp_path):
    missing = tmp_path / "missing.json"
    not_a_request = tmp_path / "list.json"
    not_a_request.write_text("[1, 2]")
    result = subprocess.run([sys.executable, "-m", "stable_prefix.engine_patch", "warm", str(missing), str(not_a_request),
                             "--url", f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"{missing}: cannot read it" in result.stderr and f"{not_a_request}: a JSON list" in result.stderr


# --- a hybrid model: what comes back from disk is checkpoints -------------------------


def test_a_hybrid_model_killed_and_restarted_restores_the_next_turn_and_the_head_and_answers_as_cold(tmp_path_factory):
    directory = killed_after_one_turn(tmp_path_factory, HYBRID_MODEL)
    with engine(tmp_path_factory.mktemp("hybrid-restarted"), "hybrid-restarted", "--prefix-cache-dir", str(directory),
                model=HYBRID_MODEL) as server:
        next_turn, stats, new_conversation = next_turn_then_new_conversation(server)
    with engine(tmp_path_factory.mktemp("hybrid-shipped"), "hybrid-shipped", "--no-prefix-cache", model=HYBRID_MODEL) as server:
        shipped_next_turn = send(server.url, "/v1/messages", body(NEXT_TURN, stream=True))
        shipped_new_conversation = send(server.url, "/v1/messages", body(NEW_CONVERSATION))
    for restored, shipped in ((next_turn, shipped_next_turn), (new_conversation, shipped_new_conversation)):
        assert restored.text == shipped.text and restored.usage["output_tokens"] == shipped.usage["output_tokens"]
    assert stats["disk_hits"] == 1 and stats["disk_errors"] == 0 and not stats["disabled_reasons"]
    # The next turn resumes where the first turn's prompt left off (its generation prompt), the new
    # conversation at the system + tools head: both checkpoints, both from the killed server's file.
    assert next_turn.usage["cache_read_input_tokens"] > prompt_tokens(next_turn.usage) // 2
    assert 0 < new_conversation.usage["cache_read_input_tokens"] < next_turn.usage["cache_read_input_tokens"]


@pytest.mark.parametrize("model", [TEST_MODEL, HYBRID_MODEL], ids=["qwen2", "qwen3_5"])
def test_the_batched_engine_killed_and_restarted_restores_the_next_turn_and_the_head_from_disk(model, tmp_path_factory):
    directory = killed_after_one_turn(tmp_path_factory, model, "--engine", "batched")
    with engine(tmp_path_factory.mktemp("batched-restarted"), "batched-restarted", "--engine", "batched",
                "--prefix-cache-dir", str(directory), model=model) as server:
        next_turn, stats, new_conversation = next_turn_then_new_conversation(server)
    with engine(tmp_path_factory.mktemp("batched-shipped"), "batched-shipped", "--no-prefix-cache", "--continuous-batching",
                model=model, env={"HOME": str(tmp_path_factory.mktemp("batched-shipped-home"))}) as server:
        shipped_next_turn = send(server.url, "/v1/messages", body(NEXT_TURN, stream=True))
        shipped_new_conversation = send(server.url, "/v1/messages", body(NEW_CONVERSATION))
    for restored, shipped in ((next_turn, shipped_next_turn), (new_conversation, shipped_new_conversation)):
        assert restored.text == shipped.text and restored.usage["output_tokens"] == shipped.usage["output_tokens"]
    assert stats["engine"] == "batched" and stats["disk_hits"] == 1 and stats["disk_errors"] == 0
    assert next_turn.usage["cache_read_input_tokens"] > prompt_tokens(next_turn.usage) // 2
    assert new_conversation.usage["cache_read_input_tokens"] > 0
