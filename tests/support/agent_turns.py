"""What an agent's conversation (opencode, Qwen Code, Pi; the Agent SDK's Claude Code on the Anthropic path) looked
like at both ends of our proxy, for its end-to-end test; the scenarios the agents share are `tests/e2e/agent_scenarios.py`.

Each request the agent sent is a `Turn`: its capture record (`addons/capture.py`: the body as the
agent sent it and as forwarded, the lane and the diagnosis) matched to what the engine's door recorded
(`tests/support/upstream_recorder.py`: the body as it arrived, the engine's usage). The engine's usage
is the measure of reuse: `prompt_tokens_details.cached_tokens` of `prompt_tokens` (on the Anthropic
path `cache_read_input_tokens` of the prompt).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import agent_stack
from tests.support.agent_stack import Stack
from tests.support.llm_client import send
from tests.support.models import require_model

CHAT_PATH = "/v1/chat/completions"
SERVED_MODEL = "tiny-model-test"
# Issue 17's targets: every continued turn, and a new conversation in the same repository.
MIN_CONTINUED_REUSE = 0.95
MIN_NEW_CONVERSATION_REUSE = 0.90
# Time zones twenty-six hours apart: whenever a test runs, the dates an agent writes into its prompt before and
# after differ (a conversation continued past midnight).
BEFORE_MIDNIGHT, AFTER_MIDNIGHT = "Etc/GMT+12", "Etc/GMT-14"
TURN_TIMEOUT_S = 600.0


def run(driver: Any, prompt: str, **options) -> None:
    """One turn of the agent (`driver.run_turn`), which must succeed."""
    assert_ran(driver.run_turn(prompt, timeout=TURN_TIMEOUT_S, **options), f"{driver.__class__.__name__} {prompt!r}")


@dataclass
class Turn:
    number: int
    lane: str
    prompt_tokens: int
    reused_tokens: int
    arrived: dict
    capture: dict

    @property
    def reuse(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def diagnosis(self) -> dict:
        return self.capture["diagnosis"]

    @property
    def headers(self) -> dict:
        return self.capture["request"]["headers"]


def collect_turns(stack: Stack) -> list[Turn]:
    """Every captured request, oldest first, with what the engine received for it (matched by
    content: concurrent requests finish in either order). Asserts that both ends saw them all."""
    arrived, captures = stack.arrived(), stack.captures()
    assert len(captures) == len(arrived), f"the proxy captured {len(captures)} requests, the engine received {len(arrived)}"
    turns, unmatched = [], list(arrived)
    for number, capture in enumerate(captures, start=1):
        record = next((r for r in unmatched if r["request"] == capture["forwarded_body"]), None)
        assert record is not None, f"capture {capture['seq']} ({capture['lane']}): what was forwarded is not what the engine received"
        unmatched.remove(record)
        turns.append(Turn(number, capture["lane"], *prompt_and_reused_tokens(record["usage"]), record, capture))
    return turns


def prompt_and_reused_tokens(usage: dict) -> tuple[int, int]:
    """(prompt tokens, of them reused) from the engine's usage: OpenAI's `prompt_tokens` and
    `prompt_tokens_details.cached_tokens`, or Anthropic's `input_tokens` (the part not read
    from the cache) and `cache_read_input_tokens`."""
    if "prompt_tokens" in usage:
        return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    reused = usage.get("cache_read_input_tokens", 0)
    return usage.get("input_tokens", 0) + reused, reused


def lane_turns(turns: list[Turn], lane: str) -> list[Turn]:
    return [turn for turn in turns if turn.lane == lane]


def print_turns(title: str, turns: list[Turn], stats: dict, wall_s: float) -> None:
    print(f"\n{title}: {len(turns)} requests in {wall_s:.1f}s")
    print(f"{'#':>3}  {'lane':<24} {'prompt tok':>10} {'reused':>8} {'share':>7} {'TTFT s':>7}  diagnosis")
    for turn in turns:
        line = turn.diagnosis["line"].split(" · ", 1)[-1]
        ttft = f"{turn.arrived['ttft_s']:.2f}" if turn.arrived.get("ttft_s") is not None else "-"
        print(f"{turn.number:>3}  {turn.lane[:24]:<24} {turn.prompt_tokens:>10,} {turn.reused_tokens:>8,} {turn.reuse:>7.1%} {ttft:>7}  {line[:150]}")
    print("engine cache: " + ", ".join(f"{key}={stats[key]}" for key in ("hits", "misses", "tokens_reused", "tokens_prefilled", "entries")))


def assert_every_later_request_reuses(turns: list[Turn], share: float) -> None:
    """Every request but the first of its lane reused at least `share` of its prompt tokens."""
    for turn in turns[1:]:
        assert turn.reuse >= share, (f"request {turn.number} ({turn.lane}) reused {turn.reused_tokens:,} of "
                                     f"{turn.prompt_tokens:,} prompt tokens: {turn.diagnosis['line']}")


def assert_captured_at_both_ends(turns: list[Turn], served_model: str) -> None:
    """The proxy kept what the agent sent and what it forwarded; the engine got the forwarded body,
    under the served model's name, and answered."""
    for turn in turns:
        assert isinstance(turn.capture.get("client_body"), dict) and turn.capture["forwarded_body"] == turn.arrived["request"]
        assert turn.arrived["status"] == 200, f"request {turn.number}: the engine answered {turn.arrived['status']}"
        assert turn.arrived["request"]["model"] == served_model


