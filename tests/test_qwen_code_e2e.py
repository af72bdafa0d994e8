"""The real Qwen Code CLI, end to end: every continued turn and every new conversation is warm.

The stack is what a user runs, on 127.0.0.1, offline:

    qwen PROMPT (pinned npm release on the node on PATH, a system settings file, a scratch HOME and git repository)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, OpenAI path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test

Qwen Code's first request is ~13.7K tokens of the tiny model (its
non-interactive tool set; ~17.4K with every tool, as under `--approval-mode
yolo`). After each turn it sends a managed-memory request of its own, on its
own lane. The tiny model never calls a tool, so the tool calls (a
`read_file`, two `agent` subagents and their first steps) are scripted at the
engine's door (`tests/support/scripted_tool_use.py`): those requests still
reach the real engine, which prefills and caches them; only their answers are
replaced. Each test prints what each request reused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stable_prefix.tools import qwen_code
from stable_prefix.tools.scratch_project import ScratchProject
from tests.support import agent_stack
from tests.support.agent_stack import Stack
from tests.support.agent_turns import (
    CHAT_PATH,
    assert_ran,
    finished_turns,
    greedy_answer,
    lane_turns,
)
from tests.support.models import require_model

pytestmark = [pytest.mark.server, pytest.mark.slow]

SERVED_MODEL = "tiny-model-test"
# The tiny model ends an answer after ~40 tokens, now and then much later: an answer cut at the
# cap would be asked again by Qwen Code with a larger cap, then resumed.
ANSWER_TOKENS = 256
MIN_CONTINUED_REUSE = 0.95
MIN_NEW_CONVERSATION_REUSE = 0.90
TURN_TIMEOUT_S = 600.0


@contextlib.contextmanager
def agent_in_stack(tmp_path: Path, cli: Path, script: list[dict] | None = None) -> Iterator[tuple[Stack, qwen_code.QwenCode]]:
    with agent_stack.running_stack(tmp_path / "stack", require_model(), SERVED_MODEL, ANSWER_TOKENS, CHAT_PATH, script) as stack:
        project = ScratchProject.create(tmp_path / "qwen")
        yield stack, qwen_code.QwenCode(cli, project, stack.proxy.url, SERVED_MODEL, ANSWER_TOKENS)


def run(cli: qwen_code.QwenCode, prompt: str, **options) -> None:
    assert_ran(cli.run_turn(prompt, timeout=TURN_TIMEOUT_S, **options), f"qwen {prompt!r}")


def finished(stack: Stack, title: str, started: float, capsys) -> list:
    return finished_turns(stack, title, started, capsys, SERVED_MODEL, TURN_TIMEOUT_S)


# A file worth reading: as Qwen Code sends them, the next turn re-reads the whole tool turn.
DESIGN_NOTES = "".join(f"{number}. The parser keeps every token of line {number} and reports where it stopped.\n" for number in range(1, 80))


def test_a_conversation_with_a_tool_turn_reuses_its_prompt_on_every_continued_turn(qwen_cli, tmp_path, capsys):
    notes = tmp_path / "qwen" / "project" / "design.md"
    with agent_in_stack(tmp_path, qwen_cli, [{"tool": "read_file", "inputs": [{"file_path": str(notes)}]}]) as (stack, agent):
        agent.project.commit("design.md", DESIGN_NOTES, "Write down the design")
        started = time.monotonic()
        reused_after_each_turn = []
        for index, prompt in enumerate(["Read the design notes.", "Now say it in French.", "And in German."]):
            run(agent, prompt, continue_conversation=index > 0)
            reused_after_each_turn.append(stack.cache_stats()["tokens_reused"])
        turns = finished(stack, "qwen, a tool turn, then qwen --continue twice", started, capsys)
        main = lane_turns(turns, "main")
        with agent_stack.shipped_engine(tmp_path / "shipped", require_model(), SERVED_MODEL) as shipped:
            last = main[-1].arrived["request"]
            warm, cold = greedy_answer(stack.engine.url, last), greedy_answer(shipped.url, last)

    assert len(main) >= 4, "one request per turn, and one more after the tool result"
    assert any(message["role"] == "tool" for message in main[1].arrived["request"]["messages"]), "Qwen Code ran the scripted read_file"
    assert {turn.lane for turn in turns} - {"main"}, "its managed-memory requests have a lane of their own"
    tool_step, *continued = main[1:]
    assert tool_step.reused_tokens >= main[0].prompt_tokens, "the step after the tool call reuses all of the first request"
    for turn in continued:
        assert turn.reuse >= MIN_CONTINUED_REUSE, turn.diagnosis["line"]
    assert all(later > earlier for earlier, later in zip(reused_after_each_turn, reused_after_each_turn[1:]))
    assert all(turn.diagnosis["prefix_kept"] for turn in main[1:])
    moved = [turn for turn in main if turn.diagnosis["neutralized"]]
    assert moved and all(turn.diagnosis["neutralized"]["rule"] == "turn_reminders" for turn in moved), (
        "as sent, each continued turn broke where the date reminder left the previous turn's message")
    assert warm == cold, "the answer served from the cache differs from vllm-mlx's as shipped"


def test_a_new_conversation_in_the_same_repository_after_an_edit_and_a_commit_reuses_its_prompt(qwen_cli, tmp_path, capsys):
    with agent_in_stack(tmp_path, qwen_cli) as (stack, agent):
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


def test_a_conversation_continued_after_a_commit_keeps_its_system_prompt_tools_and_fixed_reminders(qwen_cli, tmp_path, capsys):
    with agent_in_stack(tmp_path, qwen_cli) as (stack, agent):
        started = time.monotonic()
        run(agent, "Say hello in one word.")
        agent.project.commit("notes.md", "Remember to write the tests first.\n", "Add notes")
        run(agent, "Go on after the commit.", continue_conversation=True)
        turns = finished(stack, "qwen, a commit (a new file), qwen --continue", started, capsys)

    before, after = lane_turns(turns, "main")[-2:]
    assert after.diagnosis["cause"] == "context changed", "Qwen Code rebuilt its startup context; the conversation went on"
    assert after.reuse >= MIN_NEW_CONVERSATION_REUSE, after.diagnosis["line"]


def test_two_explore_subagents_each_reuse_their_own_instances_prefix(qwen_cli, tmp_path, capsys):
    readme = str(tmp_path / "qwen" / "project" / "README.md")
    explore = [{"description": f"Look at the {what}", "prompt": f"Find out what the {what} says.", "subagent_type": "Explore"}
               for what in ("readme", "history")]
    script = [{"tool": "agent", "inputs": explore}] + [{"tool": "read_file", "inputs": [{"file_path": readme}]}] * 2
    with agent_in_stack(tmp_path, qwen_cli, script) as (stack, agent):
        started = time.monotonic()
        run(agent, "Explore this repository with two Explore agents at once.", approval_mode="yolo")
        turns = finished(stack, "qwen --approval-mode yolo starting two Explore subagents", started, capsys)

    instances: dict[str, list] = {}
    for turn in turns:
        if turn.lane.startswith("sub:") and "Find out what the" in str(turn.capture["client_body"]["messages"][1]):
            instances.setdefault(turn.lane, []).append(turn)
    assert len(instances) == 2, f"expected two Explore instances, saw lanes {sorted({turn.lane for turn in turns})}"
    assert len({lane.split("@")[0] for lane in instances}) == 1, "both are of one type"
    for requests in instances.values():
        first, *later = requests
        assert later, "its scripted step gives each instance a second request"
        for turn in later:
            assert turn.diagnosis["prefix_kept"] and turn.reused_tokens >= MIN_CONTINUED_REUSE * first.prompt_tokens, turn.diagnosis["line"]
