"""The real Pi CLI, end to end: every continued turn and every new conversation is warm.

The stack is what a user runs, on 127.0.0.1, offline:

    pi -p ... (pinned npm release, the stack's provider in an extension of ours, a scratch HOME and git repository)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, OpenAI path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

Pi's prompt is ~1.4K tokens of the tiny model (a system prompt ending in its
date and working directory, four tools). The tests share one stack
(`agent_turns.AgentUnderTest`); each runs Pi in a fresh project. The tiny
model never calls a tool, so the tool call (a `read`) is scripted at the
engine's door (`tests/support/scripted_tool_use.py`): that request still
reaches the real engine, which prefills and caches it; only its answer is
replaced. Each test prints what each request reused.
"""

from __future__ import annotations

import shutil
import time

import pytest

from stable_prefix.agents import pi
from stable_prefix.agents.scratch_project import ScratchProject
from tests.support import agent_turns
from tests.support.agent_turns import (
    AFTER_MIDNIGHT,
    BEFORE_MIDNIGHT,
    MIN_CONTINUED_REUSE,
    MIN_NEW_CONVERSATION_REUSE,
    SERVED_MODEL,
    assert_every_later_request_reuses,
    lane_turns,
    run,
    warm_and_shipped_answers,
)
from tests.support.agent_turns import finished_turns as finished

pytestmark = [pytest.mark.server, pytest.mark.slow]

ANSWER_TOKENS = 64
AGENT = agent_turns.AgentUnderTest(pi.Pi, ANSWER_TOKENS)
stack = AGENT.stack_fixture()


def system_prompt(turn) -> str:
    return turn.capture["client_body"]["messages"][0]["content"]


def test_a_conversation_with_a_tool_turn_reuses_its_prompt_on_every_continued_turn(stack, pi_cli, tmp_path, capsys):
    agent = AGENT.in_stack(stack, pi_cli)
    stack.script([{"tool": "read", "inputs": [{"path": "README.md"}]}])
    started = time.monotonic()
    for index, prompt in enumerate(["Read the README.", "Now say it in French.", "And in German."]):
        run(agent, prompt, continue_conversation=index > 0)
    turns = finished(stack, "pi -p, a tool turn, then --continue twice", started, capsys)
    main = lane_turns(turns, "main")
    warm, cold = warm_and_shipped_answers(stack, tmp_path, main[-1].arrived["request"])

    assert {turn.lane for turn in turns} == {"main"}, "Pi sends no side requests in print mode"
    assert len(main) == 4, "one request per turn, and one more after the tool result"
    assert any(message["role"] == "tool" for message in main[1].arrived["request"]["messages"]), "Pi ran the scripted read"
    assert len({turn.headers["session_id"] for turn in main}) == 1, "--continue stays in the session"
    assert_every_later_request_reuses(main, MIN_CONTINUED_REUSE)
    assert all(turn.diagnosis["prefix_kept"] for turn in main[1:])
    assert warm == cold, "the answer served from the cache differs from vllm-mlx's as shipped"


def test_a_new_conversation_in_the_same_repository_after_an_edit_and_a_commit_reuses_its_prompt(stack, pi_cli, capsys):
    agent = AGENT.in_stack(stack, pi_cli)
    started = time.monotonic()
    run(agent, "Say hello in one word.")
    agent.project.commit("README.md", "A small project, with notes.\n", "Say more in the README")
    agent.project.commit("notes.md", "Remember to write the tests first.\n", "Add notes")
    stats_before = stack.cache_stats()
    run(agent, "Now say goodbye in one word.")
    turns = finished(stack, "pi -p, an edit and a commit, pi -p again", started, capsys)
    stats = stack.cache_stats()

    first, second = lane_turns(turns, "main")
    assert first.headers["session_id"] != second.headers["session_id"]
    assert second.diagnosis["cause"] == "new conversation" and second.diagnosis["first_divergence"]["path"].startswith("messages[1]")
    assert second.reuse >= MIN_NEW_CONVERSATION_REUSE, second.diagnosis["line"]
    assert stats["tokens_reused"] - stats_before["tokens_reused"] >= second.reused_tokens


def test_a_new_conversation_in_another_project_shares_the_system_prompt_and_tools(stack, pi_cli, capsys):
    agent = AGENT.in_stack(stack, pi_cli)
    other_root = stack.captures_dir.parent / "other-agent"
    shutil.rmtree(other_root, ignore_errors=True)
    other = pi.Pi(pi_cli, ScratchProject.create(other_root), stack.proxy.url, SERVED_MODEL, ANSWER_TOKENS)
    started = time.monotonic()
    run(agent, "Say hello in one word.")
    run(other, "Say hello in one word.")
    turns = finished(stack, "pi -p in one project, then in another", started, capsys)

    first, second = lane_turns(turns, "main")
    assert system_prompt(first) != system_prompt(second), "both system prompts are the same; does Pi still write its working directory there?"
    assert second.diagnosis["neutralized"]["rule"] == "conversation_context", second.diagnosis["line"]
    assert second.diagnosis["cause"] == "environment" and second.diagnosis["first_divergence"]["path"].startswith("messages[1]")
    assert second.reuse >= MIN_NEW_CONVERSATION_REUSE, second.diagnosis["line"]


def test_a_conversation_continued_past_midnight_keeps_its_system_prompt_and_tools(stack, pi_cli, capsys):
    agent = AGENT.in_stack(stack, pi_cli)
    started = time.monotonic()
    run(agent, "Say hello in one word.", timezone=BEFORE_MIDNIGHT)
    run(agent, "Say it again.", continue_conversation=True, timezone=AFTER_MIDNIGHT)
    turns = finished(stack, "pi -p before midnight, --continue after", started, capsys)

    before, after = lane_turns(turns, "main")
    assert system_prompt(before) != system_prompt(after), "the two days' system prompts are the same; does Pi still write the date there?"
    assert after.diagnosis["cause"] == "environment" and after.diagnosis["first_divergence"]["path"].startswith("messages[1]")
    assert after.diagnosis["neutralized"]["rule"] == "conversation_context"
    assert after.reuse >= MIN_NEW_CONVERSATION_REUSE, after.diagnosis["line"]
