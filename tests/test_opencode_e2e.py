"""The real opencode CLI, end to end: every continued turn and every new conversation is warm.

The stack is what a user runs, on 127.0.0.1, offline:

    opencode run ... (pinned npm release, its config in OPENCODE_CONFIG_CONTENT, a scratch HOME and git repository)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, OpenAI path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

opencode's prompt is ~7.2K tokens of the tiny model (system prompt, ten tools).
The tiny model never calls a tool, so the tool calls (a `read`, two `task`
subagents and their first steps) are scripted at the engine's door
(`tests/support/scripted_tool_use.py`): those requests still reach the real
engine, which prefills and caches them; only their answers are replaced.
Each test prints what each request reused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stable_prefix.tools import opencode
from stable_prefix.tools.scratch_project import ScratchProject
from tests.support import agent_stack
from tests.support.agent_stack import Stack
from tests.support.agent_turns import (
    CHAT_PATH,
    assert_every_later_request_reuses,
    assert_ran,
    finished_turns,
    greedy_answer,
    lane_turns,
)
from tests.support.models import require_model

pytestmark = [pytest.mark.server, pytest.mark.slow]

SERVED_MODEL = "tiny-model-test"
ANSWER_TOKENS = 64
MIN_CONTINUED_REUSE = 0.95
MIN_NEW_CONVERSATION_REUSE = 0.90
TURN_TIMEOUT_S = 600.0
# Twenty-six hours apart: whenever the test runs, the two dates opencode writes differ.
BEFORE_MIDNIGHT, AFTER_MIDNIGHT = "Etc/GMT+12", "Etc/GMT-14"


@contextlib.contextmanager
def agent_in_stack(tmp_path: Path, binary: Path, script: list[dict] | None = None) -> Iterator[tuple[Stack, opencode.OpenCode]]:
    with agent_stack.running_stack(tmp_path / "stack", require_model(), SERVED_MODEL, ANSWER_TOKENS, CHAT_PATH, script) as stack:
        project = ScratchProject.create(tmp_path / "opencode")
        yield stack, opencode.OpenCode(binary, project, stack.proxy.url, SERVED_MODEL, ANSWER_TOKENS)


def run(cli: opencode.OpenCode, prompt: str, **options) -> None:
    assert_ran(cli.run_turn(prompt, timeout=TURN_TIMEOUT_S, **options), f"opencode run {prompt!r}")


def finished(stack: Stack, title: str, started: float, capsys) -> list:
    return finished_turns(stack, title, started, capsys, SERVED_MODEL, TURN_TIMEOUT_S)


def test_a_conversation_with_a_tool_turn_reuses_its_prompt_on_every_continued_turn(opencode_binary, tmp_path, capsys):
    readme = tmp_path / "opencode" / "project" / "README.md"
    with agent_in_stack(tmp_path, opencode_binary, [{"tool": "read", "inputs": [{"filePath": str(readme)}]}]) as (stack, agent):
        started = time.monotonic()
        reused_after_each_turn = []
        for index, prompt in enumerate(["Read the README.", "Now say it in French.", "And in German."]):
            run(agent, prompt, continue_conversation=index > 0)
            reused_after_each_turn.append(stack.cache_stats()["tokens_reused"])
        turns = finished(stack, "opencode run, a tool turn, then --continue twice", started, capsys)
        main = lane_turns(turns, "main")
        with agent_stack.shipped_engine(tmp_path / "shipped", require_model(), SERVED_MODEL) as shipped:
            last = main[-1].arrived["request"]
            warm, cold = greedy_answer(stack.engine.url, last), greedy_answer(shipped.url, last)

    assert {turn.lane for turn in turns} == {"main", "side:title"}, "the title request has a lane of its own"
    assert len(main) == 4, "one request per turn, and one more after the tool result"
    assert any(message["role"] == "tool" for message in main[1].arrived["request"]["messages"]), "opencode ran the scripted read"
    assert len({turn.headers["x-session-id"] for turn in main}) == 1, "--continue stays in the session"
    assert_every_later_request_reuses(main, MIN_CONTINUED_REUSE)
    assert all(later > earlier for earlier, later in zip(reused_after_each_turn, reused_after_each_turn[1:]))
    assert all(turn.diagnosis["prefix_kept"] for turn in main[1:])
    assert warm == cold, "the answer served from the cache differs from vllm-mlx's as shipped"


def test_a_new_conversation_in_the_same_repository_after_an_edit_and_a_commit_reuses_its_prompt(opencode_binary, tmp_path, capsys):
    with agent_in_stack(tmp_path, opencode_binary) as (stack, agent):
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


def test_plan_mode_turns_keep_their_prefix_and_the_switch_to_build_is_named(opencode_binary, tmp_path, capsys):
    with agent_in_stack(tmp_path, opencode_binary) as (stack, agent):
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


def test_a_conversation_continued_past_midnight_keeps_its_system_prompt_and_tools(opencode_binary, tmp_path, capsys):
    with agent_in_stack(tmp_path, opencode_binary) as (stack, agent):
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


def test_two_explore_subagents_each_reuse_their_own_instances_prefix(opencode_binary, tmp_path, capsys):
    readme = str(tmp_path / "opencode" / "project" / "README.md")
    explore = [{"description": f"Look at the {what}", "prompt": f"Find out what the {what} says.", "subagent_type": "explore"}
               for what in ("readme", "history")]
    script = [{"tool": "task", "inputs": explore}] + [{"tool": "read", "inputs": [{"filePath": readme}]}] * 2
    with agent_in_stack(tmp_path, opencode_binary, script) as (stack, agent):
        started = time.monotonic()
        run(agent, "Explore this repository with two explore agents at once.")
        turns = finished(stack, "opencode run starting two explore subagents", started, capsys)

    instances: dict[str, list] = {}
    for turn in turns:
        if "x-parent-session-id" in turn.headers:
            instances.setdefault(turn.headers["x-session-id"], []).append(turn)
    assert len(instances) == 2, f"expected two subagent sessions, saw {sorted(instances)}"
    assert len({turn.lane.split("@")[0] for requests in instances.values() for turn in requests}) == 1, "both are of one type"
    for requests in instances.values():
        assert len({turn.lane for turn in requests}) == 1 and "@" in requests[0].lane, "each instance has a lane of its own"
        first, *later = requests
        assert later, "its scripted step gives each instance a second request"
        for turn in later:
            assert turn.diagnosis["prefix_kept"] and turn.reused_tokens >= MIN_CONTINUED_REUSE * first.prompt_tokens, turn.diagnosis["line"]
