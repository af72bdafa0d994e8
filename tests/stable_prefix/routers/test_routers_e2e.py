"""Real routers between our proxy and two patched engines that share one disk cache directory.

proxy (real mitmdump, the team options) -> smg / HAProxy / vllm-router (key policy) -> two
`stable-prefix serve` replicas (tiny test model, one `--prefix-cache-dir`). Which replica served a
request is read from the replicas' own cache stats (hits + misses), what it reused from the engine's
usage figures in the answer.
"""

from __future__ import annotations

import contextlib
import sys
import time

import pytest
import requests

from stable_prefix import routers
from tests.fixtures import claude_code, codex, coding_agents
from tests.support.engines import engine, kill_9
from tests.support.llm_client import cache_stats, reused_tokens, send
from tests.support.processes import VENV_BIN, free_port, http_ok, mitmdump_command, running
from tests.support.slow_sse_upstream import slow_sse_upstream

pytestmark = [pytest.mark.server, pytest.mark.slow]

MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
TEAM_OPTIONS = {"upstream_model": "tiny", "max_tokens_cap": 8, "lane_routing_header": "x-smg-routing-key,x-session-id",
                "strict_router_body": "true"}
USERS = 10  # keys on a ring of two: all on one replica 2 times in 2**10


def claude_code_body(turns: int, workdir: str = "/home/ann/app", **changes) -> dict:
    """Claude Code 2.1.332's main request as it really comes: the environment message with its own
    `output_config`, and the top-level fields smg's schema is strict about."""
    body = claude_code.modern_request(turns, workdir=workdir)
    body["messages"][1]["output_config"] = {"effort": "medium"}
    body.update(thinking={"type": "enabled", "budget_tokens": 1024}, context_management={"edits": []},
                output_config={"effort": "medium"}, temperature=0, **changes)
    return body


def served(replicas) -> list[int]:
    """Requests each replica has looked up in its cache so far."""
    return [stats["hits"] + stats["misses"] for stats in map(cache_stats, (replica.url for replica in replicas))]


def send_and_locate(proxy_url: str, replicas, body: dict, headers: dict | None = None):
    """(answer, index of the replica that served it)."""
    before = served(replicas)
    answer = send_with_headers(proxy_url, body, headers)
    after = served(replicas)
    moved = [index for index, (was, now) in enumerate(zip(before, after, strict=True)) if now > was]
    assert len(moved) == 1, f"one replica should have served the request: before {before}, after {after}"
    return answer, moved[0]


def send_with_headers(proxy_url: str, body: dict, headers: dict | None = None):
    if not headers:
        return send(proxy_url, MESSAGES, body)
    response = requests.post(proxy_url + MESSAGES, json={**body, "stream": False}, headers=headers, timeout=300)
    response.raise_for_status()
    return response.json()


def prompt_tokens(usage: dict) -> int:
    return usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    logs, shared = tmp_path_factory.mktemp("replicas"), tmp_path_factory.mktemp("shared-kv")
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(engine(logs, name, "--prefix-cache-dir", str(shared))) for name in ("replica-a", "replica-b")]


@contextlib.contextmanager
def team_proxy(upstream_url: str, log_dir, **options):
    port = free_port()
    command = mitmdump_command(["addons/strip_billing.py"], upstream_url, port, {**TEAM_OPTIONS, **options})
    with running("proxy", command, port=port, log_dir=log_dir) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def smg_stack(replicas, tmp_path_factory):
    logs = tmp_path_factory.mktemp("smg")
    with routers.running_router("smg", [r.url for r in replicas], log_dir=logs) as router, team_proxy(router.url, logs) as proxy:
        yield router, proxy


@pytest.fixture(scope="module", params=["smg", "haproxy"])
def key_router_stack(request, replicas, smg_stack, tmp_path_factory):
    """Each router with the key policy, and our proxy before it."""
    if request.param == "smg":
        yield smg_stack
        return
    logs = tmp_path_factory.mktemp(request.param)
    with routers.running_router(request.param, [r.url for r in replicas], log_dir=logs) as router, team_proxy(router.url, logs) as proxy:
        yield router, proxy


