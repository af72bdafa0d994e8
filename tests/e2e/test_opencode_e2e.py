"""The real opencode CLI, end to end: every continued turn and every new conversation is warm.

The stack is what a user runs, on 127.0.0.1, offline:

    opencode run ... (pinned npm release, its config in OPENCODE_CONFIG_CONTENT, a scratch HOME and git repository)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, OpenAI path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

opencode's prompt is ~7.2K tokens of the tiny model (system prompt, ten tools).
The tests share one stack (`agent_turns.AgentUnderTest`); each runs opencode in
a fresh project. The tiny model never calls a tool, so the tool calls (a
`read`, two `task` subagents and their first steps) are scripted at the
engine's door (`tests/support/scripted_tool_use.py`): those requests still
reach the real engine, which prefills and caches them; only their answers are
replaced. Each test prints what each request reused.
"""

from __future__ import annotations

import time

import pytest

from stable_prefix.agents import opencode
from tests.support import agent_turns
from tests.support.agent_turns import (
    AFTER_MIDNIGHT,
    BEFORE_MIDNIGHT,
    MIN_CONTINUED_REUSE,
    MIN_NEW_CONVERSATION_REUSE,
    assert_each_instance_reuses_its_own_prefix,
    assert_every_later_request_reuses,
    lane_turns,
    run,
    warm_and_shipped_answers,
)
from tests.support.agent_turns import finished_turns as finished

pytestmark = [pytest.mark.server, pytest.mark.slow]

ANSWER_TOKENS = 64
AGENT = agent_turns.AgentUnderTest(opencode.OpenCode, ANSWER_TOKENS)
stack = AGENT.stack_fixture()


def test_a_conversation_with_a_tool_turn_reuses_its_prompt_on_every_continued_turn(stack, opencode_binary, tmp_path, capsys):
    agent = AGENT.in_stack(stack, opencode_binary)
    stack.script([{"tool": "read", "inputs": [{"filePath": str(agent.project.workdir / "README.md")}]}])
    started = time.monotonic()
    reused_after_each_turn = []
    for index, prompt in enumerate(["Read the README.", "Now say it in French."]):
        run(agent, prompt, continue_conversation=index > 0)
        reused_after_each_turn.append(stack.cache_stats()["tokens_reused"])
    turns = finished(stack, "opencode run, a tool turn, then --continue", started, capsys)
    main = lane_turns(turns, "main")
    warm, cold = warm_and_shipped_answers(stack, tmp_path, main[-1].arrived["request"])

    assert {turn.lane for turn in turns} == {"main", "side:title"}, "the title request has a lane of its own"
    assert len(main) == 3, "one request per turn, and one more after the tool result"
    assert any(message["role"] == "tool" for message in main[1].arrived["request"]["messages"]), "opencode ran the scripted read"
    assert len({turn.headers["x-session-id"] for turn in main}) == 1, "--continue stays in the session"
    assert_every_later_request_reuses(main, MIN_CONTINUED_REUSE)
    assert reused_after_each_turn[1] > reused_after_each_turn[0]
    assert all(turn.diagnosis["prefix_kept"] for turn in main[1:])
    assert warm == cold, "the answer served from the cache differs from vllm-mlx's as shipped"


def test_a_new_conversation_in_the_same_repository_after_an_edit_and_a_commit_reuses_its_prompt(stack, opencode_binary, capsys):
    agent = AGENT.in_stack(stack, opencode_binary)
    started = time.monotonic()
    run(agent, "Say hello in one word.")
    agent.project.commit("README.md", "A small project, with notes.\n", "Say more in the README")
    agent.project.commit("notes.md", "Remember to write the tests first.\n", "Add notes")
    stats_before = stack.cache_stats()
    run(agent, "Now say goodbye in one word.")
    turns = finished(stack, "opencode run, an edit and a commit, opencode run again", started, capsys)
    stats = stack.cache_stats()

    first, second = lane_turns(turns, "main")
    assert first.headers["x-session-id"] != second.headers["x-session-id"]
    assert second.diagnosis["cause"] == "new conversation" and second.diagnosis["first_divergence"]["path"].startswith("messages[1]")
    assert second.reuse >= MIN_NEW_CONVERSATION_REUSE, second.diagnosis["line"]
    assert stats["tokens_reused"] - stats_before["tokens_reused"] >= second.reused_tokens


def test_plan_mode_turns_keep_their_prefix_and_the_switch_to_build_is_named(stack, opencode_binary, capsys):
    agent = AGENT.in_stack(stack, opencode_binary)
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


def test_a_conversation_continued_past_midnight_keeps_its_system_prompt_and_tools(stack, opencode_binary, capsys):
    agent = AGENT.in_stack(stack, opencode_binary)
    started = time.monotonic()
    run(agent, "Say hello in one word.", timezone=BEFORE_MIDNIGHT)
    run(agent, "Say it again.", continue_conversation=True, timezone=AFTER_MIDNIGHT)
    turns = finished(stack, "opencode run before midnight, --continue after", started, capsys)

    before, after = lane_turns(turns, "main")
    systems = [turn.capture["client_body"]["messages"][0]["content"] for turn in (before, after)]
    assert systems[0] != systems[1], "the two days' system prompts are the same; does opencode still write the date there?"
    assert after.diagnosis["cause"] == "environment" and after.diagnosis["first_divergence"]["path"].startswith("messages[1]")
    assert after.diagnosis["neutralized"]["rule"] == "conversation_context"
    assert after.reuse >= MIN_NEW_CONVERSATION_REUSE, after.diagnosis["line"]


def test_two_explore_subagents_each_reuse_their_own_instances_prefix(stack, opencode_binary, capsys):
    agent = AGENT.in_stack(stack, opencode_binary)
    explore = [{"description": f"Look at the {what}", "prompt": f"Find out what the {what} says.", "subagent_type": "explore"}
               for what in ("readme", "history")]
    read = {"tool": "read", "inputs": [{"filePath": str(agent.project.workdir / "README.md")}]}
    stack.script([{"tool": "task", "inputs": explore}, read, read])
    started = time.monotonic()
    run(agent, "Explore this repository with two explore agents at once.")
    turns = finished(stack, "opencode run starting two explore subagents", started, capsys)

    instances: dict[str, list] = {}
    for turn in turns:
        if "x-parent-session-id" in turn.headers:
            instances.setdefault(turn.headers["x-session-id"], []).append(turn)
    assert_each_instance_reuses_its_own_prefix(instances)
