"""The real Codex CLI, end to end: its continued turns and new conversations hit the engine's cache.

The stack is what a user runs, on 127.0.0.1, offline:

    codex exec (pinned npm release, its own CODEX_HOME, a scratch git repository)
      -> mitmdump -s addons/strip_billing.py -s addons/capture.py   (our proxy, the Responses path)
      -> mitmdump -s tests/support/upstream_recorder.py             (the engine's door: what really arrived)
      -> python -m stable_prefix.engine_patch serve build/tiny-model-test --default-temperature 0

Codex sends no temperature, so the engine's default makes every answer greedy.
A Codex prompt is ~6,100 tokens of the tiny model (~38 KB: two developer
messages, an environment context, 9 tools); a cold one takes a few seconds to
prefill on a 2-core CPU, a warm turn well under one.

The tiny model never calls a tool, so the tool-using turn's decision (an
`exec_command` running `cat README.md`) is scripted at the engine's door
(`tests/support/scripted_tool_use.py`): the request still reaches the real
engine, which prefills and caches it; only its answer is replaced. Codex runs
the command itself and sends the result.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stable_prefix.agents import codex_cli
from tests.support import agent_stack
from tests.support.agent_stack import Stack
from tests.support.llm_client import RESPONSES_PATH, clear_cache, send, text_of
from tests.support.processes import REPO_ROOT, VENV_BIN

pytestmark = [pytest.mark.server, pytest.mark.slow]

MODEL = REPO_ROOT / "build" / "tiny-model-test"
SERVED_MODEL = "tiny"
ANSWER_TOKENS = 16
MIN_CONTINUED_REUSE = 0.95
MIN_NEW_CONVERSATION_REUSE = 0.90
TOOL_STEP = {"tool": "exec_command", "prompt_contains": "README", "inputs": [{"cmd": "cat README.md"}]}
TURN_TIMEOUT_S = 600.0


@contextlib.contextmanager
def codex_stack(tmp_path: Path, script: list[dict] | None = None) -> Iterator[Stack]:
    with agent_stack.running_stack(tmp_path / "stack", MODEL, SERVED_MODEL, ANSWER_TOKENS, RESPONSES_PATH, script,
                                   engine_flags=("--default-temperature", "0")) as stack:
        yield stack


@dataclass
class Request:
    """One request of a Codex run, as it arrived at the engine and as the proxy captured it."""

    arrived: dict
    capture: dict

    @property
    def prompt_tokens(self) -> int:
        return self.arrived["usage"]["input_tokens"]

    @property
    def reused_tokens(self) -> int:
        return self.arrived["usage"]["input_tokens_details"]["cached_tokens"]

    @property
    def reuse(self) -> float:
        return self.reused_tokens / self.prompt_tokens

    @property
    def diagnosis(self) -> dict:
        return self.capture["diagnosis"]


def requests_of(stack: Stack) -> list[Request]:
    """Every request, the door's record matched to the proxy's capture by the forwarded body."""
    stack.wait_until_quiet(timeout=TURN_TIMEOUT_S)
    arrived, captures = stack.arrived(), stack.captures()
    assert len(arrived) == len(captures), f"the proxy captured {len(captures)} requests, the engine received {len(arrived)}"
    matched = []
    for capture in captures:
        record = next((r for r in arrived if r["request"] == capture["forwarded_body"]), None)
        assert record is not None, f"capture {capture['seq']} is not what the engine received"
        matched.append(Request(record, capture))
    return matched


def run(codex: codex_cli.Codex, stack: Stack, prompt: str, resume: str | None = None, extra: tuple[str, ...] = ()) -> tuple[codex_cli.Turn, int]:
    """One `codex exec` (or `exec resume`); returns the turn and the tokens the engine's cache reused during it."""
    before = stack.cache_stats()["tokens_reused"]
    turn = codex.exec_turn(prompt, resume=resume, timeout=TURN_TIMEOUT_S, extra=extra)
    assert turn.returncode == 0, f"codex exec failed:\n{turn.stdout[-3000:]}\n{turn.stderr[-3000:]}"
    stack.wait_until_quiet(timeout=TURN_TIMEOUT_S)
    return turn, stack.cache_stats()["tokens_reused"] - before


