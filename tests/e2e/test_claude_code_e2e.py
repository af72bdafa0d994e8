"""The real Claude Code CLI, end to end: its warm turns hit the engine's cache.

The stack is what a user runs, on 127.0.0.1, offline:

    claude (pinned npm release, throwaway config)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model              (patched vllm-mlx, tiny random model)

A cold Claude Code prompt is ~11.5K tokens of the tiny model; it costs about
half a minute to prefill on a 2-core CPU, a warm turn about a second. Each test
makes one cold request per lane and a few warm ones, and prints what it saw.

The tiny model never calls a tool, so for the subagent test the main agent's
decision to start two subagents (and each subagent's first step) is scripted
at the engine's door (`tests/support/scripted_tool_use.py`): those requests
still reach the real engine, which prefills and caches them; only their
answers are replaced. Everything the subagents send is Claude Code's own.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stable_prefix.agents import claude_code
from tests.support import agent_stack
from tests.support.agent_stack import Stack, assert_reuse_grows_with_every_turn
from tests.support.processes import REPO_ROOT

pytestmark = [pytest.mark.server, pytest.mark.slow]

TINY_MODEL = REPO_ROOT / "build" / "tiny-model"
SERVED_MODEL = "tiny-model"
MESSAGES_PATH = "/v1/messages"
# The tiny model talks nonsense; a few tokens per answer keep a turn at the cost of its prefill.
ANSWER_TOKENS = 16
BILLING_HEADER = "x-anthropic-billing-header"
MIN_STABLE_PREFIX_RATIO = 0.90
# The first request of a new conversation in the same repository (issue 9's target).
MIN_NEW_CONVERSATION_REUSE = 0.95
PRINT_MODE_TURNS = ["Say hello in one word.", "Now say it in French.", "And in German."]
INTERACTIVE_TURNS = ["What is the capital of France?", "And of Italy?"]
COLD_TURN_TIMEOUT_S = 600.0


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path) as started:
        yield started


@contextlib.contextmanager
def running_stack(tmp_path: Path, script: list[dict] | None = None, *, forward_proxy: bool = False) -> Iterator[Stack]:
    with agent_stack.running_stack(tmp_path, TINY_MODEL, SERVED_MODEL, ANSWER_TOKENS, MESSAGES_PATH, script, forward_proxy=forward_proxy) as started:
        yield started


def is_main_agent(request: dict) -> bool:
    """The main agent carries the tool definitions; title requests carry none."""
    return bool(request.get("tools"))


@dataclass
class Turn:
    """One request as the test saw it: at the engine's door, and in the captures."""

    number: int
    kind: str  # main / side
    lane: str
    prompt_tokens: int
    reused_tokens: int
    ttft_s: float | None
    stable_prefix_ratio: float | None
    arrived: dict
    capture: dict


def collect_turns(stack: Stack) -> list[Turn]:
    arrived = stack.arrived()
    captures = stack.captures()
    assert len(captures) == len(arrived), (
        f"the proxy captured {len(captures)} /v1/messages requests, the engine received {len(arrived)}")
    turns = []
    unmatched = list(arrived)
    for number, capture in enumerate(captures, start=1):
        # Matched by content, not position: concurrent requests (a title request beside
        # the main one) may finish in either order.
        record = next((r for r in unmatched if r["request"] == capture["forwarded_body"]), None)
        assert record is not None, f"capture {capture['seq']} ({capture['lane']}) is not what the engine received"
        unmatched.remove(record)
        usage = record["usage"]
        reused = usage.get("cache_read_input_tokens", 0)
        diagnosis = capture["diagnosis"]
        turns.append(Turn(
            number=number,
            kind="main" if is_main_agent(record["request"]) else "side",
            lane=capture["lane"],
            prompt_tokens=usage.get("input_tokens", 0) + reused,
            reused_tokens=reused,
            ttft_s=record["ttft_s"],
            # Against the previous request of the same lane; none for the first of a lane.
            stable_prefix_ratio=diagnosis["stable_prefix_ratio"] if diagnosis["request_in_lane"] > 1 else None,
            arrived=record,
            capture=capture,
        ))
    return turns