def test_claude_code_bodies_are_refused_by_smg_without_the_strict_router_option(smg_stack, tmp_path):
    router, _ = smg_stack
    with team_proxy(router.url, tmp_path, strict_router_body="false") as proxy:
        response = requests.post(proxy.url + MESSAGES, json={**claude_code_body(1), "stream": False}, timeout=300)
    assert response.status_code == 400 and "output_config" in response.text


def test_each_lane_stays_on_one_replica_and_each_turn_reuses_the_last(key_router_stack, replicas):
    _, proxy = key_router_stack
    where, reused, prompts = set(), [], []
    for turns in (1, 2, 3):
        answer, replica = send_and_locate(proxy.url, replicas, claude_code_body(turns))
        where.add(replica)
        reused.append(reused_tokens(MESSAGES, answer.usage))
        prompts.append(prompt_tokens(answer.usage))
    assert len(where) == 1
    assert reused[1] >= prompts[0] * 0.9 and reused[2] >= prompts[1] * 0.9, (reused, prompts)


def test_users_sessions_spread_over_both_replicas(key_router_stack, replicas):
    _, proxy = key_router_stack
    places = {send_and_locate(proxy.url, replicas, claude_code_body(1, workdir=f"/home/user{user}/project"))[1] for user in range(USERS)}
    assert places == {0, 1}


def test_through_smg_the_length_cap_reaches_the_engine(smg_stack):
    _, proxy = smg_stack
    answer = send(proxy.url, MESSAGES, claude_code_body(1, max_tokens=64000))
    assert answer.usage["output_tokens"] <= TEAM_OPTIONS["max_tokens_cap"]


def test_through_smg_the_length_cap_reaches_the_engine_on_the_openai_path(smg_stack):
    """sglang-router renamed max_tokens to max_completion_tokens, which vllm-mlx ignores; smg keeps it."""
    _, proxy = smg_stack
    body = {**coding_agents.opencode_request(["Fix the failing test."]), "max_tokens": 64000, "stream": False}
    answer = send(proxy.url, "/v1/chat/completions", body)
    assert answer.usage["completion_tokens"] <= TEAM_OPTIONS["max_tokens_cap"]


def test_through_smg_a_codex_request_passes_with_the_strict_router_option_and_not_without(smg_stack, tmp_path):
    router, proxy = smg_stack
    body = {**codex.Conversation("Fix the failing test.").request(), "max_output_tokens": 8}
    answer = send(proxy.url, RESPONSES, body)
    assert answer.response["status"] in ("completed", "incomplete")
    with team_proxy(router.url, tmp_path, strict_router_body="false") as plain:
        refused = requests.post(plain.url + RESPONSES, json=body, timeout=300)
    assert refused.status_code == 400 and "client_metadata" in refused.text


def test_smg_streams_the_answer(smg_stack):
    _, proxy = smg_stack
    answer = send(proxy.url, MESSAGES, claude_code_body(2))
    assert answer.ttft_s is not None and answer.events[-1]["type"] == "message_stop"


def test_up_upstream_runs_the_proxy_alone_before_a_router_with_the_team_options(smg_stack, replicas, tmp_path):
    router, _ = smg_stack
    port = free_port()
    command = [str(VENV_BIN / "stable-prefix"), "up", "--upstream", router.url, "--served-model-name", "tiny", "--port", str(port),
               "--max-tokens", "8", "--no-capture"]
    with running("up-upstream", command, port=port, log_dir=tmp_path, ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models")) as up:
        places = {send_and_locate(up.url, replicas, claude_code_body(turns, workdir="/home/uma/app"))[1] for turns in (1, 2)}
    assert len(places) == 1  # Claude Code's body passed smg (strict_router_body) and the key kept the lane in place


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="vllm-router ships Linux wheels only")
def test_through_vllm_router_a_lane_stays_on_one_replica(replicas, tmp_path):
    with (routers.running_router("vllm-router", [r.url for r in replicas], log_dir=tmp_path) as router,
          team_proxy(router.url, tmp_path) as proxy):
        places = {send_and_locate(proxy.url, replicas, claude_code_body(turns, workdir="/home/vic/app"))[1] for turns in (1, 2, 3)}
    assert len(places) == 1