def print_table(title: str, requests: list[Request]) -> None:
    print(f"\n{title}")
    print(f"{'#':>3}  {'session':<10} {'prompt tok':>10} {'reused':>8} {'reuse':>7} {'TTFT s':>7}  diagnosis")
    for number, request in enumerate(requests, start=1):
        ttft = f"{request.arrived['ttft_s']:.2f}" if request.arrived["ttft_s"] is not None else "-"
        print(f"{number:>3}  {(request.arrived['session'] or '-')[-10:]:<10} {request.prompt_tokens:>10,} {request.reused_tokens:>8,} "
              f"{request.reuse:>7.1%} {ttft:>7}  {request.diagnosis['line']}")


def assert_what_the_agent_sent_and_the_engine_got_are_captured(requests: list[Request]) -> None:
    for request in requests:
        assert request.arrived["status"] == 200 and request.arrived["request"]["model"] == SERVED_MODEL
        assert request.capture["request"]["api"] == "responses"
        assert request.capture["client_body"]["input"], "the capture holds what Codex sent"
        assert request.capture["response"]["usage"] == request.arrived["usage"], "the capture's usage is what the engine sent"


def test_every_continued_turn_reuses_its_prompt_a_tool_call_and_a_sandbox_change_included(codex_binary, tmp_path, capsys):
    """`codex exec`, then `codex exec resume` three times: a plain turn, a turn whose
    (scripted) answer runs `cat README.md`, and one that changes the sandbox mode,
    after which Codex appends a developer message (rewritten in place by the proxy)."""
    with codex_stack(tmp_path, script=[TOOL_STEP]) as stack:
        codex = codex_cli.Codex(codex_binary, codex_cli.create_sandbox(tmp_path / "codex", stack.proxy.url, SERVED_MODEL))
        first, _ = run(codex, stack, "Say hello in one word.")
        reused_per_run = [run(codex, stack, prompt, resume=first.session, extra=extra)[1] for prompt, extra in (
            ("Now say it in French.", ()),
            ("Show me README.md.", ()),
            ("Now you may edit files.", ("-c", 'sandbox_mode="workspace-write"')),
        )]
        requests = requests_of(stack)
        with capsys.disabled():  # the table is the run's evidence: show it even when the test passes
            print_table("codex exec, then exec resume x3 (a tool call, a sandbox change)", requests)
        assert_what_the_agent_sent_and_the_engine_got_are_captured(requests)
        assert {request.arrived["session"] for request in requests} == {first.session}, "one conversation"
        assert {request.capture["lane"] for request in requests} == {"main"}
        assert len(requests) == 5, "one request per turn, one more for the tool result"
        for previous, request in zip(requests, requests[1:]):
            assert request.diagnosis["prefix_kept"], request.diagnosis["line"]
            assert request.reused_tokens >= previous.prompt_tokens, f"request {request.capture['seq']} lost part of the previous prompt"
        # The sandbox change brings ~480 tokens of new context (permissions, a new environment): its share is
        # what the previous prompt was of it (docs/agents.md); every other continued turn adds only its prompt.
        for request in requests[1:4]:
            assert request.reuse >= MIN_CONTINUED_REUSE, f"{request.reused_tokens:,}/{request.prompt_tokens:,}: {request.diagnosis['line']}"
        assert sum(request.reused_tokens for request in requests[1:]) == sum(reused_per_run), "engine usage and /v1/cache/stats agree"
        tool_result = requests[3].capture["client_body"]["input"][-1]
        assert tool_result["type"] == "function_call_output" and "A small project." in tool_result["output"]
        sandbox_change = requests[4]
        assert any(change.startswith("system_messages input[") for change in sandbox_change.capture["changes"]), sandbox_change.capture["changes"]
        assert any(item.get("role") == "developer" for item in sandbox_change.capture["client_body"]["input"][2:])
        assert not any(item.get("role") == "developer" for item in sandbox_change.arrived["request"]["input"][2:])
        assert_greedy_answers_are_unchanged_by_the_rules(stack, [requests[2], sandbox_change])