def print_table(title: str, turns: list[Turn], stats: dict, wall_s: float) -> None:
    print(f"\n{title}: {len(turns)} requests in {wall_s:.1f}s")
    print(f"{'#':>3}  {'kind':<5} {'lane':<28} {'prompt tok':>10} {'reused':>8} {'TTFT s':>7} {'stable prefix':>13}")
    for turn in turns:
        ttft = f"{turn.ttft_s:.2f}" if turn.ttft_s is not None else "-"
        ratio = f"{turn.stable_prefix_ratio:.1%}" if turn.stable_prefix_ratio is not None else "(first)"
        print(f"{turn.number:>3}  {turn.kind:<5} {turn.lane[:28]:<28} {turn.prompt_tokens:>10,} "
              f"{turn.reused_tokens:>8,} {ttft:>7} {ratio:>13}")
    print("engine cache: " + ", ".join(f"{key}={stats[key]}" for key in
                                       ("hits", "misses", "tokens_reused", "tokens_prefilled", "entries", "bytes")))


# --- the properties every run must have ---------------------------------------------------------


def assert_billing_block_never_reached_the_engine(turns: list[Turn]) -> None:
    sent_by_client = [turn for turn in turns if BILLING_HEADER in json.dumps(turn.capture["client_body"])]
    # The check below only means something if Claude Code sent the header in the first place.
    assert sent_by_client, "Claude Code sent no billing header at all; has the CLI changed?"
    for turn in turns:
        assert BILLING_HEADER not in json.dumps(turn.arrived["request"]), (
            f"request {turn.number} reached the engine with the billing header")


def assert_no_system_message_reached_the_engine_mid_conversation(turns: list[Turn]) -> None:
    """vllm-mlx hoists `role:system` messages to the front of the prompt; the proxy rewrites them in place."""
    def system_message_indexes(body: dict) -> list[int]:
        return [index for index, message in enumerate(body["messages"]) if message.get("role") == "system"]
    assert any(system_message_indexes(turn.capture["client_body"]) for turn in turns), (
        "Claude Code sent no role:system message; has the CLI changed?")
    for turn in turns:
        assert not system_message_indexes(turn.arrived["request"]), (
            f"request {turn.number} reached the engine with a role:system message inside messages")


def assert_requests_fit_the_server(turns: list[Turn]) -> None:
    for turn in turns:
        assert turn.arrived["status"] == 200, f"request {turn.number}: engine answered {turn.arrived['status']}"
        assert turn.arrived["request"]["model"] == SERVED_MODEL
        assert turn.arrived["request"]["max_tokens"] <= ANSWER_TOKENS


def assert_every_later_request_of_a_lane_is_warm(turns: list[Turn]) -> None:
    seen_lanes: set[str] = set()
    for turn in turns:
        if turn.lane not in seen_lanes:
            seen_lanes.add(turn.lane)
            continue
        assert turn.stable_prefix_ratio is not None and turn.stable_prefix_ratio >= MIN_STABLE_PREFIX_RATIO, (
            f"request {turn.number}: stable prefix below {MIN_STABLE_PREFIX_RATIO:.0%}: {turn.capture['diagnosis']['line']}")
        assert turn.reused_tokens > 0, f"request {turn.number} ({turn.lane}) was a cache miss: {turn.arrived['usage']}"
        assert (turn.capture["response"]["usage"] or {}).get("cache_read_input_tokens", 0) == turn.reused_tokens, (
            "the capture's usage differs from what the engine sent")


