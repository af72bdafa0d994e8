"""How reused tokens appear in responses: Anthropic and OpenAI usage fields,
in whole JSON bodies and in SSE streams cut at any byte."""

import json

from stable_prefix.engine_patch.cache.request_reuse import RequestReuse
from stable_prefix.engine_patch.http_api.usage_fields import SseUsageRewriter, add_reuse_to_payload
from tests.support.usage_middleware import run_middleware

REUSE = RequestReuse(prompt_tokens=1000, reused=900)


def test_anthropic_usage_splits_the_prompt_into_cached_and_new_tokens():
    payload = {"type": "message", "usage": {"input_tokens": 1000, "output_tokens": 5}}
    add_reuse_to_payload(payload, "/v1/messages", REUSE)
    assert payload["usage"] == {"input_tokens": 100, "output_tokens": 5, "cache_read_input_tokens": 900}


def test_anthropic_final_stream_event_without_an_input_count_gets_one():
    event = {"type": "message_delta", "usage": {"output_tokens": 5}}
    add_reuse_to_payload(event, "/v1/messages", REUSE)
    assert event["usage"] == {"output_tokens": 5, "input_tokens": 100, "cache_read_input_tokens": 900}


def test_openai_usage_keeps_the_prompt_total_and_adds_cached_tokens():
    payload = {"usage": {"prompt_tokens": 1000, "completion_tokens": 5, "total_tokens": 1005}}
    add_reuse_to_payload(payload, "/v1/chat/completions", REUSE)
    assert payload["usage"]["prompt_tokens"] == 1000
    assert payload["usage"]["prompt_tokens_details"] == {"cached_tokens": 900}


def test_events_without_usage_are_left_alone():
    event = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}}
    assert add_reuse_to_payload(event, "/v1/messages", REUSE) is False


STREAM = (
    b'event: message_start\ndata: {"type": "message_start", "message": {"usage": {"input_tokens": 0, "output_tokens": 0}}}\n\n'
    b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "\xc3\xa9t\xc3\xa9"}}\n\n'
    b'event: message_delta\ndata: {"type": "message_delta", "usage": {"output_tokens": 3}}\n\n'
)


def rewrite_in_chunks(stream: bytes, size: int) -> bytes:
    rewriter = SseUsageRewriter("/v1/messages", REUSE)
    out = b"".join(rewriter.feed(stream[i : i + size]) for i in range(0, len(stream), size))
    return out + rewriter.flush()


def final_usage(stream: bytes) -> dict:
    events = [json.loads(line[5:]) for line in stream.split(b"\n") if line.startswith(b"data:")]
    return events[-1]["usage"]


def test_a_stream_cut_at_every_possible_size_is_rewritten_the_same():
    whole = rewrite_in_chunks(STREAM, len(STREAM))
    for size in range(1, 40):
        assert rewrite_in_chunks(STREAM, size) == whole
    assert final_usage(whole)["cache_read_input_tokens"] == 900


def test_complete_events_are_passed_on_at_once():
    rewriter = SseUsageRewriter("/v1/messages", REUSE)
    first_event_end = STREAM.index(b"\n\n") + 2
    assert rewriter.feed(STREAM[: first_event_end + 5]).endswith(b"\n\n")


def test_a_stream_is_untouched_while_the_reuse_is_unknown():
    rewriter = SseUsageRewriter("/v1/messages", RequestReuse())
    assert rewriter.feed(STREAM) + rewriter.flush() == STREAM


def test_a_json_response_gets_the_fields_and_a_correct_content_length():
    body = json.dumps({"usage": {"prompt_tokens": 1000, "completion_tokens": 2}}).encode()
    sent = run_middleware("/v1/chat/completions", b"application/json", [body[:10], body[10:]], REUSE)
    start, final = sent[0], sent[-1]
    assert json.loads(final["body"])["usage"]["prompt_tokens_details"] == {"cached_tokens": 900}
    assert dict(start["headers"])[b"content-length"] == str(len(final["body"])).encode()


def test_other_paths_pass_through_untouched():
    body = json.dumps({"usage": {"prompt_tokens": 1000}}).encode()
    sent = run_middleware("/v1/models", b"application/json", [body], REUSE)
    assert sent[-1]["body"] == body
