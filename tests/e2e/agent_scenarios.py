"""The end-to-end scenarios the agents on the OpenAI path share (opencode, Pi, Qwen Code), each written once.

An agent's test module holds one class: the scenarios it runs (the classes below it inherits) and its case, in one
place: its driver and CLI, the command its runs are titled by, the tool it reads a file with, the header naming its
session, and the few checks that are its own (methods it overrides). One stack per class (engine, door, proxy:
`tests/support/agent_stack.py`) serves its tests: the engine starts once, and what a test's first request shares with
the earlier ones (system prompt, tools) is not prefilled again. Each test gets the agent in a fresh scratch project,
always at the same path (agents write it into their prompts), nothing scripted at the engine's door until it scripts
it, and a window on the stack's records that starts with the test. pytest runs a class's inherited tests from its
last base to its first: an agent's class lists its scenarios last first, so the conversation with a tool turn runs
first, on the coldest engine.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from stable_prefix.agents.driver import AgentDriver
from stable_prefix.agents.scratch_project import ScratchProject
from tests.support import agent_stack
from tests.support.agent_stack import Stack, assert_reuse_grows_with_every_turn
from tests.support.agent_turns import (
    AFTER_MIDNIGHT,
    BEFORE_MIDNIGHT,
    CHAT_PATH,
    MIN_CONTINUED_REUSE,
    MIN_NEW_CONVERSATION_REUSE,
    SERVED_MODEL,
    Turn,
    assert_each_instance_reuses_its_own_prefix,
    lane_turns,
    run,
    warm_and_shipped_answers,
)
from tests.support.agent_turns import finished_turns as finished
from tests.support.models import require_model

# What a continued turn reuses is measured on what the previous request of its lane sent (its prompt, the reply
# aside), not on its own whole prompt: the engine caches the tokens it generated, and a random-weight model's greedy
# reply, sent back as text, may re-tokenize into others (and under `--draft auto` the reply itself changed with the
# machine's load), so a bound on the whole prompt failed under load (#36, item 8). The generation prompt's last
# token (`<|im_start|>assistant` + newline) may merge with the reply's first characters: one token of slack.
SEAM_TOKENS = 1


def system_prompt(turn: Turn) -> str:
    return turn.capture["client_body"]["messages"][0]["content"]


def assert_reuses_the_previous_prompt(previous: Turn, turn: Turn) -> None:
    """`turn` reused every token the previous request of its lane sent (the seam aside)."""
    assert turn.reused_tokens >= previous.prompt_tokens - SEAM_TOKENS, (
        f"request {turn.number} reused {turn.reused_tokens:,} of its {turn.prompt_tokens:,} prompt tokens, less than the "
        f"{previous.prompt_tokens:,} request {previous.number} sent: {turn.diagnosis['line']}")


class AgentCase:
    """What every scenario asks of an agent's class."""

    NAME: ClassVar[str]  # as the messages name it: "opencode", "Pi", "Qwen Code"
    DRIVER: ClassVar[type[AgentDriver]]
    BINARY: ClassVar[str]  # the conftest fixture that installs the pinned CLI
    COMMAND: ClassVar[str]  # how a run's printed title names a turn: "opencode run", "pi -p", "qwen"
    ANSWER_TOKENS: ClassVar[int]  # the output cap the stack serves
    SESSION_HEADER: ClassVar[str | None] = None  # the header naming its session on every request, if it sends one

    def read_step(self, project: ScratchProject, name: str) -> dict:
        """The tool call, scripted at the engine's door, that reads the project's file `name`."""
        raise NotImplementedError

    @pytest.fixture(scope="class")
    def stack(self, tmp_path_factory) -> Iterator[Stack]:
        """The stack the class's tests share, its door ready for scripted tool calls."""
        root = tmp_path_factory.mktemp("stack")
        with agent_stack.running_stack(root, require_model(), SERVED_MODEL, self.ANSWER_TOKENS, CHAT_PATH, script=[]) as shared:
            yield shared

    @pytest.fixture
    def binary(self, request):
        return request.getfixturevalue(self.BINARY)

    def driver_in(self, stack: Stack, binary, folder: str) -> AgentDriver:
        """The agent in a fresh scratch git repository, `<stack folder>/<folder>/project`."""
        root = stack.captures_dir.parent / folder
        shutil.rmtree(root, ignore_errors=True)
        return self.DRIVER(binary, ScratchProject.create(root), stack.proxy.url, SERVED_MODEL, self.ANSWER_TOKENS)

    @pytest.fixture
    def agent(self, stack, binary) -> AgentDriver:
        """The agent in a fresh project (always `<stack folder>/agent/project`), the stack's records from here on, nothing scripted."""
        stack.script([])
        stack.new_window()
        return self.driver_in(stack, binary, "agent")


