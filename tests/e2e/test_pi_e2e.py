"""The real Pi CLI, end to end: every continued turn and every new conversation is warm.

The stack is what a user runs, on 127.0.0.1, offline:

    pi -p ... (pinned npm release, the stack's provider in an extension of ours, a scratch HOME and git repository)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, OpenAI path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

Pi's prompt is ~1.4K tokens of the tiny model (a system prompt ending in its
date and working directory, four tools). The scenarios are the agents' shared
ones (`agent_scenarios.py`) and one in another project; they share one stack,
and each runs Pi in a fresh project. The tiny
model never calls a tool, so the tool call (a `read`) is scripted at the
engine's door (`tests/support/scripted_tool_use.py`): that request still
reaches the real engine, which prefills and caches it; only its answer is
replaced. Each test prints what each request reused.
"""

from __future__ import annotations

import time

import pytest

from stable_prefix.agents import pi
from tests.e2e.agent_scenarios import ContinuedTurns, NewConversationAfterACommit, PastMidnight, system_prompt
from tests.support.agent_turns import MIN_NEW_CONVERSATION_REUSE, lane_turns, run
from tests.support.agent_turns import finished_turns as finished

pytestmark = [pytest.mark.server, pytest.mark.slow]


class TestPi(PastMidnight, NewConversationAfterACommit, ContinuedTurns):
    NAME, DRIVER, BINARY, COMMAND = "Pi", pi.Pi, "pi_cli", "pi -p"
    ANSWER_TOKENS = 64
    SESSION_HEADER = "session_id"

    def read_step(self, project, name):
        return {"tool": "read", "inputs": [{"path": name}]}

    def assert_side_lanes(self, lanes):
        assert lanes == set(), "Pi sends no side requests in print mode"

    def test_a_new_conversation_in_another_project_shares_the_system_prompt_and_tools(self, stack, agent, binary, capsys):
        other = self.driver_in(stack, binary, "other-agent")
        started = time.monotonic()
        run(agent, "Say hello in one word.")
        run(other, "Say hello in one word.")
        turns = finished(stack, "pi -p in one project, then in another", started, capsys)

        first, second = lane_turns(turns, "main")
        assert system_prompt(first) != system_prompt(second), "both system prompts are the same; does Pi still write its working directory there?"
        assert second.diagnosis["neutralized"]["rule"] == "conversation_context", second.diagnosis["line"]
        assert second.diagnosis["cause"] == "environment" and second.diagnosis["first_divergence"]["path"].startswith("messages[1]")
        assert second.reuse >= MIN_NEW_CONVERSATION_REUSE, second.diagnosis["line"]