def one_scripted_turn(claude: claude_code.ClaudeCode, stack: Stack, prompt: str, title: str, capsys) -> list[Turn]:
    """One `claude -p` turn whose tool calls the door scripts; every request it made, its table printed."""
    started = time.monotonic()
    result = claude.print_turn(prompt, timeout=2 * COLD_TURN_TIMEOUT_S)
    assert result.returncode == 0, f"claude -p failed:\n{result.stdout}\n{result.stderr}"
    stack.wait_until_quiet(timeout=COLD_TURN_TIMEOUT_S)
    turns = collect_turns(stack)
    with capsys.disabled():  # the table is the run's evidence: show it even when the test passes
        print_table(title, turns, stack.cache_stats(), time.monotonic() - started)
    return turns


# --- the tests -----------------------------------------------------------------------------------


def test_print_mode_conversation_reuses_the_cache_on_every_continued_turn(stack: Stack, claude_binary: Path,
                                                                           tmp_path: Path, capsys) -> None:
    claude = claude_code.ClaudeCode(claude_binary, claude_code.create_sandbox(tmp_path / "claude"), stack.proxy.url)

    def claude_print(index: int, prompt: str) -> None:
        result = claude.print_turn(prompt, continue_conversation=index > 0, timeout=COLD_TURN_TIMEOUT_S)
        assert result.returncode == 0, f"claude -p turn {index + 1} failed:\n{result.stdout}\n{result.stderr}"

    started = time.monotonic()
    reused_after_each_turn = stack.reused_after_each_turn(PRINT_MODE_TURNS, claude_print)
    stack.wait_until_quiet(timeout=COLD_TURN_TIMEOUT_S)  # the proxy and the door write their records as the stream ends, maybe after claude exits
    turns = collect_turns(stack)
    with capsys.disabled():  # the table is the run's evidence: show it even when the test passes
        print_table("claude -p, then --continue", turns, stack.cache_stats(), time.monotonic() - started)

    assert [turn.kind for turn in turns] == ["main"] * len(PRINT_MODE_TURNS), "one main-agent request per -p turn"
    assert len({turn.lane for turn in turns}) == 1, "a continued conversation stays in its lane"
    assert_billing_block_never_reached_the_engine(turns)
    assert_no_system_message_reached_the_engine_mid_conversation(turns)
    assert_requests_fit_the_server(turns)
    assert_every_later_request_of_a_lane_is_warm(turns)
    assert_reuse_grows_with_every_turn(reused_after_each_turn)


def test_interactive_session_keeps_title_requests_in_their_own_lane(stack: Stack, claude_binary: Path,
                                                                    tmp_path: Path, capsys) -> None:
    claude = claude_code.ClaudeCode(claude_binary, claude_code.create_sandbox(tmp_path / "claude"), stack.proxy.url)
    started = time.monotonic()
    reused_after_each_turn = []
    with claude.interactive() as session:
        session.wait_until_ready()
        for number, message in enumerate(INTERACTIVE_TURNS, start=1):
            session.type_message(message)
            session.wait_for(lambda number=number: sum(is_main_agent(r["request"]) for r in stack.arrived()) >= number,
                             f"the main-agent request of turn {number}", COLD_TURN_TIMEOUT_S)
            reused_after_each_turn.append(stack.cache_stats()["tokens_reused"])
        # A side request of the last turn may still be on its way.
        stack.wait_until_quiet(timeout=COLD_TURN_TIMEOUT_S)
    turns = collect_turns(stack)
    with capsys.disabled():
        print_table("interactive claude under tmux", turns, stack.cache_stats(), time.monotonic() - started)

    main_lanes = {turn.lane for turn in turns if turn.kind == "main"}
    side_lanes = {turn.lane for turn in turns if turn.kind == "side"}
    assert [turn.kind for turn in turns].count("main") == len(INTERACTIVE_TURNS)
    assert side_lanes, "the interactive UI sent no side (title) request"
    assert len(main_lanes) == 1, f"the main agent's turns were split over lanes {main_lanes}"
    assert not main_lanes & side_lanes, f"side requests share the main agent's lane: {main_lanes & side_lanes}"
    assert_billing_block_never_reached_the_engine(turns)
    assert_no_system_message_reached_the_engine_mid_conversation(turns)
    assert_requests_fit_the_server(turns)
    assert_every_later_request_of_a_lane_is_warm(turns)
    assert reused_after_each_turn[-1] > reused_after_each_turn[0], (
        f"tokens_reused must grow with the warm turn: {reused_after_each_turn}")


