"""Another answer spliced into a chat completion stream that was broken off: the client reads one answer."""

from __future__ import annotations

import json

import pytest

from stable_prefix.addons.chat_splice import (
    Delivered,
    Diverged,
    Splice,
    continuation_request,
    count_request,
    prompt_tokens_of,
    usage_of_whole_answer,
)
from stable_prefix.addons.sse_events import SSEParser, format_event

ENVELOPE = {"id": "chatcmpl-first", "object": "chat.completion.chunk", "created": 100, "model": "tiny"}
OTHER_ENVELOPE = {"id": "chatcmpl-second", "object": "chat.completion.chunk", "created": 200, "model": "tiny"}


def chunk(delta: dict | None = None, finish: str | None = None, envelope: dict = ENVELOPE, usage: dict | None = None) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return format_event({**envelope, "choices": choices, **({"usage": usage} if usage else {})})


def answer(words: list[str], envelope: dict = ENVELOPE, usage: dict | None = None) -> list[bytes]:
    """A whole streamed answer: role, one chunk per word, the finish, usage, [DONE]."""
    return [chunk({"role": "assistant", "content": ""}, envelope=envelope), *(chunk({"content": word}, envelope=envelope) for word in words),
            chunk({}, "stop", envelope=envelope), chunk(None, envelope=envelope, usage=usage or {"prompt_tokens": 50, "completion_tokens": len(words),
                                                                                                  "total_tokens": 50 + len(words)}),
            format_event("[DONE]")]


def delivered(events: list[bytes]) -> Delivered:
    seen = Delivered()
    for event in SSEParser().feed(b"".join(events)):
        seen.observe(event)
    return seen


def spliced(into: Delivered, events: list[bytes], *, continuation: bool = False, **options) -> list[dict | str]:
    splice = Splice(into, continuation=continuation, **options)
    out = b"".join(piece for event in SSEParser().feed(b"".join(events)) for piece in splice.events(event))
    return [event.json() if event.data != "[DONE]" else "[DONE]" for event in SSEParser().feed(out)]


def text_of(chunks: list[dict | str]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if isinstance(c, dict) and c["choices"])


WORDS = ["The", " parser", " reads", " each", " line", "."]


def test_a_replay_sends_only_what_goes_beyond_what_the_client_has():
    client_has = delivered(answer(WORDS)[:4])  # role, "The", " parser", " reads"
    out = spliced(client_has, answer(WORDS, OTHER_ENVELOPE))
    assert client_has.text() + text_of(out) == "".join(WORDS)
    assert out[-1] == "[DONE]"


def test_a_replay_cut_inside_a_chunk_sends_the_rest_of_that_chunk():
    client_has = delivered(answer(WORDS)[:2])
    client_has.segments[0].text = "Th"  # as if the client had half a chunk (a replay chunked otherwise)
    out = spliced(client_has, answer(WORDS, OTHER_ENVELOPE))
    assert "Th" + text_of(out) == "".join(WORDS)


def test_every_spliced_chunk_carries_the_first_answers_id_and_no_second_role():
    out = spliced(delivered(answer(WORDS)[:3]), answer(WORDS, OTHER_ENVELOPE))
    chunks = [c for c in out if isinstance(c, dict)]
    assert {c["id"] for c in chunks} == {"chatcmpl-first"} and {c["created"] for c in chunks} == {100}
    assert not any("role" in c["choices"][0]["delta"] for c in chunks if c["choices"])


def test_a_cut_before_the_first_output_sends_the_whole_replay_without_its_role():
    out = spliced(delivered(answer(WORDS)[:1]), answer(WORDS, OTHER_ENVELOPE))
    assert text_of(out) == "".join(WORDS)


