"""A streamed answer cut at any byte reaches the client as one well-formed stream: whole events only, never two answers.

The upstream can die anywhere (a replica on another Mac loses power or its network): inside an event, inside a
multi-byte character. Here recorded streams of the three protocols (`tests/support/recorded_streams.py`:
thinking, text, a tool call with JSON arguments, multi-byte characters) are cut at every byte offset and run
through what the proxy does with them: the stream callable `stream_recovery.follow` installs, then at the cut
either the recovery (a chat completion: the same `Recovery` `_recover` drives, answered by the replay the engine
would send, grouped into events otherwise and with its own ids) or the protocol's error event that
`engine_errors` writes (Anthropic and Responses streams, which their agents send again). The chat completion
must come out equal to the uncut one, usage included; the others must be whole events of the uncut stream,
then the error event. By default the cuts are a dense sample (`cuts_of`: every event's end and every byte of the
hardest events, a second or two); `STREAM_CUTS=every` cuts at every byte (a few minutes).
`test_stream_cuts_end_to_end.py` cuts through a real mitmdump.
"""

from __future__ import annotations

import asyncio
import itertools
import os

from stable_prefix.addons.engine_errors import error_event
from stable_prefix.addons.sse_events import SSEParser
from stable_prefix.addons.stream_recovery import Recovery, follow
from tests.support.recorded_streams import Ids, answer_of_chat, anthropic_stream, chat_stream, responses_stream
from tests.support.recovery_in_memory import CUT_REASON, in_turn, recovered, streamed_flow, through_proxy

REPLAY_IDS = Ids(answer="replayed", call="2", created=200)


def as_sent(stream: bytes, cut: int) -> list[bytes]:
    """The first `cut` bytes of `stream` as the engine writes them, an event at a time, the last one cut."""
    pieces, start = [], 0
    for event in SSEParser().feed(stream):
        end = start + len(event.raw)
        pieces.append(stream[start : min(end, cut)])
        if end >= cut:
            break
        start = end
    return [piece for piece in pieces if piece]


def cuts_of(stream: bytes) -> list[int]:
    """Where to cut `stream`: at every byte with STREAM_CUTS=every; by default at, before and after every event's end,
    and at every byte of the events where a cut is hardest to mend (the first, those with 2-, 3- and 4-byte
    characters, the tool call's first and last, the last three: the finish, the usage, [DONE])."""
    if os.environ.get("STREAM_CUTS") == "every":
        return list(range(len(stream) + 1))
    events = [event.raw for event in SSEParser().feed(stream)]
    ends = list(itertools.accumulate(len(event) for event in events))
    hardest = {0, len(events) - 1, len(events) - 2, len(events) - 3}
    for marker in ("ï".encode(), "日".encode(), "🚀".encode(), b"tool_calls", b"input_json_delta", b"function_call_arguments.delta"):
        found = [index for index, event in enumerate(events) if marker in event]
        hardest.update(found[:1] + found[-1:])
    cuts = {0, len(stream)} | {end + step for end in ends for step in (-1, 0, 1)}
    for index in hardest:
        start = ends[index] - len(events[index])
        cuts.update(range(start, ends[index]))
    return sorted(cut for cut in cuts if 0 <= cut <= len(stream))


async def chat_after_cut(stream: bytes, cut: int, replay: bytes) -> bytes:
    """The client's bytes of a chat completion stream cut after `cut` bytes and recovered by a replay."""
    flow = streamed_flow("/v1/chat/completions")
    followed = follow(flow, "replay")
    received = b"".join(through_proxy(flow, piece) for piece in as_sent(stream, cut))
    return received + await recovered(followed, Recovery(followed, "replay", CUT_REASON, ask=in_turn(replay)))


def test_a_chat_completion_cut_at_any_byte_is_completed_equal_to_the_uncut_one():
    uncut_stream = chat_stream()
    uncut = answer_of_chat(uncut_stream)
    replays = [chat_stream(REPLAY_IDS, per_event=3), chat_stream(REPLAY_IDS, per_event=1)]

    async def sweep() -> tuple[int, int]:
        tried = equal = 0
        for cut in cuts_of(uncut_stream):
            received = await chat_after_cut(uncut_stream, cut, replays[cut % 2])
            answer = answer_of_chat(received)
            tried += 1
            assert answer.errors == [], f"cut at byte {cut}: {answer.errors}"
            assert len(answer.ids) == 1 and answer.roles == 1 and answer.done == 1, f"cut at byte {cut}: two answers in one stream"
            assert (answer.reasoning, answer.content) == (uncut.reasoning, uncut.content), f"cut at byte {cut}"
            assert {index: (len(ids), name, arguments) for index, (ids, name, arguments) in answer.calls.items()} == \
                   {index: (1, name, arguments) for index, (_, name, arguments) in uncut.calls.items()}, f"cut at byte {cut}"
            assert answer.finish_reasons == uncut.finish_reasons and answer.usage == uncut.usage, f"cut at byte {cut}"
            equal += 1
        return tried, equal

    tried, equal = asyncio.run(sweep())
    print(f"chat completions: {tried} cuts tried, {equal} answers equal to the uncut one")
    assert tried == equal == len(cuts_of(uncut_stream))


def events_of(data: bytes) -> list[bytes]:
    parser = SSEParser()
    events = parser.feed(data)
    assert parser.finish() == b"", "the stream ends inside an event"
    return [event.raw for event in events]


def check_ends_with_the_error_event_after_whole_events(path: str, protocol: str, uncut_stream: bytes) -> int:
    uncut_events = events_of(uncut_stream)
    ending = error_event(protocol, "stable-prefix proxy: the engine broke off its answer")
    cuts = cuts_of(uncut_stream)
    for cut in cuts:
        flow = streamed_flow(path)
        follow(flow, "replay")
        received = b"".join(through_proxy(flow, piece) for piece in as_sent(uncut_stream, cut))
        events = events_of(received + ending)  # engine_errors writes the error event at the cut
        assert events[-1] == ending, f"cut at byte {cut}: the error event is glued to a half event"
        assert events[:-1] == uncut_events[: len(events) - 1], f"cut at byte {cut}: not whole events of the answer"
        for event in SSEParser().feed(received + ending):
            assert isinstance(event.json(), dict), f"cut at byte {cut}: a malformed event {event.raw!r}"
    return len(cuts)


def test_an_anthropic_stream_cut_at_any_byte_ends_with_the_error_event_after_whole_events():
    tried = check_ends_with_the_error_event_after_whole_events("/v1/messages", "anthropic", anthropic_stream())
    print(f"Anthropic messages: {tried} cuts tried, each whole events then the error event")


def test_a_responses_stream_cut_at_any_byte_ends_with_the_error_event_after_whole_events():
    tried = check_ends_with_the_error_event_after_whole_events("/v1/responses", "responses", responses_stream())
    print(f"Responses: {tried} cuts tried, each whole events then the error event")
