"""The patched vllm-mlx server, for real, with the tiny model on 127.0.0.1, in both engine modes
(SimpleEngine, and the continuous-batching scheduler with `--engine batched`).

Compared against the same vllm-mlx engine as shipped (`--no-prefix-cache`): greedy
answers are identical on both endpoints, streamed and not, also with requests in
flight at once; follow-up turns prefill only their new tokens; interleaved lanes
stay warm; a small budget evicts by LRU and is never exceeded.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.engines import ENGINE_MODE_FLAGS
from tests.support.lane_conversations import PROTOCOLS, anthropic_turns, interleaved
from tests.support.llm_client import cache_stats, clear_cache, prompt_tokens, reused_tokens, send
from tests.support.models import require_model
from tests.support.processes import free_port, http_ok, running

pytestmark = pytest.mark.server


def engine_server(tmp_path_factory, name: str, *flags: str):
    model = require_model()
    port = free_port()
    command = [sys.executable, "-m", "stable_prefix.engine_patch", "serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny", *flags]
    return running(
        name,
        command,
        port=port,
        log_dir=tmp_path_factory.mktemp(name),
        ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models"),
    )


@pytest.fixture(scope="module", params=list(ENGINE_MODE_FLAGS))
def engine(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def patched(tmp_path_factory, engine):
    with engine_server(tmp_path_factory, f"patched-{engine}", *ENGINE_MODE_FLAGS[engine][0], "--prefix-cache-bytes", "64MiB") as server:
        yield server


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, engine):
    with engine_server(tmp_path_factory, f"shipped-{engine}", *ENGINE_MODE_FLAGS[engine][1]) as server:
        yield server


@pytest.fixture
def fresh_cache(patched):
    clear_cache(patched.url)
    return patched


# --- the specification ------------------------------------------------------


@pytest.mark.parametrize("path", list(PROTOCOLS))
def test_greedy_answers_are_identical_with_and_without_the_patch(path, fresh_cache, shipped):
    for lane, body in interleaved(path):
        with_patch = send(fresh_cache.url, path, body)
        as_shipped = send(shipped.url, path, body)
        assert with_patch.text == as_shipped.text, f"{lane} {'streamed' if body['stream'] else 'non-streamed'}"
    assert cache_stats(fresh_cache.url)["hits"] >= 4


@pytest.mark.parametrize("path", list(PROTOCOLS))
def test_each_follow_up_turn_prefills_only_its_new_tokens_in_every_interleaved_lane(path, fresh_cache):
    previous_prompt: dict[str, int] = {}
    for lane, body in interleaved(path):
        before = cache_stats(fresh_cache.url)
        answer = send(fresh_cache.url, path, body)
        after = cache_stats(fresh_cache.url)
        total = prompt_tokens(path, answer.usage)
        reused = reused_tokens(path, answer.usage)
        assert after["tokens_prefilled"] - before["tokens_prefilled"] == total - reused
        assert after["tokens_reused"] - before["tokens_reused"] == reused
        if lane in previous_prompt:
            assert reused >= previous_prompt[lane], f"{lane} lost its warm prefix"
        previous_prompt[lane] = total
        assert after["bytes"] <= after["budget_bytes"]


def test_stats_report_every_counter_and_delete_clears_the_cache(fresh_cache):
    send(fresh_cache.url, "/v1/messages", anthropic_turns("main")[0])
    stats = cache_stats(fresh_cache.url)
    for name in ("hits", "misses", "tokens_reused", "tokens_prefilled", "entries", "bytes", "budget_bytes", "evictions", "fallbacks"):
        assert isinstance(stats[name], int), name
    assert stats["entries"] == 1 and stats["bytes"] > 0
    assert stats["budget_bytes"] == 64 * 2**20
    clear_cache(fresh_cache.url)
    assert cache_stats(fresh_cache.url)["entries"] == 0
    assert cache_stats(fresh_cache.url)["bytes"] == 0


def test_concurrent_requests_queue_and_answer_as_if_sent_alone(fresh_cache, shipped):
    bodies = [anthropic_turns(lane)[1] for lane in ("main", "subagent", "title")]
    expected = [send(shipped.url, "/v1/messages", body).text for body in bodies]
    with ThreadPoolExecutor(max_workers=3) as pool:
        answers = list(pool.map(lambda body: send(fresh_cache.url, "/v1/messages", body), bodies))
    assert [answer.text for answer in answers] == expected


def test_a_budget_too_small_for_every_lane_evicts_the_least_recent_and_is_never_exceeded(tmp_path_factory, engine):
    # The test model holds 256 bytes per token: one lane of ~200 tokens fits, not two.
    budget = 60_000
    lost_warm_prefix = []
    previous_prompt: dict[str, int] = {}
    with engine_server(tmp_path_factory, f"small-budget-{engine}", *ENGINE_MODE_FLAGS[engine][0], "--prefix-cache-bytes", str(budget)) as server:
        for lane, body in interleaved("/v1/messages"):
            answer = send(server.url, "/v1/messages", body)
            stats = cache_stats(server.url)
            assert stats["bytes"] <= budget
            if lane in previous_prompt and answer.usage["cache_read_input_tokens"] < previous_prompt[lane]:
                lost_warm_prefix.append(lane)
            previous_prompt[lane] = prompt_tokens("/v1/messages", answer.usage)
    assert stats["evictions"] > 0
    assert lost_warm_prefix, "with room for one lane, interleaved lanes must evict each other"


def test_the_server_logs_what_it_installed_on_which_version_and_engine(patched, engine):
    log = Path(patched.log_path).read_text()
    assert f"prefix cache installed on vllm-mlx 0.6.0, {engine} engine" in log
    assert cache_stats(patched.url)["engine"] == engine
