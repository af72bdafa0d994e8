"""A team's vLLM pool: two real vLLM replicas behind vllm-router on our key, our proxy before it.

proxy (`stable-prefix up --upstream`, the team options) -> vllm-router (`consistent_hash` on the key's
`x-session-id`) -> two vLLM CPU replicas (`up --server vllm`'s command, `bench/servers_vllm.py` starts them at once;
the failover model: float32, greedy, ~400-token replies). Which replica served a request, and what it reused, is read
from vLLM's own counters on each replica's /metrics (`vllm:prompt_tokens_total`, `vllm:prefix_cache_hits_total`).
"""

from __future__ import annotations

import contextlib
import json

import pytest
import requests

from stable_prefix import routers
from stable_prefix.addons.stream_recovery import RECOVERED_NOTE
from stable_prefix.bench.servers_vllm import SERVED_MODEL, counters, running_replicas
from tests.fixtures import claude_code, coding_agents
from tests.support.engines import kill_9
from tests.support.models import FAILOVER_MODEL, require_model
from tests.support.processes import VENV_BIN, free_port, http_ok, running

pytestmark = [pytest.mark.server, pytest.mark.slow]

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
# vLLM's KV block on a CPU (its platforms/cpu.py default): a prompt is cached in whole blocks only.
BLOCK_TOKENS = 128
USERS = 10  # keys on a ring of two: all on one replica 2 times in 2**10
MAX_TOKENS = 512
KILL_AFTER_CHUNKS = 8


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """(replicas, proxy URL, the proxy's log folder)."""
    logs = tmp_path_factory.mktemp("vllm-pool")
    with contextlib.ExitStack() as stack:
        # A home of their own: vLLM writes its caches and settings under ~.
        replicas = stack.enter_context(running_replicas(2, logs, model=require_model(FAILOVER_MODEL), env={"HOME": str(logs / "home")}))
        router = stack.enter_context(routers.running_router("vllm-router", [replica.url for replica in replicas], log_dir=logs))
        port = free_port()
        up = [str(VENV_BIN / "stable-prefix"), "up", "--upstream", router.url, "--served-model-name", SERVED_MODEL, "--port", str(port),
              "--max-tokens", str(MAX_TOKENS), "--capture-dir", str(logs / "proxy")]
        stack.enter_context(running("up", up, port=port, log_dir=logs, env={"XDG_STATE_HOME": str(logs / "state")},
                                    ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models")))
        yield replicas, f"http://127.0.0.1:{port}", logs / "proxy"


def send_and_locate(proxy_url: str, replicas, path: str, body: dict) -> tuple[dict, int, dict[str, float]]:
    """(answer, index of the replica that served it, what vLLM counted for it there)."""
    before = [counters(replica.url) for replica in replicas]
    response = requests.post(proxy_url + path, json={**body, "stream": False}, timeout=300)
    response.raise_for_status()
    after = [counters(replica.url) for replica in replicas]
    moved = [index for index in range(len(replicas)) if after[index]["prompt_tokens_total"] > before[index]["prompt_tokens_total"]]
    assert len(moved) == 1, f"one replica should have served the request: before {before}, after {after}"
    served = moved[0]
    return response.json(), served, {name: after[served][name] - before[served][name] for name in after[served]}


def claude_code_turn(turns: int, user: str) -> dict:
    return {**claude_code.modern_request(turns, workdir=f"/home/{user}/app"), "max_tokens": 8}


def test_each_lane_stays_on_one_replica_and_reuses_its_previous_prompt_there(pool):
    replicas, proxy_url, _ = pool
    for user in ("ann", "bob", "cy"):
        places, figures = set(), []
        for turns in (1, 2, 3):
            _, replica, counted = send_and_locate(proxy_url, replicas, MESSAGES, claude_code_turn(turns, user))
            places.add(replica)
            figures.append(counted)
        assert len(places) == 1, f"{user}'s lane moved between replicas"
        for previous, turn in zip(figures, figures[1:]):
            whole_blocks = int(previous["prompt_tokens_total"]) // BLOCK_TOKENS * BLOCK_TOKENS
            assert turn["prefix_cache_hits_total"] >= whole_blocks, f"{user}: vLLM counted {turn} after {previous}"


def test_users_lanes_spread_over_both_replicas(pool):
    replicas, proxy_url, _ = pool
    places = {send_and_locate(proxy_url, replicas, MESSAGES, claude_code_turn(1, f"user{user}"))[1] for user in range(USERS)}
    assert places == {0, 1}


def streamed_chat(proxy_url: str, body: dict, on_chunk) -> tuple[str, set[str], list[str]]:
    """(text, completion ids, finish reasons) of a streamed chat completion; `on_chunk(count)` after each text chunk."""
    text, ids, finishes, chunks = "", set(), [], 0
    with requests.post(proxy_url + CHAT, json={**body, "stream": True}, stream=True, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[len(b"data: "):])
            ids.add(event.get("id"))
            for choice in event.get("choices") or []:
                if choice.get("finish_reason"):
                    finishes.append(choice["finish_reason"])
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece:
                    text += piece
                    chunks += 1
                    on_chunk(chunks)
    return text, ids, finishes


def test_a_replica_killed_mid_reply_costs_the_client_no_turn(pool):
    """Runs last in the module: it leaves one replica dead. The replica holding the lane is SIGKILLed after
    KILL_AFTER_CHUNKS chunks of a streamed reply; vllm-router's circuit breaker takes it off the ring at the
    first failed retry, and the proxy completes the stream from the survivor (`addons/stream_recovery.py`):
    the client reads one whole answer, the one the replica would have given uncut (greedy, float32)."""
    replicas, proxy_url, proxy_logs = pool
    first = {**coding_agents.opencode_request(["Explain what this project does."]), "max_tokens": MAX_TOKENS, "temperature": 0}
    _, holder, _ = send_and_locate(proxy_url, replicas, CHAT, first)
    second = {**coding_agents.opencode_request(["Explain what this project does.", "Now say more."]), "max_tokens": MAX_TOKENS, "temperature": 0}
    uncut, again, _ = send_and_locate(proxy_url, replicas, CHAT, second)
    assert again == holder
    survivor = replicas[1 - holder]
    survivor_prompts = counters(survivor.url)["prompt_tokens_total"]

    def kill_at(chunks: int) -> None:
        if chunks == KILL_AFTER_CHUNKS:
            kill_9(replicas[holder])

    text, ids, finishes = streamed_chat(proxy_url, second, kill_at)
    proxy_log = "\n".join(path.read_text(errors="replace") for path in proxy_logs.glob("*/logs/proxy-*.log"))
    assert replicas[holder].process.poll() is not None, "the reply ended before its replica could be killed"
    assert RECOVERED_NOTE in proxy_log, "the proxy did not complete the stream"
    assert counters(survivor.url)["prompt_tokens_total"] > survivor_prompts, "the survivor served nothing"
    assert len(ids) == 1 and finishes, f"ids {ids}, finish reasons {finishes}"
    assert text == uncut["choices"][0]["message"]["content"]