def wait_for_disk_writes(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while cache_stats(url)["disk_writes_pending"]:
        assert time.monotonic() < deadline, "snapshots not on disk"
        time.sleep(0.2)


@pytest.mark.parametrize("kind", ["haproxy", "smg"])
def test_a_killed_replicas_lane_moves_to_the_survivor_warm_from_disk_and_comes_back(kind, tmp_path):
    """No request lost: the lane's next request, sent at once after a SIGKILL, goes to the survivor (the
    router's retry: HAProxy's L7 retry, redispatched; smg's retry), restored from the shared directory;
    after the replica returns the lane goes back."""
    shared = tmp_path / "shared-kv"
    ports = [free_port(), free_port()]
    with contextlib.ExitStack() as stack:
        pair = [stack.enter_context(engine(tmp_path, f"replica-{n}", "--prefix-cache-dir", str(shared), port=port))
                for n, port in zip("ab", ports, strict=True)]
        router = stack.enter_context(routers.running_router(kind, [r.url for r in pair], log_dir=tmp_path))
        proxy = stack.enter_context(team_proxy(router.url, tmp_path))
        for turns in (1, 2):
            _, holder = send_and_locate(proxy.url, pair, claude_code_body(turns, workdir="/home/flo/app"))
        wait_for_disk_writes(pair[holder].url)
        kill_9(pair[holder])
        survivor = pair[1 - holder]
        before = served([survivor])[0]
        started = time.monotonic()
        moved = send(proxy.url, MESSAGES, claude_code_body(3, workdir="/home/flo/app"))  # at once: before any health check saw it
        print(f"\n{kind}: the moved lane's turn {time.monotonic() - started:.2f} s, reused {reused_tokens(MESSAGES, moved.usage)} "
              f"of {prompt_tokens(moved.usage)} prompt tokens")
        assert served([survivor])[0] == before + 1
        assert reused_tokens(MESSAGES, moved.usage) >= 0.9 * prompt_tokens(moved.usage), moved.usage
        returned = stack.enter_context(engine(tmp_path, "replica-back", "--prefix-cache-dir", str(shared), port=ports[holder]))
        pair[holder] = returned
        time.sleep(3)  # a passed health check (every second, one needed) puts it back on the ring
        back, place = send_and_locate(proxy.url, pair, claude_code_body(4, workdir="/home/flo/app"))
        print(f"{kind}: back on the returned replica: {place == holder}, reused {reused_tokens(MESSAGES, back.usage)} "
              f"of {prompt_tokens(back.usage)}")
        assert place == holder
        assert reused_tokens(MESSAGES, back.usage) >= 0.9 * prompt_tokens(back.usage), back.usage


def test_haproxy_passes_a_stream_cut_mid_way_on_and_the_proxy_ends_it_with_the_protocols_error_event(tmp_path):
    """A replica that dies mid-answer: the router has sent bytes and cannot retry; the proxy ends the
    stream with Anthropic's error event (engine_errors.py)."""
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(slow_sse_upstream(event_delay=0.01))
        router = stack.enter_context(routers.running_router("haproxy", [upstream.url], log_dir=tmp_path))
        proxy = stack.enter_context(team_proxy(router.url, tmp_path))
        response = requests.post(proxy.url + MESSAGES, json={**claude_code_body(1), "stream": True}, timeout=60, stream=True,
                                 headers={"x-test-break-after": "2"})
        text = b"".join(response.iter_content(chunk_size=None)).decode()
    assert "event: error" in text and "message_stop" not in text
