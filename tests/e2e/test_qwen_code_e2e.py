"""The real Qwen Code CLI, end to end: every continued turn and every new conversation is warm.

The stack is what a user runs, on 127.0.0.1, offline:

    qwen PROMPT (pinned npm release on the node on PATH, a system settings file, a scratch HOME and git repository)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, OpenAI path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

Qwen Code's first request is ~13.8K tokens of the tiny model (its
non-interactive tool set; ~17.5K with every tool, as under `--approval-mode
yolo`). After each turn it sends a managed-memory request of its own, on its
own lane. The scenarios are the agents' shared ones (`agent_scenarios.py`) and one
continued after a commit; they share one stack, and each runs Qwen Code in a
fresh project. The tiny model never calls a tool, so the tool
calls (a `read_file`, two `agent` subagents and their first steps) are
scripted at the engine's door (`tests/support/scripted_tool_use.py`): those
requests still reach the real engine, which prefills and caches them; only
their answers are replaced. Each test prints what each request reused.
"""

from __future__ import annotations

import time

import pytest

from stable_prefix.agents import qwen_code
from tests.e2e.agent_scenarios import ContinuedTurns, NewConversationAfterACommit, TwoSubagents
from tests.support.agent_turns import MIN_NEW_CONVERSATION_REUSE, lane_turns, run
from tests.support.agent_turns import finished_turns as finished

pytestmark = [pytest.mark.server, pytest.mark.slow]

# A file worth reading: as Qwen Code sends them, the next turn re-reads the whole tool turn.
DESIGN_NOTES = "".join(f"{number}. The parser keeps every token of line {number} and reports where it stopped.\n" for number in range(1, 80))


class TestQwenCode(TwoSubagents, NewConversationAfterACommit, ContinuedTurns):
    NAME, DRIVER, BINARY, COMMAND = "Qwen Code", qwen_code.QwenCode, "qwen_cli", "qwen"
    # The tiny model ends an answer after ~40 tokens, now and then much later: an answer cut at the
    # cap would be asked again by Qwen Code with a larger cap, then resumed.
    ANSWER_TOKENS = 256
    TOOL_TURN_PROMPTS = ("Read the design notes.", "Now say it in French.", "And in German.")
    TOOL_TURN_FILE = "design.md"
    EXACT_MAIN_REQUESTS = False
    GIT_STATUS_MARKER = "Git snapshot"
    SUBAGENT_TOOL, SUBAGENT_TYPE = "agent", "Explore"
    SUBAGENT_TURN_OPTIONS = {"approval_mode": "yolo"}

    def read_step(self, project, name):
        return {"tool": "read_file", "inputs": [{"file_path": str(project.workdir / name)}]}

    def prepare_tool_turn(self, project):
        project.commit("design.md", DESIGN_NOTES, "Write down the design")

    def assert_side_lanes(self, lanes):
        assert lanes, "its managed-memory requests have a lane of their own"

    def assert_tool_step_reuses(self, tool_step, first):
        assert tool_step.reused_tokens >= first.prompt_tokens, "the step after the tool call reuses all of the first request"

    def assert_continued_turns_kept_by_the_rules(self, main):
        moved = [turn for turn in main[1:] if turn.diagnosis["neutralized"]]
        assert moved and all(turn.diagnosis["neutralized"]["rule"] == "turn_reminders" for turn in moved), (
            "as sent, each continued turn broke where the date reminder left the previous turn's message")

    def subagent_instances(self, turns):
        instances: dict[str, list] = {}
        for turn in turns:
            if turn.lane.startswith("sub:") and "Find out what the" in str(turn.capture["client_body"]["messages"][1]):
                instances.setdefault(turn.lane, []).append(turn)
        return instances

    def test_a_conversation_continued_after_a_commit_keeps_its_system_prompt_tools_and_fixed_reminders(self, stack, agent, capsys):
        started = time.monotonic()
        run(agent, "Say hello in one word.")
        agent.project.commit("notes.md", "Remember to write the tests first.\n", "Add notes")
        run(agent, "Go on after the commit.", continue_conversation=True)
        turns = finished(stack, "qwen, a commit (a new file), qwen --continue", started, capsys)

        before, after = lane_turns(turns, "main")[-2:]
        assert after.diagnosis["cause"] == "context changed", "Qwen Code rebuilt its startup context; the conversation went on"
        assert after.reuse >= MIN_NEW_CONVERSATION_REUSE, after.diagnosis["line"]
