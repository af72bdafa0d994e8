"""The auto tool parser's stream through our seam (`http_api/tool_parser_stream.py`), fed the way vllm-mlx's server
feeds it (`_extract_streaming_tool_delta` each delta, `_finalize_streaming_tool_result` on the last), and vllm-mlx's
own chat stream (`server.stream_chat_completion`) over scripted text with the seam installed: the content let out,
concatenated, is the text; a real call still comes out as a call. (The tiny models never write a call: the server
test, `test_tool_parser_stream_server.py`, proves the prose through the real patched server.)"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("vllm_mlx")

from vllm_mlx import server  # noqa: E402
from vllm_mlx.api.models import ChatCompletionRequest  # noqa: E402
from vllm_mlx.api.tool_calling import parse_tool_calls  # noqa: E402
from vllm_mlx.engine.base import GenerationOutput  # noqa: E402
from vllm_mlx.tool_parsers.auto_tool_parser import AutoToolParser  # noqa: E402

from stable_prefix.engine_patch.http_api import tool_parser_stream  # noqa: E402
from stable_prefix.engine_patch.http_api.tool_parser_stream import ReleasingToolParser, call_opening_at  # noqa: E402

PROSE = "Compare a < b first, then read arr[0] and print it. Done."
CALL = '<tool_call>{"name": "read", "arguments": {"path": "a.py"}}</tool_call>'


def streamed(parser, deltas: list[str]) -> tuple[str, list[dict]]:
    """The content and tool calls the server would stream for these deltas."""
    parser.reset()
    accumulated, content, calls = "", "", []
    for number, delta in enumerate(deltas, start=1):
        accumulated, result = server._extract_streaming_tool_delta(parser, accumulated, delta, {})
        if number == len(deltas):
            result = server._finalize_streaming_tool_result(parser, accumulated, result)
        if result is not None:
            content += result.get("content") or ""
            calls += result.get("tool_calls") or []
    return content, calls


def releasing() -> ReleasingToolParser:
    return ReleasingToolParser(AutoToolParser(None))


def test_vllm_mlx_s_auto_parser_loses_prose_after_a_less_than_and_a_bracket():
    """The bug the seam exists for: if this passes no more, vllm-mlx fixed it and the seam can go."""
    content, _ = streamed(AutoToolParser(None), list(PROSE))
    assert content == "Compare a < b first, then read arr"


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(PROSE)])
def test_prose_with_a_less_than_and_a_bracket_streams_whole_however_it_is_split(size):
    deltas = [PROSE[start : start + size] for start in range(0, len(PROSE), size)]
    assert streamed(releasing(), deltas) == (PROSE, [])


def test_a_call_between_prose_is_a_call_and_the_prose_around_it_streams_in_order():
    text = f"See a < b, x[0]. {CALL} then more."
    deltas = ["See a < b, x[0]. ", "<tool_call>", '{"name": "read", ', '"arguments": {"path": "a.py"}}', "</tool_call>", " then", " more."]
    content, calls = streamed(releasing(), deltas)
    assert content == "See a < b, x[0].  then more."
    assert [call["function"]["name"] for call in calls] == ["read"]
    assert "".join(deltas) == text


def test_a_call_s_opening_is_held_until_the_call_ends_and_none_of_its_markup_streams():
    parser = releasing()
    parser.reset()
    accumulated, contents = "", []
    for delta in ["Hi ", "<tool", "_call>", '{"name": "read", "arguments": {}}', "</tool_call>"]:
        accumulated, result = server._extract_streaming_tool_delta(parser, accumulated, delta, {})
        contents.append((result or {}).get("content"))
    assert contents == ["Hi ", None, None, None, ""]


def test_an_opening_never_closed_streams_at_the_end_as_the_text_it_was():
    text = "Use <function=lookup to x[0] and stop"
    assert streamed(releasing(), list(text)) == (text, [])


def test_a_possible_opening_at_the_end_is_held_and_released_once_the_next_delta_shows_prose():
    parser = releasing()
    parser.reset()
    _, first = server._extract_streaming_tool_delta(parser, "", "a[", {})
    _, second = server._extract_streaming_tool_delta(parser, "a[", "0]", {})
    assert (first, second) == ({"content": "a"}, {"content": "[0]"})


def test_a_bare_bracket_call_s_opening_is_found_and_code_brackets_are_not():
    assert call_opening_at('x[0] [read({"path": "a"})]', 0) == 5
    assert call_opening_at("x[0] and y[i](z)", 0) == len("x[0] and y[i](z)")
    assert call_opening_at("ends with [rea", 0) == len("ends with ")


def test_the_wrapped_parser_s_flags_are_what_vllm_mlx_reads():
    parser = releasing()
    assert server._requires_eager_tool_streaming(parser)
    assert not server._parser_drops_text_after_tool_call(parser)


class ScriptedText:
    """What vllm-mlx's stream loop reads of an engine: `stream_chat`'s outputs, one a delta, the last finished."""

    model_name = "scripted"
    tokenizer = None

    def __init__(self, deltas: list[str]):
        self.deltas = deltas

    async def stream_chat(self, messages, **kwargs):
        for number, delta in enumerate(self.deltas, start=1):
            last = number == len(self.deltas)
            yield GenerationOutput(text="".join(self.deltas[:number]), new_text=delta, prompt_tokens=5, completion_tokens=number,
                                   finished=last, finish_reason="stop" if last else None)


@pytest.fixture
def seam_installed(monkeypatch):
    monkeypatch.setattr(server, "_get_streaming_tool_parser", server._get_streaming_tool_parser)  # restored after the test
    assert tool_parser_stream.install() == [tool_parser_stream.PATCHED]


def chat_stream(deltas: list[str]) -> tuple[str, list[dict]]:
    request = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "Hi"}], stream=True,
                                    tools=[{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}])

    async def collect() -> list[str]:
        return [event async for event in server.stream_chat_completion(ScriptedText(deltas), [], request)]

    content, calls = "", []
    for event in asyncio.run(collect()):
        data = event.removeprefix("data: ").strip()
        if data == "[DONE]":
            continue
        for choice in json.loads(data)["choices"]:
            content += choice["delta"].get("content") or ""
            calls += choice["delta"].get("tool_calls") or []
    return content, calls


def test_vllm_mlx_s_chat_stream_with_the_seam_sends_the_whole_prose(seam_installed):
    assert chat_stream(list(PROSE)) == (PROSE, [])


def test_vllm_mlx_s_chat_stream_with_the_seam_sends_the_prose_a_call_and_the_prose_after_it(seam_installed):
    deltas = ["See a < b, x[0]. ", "<tool_call>", '{"name": "read", ', '"arguments": {"path": "a.py"}}', "</tool_call>", " Then", " more."]
    content, calls = chat_stream(deltas)
    whole_text, whole_calls = parse_tool_calls("".join(deltas), {"tools": []})  # what the answer not streamed parses
    assert content == whole_text == "See a < b, x[0].  Then more." and len(whole_calls) == 1
    assert [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in calls] == [("read", {"path": "a.py"})]
