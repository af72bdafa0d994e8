"""A continuation counts the tokens the client has as the server counts them, never by the events that carried them.

An engine sends as many tokens in one event as it likes: the batched engine's collector merges outputs when the
stream lags, a drafted step sends its accepted run in one event, a partial character or the stop token sends
none. Here a cut answer carried 120 tokens in 10 events; the upstream (from memory) counts tokens as words,
as a tokenizer would count them, and answers what the recovery asks: the cap of the continuation is the
request's less the 120, and the stitched answer's usage is the original prompt's and all the generated tokens.
"""

from __future__ import annotations

import asyncio
import json
import re

from stable_prefix.addons.sse_events import format_event
from stable_prefix.addons.stream_recovery import Recovery, follow
from tests.support.recorded_streams import answer_of_chat
from tests.support.recovery_in_memory import CUT_REASON, RecordedAnswer, answered_by, recovered, streamed_flow, through_proxy

ENVELOPE = {"id": "chatcmpl-first", "object": "chat.completion.chunk", "created": 100, "model": "tiny"}
EVENTS, TOKENS_PER_EVENT, CONTINUED_TOKENS, CAP = 10, 12, 30, 200
MESSAGES = [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Write about caches."}]


def tokens_of(body: dict) -> int:
    """How the toy server counts a prompt: a token per word, 3 per message for its template, and 3 for the
    generation prompt (the assistant's opening) unless the prompt ends with an assistant message to continue."""
    messages = body["messages"]
    return sum(len(re.findall(r"\S+", message["content"])) + 3 for message in messages) + 3 * (messages[-1]["role"] != "assistant")


def chunk(delta: dict | None, finish: str | None = None, **extra) -> bytes:
    return format_event({**ENVELOPE, "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})


def toy_server(body: dict) -> RecordedAnswer:
    """A count (not streamed, one token) or the continuation (streamed, 30 tokens), with the usage the server reports."""
    prompt = tokens_of(body)
    if not body.get("stream"):
        return RecordedAnswer(json.dumps({"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                                                                                     "finish_reason": "length"}],
                                          "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}}).encode())
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": " more" * 10}) for _ in range(CONTINUED_TOKENS // 10)]
    events.append(chunk({}, "stop"))
    if body.get("stream_options", {}).get("include_usage"):
        events.append(chunk(None, usage={"prompt_tokens": prompt, "completion_tokens": CONTINUED_TOKENS, "total_tokens": prompt + CONTINUED_TOKENS}))
    return RecordedAnswer(b"".join(events) + format_event("[DONE]"))


def cut_and_continued(include_usage: bool) -> tuple[bytes, list[dict]]:
    """The client's bytes of an answer cut after 10 events of 12 tokens each and continued; the bodies the recovery sent."""
    request = {"model": "tiny", "messages": MESSAGES, "stream": True, "max_tokens": CAP,
               **({"stream_options": {"include_usage": True}} if include_usage else {})}
    flow = streamed_flow("/v1/chat/completions", request)
    followed = follow(flow, "continue")
    cut = chunk({"role": "assistant", "content": ""}) + b"".join(chunk({"content": " word" * TOKENS_PER_EVENT}) for _ in range(EVENTS))
    received = through_proxy(flow, cut)
    ask = answered_by(toy_server)
    received += asyncio.run(recovered(followed, Recovery(followed, "continue", CUT_REASON, ask=ask)))
    return received, ask.asked


def test_the_continuations_cap_is_the_requests_less_the_tokens_delivered_as_the_server_counts_them():
    _, asked = cut_and_continued(include_usage=True)
    continuation = asked[-1]
    assert continuation["stream"] is True and continuation["messages"][-1]["role"] == "assistant"
    assert continuation["max_tokens"] == CAP - EVENTS * TOKENS_PER_EVENT


def test_the_stitched_answers_usage_is_the_original_prompt_and_every_generated_token():
    received, _ = cut_and_continued(include_usage=True)
    answer = answer_of_chat(received)
    generated = EVENTS * TOKENS_PER_EVENT + CONTINUED_TOKENS
    assert answer.usage == {"prompt_tokens": tokens_of({"messages": MESSAGES}), "completion_tokens": generated,
                            "total_tokens": tokens_of({"messages": MESSAGES}) + generated}
    assert len(answer.ids) == 1 and answer.roles == 1 and answer.done == 1 and answer.finish_reasons == ["stop"]


def test_the_continuation_asks_for_its_usage_and_a_client_that_did_not_ask_gets_none():
    received, asked = cut_and_continued(include_usage=False)
    assert asked[-1]["stream_options"] == {"include_usage": True}
    answer = answer_of_chat(received)
    assert answer.usage is None and answer.content == " word" * EVENTS * TOKENS_PER_EVENT + " more" * CONTINUED_TOKENS