def test_a_new_conversation_in_the_same_repository_reuses_its_prompt(stack: Stack, claude_binary: Path, tmp_path: Path, capsys) -> None:
    """Two `claude -p` conversations in one git repository, an edit and a commit
    between them: the second one's first request reuses >= 95% of its prompt
    (system prompt, tools and the environment message; it parts at the git status)."""
    sandbox = claude_code.create_sandbox(tmp_path / "claude", git_repository=True)
    claude = claude_code.ClaudeCode(claude_binary, sandbox, stack.proxy.url)
    started = time.monotonic()
    first = claude.print_turn("Say hello in one word.", timeout=COLD_TURN_TIMEOUT_S)
    assert first.returncode == 0, f"the first conversation failed:\n{first.stdout}\n{first.stderr}"
    sandbox.project.commit("notes.md", "Remember to write the tests first.\n", "Add notes")
    stats_before = stack.cache_stats()
    second = claude.print_turn("Now say goodbye in one word.", timeout=COLD_TURN_TIMEOUT_S)
    assert second.returncode == 0, f"the second conversation failed:\n{second.stdout}\n{second.stderr}"
    stack.wait_until_quiet(timeout=COLD_TURN_TIMEOUT_S)
    turns = collect_turns(stack)
    stats = stack.cache_stats()
    with capsys.disabled():
        print_table("claude -p, a commit, claude -p again in the same repository", turns, stats, time.monotonic() - started)
        print(f"second conversation's first request: {turns[-1].capture['diagnosis']['line']}")

    assert [turn.kind for turn in turns] == ["main", "main"] and turns[0].lane == turns[1].lane == "main"
    assert turns[0].arrived["session"] != turns[1].arrived["session"], "each `claude -p` is a new conversation"
    diagnosis = turns[1].capture["diagnosis"]
    assert diagnosis["cause"] == "new conversation", diagnosis["line"]
    assert diagnosis["first_divergence"]["path"].startswith("messages[1]"), "the break lies in the git status, behind the environment"
    assert_billing_block_never_reached_the_engine(turns)
    assert_requests_fit_the_server(turns)
    new_conversation = turns[1]
    assert new_conversation.reused_tokens >= MIN_NEW_CONVERSATION_REUSE * new_conversation.prompt_tokens, (
        f"the new conversation reused {new_conversation.reused_tokens:,} of {new_conversation.prompt_tokens:,} prompt tokens")
    assert stats["hits"] == stats_before["hits"] + 1
    assert stats["tokens_reused"] - stats_before["tokens_reused"] == new_conversation.reused_tokens


