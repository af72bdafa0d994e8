"""The one SSE parser and formatter, and the one definition of "first token"."""

import itertools

from stable_prefix.addons.sse_events import EventStream, SSEParser, carries_output, format_event

MESSAGE_START = format_event({"type": "message_start", "message": {"usage": {"input_tokens": 12, "output_tokens": 0}}}, "message_start")
TEXT_DELTA = format_event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "héllo"}}, "content_block_delta")
MESSAGE_DELTA = format_event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}, "message_delta")
STREAM = MESSAGE_START + TEXT_DELTA + MESSAGE_DELTA


def test_events_split_anywhere_come_out_whole():
    for cut in range(1, len(STREAM)):
        parser = SSEParser()
        events = parser.feed(STREAM[:cut]) + parser.feed(STREAM[cut:])
        assert [event.event for event in events] == ["message_start", "content_block_delta", "message_delta"], cut
        assert b"".join(event.raw for event in events) == STREAM


def test_a_formatted_event_parses_back_to_its_data():
    (event,) = SSEParser().feed(format_event({"a": "ü"}, "x"))
    assert (event.event, event.json()) == ("x", {"a": "ü"})


def test_the_first_token_is_the_first_event_with_generated_output():
    assert not carries_output({"type": "message_start", "message": {}})
    assert not carries_output({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    assert carries_output({"type": "content_block_delta", "delta": {"type": "input_json_delta", "partial_json": "{"}})
    assert not carries_output({"choices": [{"delta": {"role": "assistant"}}]})  # OpenAI's opening chunk
    assert carries_output({"choices": [{"delta": {"content": "hi"}}]})
    assert carries_output({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]})
    assert not carries_output("[DONE]")


def test_an_event_stream_keeps_the_usage_and_times_the_first_output():
    ticks = itertools.count(1)
    stream = EventStream(clock=lambda: next(ticks))
    stream.feed(MESSAGE_START)
    assert stream.first_output_at is None
    stream.feed(TEXT_DELTA[:7])
    assert stream.first_output_at is None  # half an event is not an event yet
    stream.feed(TEXT_DELTA[7:] + MESSAGE_DELTA)
    assert stream.first_output_at == 1
    assert stream.usage == {"input_tokens": 12, "output_tokens": 3}
    assert stream.error is None


def test_an_event_stream_reports_an_error_event():
    stream = EventStream()
    stream.feed(format_event({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}, "error"))
    assert stream.error == {"type": "overloaded_error", "message": "busy"}
