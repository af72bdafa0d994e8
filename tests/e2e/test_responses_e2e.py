"""The Responses API end to end: a real mitmdump (strip_billing + capture) before the
real patched engine with the test tiny model, on 127.0.0.1.

    client -> mitmdump (our proxy) -> mitmdump (the engine's door: what really arrived)
           -> python -m stable_prefix.engine_patch serve build/tiny-model-test

A conversation's second turn reuses all of the first turn's prompt from the
engine's cache and its usage says so in the protocol's own field (`usage.input_tokens_details.cached_tokens`),
streamed and not; a turn that continues a stored response (`previous_response_id`)
reaches the engine with its whole history and is reused the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests

from tests.support import agent_stack
from tests.support.agent_stack import Stack
from tests.support.llm_client import RESPONSES_PATH, cache_stats, clear_cache, send
from tests.support.processes import REPO_ROOT

pytestmark = pytest.mark.server

MODEL = REPO_ROOT / "build" / "tiny-model-test"
SERVED_MODEL = "tiny"
ANSWER_TOKENS = 8
INSTRUCTIONS = "You are a coding agent. Read before you edit and keep changes small.\n" * 12
TOOLS = [{"type": "function", "name": "read_file", "description": "Read a file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    with agent_stack.running_stack(tmp_path_factory.mktemp("responses"), MODEL, SERVED_MODEL, ANSWER_TOKENS, RESPONSES_PATH) as started:
        yield started


@pytest.fixture
def fresh(stack) -> Stack:
    clear_cache(stack.engine.url)
    return stack


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def first_turn(topic: str, stream: bool) -> dict:
    # A model name the engine does not serve: the proxy maps it.
    return {"model": "gpt-5.4", "instructions": INSTRUCTIONS, "tools": TOOLS, "temperature": 0, "stream": stream,
            "input": [user(f"[{topic}] What does src/app.py do?")]}


def next_turn(body: dict, answer_output: list, text: str) -> dict:
    return {**body, "input": body["input"] + answer_output + [user(text)]}


def reused(usage: dict) -> int:
    return usage["input_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "streamed"])
def test_the_second_turn_is_served_from_the_cache_and_says_so_in_usage(fresh, stream):
    turn1 = first_turn("two turns", stream)
    answer1 = send(fresh.proxy.url, RESPONSES_PATH, turn1)
    before = cache_stats(fresh.engine.url)
    answer2 = send(fresh.proxy.url, RESPONSES_PATH, next_turn(turn1, answer1.response["output"], "Thanks. And the tests?"))
    after = cache_stats(fresh.engine.url)
    assert reused(answer2.usage) >= answer1.usage["input_tokens"], (answer1.usage, answer2.usage)  # all of turn 1's prompt
    assert reused(answer2.usage) == after["tokens_reused"] - before["tokens_reused"]
    assert reused(answer1.usage) == 0


def test_the_engine_gets_the_served_model_name_and_both_turns_are_captured_with_their_reuse(fresh):
    captured_before = len(fresh.captures())
    turn1 = first_turn("captured", stream=True)
    answer1 = send(fresh.proxy.url, RESPONSES_PATH, turn1)
    answer2 = send(fresh.proxy.url, RESPONSES_PATH, next_turn(turn1, answer1.response["output"], "More."))
    fresh.wait_until_quiet()
    arrived, captured = fresh.arrived()[-2:], fresh.captures()[captured_before:]
    assert [record["request"]["model"] for record in arrived] == [SERVED_MODEL, SERVED_MODEL]
    assert [record["client_body"]["model"] for record in captured] == ["gpt-5.4", "gpt-5.4"]
    assert [record["forwarded_body"] for record in captured] == [record["request"] for record in arrived]
    assert captured[1]["response"]["usage"]["input_tokens_details"]["cached_tokens"] == reused(answer2.usage) > 0
    assert captured[1]["diagnosis"]["prefix_kept"] is True and captured[1]["lane"] == captured[0]["lane"]


def test_a_turn_continuing_a_stored_response_reaches_the_engine_with_its_whole_history(fresh):
    """vllm-mlx puts the stored turn in front of the new input: the prompt is as
    long as the same turn sent in full, and the cache serves it."""
    turn1 = {**first_turn("chained", stream=False), "store": True}
    answer1 = send(fresh.proxy.url, RESPONSES_PATH, turn1)
    chained = {**turn1, "previous_response_id": answer1.response["id"], "input": [user("And the tests?")]}
    answer2 = send(fresh.proxy.url, RESPONSES_PATH, chained)
    in_full = send(fresh.proxy.url, RESPONSES_PATH, next_turn(turn1, answer1.response["output"], "And the tests?"))
    assert answer2.usage["input_tokens"] == in_full.usage["input_tokens"]
    assert reused(answer2.usage) >= answer1.usage["input_tokens"]
    fresh.wait_until_quiet()
    chained_capture = fresh.captures()[-2]
    assert chained_capture["client_body"]["previous_response_id"] == answer1.response["id"]
    assert chained_capture["diagnosis"]["prefix_kept"] is True  # read with the history the proxy saw


def test_a_response_not_stored_cannot_be_continued(fresh):
    answer = send(fresh.proxy.url, RESPONSES_PATH, {**first_turn("unstored", stream=False), "store": False})
    response = requests.post(fresh.proxy.url + RESPONSES_PATH, timeout=60,
                             json={"model": "gpt-5.4", "previous_response_id": answer.response["id"], "input": "More."})
    assert response.status_code == 404 and "not found" in response.text


def test_greedy_answers_through_the_proxy_equal_the_engines_own(fresh):
    for stream in (False, True):
        body = next_turn(first_turn("greedy", stream), [], "Explain it in one line.")
        through_proxy = send(fresh.proxy.url, RESPONSES_PATH, body)
        clear_cache(fresh.engine.url)
        direct = send(fresh.engine.url, RESPONSES_PATH, {**body, "model": SERVED_MODEL})
        assert through_proxy.text == direct.text and direct.text


def test_a_body_the_proxy_cannot_read_reaches_the_engine_untouched_and_is_logged(stack):
    content = b'{"model": "gpt-5.4", "input": {"not": "items"}}'
    requests.post(stack.proxy.url + RESPONSES_PATH, data=content, headers={"content-type": "application/json"}, timeout=60)
    stack.wait_until_quiet()
    assert json.dumps(stack.arrived()[-1]["request"]).encode() == json.dumps(json.loads(content)).encode()
    assert "not a string or a list of items; passed through unchanged" in stack.proxy.log_text()
