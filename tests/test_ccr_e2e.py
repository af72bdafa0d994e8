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
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stable_prefix.tools import claude_code, claude_code_router
from tests.support.models import require_model
from tests.support.processes import VENV_BIN, Server, free_port, http_ok, mitmdump_command, running

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


@dataclass
class Stack:
    engine: Server
    proxy: Server
    door_record: Path
    captures_dir: Path

    def cache_stats(self) -> dict:
        with urllib.request.urlopen(f"{self.engine.url}/v1/cache/stats", timeout=10) as response:
            return json.load(response)

    def arrived(self) -> list[dict]:
        """Every finished chat completion, as the engine's door saw it (complete lines only)."""
        if not self.door_record.exists():
            return []
        lines = self.door_record.read_text().split("\n")[:-1]
        return [record for record in map(json.loads, filter(str.strip, lines)) if record["path"].split("?")[0] == CHAT_PATH]

    def captures(self) -> list[dict]:
        paths = sorted(self.captures_dir.glob("*/[0-9]*-*.json"))
        return sorted((json.loads(path.read_text()) for path in paths), key=lambda record: record["seq"])


@pytest.fixture(scope="module")
def binaries() -> tuple[Path, Path]:
    try:
        return claude_code.install(), claude_code_router.install()
    except claude_code.ClaudeCodeUnavailable as error:
        pytest.fail(f"the claude-code-router end-to-end test cannot run: {error}", pytrace=False)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    model = require_model()
    logs, door_record, captures_dir = tmp_path / "logs", tmp_path / "arrived-at-engine.jsonl", tmp_path / "captures"
    engine_port, door_port, proxy_port = free_port(), free_port(), free_port()
    engine_command = [str(VENV_BIN / "python"), "-m", "stable_prefix.engine_patch", "serve", str(model), "--host", "127.0.0.1",
                      "--port", str(engine_port), "--served-model-name", SERVED_MODEL, "--max-tokens", str(ANSWER_TOKENS)]
    door_command = mitmdump_command(["tests/support/upstream_recorder.py"], f"http://127.0.0.1:{engine_port}", door_port,
                                    {"record_path": door_record})
    proxy_command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], f"http://127.0.0.1:{door_port}", proxy_port,
                                     {"upstream_model": SERVED_MODEL, "max_tokens_cap": ANSWER_TOKENS, "capture_dir": captures_dir})
    with (
        running("engine", engine_command, port=engine_port, log_dir=logs, ready=lambda: http_ok(f"http://127.0.0.1:{engine_port}/v1/models")) as engine,
        running("door", door_command, port=door_port, log_dir=logs),
        running("proxy", proxy_command, port=proxy_port, log_dir=logs) as proxy,
    ):
        yield Stack(engine, proxy, door_record, captures_dir)


@pytest.fixture
def router(stack: Stack, binaries: tuple[Path, Path], tmp_path: Path) -> Iterator[claude_code_router.Router]:
    claude_binary, router_cli = binaries
    sandbox = claude_code.Sandbox.create(tmp_path / "claude")
    router = claude_code_router.Router.create(
        router_cli, tmp_path / "ccr", claude_config_dir=sandbox.config_dir, workdir=sandbox.workdir,
        claude_binary=claude_binary, proxy_url=stack.proxy.url, model=SERVED_MODEL, port=free_port(),
        claude_environment={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(ANSWER_TOKENS)})
    try:
        yield router
    finally:
        router.stop_service()


def wait_until_quiet(stack: Stack, quiet_s: float = 3.0, timeout: float = 60.0) -> None:
    """Until the proxy's captures and the engine's door agree and nothing new arrived for `quiet_s`."""
    deadline, last, changed = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        counts = (len(stack.arrived()), len(stack.captures()))
        if counts != last:
            last, changed = counts, time.monotonic()
        elif counts[0] == counts[1] and time.monotonic() - changed >= quiet_s:
            return
        time.sleep(0.5)
    raise TimeoutError(f"requests still in flight after {timeout:.0f}s (engine door, captures): {last}")


def cached_tokens(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_a_multi_turn_conversation_through_the_router_reuses_its_prefix_and_never_sends_the_billing_line(stack, router, capsys):
    started = time.monotonic()
    reused_after_each_turn = []
    for index, prompt in enumerate(TURNS):
        result = router.code(prompt, continue_conversation=index > 0, timeout=TURN_TIMEOUT_S)
        assert result.returncode == 0, f"ccr code turn {index + 1} failed:\n{result.stdout}\n{result.stderr}"
        reused_after_each_turn.append(stack.cache_stats()["tokens_reused"])
    wait_until_quiet(stack)
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
    assert all(later > earlier for earlier, later in zip(reused_after_each_turn, reused_after_each_turn[1:])), (
        f"tokens_reused must grow with every warm turn: {reused_after_each_turn}")
