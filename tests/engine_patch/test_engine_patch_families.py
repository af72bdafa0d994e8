"""The patched server with every model family people run: hybrid (Qwen3.5
gated-DeltaNet, Nemotron-H Mamba2) and sliding-window (gpt-oss, Gemma 3).

For each family and each engine mode (SimpleEngine, continuous batching),
through a real patched server and the same vllm-mlx engine as shipped, on interleaved agent-shaped lanes over both endpoints (streamed and
not): the greedy answers are identical, every follow-up turn is warm, a new
conversation reuses the shared system + tools head, no request reuses less
than vllm-mlx as shipped did on the same request, and nothing is disabled.
"""

from __future__ import annotations

import re
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.engines import ENGINE_MODE_FLAGS
from tests.support.lane_conversations import PROTOCOLS, anthropic_turns, interleaved
from tests.support.llm_client import cache_stats, prompt_tokens, reused_tokens, send
from tests.support.models import REPO_ROOT, require_model
from tests.support.processes import free_port, http_ok, running

pytestmark = pytest.mark.server

FAMILIES = [
    "qwen3_5",
    pytest.param("gpt_oss", marks=pytest.mark.slow),
    pytest.param("gemma3_text", marks=pytest.mark.slow),
    pytest.param("nemotron_h", marks=pytest.mark.slow),
]

# What vllm-mlx as shipped logs when its cache serves a request: SimpleEngine's system-prefix
# cache, the batched engine's memory-aware cache.
SHIPPED_HIT = re.compile(r"System KV cache HIT \(stream_chat\): reusing (\d+) tokens|\[cache_fetch\] request=\S+ HIT prompt_tokens=\d+ cached=(\d+)")


def family_model(family: str):
    return require_model(REPO_ROOT / "build" / f"tiny-{family}")


def engine_server(tmp_path_factory, family: str, name: str, *flags: str):
    port = free_port()
    command = [sys.executable, "-m", "stable_prefix.engine_patch", "serve", str(family_model(family)), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", "tiny", *flags]
    return running(f"{name}-{family}", command, port=port, log_dir=tmp_path_factory.mktemp(f"{name}-{family}"),
                   ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models"))


def send_to_shipped(server, path: str, body: dict):
    """The answer of vllm-mlx as shipped, and the tokens it reused, from its own log line (0 when it logs no hit)."""
    before = len(server.log_text())
    answer = send(server.url, path, body)
    hits = [int(simple or batched) for simple, batched in SHIPPED_HIT.findall(server.log_text()[before:])]
    return answer, hits[-1] if hits else 0


def new_conversation(body: dict, path: str) -> dict:
    """The same system + tools, a first user message never seen before."""
    first = [message for message in body["messages"] if message["role"] == "system"]
    return {**body, "messages": [*first, {"role": "user", "content": "A different task: list the open issues."}], "stream": False}


@pytest.mark.parametrize("engine", list(ENGINE_MODE_FLAGS))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_answers_as_shipped_stays_warm_and_never_reuses_less(family, engine, tmp_path_factory):
    ours, theirs = ENGINE_MODE_FLAGS[engine]
    with engine_server(tmp_path_factory, family, f"patched-{engine}", *ours, "--prefix-cache-bytes", "64MiB") as patched, \
            engine_server(tmp_path_factory, family, f"shipped-{engine}", *theirs) as shipped:
        # Both servers start empty and keep what they cached across the two
        # protocols, so each request meets the same history on both.
        for path in PROTOCOLS:
            previous_prompt: dict[str, int] = {}
            sequence = interleaved(path)
            main_body = sequence[0][1]
            for lane, body in [*sequence, ("new conversation", new_conversation(main_body, path))]:
                label = f"{family} {path} {lane} {'streamed' if body['stream'] else 'non-streamed'}"
                ours = send(patched.url, path, body)
                as_shipped, theirs = send_to_shipped(shipped, path, body)
                assert ours.text == as_shipped.text, label
                reused = reused_tokens(path, ours.usage)
                assert reused >= theirs, f"{label}: reused {reused}, as shipped {theirs}"
                if lane in previous_prompt:
                    # Warm: everything up to the previous turn's generation prompt.
                    assert reused >= previous_prompt[lane] - 8, f"{label} lost its warm prefix"
                if lane == "new conversation":
                    assert reused > 0, f"{label}: the shared head was not reused"
                previous_prompt[lane] = prompt_tokens(path, ours.usage)
        stats = cache_stats(patched.url)
        assert stats["disabled_reasons"] == []
        assert stats["fallbacks"] == 0
        assert stats["bytes"] <= stats["budget_bytes"]


@pytest.mark.parametrize("family", FAMILIES)
def test_requests_of_three_lengths_sent_at_once_to_the_batched_engine_answer_as_each_alone(family, tmp_path_factory):
    # A long main turn, a subagent's first and a title request: prefilled together (recurrent_padding_fix
    # for the hybrids), each answer as vllm-mlx's SimpleEngine gives it alone.
    bodies = [anthropic_turns("main")[2], anthropic_turns("subagent")[0], anthropic_turns("title")[0]]
    with engine_server(tmp_path_factory, family, "patched-batched-at-once", *ENGINE_MODE_FLAGS["batched"][0], "--prefix-cache-bytes", "64MiB") as patched, \
            engine_server(tmp_path_factory, family, "shipped-simple-alone", *ENGINE_MODE_FLAGS["simple"][1]) as alone:
        expected = [send(alone.url, "/v1/messages", body).text for body in bodies]
        with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
            answers = list(pool.map(lambda body: send(patched.url, "/v1/messages", body), bodies))
    assert [answer.text for answer in answers] == expected
