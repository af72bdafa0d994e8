"""The claude-code-router path, end to end: Claude Code -> ccr -> our proxy's /v1/chat/completions -> the engine.

The route of the case behind this project, run as a user runs it, offline on 127.0.0.1:

    ccr code -p ... (pinned @musistudio/claude-code-router 2.0.0, sandboxed HOME, launching the pinned claude)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py      (our proxy, OpenAI path)
      -> mitmdump -s tests/support/upstream_recorder.py                (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

The router sends Claude Code's system prompt as a `role:"system"` message at
messages[0], its text blocks kept as a list with the billing header as the
first block; the proxy removes that block. Warm turns must reuse their prefix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stable_prefix.agents import claude_code, claude_code_router
from tests.support.agent_stack import Stack, assert_reuse_grows_with_every_turn, running_stack
from tests.support.models import require_model
from tests.support.processes import free_port

pytestmark = [pytest.mark.server, pytest.mark.slow]

SERVED_MODEL = "tiny-model-test"
# The tiny model ends its replies after ~40 tokens; a cap it reaches would make Claude Code
# ask it to resume ("output token limit hit"), a second request per turn.
ANSWER_TOKENS = 64
BILLING_HEADER = "x-anthropic-billing-header"
CHAT_PATH = "/v1/chat/completions"
TURNS = ["Say hello in one word.", "Now say it in French.", "And in German."]
MIN_REUSED_SHARE = 0.9
TURN_TIMEOUT_S = 600.0


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path, require_model(), SERVED_MODEL, ANSWER_TOKENS, CHAT_PATH) as started:
        yield started


@pytest.fixture
def router(stack: Stack, claude_binary: Path, router_cli: Path, tmp_path: Path) -> Iterator[claude_code_router.Router]:
    sandbox = claude_code.create_sandbox(tmp_path / "claude")
    router = claude_code_router.Router.create(
        router_cli, tmp_path / "ccr", claude_config_dir=sandbox.config_dir, workdir=sandbox.workdir,
        claude_binary=claude_binary, proxy_url=stack.proxy.url, model=SERVED_MODEL, port=free_port(),
        claude_environment={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(ANSWER_TOKENS)})
    try:
        yield router
    finally:
        router.stop_service()


def cached_tokens(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_a_multi_turn_conversation_through_the_router_reuses_its_prefix_and_never_sends_the_billing_line(stack, router, capsys):
    def ccr_code(index: int, prompt: str) -> None:
        result = router.code(prompt, continue_conversation=index > 0, timeout=TURN_TIMEOUT_S)
        assert result.returncode == 0, f"ccr code turn {index + 1} failed:\n{result.stdout}\n{result.stderr}"

    started = time.monotonic()
    reused_after_each_turn = stack.reused_after_each_turn(TURNS, ccr_code)
    stack.wait_until_quiet(timeout=TURN_TIMEOUT_S)
    arrived, captures = stack.arrived(), stack.captures()
    with capsys.disabled():  # the run's evidence, shown when it passes too
        print(f"\nccr code -p, then --continue: {len(captures)} requests in {time.monotonic() - started:.1f}s")
        for record in captures:
            usage = record["response"]["usage"] or {}
            print(f"  #{record['seq']} {record['lane']:<8} {usage.get('prompt_tokens', '?'):>6} prompt tok "
                  f"{cached_tokens(usage):>6} reused  TTFT {record['response']['ttft_s']}  {record['diagnosis']['line']}")
        print(f"  engine cache: {stack.cache_stats()}")

    assert len(captures) == len(arrived) >= len(TURNS), "one request per turn at least, each captured and each at the engine"
    assert {record["request"]["path"] for record in captures} == {CHAT_PATH}, "the router speaks OpenAI chat completions"
    assert len({record["lane"] for record in captures}) == 1, "a continued conversation stays in its lane"

    assert any(BILLING_HEADER in json.dumps(record["client_body"]) for record in captures), "Claude Code sent no billing header; has the CLI changed?"
    for record in arrived:
        assert BILLING_HEADER not in json.dumps(record["request"]), "the billing line reached the engine"
        assert record["status"] == 200 and record["request"]["model"] == SERVED_MODEL
        roles = [message.get("role") for message in record["request"]["messages"]]
        assert "system" not in roles[1:], "a role:system message reached the engine after messages[0]"

    for record in arrived[1:]:  # in the order they arrived: every request but the cold first one
        usage = record["usage"]
        assert cached_tokens(usage) >= MIN_REUSED_SHARE * usage["prompt_tokens"], f"a warm request reused too little: {usage}"
    assert_reuse_grows_with_every_turn(reused_after_each_turn)
