"""The real opencode CLI, end to end: every continued turn and every new conversation is warm.

The stack is what a user runs, on 127.0.0.1, offline:

    opencode run ... (pinned npm release, its config in OPENCODE_CONFIG_CONTENT, a scratch HOME and git repository)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, OpenAI path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

opencode's prompt is ~7.2K tokens of the tiny model (system prompt, ten tools).
The scenarios are the agents' shared ones (`agent_scenarios.py`) and plan mode;
they share one stack, and each runs opencode in a fresh project. The tiny model never calls a tool, so the tool calls (a
`read`, two `task` subagents and their first steps) are scripted at the
engine's door (`tests/support/scripted_tool_use.py`): those requests still
reach the real engine, which prefills and caches them; only their answers are
replaced. Each test prints what each request reused.
"""

from __future__ import annotations

import time

import pytest

from stable_prefix.agents import opencode
from tests.e2e.agent_scenarios import ContinuedTurns, NewConversationAfterACommit, PastMidnight, TwoSubagents
from tests.support.agent_turns import MIN_CONTINUED_REUSE, lane_turns, run
from tests.support.agent_turns import finished_turns as finished

pytestmark = [pytest.mark.server, pytest.mark.slow]


class TestOpenCode(TwoSubagents, PastMidnight, NewConversationAfterACommit, ContinuedTurns):
    NAME, DRIVER, BINARY, COMMAND = "opencode", opencode.OpenCode, "opencode_binary", "opencode run"
    ANSWER_TOKENS = 64
    SESSION_HEADER = "x-session-id"
    TOOL_TURN_PROMPTS = ("Read the README.", "Now say it in French.")
    SUBAGENT_TOOL, SUBAGENT_TYPE = "task", "explore"

    def read_step(self, project, name):
        return {"tool": "read", "inputs": [{"filePath": str(project.workdir / name)}]}

    def assert_side_lanes(self, lanes):
        assert lanes == {"side:title"}, "the title request has a lane of its own"

    def subagent_instances(self, turns):
        instances: dict[str, list] = {}
        for turn in turns:
            if "x-parent-session-id" in turn.headers:
                instances.setdefault(turn.headers["x-session-id"], []).append(turn)
        return instances

    def test_plan_mode_turns_keep_their_prefix_and_the_switch_to_build_is_named(self, stack, agent, capsys):
        started = time.monotonic()
        run(agent, "Plan a hello world script.", agent="plan")
        run(agent, "Refine the plan.", agent="plan", continue_conversation=True)
        run(agent, "Now build it.", agent="build", continue_conversation=True)
        run(agent, "Thanks.", agent="build", continue_conversation=True)
        turns = finished(stack, "opencode run --agent plan twice, then --agent build twice", started, capsys)

        plan, refine, build, thanks = lane_turns(turns, "main")
        assert "<system-reminder>" in str(refine.capture["client_body"]["messages"][-1]), "opencode sent no mode reminder; has it changed?"
        for turn in (refine, thanks):  # opencode moved its reminder to the newest message; the proxy kept it in the first
            assert turn.reuse >= MIN_CONTINUED_REUSE, turn.diagnosis["line"]
            assert turn.diagnosis["neutralized"]["rule"] == "turn_reminders", turn.diagnosis["line"]
        assert build.diagnosis["cause"] == "mode switch", build.diagnosis["line"]