def test_two_subagent_tasks_of_one_type_each_reuse_their_own_instances_prefix(claude_binary: Path, tmp_path: Path, capsys) -> None:
    """The main agent starts two Explore subagents at once (scripted); each takes
    one scripted step and then its own next request reuses its own prefix."""
    explore = [{"subagent_type": "Explore", "description": f"Look at the {what}", "prompt": f"Find out what the {what} says."}
               for what in ("readme", "history")]
    script = [{"tool": "Agent", "inputs": explore},
              {"tool": "Bash", "inputs": [{"command": "ls", "description": "List the files"}]},
              {"tool": "Bash", "inputs": [{"command": "git log --oneline", "description": "Show the history"}]}]
    with running_stack(tmp_path / "stack", script) as stack:
        claude = claude_code.ClaudeCode(claude_binary, claude_code.create_sandbox(tmp_path / "claude", git_repository=True), stack.proxy.url)
        turns = one_scripted_turn(claude, stack, "Explore this repository with two Explore agents at once.",
                                  "claude -p starting two Explore subagents", capsys)

    instances: dict[str, list[Turn]] = {}
    for turn in turns:
        agent_id = turn.capture["request"]["headers"].get("x-claude-code-agent-id")
        if agent_id:
            instances.setdefault(agent_id, []).append(turn)
    assert len(instances) == 2, f"expected two subagent instances, saw agent ids {sorted(instances)}"
    groups = set()
    for agent_id, requests in instances.items():
        lanes = {turn.lane for turn in requests}
        assert lanes == {f"{requests[0].lane.split('@')[0]}@{agent_id[:8]}"}, f"instance {agent_id} is not in a lane of its own: {lanes}"
        groups.add(requests[0].lane.split("@")[0])
        assert len(requests) >= 2, f"instance {agent_id} sent {len(requests)} request(s); its scripted step should give it a second"
        first, later = requests[0], requests[1:]
        assert first.capture["diagnosis"]["request_in_lane"] == 1
        for turn in later:
            assert turn.capture["diagnosis"]["prefix_kept"], turn.capture["diagnosis"]["line"]
            # Its own prefix: all of its first request's prompt, not only what it shares with the other instance.
            assert turn.reused_tokens >= MIN_NEW_CONVERSATION_REUSE * first.prompt_tokens, (
                f"instance {agent_id}: request {turn.number} reused {turn.reused_tokens:,} tokens, its first prompt had {first.prompt_tokens:,}")
    assert len(groups) == 1 and groups.pop().startswith("sub:"), "both instances are of one subagent type"
    assert_billing_block_never_reached_the_engine(turns)
    assert_requests_fit_the_server(turns)


@pytest.mark.parametrize("told", [True, False], ids=["hint headers", "no hint headers"])
def test_a_fork_subagent_is_served_from_the_main_lanes_cache_and_gets_a_lane_of_its_own(claude_binary: Path, tmp_path: Path, capsys, told: bool) -> None:
    """With CLAUDE_CODE_FORK_SUBAGENT=1 the main agent starts a fork (scripted: `subagent_type: "fork"`);
    the fork's first request is the main agent's prompt with the call and its directive after it: the
    engine reuses >= 95% of it from the main lane's cache, and the fork's turns are a lane named as a
    fork of main. With the hint headers Claude Code says `fork` (`x-claude-code-agent-type`); without
    them the lanes tell it by its agent id on the main lane's signature."""
    fork = {"subagent_type": "fork", "description": "Count the files", "prompt": "Count the files in this folder."}
    with running_stack(tmp_path / "stack", [{"tool": "Agent", "inputs": [fork]}]) as stack:
        claude = claude_code.ClaudeCode(claude_binary, claude_code.create_sandbox(tmp_path / "claude", git_repository=True), stack.proxy.url,
                                        hint_headers=told, extra_environment=(("CLAUDE_CODE_FORK_SUBAGENT", "1"),))
        turns = one_scripted_turn(claude, stack, "Count the files here with a fork.",
                                  f"claude -p starting a fork ({'with' if told else 'without'} hint headers)", capsys)

    forks = [turn for turn in turns if turn.capture["request"]["headers"].get("x-claude-code-agent-id")]
    assert forks, "no request named a subagent instance: the fork did not start"
    agent_id = forks[0].capture["request"]["headers"]["x-claude-code-agent-id"]
    assert {turn.lane for turn in forks} == {f"fork:main@{agent_id[:8]}"}
    assert (forks[0].capture["request"]["headers"].get("x-claude-code-agent-type") == "fork") is told
    main = [turn for turn in turns if turn not in forks]
    assert {turn.lane for turn in main} == {"main"}
    first = forks[0]
    diagnosis = first.capture["diagnosis"]
    assert diagnosis["request_in_lane"] == 1 and diagnosis["shared_with_earlier"]["lane"] == "main", diagnosis["line"]
    with capsys.disabled():
        print(f"the fork's first request: {first.reused_tokens:,} of {first.prompt_tokens:,} prompt tokens reused "
              f"({first.reused_tokens / first.prompt_tokens:.1%}); {diagnosis['line']}")
    assert first.reused_tokens >= MIN_NEW_CONVERSATION_REUSE * first.prompt_tokens, (
        f"the fork reused {first.reused_tokens:,} of {first.prompt_tokens:,} prompt tokens")
    assert_billing_block_never_reached_the_engine(turns)
    assert_requests_fit_the_server(turns)
    assert_every_later_request_of_a_lane_is_warm(turns)


