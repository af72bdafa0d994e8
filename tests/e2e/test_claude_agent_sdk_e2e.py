"""The Claude Agent SDK, end to end: a script of ours using it runs two turns of one session through
the stack, and the second is warm.

    node stable_prefix/agents/claude_agent_sdk_turns.mjs (the pinned @anthropic-ai/claude-agent-sdk: query(), then query({resume}))
      -> the pinned Claude Code it drives (pathToClaudeCodeExecutable; a sandbox HOME and config folder)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, Anthropic path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

Reuse is the engine's own usage (`cache_read_input_tokens` of the prompt);
the test prints what each request reused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stable_prefix.agents.claude_agent_sdk import AgentSdk
from stable_prefix.agents.claude_code import ClaudeCode, create_sandbox
from tests.support import agent_stack
from tests.support.agent_stack import Stack
from tests.support.agent_turns import MIN_CONTINUED_REUSE, SERVED_MODEL, finished_turns, lane_turns
from tests.support.models import require_model

pytestmark = [pytest.mark.server, pytest.mark.slow]

MESSAGES_PATH = "/v1/messages"
ANSWER_TOKENS = 16


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with agent_stack.running_stack(tmp_path / "stack", require_model(), SERVED_MODEL, ANSWER_TOKENS, MESSAGES_PATH) as started:
        yield started


def test_a_script_using_the_agent_sdk_reuses_the_first_turns_prompt_on_the_second(stack, claude_binary, agent_sdk_entry, tmp_path, capsys):
    sandbox = create_sandbox(tmp_path / "sdk", git_repository=True)
    sdk = AgentSdk(agent_sdk_entry, ClaudeCode(claude_binary, sandbox, stack.proxy.url))
    started = time.monotonic()
    results = sdk.run_turns(["Say hello in one word.", "Now say goodbye in one word."])
    turns = finished_turns(stack, "the Agent SDK: query(), then query({resume})", started, capsys)

    first, second = lane_turns(turns, "main")
    assert [result["turn"] for result in results] == [1, 2] and results[0]["session_id"] == results[1]["session_id"]
    assert all(turn.headers["user-agent"].startswith("claude-cli/") and "sdk" in turn.headers["user-agent"] for turn in (first, second))
    assert first.headers["x-claude-code-session-id"] == second.headers["x-claude-code-session-id"], "resume stays in the session"
    assert second.diagnosis["prefix_kept"], second.diagnosis["line"]
    assert second.reused_tokens >= first.prompt_tokens - 1 and second.reuse >= MIN_CONTINUED_REUSE, second.diagnosis["line"]
