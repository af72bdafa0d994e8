"""The real Qwen Code CLI, end to end: every continued turn and every new conversation is warm.

The stack is what a user runs, on 127.0.0.1, offline:

    qwen PROMPT (pinned npm release on the node on PATH, a system settings file, a scratch HOME and git repository)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, OpenAI path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

Qwen Code's first request is ~13.8K tokens of the tiny model (its
non-interactive tool set; ~17.5K with every tool, as under `--approval-mode
yolo`). After each turn it sends a managed-memory request of its own, on its
own lane. The tests share one stack (`agent_turns.AgentUnderTest`); each runs
Qwen Code in a fresh project. The tiny model never calls a tool, so the tool
calls (a `read_file`, two `agent` subagents and their first steps) are
scripted at the engine's door (`tests/support/scripted_tool_use.py`): those
requests still reach the real engine, which prefills and caches them; only
their answers are replaced. Each test prints what each request reused.
"""

from __future__ import annotations

import time

import pytest

from stable_prefix.agents import qwen_code
from tests.support import agent_turns
from tests.support.agent_turns import (
    MIN_CONTINUED_REUSE,
    MIN_NEW_CONVERSATION_REUSE,
    assert_each_instance_reuses_its_own_prefix,
    lane_turns,
    run,
    warm_and_shipped_answers,
)
from tests.support.agent_turns import finished_turns as finished

pytestmark = [pytest.mark.server, pytest.mark.slow]

# The tiny model ends an answer after ~40 tokens, now and then much later: an answer cut at the
# cap would be asked again by Qwen Code with a larger cap, then resumed.
ANSWER_TOKENS = 256
AGENT = agent_turns.AgentUnderTest(qwen_code.QwenCode, ANSWER_TOKENS)
stack = AGENT.stack_fixture()


# A file worth reading: as Qwen Code sends them, the next turn re-reads the whole tool turn.
DESIGN_NOTES = "".join(f"{number}. The parser keeps every token of line {number} and reports where it stopped.\n" for number in range(1, 80))


def test_a_conversation_with_a_tool_turn_reuses_its_prompt_on_every_continued_turn(stack, qwen_cli, tmp_path, capsys):
    agent = AGENT.in_stack(stack, qwen_cli)
    agent.project.commit("design.md", DESIGN_NOTES, "Write down the design")
    stack.script([{"tool": "read_file", "inputs": [{"file_path": str(agent.project.workdir / "design.md")}]}])
    started = time.monotonic()
    reused_after_each_turn = []
    for index, prompt in enumerate(["Read the design notes.", "Now say it in French.", "And in German."]):
        run(agent, prompt, continue_conversation=index > 0)
        reused_after_each_turn.append(stack.cache_stats()["tokens_reused"])
    turns = finished(stack, "qwen, a tool turn, then qwen --continue twice", started, capsys)
    main = lane_turns(turns, "main")
    warm, cold = warm_and_shipped_answers(stack, tmp_path, main[-1].arrived["request"])

    assert len(main) >= 4, "one request per turn, and one more after the tool result"
    assert any(message["role"] == "tool" for message in main[1].arrived["request"]["messages"]), "Qwen Code ran the scripted read_file"
    assert {turn.lane for turn in turns} - {"main"}, "its managed-memory requests have a lane of their own"
    tool_step, *continued = main[1:]
    assert tool_step.reused_tokens >= main[0].prompt_tokens, "the step after the tool call reuses all of the first request"
    for turn in continued:
        assert turn.reuse >= MIN_CONTINUED_REUSE, turn.diagnosis["line"]
    assert all(later > earlier for earlier, later in zip(reused_after_each_turn, reused_after_each_turn[1:]))
    assert all(turn.diagnosis["prefix_kept"] for turn in main[1:])
    moved = [turn for turn in main[1:] if turn.diagnosis["neutralized"]]
    assert moved and all(turn.diagnosis["neutralized"]["rule"] == "turn_reminders" for turn in moved), (
        "as sent, each continued turn broke where the date reminder left the previous turn's message")
    assert warm == cold, "the answer served from the cache differs from vllm-mlx's as shipped"


def test_a_new_conversation_in_the_same_repository_after_an_edit_and_a_commit_reuses_its_prompt(stack, qwen_cli, capsys):
    agent = AGENT.in_stack(stack, qwen_cli)
    started = time.monotonic()
    run(agent, "Say hello in one word.")
    agent.project.commit("README.md", "A small project, with notes.\n", "Say more in the README")
    agent.project.commit("notes.md", "Remember to write the tests first.\n", "Add notes")
    run(agent, "Now say goodbye in one word.")
    turns = finished(stack, "qwen, an edit and a commit (a new file), qwen again", started, capsys)

    first, second = lane_turns(turns, "main")
    assert second.diagnosis["cause"] == "new conversation", second.diagnosis["line"]
    assert second.diagnosis["first_divergence"]["path"].startswith("messages[1]"), "system prompt and tools stay shared"
    assert "Git snapshot" in second.capture["client_body"]["messages"][0]["content"], "Qwen Code sent no git snapshot; has it changed?"
    assert second.reuse >= MIN_NEW_CONVERSATION_REUSE, second.diagnosis["line"]


def test_a_conversation_continued_after_a_commit_keeps_its_system_prompt_tools_and_fixed_reminders(stack, qwen_cli, capsys):
    agent = AGENT.in_stack(stack, qwen_cli)
    started = time.monotonic()
    run(agent, "Say hello in one word.")
    agent.project.commit("notes.md", "Remember to write the tests first.\n", "Add notes")
    run(agent, "Go on after the commit.", continue_conversation=True)
    turns = finished(stack, "qwen, a commit (a new file), qwen --continue", started, capsys)

    before, after = lane_turns(turns, "main")[-2:]
    assert after.diagnosis["cause"] == "context changed", "Qwen Code rebuilt its startup context; the conversation went on"
    assert after.reuse >= MIN_NEW_CONVERSATION_REUSE, after.diagnosis["line"]


def test_two_explore_subagents_each_reuse_their_own_instances_prefix(stack, qwen_cli, capsys):
    agent = AGENT.in_stack(stack, qwen_cli)
    explore = [{"description": f"Look at the {what}", "prompt": f"Find out what the {what} says.", "subagent_type": "Explore"}
               for what in ("readme", "history")]
    read = {"tool": "read_file", "inputs": [{"file_path": str(agent.project.workdir / "README.md")}]}
    stack.script([{"tool": "agent", "inputs": explore}, read, read])
    started = time.monotonic()
    run(agent, "Explore this repository with two Explore agents at once.", approval_mode="yolo")
    turns = finished(stack, "qwen --approval-mode yolo starting two Explore subagents", started, capsys)

    instances: dict[str, list] = {}
    for turn in turns:
        if turn.lane.startswith("sub:") and "Find out what the" in str(turn.capture["client_body"]["messages"][1]):
            instances.setdefault(turn.lane, []).append(turn)
    assert_each_instance_reuses_its_own_prefix(instances)