def test_through_a_forward_proxy_with_message_threads_on_every_turn_reaches_the_engine_whole_and_warm(claude_binary: Path, tmp_path: Path, capsys) -> None:
    """HTTPS_PROXY at mitmdump (`--mode regular`, its CA through NODE_EXTRA_CA_CERTS), no ANTHROPIC_BASE_URL:
    Claude Code believes it talks to Anthropic. CLAUDE_CODE_TETHER_LIVE=1 turns its Message Threads on (what
    a feature flag of Anthropic's would do). Every request goes to the engine, none leaves loopback; a thread's
    `continue` is answered 400 and Claude Code sends the turn again whole; the first-party billing line is
    stripped; the second turn is warm."""
    script = [{"tool": "Bash", "inputs": [{"command": "ls", "description": "List the files"}]}]
    with running_stack(tmp_path / "stack", script, forward_proxy=True) as stack:
        forward = (("HTTPS_PROXY", stack.proxy.url), ("NODE_EXTRA_CA_CERTS", str(stack.ca_cert)), ("CLAUDE_CODE_TETHER_LIVE", "1"))
        claude = claude_code.ClaudeCode(claude_binary, claude_code.create_sandbox(tmp_path / "claude", git_repository=True), None,
                                        extra_environment=forward)
        started = time.monotonic()
        result = claude.print_turn("List the files here.", timeout=2 * COLD_TURN_TIMEOUT_S)
        assert result.returncode == 0, f"claude -p failed:\n{result.stdout}\n{result.stderr}"
        stack.wait_until_quiet(timeout=COLD_TURN_TIMEOUT_S)
        captures = stack.captures()
        refused = [capture for capture in captures if capture["answered_by_proxy"]]
        proxy_log = stack.proxy.log_text()
        forwarded = [capture for capture in captures if capture not in refused]
        arrived = stack.arrived()
        with capsys.disabled():
            print(f"\nforward proxy: {len(captures)} requests in {time.monotonic() - started:.1f}s, {len(refused)} thread continue(s) refused")
            for capture, record in zip(forwarded, arrived, strict=False):
                usage = record["usage"]
                reused = usage.get("cache_read_input_tokens", 0)
                print(f"  {reused:,}/{reused + usage.get('input_tokens', 0):,} tokens reused, TTFT {record['ttft_s']} s · {capture['diagnosis']['line']}")

    assert any('"thread"' in json.dumps(capture["client_body"]) for capture in captures), "Claude Code sent no message thread; has the CLI changed?"
    assert refused, "no thread continue was sent (and refused)"
    assert all(capture["client_body"].get("thread", {}).get("type") == "continue" and capture["response"]["status"] == 400 for capture in refused)
    assert len(arrived) == len(forwarded) and all(record["status"] == 200 for record in arrived)
    for record in arrived:
        assert "thread" not in record["request"] and record["request"].get("system") and record["request"].get("tools"), (
            "a request reached the engine without its whole prompt")
        assert BILLING_HEADER not in json.dumps(record["request"])
    assert any("cch=" in json.dumps(capture["client_body"]) for capture in captures), "no first-party billing line: did it see a custom base URL?"
    connected = set(re.findall(r"server connect (\S+)", proxy_log))
    assert connected and all(address.startswith("127.0.0.1:") for address in connected), f"the proxy connected beyond loopback: {connected}"
    later = arrived[1:]
    assert later and all(record["usage"].get("cache_read_input_tokens", 0) > 0 for record in later), [r["usage"] for r in arrived]
