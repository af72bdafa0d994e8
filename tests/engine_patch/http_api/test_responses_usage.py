"""A Responses answer's events and usage: first token, usage and final response as the
proxy reads them (`sse_events`), and the reuse the patched engine writes into them
(`usage_fields`: `usage.input_tokens_details.cached_tokens`)."""

import json

from stable_prefix.addons.sse_events import EventStream, carries_output, error_in, format_event, merge_usage
from stable_prefix.engine_patch.cache.request_reuse import RequestReuse
from stable_prefix.engine_patch.http_api.usage_fields import SseUsageRewriter, add_reuse_to_payload
from tests.support.usage_middleware import run_middleware

REUSE = RequestReuse(prompt_tokens=1000, reused=900)
ENGINE_USAGE = {"input_tokens": 1000, "output_tokens": 3, "total_tokens": 1003,
                "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}


def completed(usage):
    return {"type": "response.completed", "sequence_number": 9,
            "response": {"id": "resp_1", "object": "response", "output": [], "usage": usage}}


STREAM = b"".join([
    format_event({"type": "response.created", "sequence_number": 1, "response": {"id": "resp_1", "usage": None}}, "response.created"),
    format_event({"type": "response.in_progress", "sequence_number": 2, "response": {"id": "resp_1", "usage": None}}, "response.in_progress"),
    format_event({"type": "response.output_text.delta", "sequence_number": 3, "delta": "H\u00e9"}, "response.output_text.delta"),
    format_event(completed(ENGINE_USAGE), "response.completed"),
])


def test_the_response_opening_events_carry_no_output_and_a_delta_does():
    assert not carries_output({"type": "response.created", "response": {}})
    assert not carries_output({"type": "response.output_item.added", "item": {"type": "message"}})
    assert carries_output({"type": "response.output_text.delta", "delta": "Hi"})
    assert carries_output({"type": "response.function_call_arguments.delta", "delta": "{\"cmd\""})
    assert not carries_output({"type": "response.output_text.delta", "delta": ""})


def test_the_usage_and_the_whole_response_are_read_from_the_final_event():
    events = EventStream()
    for start in range(0, len(STREAM), 17):
        events.feed(STREAM[start : start + 17])
    assert events.usage == ENGINE_USAGE
    assert events.response["id"] == "resp_1"
    assert events.first_output_at is not None


def test_a_whole_response_object_has_its_usage_at_the_top():
    usage = {}
    merge_usage(usage, {"object": "response", "usage": ENGINE_USAGE})
    assert usage == ENGINE_USAGE


def test_a_failed_response_reports_its_error():
    assert error_in({"type": "response.failed", "response": {"error": {"code": "server_error"}}}) == {"code": "server_error"}
    assert error_in({"type": "response.completed", "response": {"error": None}}) is None


def test_the_engine_writes_the_reuse_into_a_whole_response_and_keeps_input_tokens_the_whole_prompt():
    payload = {"object": "response", "usage": dict(ENGINE_USAGE, input_tokens_details={"cached_tokens": 0})}
    assert add_reuse_to_payload(payload, "/v1/responses", REUSE)
    assert payload["usage"]["input_tokens"] == 1000
    assert payload["usage"]["input_tokens_details"] == {"cached_tokens": 900}


def test_the_engine_writes_the_reuse_into_the_final_event_of_a_stream_cut_anywhere():
    expected = None
    for size in (1, 7, 64, len(STREAM)):
        rewriter = SseUsageRewriter("/v1/responses", REUSE)
        out = b"".join(rewriter.feed(STREAM[i : i + size]) for i in range(0, len(STREAM), size)) + rewriter.flush()
        expected = expected or out
        assert out == expected
    final = json.loads(expected.split(b"data: ")[-1])
    assert final["response"]["usage"]["input_tokens_details"]["cached_tokens"] == 900
    assert expected.startswith(STREAM[: STREAM.index(b"response.output_text.delta")])  # events without usage untouched


def test_the_middleware_covers_the_responses_route():
    body = json.dumps({"object": "response", "usage": ENGINE_USAGE}).encode()
    sent = run_middleware("/v1/responses", b"application/json", [body], REUSE)
    assert json.loads(sent[-1]["body"])["usage"]["input_tokens_details"]["cached_tokens"] == 900