class ContinuedTurns(AgentCase):
    """A conversation with a tool turn, continued: every continued turn reuses its prompt."""

    TOOL_TURN_PROMPTS: ClassVar[tuple[str, ...]] = ("Read the README.", "Now say it in French.", "And in German.")
    TOOL_TURN_FILE: ClassVar[str] = "README.md"  # the file the scripted tool call reads
    # One request per turn and one more after the tool result, and no other on the main lane.
    EXACT_MAIN_REQUESTS: ClassVar[bool] = True

    def prepare_tool_turn(self, project: ScratchProject) -> None:
        """What the project needs before the first turn (the file it reads is its README unless said)."""

    def assert_side_lanes(self, lanes: set[str]) -> None:
        """The lanes beside `main` its turns sent requests on."""
        raise NotImplementedError

    def assert_tool_step_reuses(self, tool_step: Turn, first: Turn) -> None:
        assert tool_step.reuse >= MIN_CONTINUED_REUSE, (f"request {tool_step.number} ({tool_step.lane}) reused {tool_step.reused_tokens:,} of "
                                                        f"{tool_step.prompt_tokens:,} prompt tokens: {tool_step.diagnosis['line']}")

    def assert_continued_turns_kept_by_the_rules(self, main: list[Turn]) -> None:
        """What the agent's rules did on its continued turns, where that is its own."""

    def test_a_conversation_with_a_tool_turn_reuses_its_prompt_on_every_continued_turn(self, stack, agent, tmp_path, capsys):
        self.prepare_tool_turn(agent.project)
        stack.script([self.read_step(agent.project, self.TOOL_TURN_FILE)])
        started = time.monotonic()
        reused_after_each_turn = stack.reused_after_each_turn(
            self.TOOL_TURN_PROMPTS, lambda index, prompt: run(agent, prompt, continue_conversation=index > 0))
        turns = finished(stack, f"{self.COMMAND}, a tool turn, then --continue", started, capsys)
        main = lane_turns(turns, "main")
        warm, cold = warm_and_shipped_answers(stack, tmp_path, main[-1].arrived["request"])

        self.assert_side_lanes({turn.lane for turn in turns} - {"main"})
        requests = len(self.TOOL_TURN_PROMPTS) + 1
        assert len(main) == requests if self.EXACT_MAIN_REQUESTS else len(main) >= requests, "one request per turn, and one more after the tool result"
        assert any(message["role"] == "tool" for message in main[1].arrived["request"]["messages"]), f"{self.NAME} ran the scripted read"
        if self.SESSION_HEADER:
            assert len({turn.headers[self.SESSION_HEADER] for turn in main}) == 1, "--continue stays in the session"
        self.assert_tool_step_reuses(main[1], main[0])
        for previous, turn in zip(main[1:], main[2:]):
            assert_reuses_the_previous_prompt(previous, turn)
        assert_reuse_grows_with_every_turn(reused_after_each_turn)
        assert all(turn.diagnosis["prefix_kept"] for turn in main[1:])
        self.assert_continued_turns_kept_by_the_rules(main)
        assert warm == cold, "the answer served from the cache differs from vllm-mlx's as shipped"