def greedy_answer(base_url: str, body: dict, max_tokens: int = 16) -> str:
    """The engine's greedy answer to `body` (not streamed)."""
    request = {key: value for key, value in body.items() if key != "stream_options"}
    return send(base_url, CHAT_PATH, {**request, "stream": False, "temperature": 0, "max_tokens": max_tokens}).text


def assert_ran(result: subprocess.CompletedProcess[str], what: str) -> None:
    assert result.returncode == 0, f"{what} failed:\n{result.stdout}\n{result.stderr}"


def finished_turns(stack: Stack, title: str, started: float, capsys) -> list[Turn]:
    """Once every request is recorded at both ends (each record is written as its stream ends, maybe
    after the agent exited): the turns, printed as the run's evidence (when the test passes too)."""
    stack.wait_until_quiet(timeout=TURN_TIMEOUT_S)
    turns = collect_turns(stack)
    with capsys.disabled():
        print_turns(title, turns, stack.cache_stats(), time.monotonic() - started)
    assert_captured_at_both_ends(turns, SERVED_MODEL)
    return turns


def warm_and_shipped_answers(stack: Stack, tmp_path: Path, body: dict) -> tuple[str, str]:
    """The greedy answer to `body` from the stack's engine (its cache warm from the run) and from
    vllm-mlx as shipped: the rules and the cache must not change it."""
    with agent_stack.shipped_engine(tmp_path / "shipped", require_model(), SERVED_MODEL) as shipped:
        return greedy_answer(stack.engine.url, body), greedy_answer(shipped.url, body)


def assert_each_instance_reuses_its_own_prefix(instances: dict[str, list[Turn]]) -> None:
    """Two subagent instances of one type, each on its own lane: every later request of an instance
    keeps its prefix and reuses at least the continued-turn share of the instance's first prompt."""
    assert len(instances) == 2, f"expected two subagent instances, saw {sorted(instances)}"
    assert len({turn.lane.split("@")[0] for requests in instances.values() for turn in requests}) == 1, "both are of one type"
    for requests in instances.values():
        assert len({turn.lane for turn in requests}) == 1 and "@" in requests[0].lane, "each instance has a lane of its own"
        first, *later = requests
        assert later, "its scripted step gives each instance a second request"
        for turn in later:
            assert turn.diagnosis["prefix_kept"] and turn.reused_tokens >= MIN_CONTINUED_REUSE * first.prompt_tokens, turn.diagnosis["line"]
