"""The bench drives every agent whose record says how (`CodingAgent.conversation`): one conversation in a fresh
scratch project, its first turn a new conversation and every later one a continuation of it. A stand-in CLI of ours
(it prints the arguments it got, and answers as Codex does in `--json` mode) takes the place of each real one, so
what is checked is the command line each record's driver builds; the real CLIs run in tests/e2e/."""

import json
import sys

import pytest

from stable_prefix.bench.clients.cli_agents import AGENTS, conversation

STANDIN = f"""#!{sys.executable}
import json, sys
arguments = sys.argv[1:]
print(json.dumps({{"type": "thread.started", "thread_id": "thread-1"}}))
print(json.dumps({{"arguments": arguments}}))
if "-o" in arguments:  # Codex writes its last message to the file `-o` names
    with open(arguments[arguments.index("-o") + 1], "w") as last_message:
        last_message.write("answer to " + arguments[-1])
"""
# How each agent's continued turn says which conversation it continues.
CONTINUES = {"claude": ["--continue"], "opencode": ["--continue"], "qwen": ["--continue"], "pi": ["--continue"],
             "codex": ["resume", "thread-1"]}


def arguments_of(turn) -> list[str]:
    return next(json.loads(line)["arguments"] for line in turn.stdout.splitlines() if line.startswith('{"arguments"'))


def contains(arguments: list[str], run: list[str]) -> bool:
    return any(arguments[start:start + len(run)] == run for start in range(len(arguments)))


def test_every_agent_the_bench_drives_is_named_here():
    assert set(AGENTS) == set(CONTINUES)


@pytest.mark.parametrize("key", list(AGENTS))
def test_the_first_turn_starts_a_conversation_and_the_next_continues_it(key, tmp_path):
    standin = tmp_path / "agent-cli"
    standin.write_text(STANDIN)
    standin.chmod(0o755)
    talk = conversation(key, standin, tmp_path / key, "http://127.0.0.1:9", "served-model", 64, timeout=60)
    first, second = talk.turn("first prompt"), talk.turn("second prompt")
    assert (first.returncode, second.returncode) == (0, 0), second.stderr
    assert arguments_of(first)[-1] == "first prompt" and arguments_of(second)[-1] == "second prompt"
    assert not contains(arguments_of(first), CONTINUES[key])
    assert contains(arguments_of(second), CONTINUES[key])
    assert talk.turns == [first, second]
    if key == "codex":
        assert second.reply == "answer to second prompt"