class NewConversationAfterACommit(AgentCase):
    """A new conversation in the same repository, after an edit and a commit, shares the system prompt and tools."""

    # What the agent writes of the git status into its system prompt, where it does.
    GIT_STATUS_MARKER: ClassVar[str | None] = None

    def test_a_new_conversation_in_the_same_repository_after_an_edit_and_a_commit_reuses_its_prompt(self, stack, agent, capsys):
        started = time.monotonic()
        run(agent, "Say hello in one word.")
        agent.project.commit("README.md", "A small project, with notes.\n", "Say more in the README")
        agent.project.commit("notes.md", "Remember to write the tests first.\n", "Add notes")
        stats_before = stack.cache_stats()
        run(agent, "Now say goodbye in one word.")
        turns = finished(stack, f"{self.COMMAND}, an edit and a commit, {self.COMMAND} again", started, capsys)
        stats = stack.cache_stats()

        first, second = lane_turns(turns, "main")
        if self.SESSION_HEADER:
            assert first.headers[self.SESSION_HEADER] != second.headers[self.SESSION_HEADER]
        assert second.diagnosis["cause"] == "new conversation", second.diagnosis["line"]
        assert second.diagnosis["first_divergence"]["path"].startswith("messages[1]"), "system prompt and tools stay shared"
        if self.GIT_STATUS_MARKER:
            assert self.GIT_STATUS_MARKER in system_prompt(second), f"{self.NAME} sent no git status ({self.GIT_STATUS_MARKER!r}); has it changed?"
        assert second.reuse >= MIN_NEW_CONVERSATION_REUSE, second.diagnosis["line"]
        assert stats["tokens_reused"] - stats_before["tokens_reused"] >= second.reused_tokens


class PastMidnight(AgentCase):
    """A conversation continued past midnight: the date in the system prompt moves, the rules keep the prefix."""

    def test_a_conversation_continued_past_midnight_keeps_its_system_prompt_and_tools(self, stack, agent, capsys):
        started = time.monotonic()
        run(agent, "Say hello in one word.", timezone=BEFORE_MIDNIGHT)
        run(agent, "Say it again.", continue_conversation=True, timezone=AFTER_MIDNIGHT)
        turns = finished(stack, f"{self.COMMAND} before midnight, --continue after", started, capsys)

        before, after = lane_turns(turns, "main")
        assert system_prompt(before) != system_prompt(after), f"the two days' system prompts are the same; does {self.NAME} still write the date there?"
        assert after.diagnosis["cause"] == "environment" and after.diagnosis["first_divergence"]["path"].startswith("messages[1]")
        assert after.diagnosis["neutralized"]["rule"] == "conversation_context"
        assert after.reuse >= MIN_NEW_CONVERSATION_REUSE, after.diagnosis["line"]


class TwoSubagents(AgentCase):
    """Two Explore subagents at once, each on a lane of its own: each reuses its own instance's prefix."""

    SUBAGENT_TOOL: ClassVar[str]  # the tool the main agent starts a subagent with
    SUBAGENT_TYPE: ClassVar[str]  # its Explore subagent's name
    SUBAGENT_TURN_OPTIONS: ClassVar[dict[str, Any]] = {}  # what the turn needs for the agent to start subagents unasked

    def subagent_instances(self, turns: list[Turn]) -> dict[str, list[Turn]]:
        """The subagents' requests, by instance."""
        raise NotImplementedError

    def test_two_explore_subagents_each_reuse_their_own_instances_prefix(self, stack, agent, capsys):
        explore = [{"description": f"Look at the {what}", "prompt": f"Find out what the {what} says.", "subagent_type": self.SUBAGENT_TYPE}
                   for what in ("readme", "history")]
        read = self.read_step(agent.project, "README.md")
        stack.script([{"tool": self.SUBAGENT_TOOL, "inputs": explore}, read, read])
        started = time.monotonic()
        run(agent, f"Explore this repository with two {self.SUBAGENT_TYPE} agents at once.", **self.SUBAGENT_TURN_OPTIONS)
        turns = finished(stack, f"{self.COMMAND} starting two {self.SUBAGENT_TYPE} subagents", started, capsys)

        assert_each_instance_reuses_its_own_prefix(self.subagent_instances(turns))