def test_a_cut_before_any_event_sends_the_replay_as_it_comes():
    out = spliced(Delivered(), answer(WORDS, OTHER_ENVELOPE))
    assert text_of(out) == "".join(WORDS) and out[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {c["id"] for c in out if isinstance(c, dict)} == {"chatcmpl-second"}


def test_a_replay_that_differs_from_what_the_client_has_stops_before_sending_any_of_it():
    client_has = delivered(answer(WORDS)[:4])
    other = answer(["The", " parser", " skips", " lines"], OTHER_ENVELOPE)
    splice = Splice(client_has, continuation=False)
    sent = []
    with pytest.raises(Diverged, match="skips"):
        for event in SSEParser().feed(b"".join(other)):
            sent += splice.events(event)
    assert text_of([json.loads(e.decode().removeprefix("data: ")) for e in sent]) == ""


def test_a_replay_that_stops_writing_text_where_the_client_has_more_differs():
    client_has = delivered(answer(WORDS)[:4])
    other = [chunk({"role": "assistant"}), chunk({"content": "The parser"}), chunk({}, "stop")]
    with pytest.raises(Diverged):
        spliced(client_has, other)


def test_a_continuation_is_sent_whole_after_what_the_client_has():
    client_has = delivered(answer(WORDS)[:3])
    out = spliced(client_has, answer([" reads", " each", " line", "."], OTHER_ENVELOPE), continuation=True)
    assert client_has.text() + text_of(out) == "".join(WORDS)


def test_a_continuations_usage_counts_what_goes_beyond_the_original_prompt_as_completion():
    client_has = delivered(answer(WORDS)[:3])  # two output chunks, two tokens as the server counted the prompts
    usage = {"prompt_tokens": 52, "completion_tokens": 4, "total_tokens": 56, "prompt_tokens_details": {"cached_tokens": 52}}
    out = spliced(client_has, answer([" reads", " each", " line", "."], OTHER_ENVELOPE, usage=usage), continuation=True, original_prompt_tokens=50)
    whole = next(c["usage"] for c in out if isinstance(c, dict) and c.get("usage"))
    assert (whole["prompt_tokens"], whole["completion_tokens"], whole["total_tokens"]) == (50, 6, 56)
    assert whole["prompt_tokens_details"]["cached_tokens"] == 50


def test_a_replays_usage_is_the_whole_answers_as_the_engine_counted_it():
    usage = {"prompt_tokens": 50, "completion_tokens": 6, "total_tokens": 56}
    assert usage_of_whole_answer(usage, None) == usage


def test_a_tool_call_the_client_has_begun_keeps_its_id_and_name():
    first = [chunk({"role": "assistant"}),
             chunk({"tool_calls": [{"index": 0, "id": "call_first", "type": "function", "function": {"name": "read", "arguments": ""}}]}),
             chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": '}}]})]
    replay = [chunk({"role": "assistant"}, envelope=OTHER_ENVELOPE),
              chunk({"tool_calls": [{"index": 0, "id": "call_other", "type": "function", "function": {"name": "read", "arguments": ""}}]},
                    envelope=OTHER_ENVELOPE),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "a.py"}'}}]}, envelope=OTHER_ENVELOPE),
              chunk({}, "tool_calls", envelope=OTHER_ENVELOPE), format_event("[DONE]")]
    out = spliced(delivered(first), replay)
    fragments = [f for c in out if isinstance(c, dict) and c["choices"] for f in c["choices"][0]["delta"].get("tool_calls", [])]
    assert fragments == [{"index": 0, "function": {"arguments": '"a.py"}'}}]
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_tool_call_the_client_has_not_seen_comes_whole_with_the_engines_id():
    client_has = delivered([chunk({"role": "assistant"}), chunk({"content": "Reading."})])
    replay = [chunk({"role": "assistant"}, envelope=OTHER_ENVELOPE), chunk({"content": "Reading."}, envelope=OTHER_ENVELOPE),
              chunk({"tool_calls": [{"index": 0, "id": "call_other", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                    envelope=OTHER_ENVELOPE)]
    out = spliced(client_has, replay)
    assert out[0]["choices"][0]["delta"]["tool_calls"] == [{"index": 0, "id": "call_other", "type": "function",
                                                            "function": {"name": "read", "arguments": "{}"}}]


def test_reasoning_is_checked_and_continued_as_text_is():
    first = [chunk({"role": "assistant"}), chunk({"reasoning_content": "Think"})]
    replay = [chunk({"role": "assistant"}), chunk({"reasoning_content": "Think"}), chunk({"reasoning_content": "ing."}),
              chunk({"content": "Done."})]
    out = spliced(delivered(first), replay)
    assert [c["choices"][0]["delta"] for c in out] == [{"reasoning_content": "ing."}, {"content": "Done."}]


def test_only_text_can_be_continued():
    assert delivered([chunk({"content": "Hello"})]).continuable() is None
    assert "reasoning" in delivered([chunk({"reasoning_content": "Hm"})]).continuable()
    assert "tool" in delivered([chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "x", "arguments": ""}}]})]).continuable()
    assert delivered([format_event({"error": {"message": "boom"}})]).continuable()


def test_several_choices_cannot_be_spliced():
    many = format_event({**ENVELOPE, "choices": [{"index": 1, "delta": {"content": "x"}, "finish_reason": None}]})
    assert delivered([many]).unreadable == "more than one choice"


def test_the_continuation_request_ends_with_the_delivered_text_to_continue_and_a_cap_less_its_tokens():
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100, "stream": True,
            "chat_template_kwargs": {"enable_thinking": False}}
    request = continuation_request(body, delivered(answer(WORDS)[:4]), delivered_tokens=40)
    assert request["messages"][-1] == {"role": "assistant", "content": "The parser reads"}
    assert request["chat_template_kwargs"] == {"enable_thinking": False, "add_generation_prompt": False, "continue_final_message": True}
    assert request["max_tokens"] == 60 and request["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "Hi"}] and "stream_options" not in body


def test_uncounted_the_continuations_cap_is_less_the_chunks_delivered_each_at_least_a_token():
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100, "stream": True}
    assert continuation_request(body, delivered(answer(WORDS)[:4]), delivered_tokens=None)["max_tokens"] == 97


def test_a_count_request_asks_for_one_token_not_streamed():
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100, "stream": True,
            "stream_options": {"include_usage": True}, "tools": []}
    assert count_request(body) == {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": False, "tools": []}
    assert prompt_tokens_of(b'{"usage": {"prompt_tokens": 12, "completion_tokens": 1}}') == 12
    assert prompt_tokens_of(b'{"error": "busy"}') is None and prompt_tokens_of(b"<html>") is None


def test_a_usage_the_client_did_not_ask_for_is_not_sent():
    out = spliced(delivered(answer(WORDS)[:3]), answer(WORDS, OTHER_ENVELOPE), usage_wanted=False)
    assert not any(isinstance(c, dict) and c.get("usage") for c in out) and out[-1] == "[DONE]"


def test_what_the_client_has_follows_each_whole_event():
    seen = delivered(answer(WORDS))
    assert seen.text() == "".join(WORDS) and seen.output_events == len(WORDS)
    assert seen.finished and seen.usage_sent and seen.done_sent and seen.envelope["id"] == "chatcmpl-first"