def assert_greedy_answers_are_unchanged_by_the_rules(stack: Stack, requests: list[Request]) -> None:
    """Sent again straight to the engine with its cache emptied, each prompt gets the
    answer Codex got through the stack; where no rule changed a request, that prompt
    is Codex's own."""
    for request in requests:
        if not request.capture["changes"]:
            assert request.capture["client_body"] == request.arrived["request"]
        clear_cache(stack.engine.url)
        uncached = send(stack.engine.url, RESPONSES_PATH, request.arrived["request"])
        assert uncached.text == text_of(RESPONSES_PATH, request.arrived["response_body"]) and uncached.text


def test_a_new_conversation_in_the_same_repository_after_an_edit_and_a_commit_reuses_its_prompt(codex_binary, tmp_path, capsys):
    with codex_stack(tmp_path) as stack:
        sandbox = codex_cli.create_sandbox(tmp_path / "codex", stack.proxy.url, SERVED_MODEL)
        codex = codex_cli.Codex(codex_binary, sandbox)
        first, _ = run(codex, stack, "Say hello in one word.")
        sandbox.project.commit("notes.md", "Write the tests first.\n", "Add notes")
        second, reused = run(codex, stack, "Now say goodbye in one word.")
        requests = requests_of(stack)
        with capsys.disabled():
            print_table("codex exec, a commit, codex exec again in the same repository", requests)
        assert_what_the_agent_sent_and_the_engine_got_are_captured(requests)
        assert first.session != second.session and [r.arrived["session"] for r in requests] == [first.session, second.session]
        new_conversation = requests[1]
        assert new_conversation.diagnosis["cause"] == "new conversation", new_conversation.diagnosis["line"]
        assert new_conversation.diagnosis["first_divergence"]["path"].startswith("input[3]"), "it parts at the user's prompt"
        assert new_conversation.reuse >= MIN_NEW_CONVERSATION_REUSE, f"{new_conversation.reused_tokens:,}/{new_conversation.prompt_tokens:,}"
        assert new_conversation.reused_tokens == reused


def test_stable_prefix_codex_runs_codex_against_the_stack_with_its_config(codex_binary, tmp_path):
    """The launcher, as a user runs it: their own CODEX_HOME (no config for the stack
    in it), the stack found from the state file `stable-prefix up` writes."""
    with codex_stack(tmp_path) as stack:
        state_home, home, workdir = tmp_path / "state", tmp_path / "home", tmp_path / "project"
        (state_home / "stable-prefix").mkdir(parents=True)
        home.mkdir()
        workdir.mkdir()
        (state_home / "stable-prefix" / "stack-8080.json").write_text(json.dumps({"url": stack.proxy.url, "model": SERVED_MODEL, "max_tokens": ANSWER_TOKENS}))
        environment = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home / ".codex"),
                       "XDG_STATE_HOME": str(state_home), "OPENAI_API_KEY": "sk-the-users-own-key"}
        (home / ".codex").mkdir()
        result = subprocess.run([str(VENV_BIN / "stable-prefix"), "codex", "--codex", str(codex_binary), "exec", "--skip-git-repo-check",
                                 "Say hello."], capture_output=True, text=True, env=environment, cwd=workdir,
                                timeout=TURN_TIMEOUT_S, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, f"stable-prefix codex failed:\n{result.stdout}\n{result.stderr}"
        [request] = requests_of(stack)
        assert request.capture["client_body"]["model"] == SERVED_MODEL, "Codex was not told the served model's name"
        assert "authorization" not in request.capture["request"]["headers"], "no key goes to the local stack"
        assert not (home / ".codex" / "config.toml").exists(), "the user's configuration is not written"
