"""toolcall_stream: tool calls written as text become structured tool calls.

The pure parts (scanner, SSE parser, the two stream rewriters, the body
rewriters) are fed our recorded-shape fixtures in every chunk size from one byte
up; the addon's hooks are checked with mitmproxy's test helpers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons import toolcall_stream
from stable_prefix.addons.sse_events import SSEParser, format_event
from stable_prefix.addons.text_tool_calls import HERMES, Text, ToolCall, ToolCallScanner
from stable_prefix.addons.toolcall_anthropic import AnthropicStreamRewriter, rewrite_message
from stable_prefix.addons.toolcall_openai import OpenAIStreamRewriter, rewrite_completion

STREAMS = Path(__file__).parents[1] / "fixtures" / "streams"
CHUNK_SIZES = [1, 2, 3, 5, 8, 13, 64, 100_000]
ANTHROPIC_TOOLS = frozenset({"Read", "Bash", "Glob"})
OPENAI_TOOLS = frozenset({"run_tests", "read_file"})
READ_CALL = '<tool_call>\n{"name": "Read", "arguments": {"file_path": "/a.py"}}\n</tool_call>'


def fixture(name: str) -> bytes:
    return (STREAMS / name).read_bytes()


def run_stream(rewriter, data: bytes, chunk_size: int) -> bytes:
    out = b"".join(rewriter.feed(data[at : at + chunk_size]) for at in range(0, len(data), chunk_size))
    return out + rewriter.finish()


def scan(text: str, tools=ANTHROPIC_TOOLS, piece_size: int = 1, **options) -> tuple[list, ToolCallScanner]:
    scanner = ToolCallScanner(tools, **options)
    pieces = []
    for at in range(0, len(text), piece_size):
        pieces += scanner.feed(text[at : at + piece_size])
    return pieces + scanner.finish(), scanner


def joined_text(pieces) -> str:
    return "".join(piece.text for piece in pieces if isinstance(piece, Text))


def anthropic_message(stream: bytes) -> dict:
    """Assemble a streamed message, asserting the event order the SDKs rely on."""
    message, open_index = None, None
    for event in SSEParser().feed(stream):
        data = event.json()
        assert event.event == data["type"], "event name and type must agree"
        if data["type"] == "message_start":
            message = {**data["message"], "content": []}
        elif data["type"] == "content_block_start":
            assert open_index is None, "a block starts while another is open"
            assert data["index"] == len(message["content"]), "blocks must be numbered 0, 1, 2, ..."
            message["content"].append(dict(data["content_block"]))
            open_index = data["index"]
        elif data["type"] == "content_block_delta":
            assert data["index"] == open_index
            block, delta = message["content"][open_index], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                block["partial_json"] = block.get("partial_json", "") + delta["partial_json"]
        elif data["type"] == "content_block_stop":
            assert data["index"] == open_index
            block = message["content"][open_index]
            if "partial_json" in block:
                block["input"] = json.loads(block.pop("partial_json"))
            open_index = None
        elif data["type"] == "message_delta":
            assert open_index is None
            message.update(data["delta"])
            message["usage"] = {**message["usage"], **data["usage"]}
    return message


def openai_completion(stream: bytes) -> dict:
    """Assemble a streamed chat completion (one choice)."""
    content, calls, finish, usage, done = "", {}, None, None, False
    for event in SSEParser().feed(stream):
        assert not done, "nothing may follow [DONE]"
        if event.data == "[DONE]":
            done = True
            continue
        chunk = event.json()
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            assert finish is None, "nothing may follow the finish_reason"
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], {"arguments": ""})
                entry.update({key: call[key] for key in ("id", "type") if key in call})
                entry["name"] = call["function"].get("name", entry.get("name"))
                entry["arguments"] += call["function"].get("arguments", "")
            finish = choice["finish_reason"] or finish
    assert done
    assert sorted(calls) == list(range(len(calls))), "tool call indexes must count 0, 1, 2, ..."
    return {"content": content, "tool_calls": [calls[index] for index in sorted(calls)], "finish_reason": finish, "usage": usage}


def text_stream(*texts: str, stop_reason: str = "end_turn") -> bytes:
    """An Anthropic stream with one text block per argument."""
    out = format_event({"type": "message_start", "message": {"id": "m", "content": [], "usage": {"input_tokens": 5}}}, "message_start")
    for index, text in enumerate(texts):
        out += format_event({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}, "content_block_start")
        delta = {"type": "text_delta", "text": text}
        out += format_event({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
        out += format_event({"type": "content_block_stop", "index": index}, "content_block_stop")
    out += format_event({"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 9}}, "message_delta")
    return out + format_event({"type": "message_stop"}, "message_stop")


# --- finding calls in text ---------------------------------------------------


def test_text_before_a_call_goes_out_before_the_call_is_complete():
    scanner = ToolCallScanner(ANTHROPIC_TOOLS)
    assert scanner.feed('Reading it now.\n<tool_call>\n{"name": "Re') == [Text("Reading it now.\n")]
    assert scanner.feed('ad", "arguments": {}}\n</tool_call>') == [ToolCall("Read", {}, '<tool_call>\n{"name": "Read", "arguments": {}}\n</tool_call>')]


def test_a_partial_opening_tag_is_held_only_until_the_next_piece_decides():
    scanner = ToolCallScanner(ANTHROPIC_TOOLS)
    assert scanner.feed("use <tool") == [Text("use ")]
    assert scanner.feed("box> here") == [Text("<toolbox> here")]


def test_a_backtick_at_the_end_of_a_piece_is_held_only_until_the_next_piece_decides():
    scanner = ToolCallScanner(ANTHROPIC_TOOLS)
    assert scanner.feed("run `") == [Text("run ")]
    assert scanner.feed("ls` now") == [Text("`ls` now")]


@pytest.mark.parametrize("piece_size", [1, 2, 7, 1000])
def test_several_calls_in_a_row_become_calls_without_the_whitespace_between(piece_size):
    text = f"\n{READ_CALL}\n\n" + READ_CALL.replace("/a.py", "/b.py") + "\n"
    pieces, scanner = scan(text, piece_size=piece_size)
    assert pieces == [
        ToolCall("Read", {"file_path": "/a.py"}, READ_CALL),
        ToolCall("Read", {"file_path": "/b.py"}, READ_CALL.replace("/a.py", "/b.py")),
    ]
    assert scanner.calls_found == 2 and scanner.problems == []


def test_text_after_a_call_keeps_its_leading_whitespace():
    pieces, _ = scan(f"{READ_CALL}\n\nDone.", piece_size=2)
    assert isinstance(pieces[0], ToolCall)
    assert joined_text(pieces[1:]) == "\n\nDone."


def test_a_closing_tag_inside_a_json_string_does_not_end_the_call():
    text = '<tool_call>{"name": "Bash", "arguments": {"command": "echo \\"</tool_call>\\" ```"}}</tool_call>'
    pieces, _ = scan(text)
    assert pieces == [ToolCall("Bash", {"command": 'echo "</tool_call>" ```'}, text)]


def test_malformed_json_at_the_end_is_sent_as_the_original_text_and_reported():
    text = 'Trying.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"'
    pieces, scanner = scan(text, piece_size=3)
    assert joined_text(pieces) == text and not any(isinstance(p, ToolCall) for p in pieces)
    assert len(scanner.problems) == 1 and "JSON does not parse" in scanner.problems[0]


def test_malformed_json_inside_closed_tags_is_sent_as_the_original_text_and_reported():
    text = "<tool_call>{name: Bash}</tool_call> and more"
    pieces, scanner = scan(text)
    assert joined_text(pieces) == text
    assert "JSON does not parse" in scanner.problems[0]


def test_a_call_to_a_tool_that_was_not_offered_is_sent_as_the_original_text_and_reported():
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    pieces, scanner = scan(text)
    assert pieces == [Text(text)]
    assert "'rm_rf' was not offered" in scanner.problems[0]


def test_a_complete_call_whose_closing_tag_never_came_is_still_a_call():
    # A "</tool_call>" stop sequence ends the text before the closing tag.
    pieces, scanner = scan('<tool_call>\n{"name": "Glob", "arguments": {"pattern": "*.py"}}\n')
    assert [type(p) for p in pieces] == [ToolCall] and pieces[0].arguments == {"pattern": "*.py"}
    assert scanner.problems == []


def test_a_fenced_json_call_becomes_a_call():
    text = 'Listing:\n```json\n{"name": "Bash", "arguments": {"command": "ls"}}\n```\nok'
    pieces, _ = scan(text, piece_size=2)
    assert [p for p in pieces if isinstance(p, ToolCall)] == [
        ToolCall("Bash", {"command": "ls"}, '```json\n{"name": "Bash", "arguments": {"command": "ls"}}\n```')
    ]
    assert joined_text(pieces) == "Listing:\n\nok"


def test_a_fenced_json_block_that_is_not_a_call_stays_text_without_a_problem():
    text = 'Example config:\n```json\n{"retries": 3, "note": "it\'s fine"}\n```\nThat is all.'
    pieces, scanner = scan(text, piece_size=4)
    assert joined_text(pieces) == text and scanner.problems == []


def test_arguments_encoded_as_a_json_string_are_decoded():
    pieces, _ = scan('<tool_call>{"name": "Read", "arguments": "{\\"file_path\\": \\"/x\\"}"}</tool_call>')
    assert pieces[0].arguments == {"file_path": "/x"}


def test_only_the_configured_syntaxes_are_recognised():
    text = '```json\n{"name": "Bash", "arguments": {"command": "ls"}}\n```'
    pieces, _ = scan(text, syntaxes=(HERMES,))
    assert joined_text(pieces) == text


def test_a_reply_without_calls_comes_out_as_exactly_the_same_text():
    text = "  \nA reply with <b>tags</b>, `code`, ```python\nprint(1)\n``` and <tool_calls> mentioned.\n  "
    for piece_size in (1, 3, 1000):
        pieces, scanner = scan(text, piece_size=piece_size)
        assert joined_text(pieces) == text and scanner.calls_found == 0


# --- SSE framing ---------------------------------------------------------------


def test_events_split_at_every_byte_come_out_whole_even_inside_utf8_characters():
    data = fixture("anthropic_text_then_call.sse")
    whole = SSEParser().feed(data)
    for split in range(1, len(data)):
        parser = SSEParser()
        assert parser.feed(data[:split]) + parser.feed(data[split:]) == whole
        assert parser.finish() == b""


def test_crlf_line_endings_are_understood():
    events = SSEParser().feed(b'event: ping\r\ndata: {"type":"ping"}\r\n\r\ndata: [DONE]\r\n\r\n')
    assert [(e.event, e.data) for e in events] == [("ping", '{"type":"ping"}'), (None, "[DONE]")]


def test_an_unfinished_last_event_is_returned_as_bytes_at_the_end():
    parser = SSEParser()
    assert parser.feed(b"data: 1\n\ndata: 2") [0].data == "1"
    assert parser.finish() == b"data: 2"


# --- Anthropic streams ---------------------------------------------------------


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_anthropic_text_then_call_becomes_text_block_then_tool_use(chunk_size):
    rewriter = AnthropicStreamRewriter(ANTHROPIC_TOOLS)
    message = anthropic_message(run_stream(rewriter, fixture("anthropic_text_then_call.sse"), chunk_size))
    text, call = message["content"]
    assert text == {"type": "text", "text": "Let me read the file — café ☕ 파일.\n\n"}
    assert call["type"] == "tool_use" and call["id"].startswith("toolu_")
    assert (call["name"], call["input"]) == ("Read", {"file_path": "/src/app.py", "limit": 40})
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 812, "output_tokens": 57}
    assert rewriter.calls_converted == 1 and rewriter.problems == []


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_anthropic_two_calls_become_two_tool_use_blocks_numbered_from_zero(chunk_size):
    message = anthropic_message(run_stream(AnthropicStreamRewriter(ANTHROPIC_TOOLS), fixture("anthropic_two_calls.sse"), chunk_size))
    assert [(b["type"], b["name"], b["input"]) for b in message["content"]] == [
        ("tool_use", "Bash", {"command": 'grep -n "</tool_call>" *.py'}),
        ("tool_use", "Glob", {"pattern": "**/*.md"}),
    ]
    assert len({b["id"] for b in message["content"]}) == 2
    assert message["stop_reason"] == "tool_use"


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_anthropic_fenced_call_between_texts_gives_text_tool_use_text(chunk_size):
    message = anthropic_message(run_stream(AnthropicStreamRewriter(ANTHROPIC_TOOLS), fixture("anthropic_fenced_call.sse"), chunk_size))
    assert [b["type"] for b in message["content"]] == ["text", "tool_use", "text"]
    assert message["content"][0]["text"] == "Listing the directory:\n"
    assert message["content"][1]["input"] == {"command": "ls -la"}
    assert message["content"][2]["text"] == "\nThat should show it."


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_anthropic_malformed_call_is_sent_as_the_original_text_with_stop_reason_kept(chunk_size):
    rewriter = AnthropicStreamRewriter(ANTHROPIC_TOOLS)
    message = anthropic_message(run_stream(rewriter, fixture("anthropic_malformed_call.sse"), chunk_size))
    original = anthropic_message(fixture("anthropic_malformed_call.sse"))
    assert message["content"] == original["content"]
    assert message["stop_reason"] == "max_tokens"
    assert len(rewriter.problems) == 1 and "JSON does not parse" in rewriter.problems[0]


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_anthropic_call_to_unknown_tool_is_sent_as_the_original_text(chunk_size):
    rewriter = AnthropicStreamRewriter(ANTHROPIC_TOOLS)
    message = anthropic_message(run_stream(rewriter, fixture("anthropic_unknown_tool.sse"), chunk_size))
    assert message["content"] == anthropic_message(fixture("anthropic_unknown_tool.sse"))["content"]
    assert message["stop_reason"] == "end_turn"
    assert "'DeleteRepository' was not offered" in rewriter.problems[0]


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_anthropic_response_with_structured_tool_use_passes_byte_for_byte(chunk_size):
    data = fixture("anthropic_structured_call.sse")
    rewriter = AnthropicStreamRewriter(ANTHROPIC_TOOLS)
    assert run_stream(rewriter, data, chunk_size) == data
    assert rewriter.upstream_structured and rewriter.calls_converted == 0


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_anthropic_server_repeating_a_converted_call_as_tool_use_is_not_run_twice(chunk_size):
    rewriter = AnthropicStreamRewriter(ANTHROPIC_TOOLS)
    message = anthropic_message(run_stream(rewriter, fixture("anthropic_call_in_text_and_repeated.sse"), chunk_size))
    assert [(b["type"], b.get("input")) for b in message["content"]] == [
        ("text", None),
        ("tool_use", {"file_path": "/src/a.py"}),
        ("tool_use", {"file_path": "/src/b.py"}),  # the server's own, different call is kept
    ]
    assert message["content"][1]["id"].startswith("toolu_") and message["content"][2]["id"] == "call_vllm02"
    assert rewriter.duplicates_dropped == 1 and message["stop_reason"] == "tool_use"


def test_anthropic_plain_text_reply_passes_byte_for_byte():
    data = text_stream("Hello, I looked at ", "the code and it is fine.")
    assert run_stream(AnthropicStreamRewriter(ANTHROPIC_TOOLS), data, 7) == data


def test_anthropic_blocks_after_a_converted_call_are_renumbered():
    message = anthropic_message(run_stream(AnthropicStreamRewriter(ANTHROPIC_TOOLS), text_stream(f"A{READ_CALL}", "B"), 5))
    assert [(b["type"], b.get("text")) for b in message["content"]] == [("text", "A"), ("tool_use", None), ("text", "B")]


def test_anthropic_empty_text_block_stays_an_empty_block():
    message = anthropic_message(run_stream(AnthropicStreamRewriter(ANTHROPIC_TOOLS), text_stream(""), 3))
    assert message["content"] == [{"type": "text", "text": ""}]


def test_anthropic_text_before_a_call_is_sent_before_the_call_arrives():
    data = fixture("anthropic_text_then_call.sse")
    rewriter = AnthropicStreamRewriter(ANTHROPIC_TOOLS)
    sent = rewriter.feed(data[: data.index(b'\\"name\\": \\"Read')])
    text = "".join(e.json()["delta"]["text"] for e in SSEParser().feed(sent) if e.event == "content_block_delta")
    assert text == "Let me read the file — café ☕ 파일.\n\n"
    assert b"tool_use" not in sent


# --- OpenAI streams --------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_openai_text_then_call_becomes_content_then_tool_calls(chunk_size):
    rewriter = OpenAIStreamRewriter(OPENAI_TOOLS)
    completion = openai_completion(run_stream(rewriter, fixture("openai_text_then_call.sse"), chunk_size))
    assert completion["content"] == "Checking the tests — naïve ✓ 테스트.\n"
    [call] = completion["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function" and call["name"] == "run_tests"
    assert json.loads(call["arguments"]) == {"path": "tests/", "verbose": True}
    assert completion["finish_reason"] == "tool_calls"
    assert completion["usage"] == {"prompt_tokens": 431, "completion_tokens": 48, "total_tokens": 479}


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_openai_two_calls_become_tool_calls_zero_and_one(chunk_size):
    completion = openai_completion(run_stream(OpenAIStreamRewriter(OPENAI_TOOLS), fixture("openai_two_calls.sse"), chunk_size))
    assert [(c["name"], json.loads(c["arguments"])) for c in completion["tool_calls"]] == [
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "b.txt"}),
    ]
    assert completion["content"] == "" and completion["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_openai_malformed_call_is_sent_as_the_original_text_with_finish_reason_kept(chunk_size):
    rewriter = OpenAIStreamRewriter(OPENAI_TOOLS)
    completion = openai_completion(run_stream(rewriter, fixture("openai_malformed_call.sse"), chunk_size))
    assert completion == openai_completion(fixture("openai_malformed_call.sse"))
    assert completion["finish_reason"] == "stop" and "JSON does not parse" in rewriter.problems[0]


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_openai_call_to_unknown_tool_is_sent_as_the_original_text(chunk_size):
    rewriter = OpenAIStreamRewriter(OPENAI_TOOLS)
    completion = openai_completion(run_stream(rewriter, fixture("openai_unknown_tool.sse"), chunk_size))
    assert completion == openai_completion(fixture("openai_unknown_tool.sse"))
    assert "'format_disk' was not offered" in rewriter.problems[0]


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_openai_response_with_structured_tool_calls_passes_byte_for_byte(chunk_size):
    data = fixture("openai_structured_call.sse")
    assert run_stream(OpenAIStreamRewriter(OPENAI_TOOLS), data, chunk_size) == data


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_openai_server_repeating_a_converted_call_as_tool_calls_is_not_run_twice(chunk_size):
    rewriter = OpenAIStreamRewriter(OPENAI_TOOLS)
    completion = openai_completion(run_stream(rewriter, fixture("openai_call_in_text_and_repeated.sse"), chunk_size))
    assert completion["content"] == "Both files.\n"
    assert [(c["name"], json.loads(c["arguments"])) for c in completion["tool_calls"]] == [
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "b.txt"}),  # the server's own, different call is kept
    ]
    assert completion["tool_calls"][1]["id"] == "call_vllm02"
    assert rewriter.duplicates_dropped == 1 and completion["finish_reason"] == "tool_calls"
    assert completion["usage"]["total_tokens"] == 340


def test_openai_stream_cut_short_without_finish_or_done_still_flushes_held_text():
    data = fixture("openai_malformed_call.sse")
    cut = data[: data.index(b'data: {"id":"chatcmpl-fx13","object":"chat.completion.chunk","created":1764480002,"model":"qwen3-coder-30b-a3b","choices":[{"index":0,"delta":{},')]
    out = run_stream(OpenAIStreamRewriter(OPENAI_TOOLS), cut, 4)
    contents = [c["delta"].get("content") or "" for e in SSEParser().feed(out) for c in e.json()["choices"]]
    assert "".join(contents).endswith('<tool_call>\n{"name": "run_tests", "arguments": {"path": "tests/')


# --- non-streamed bodies -----------------------------------------------------------


def test_anthropic_message_body_text_call_becomes_tool_use_and_stop_reason_tool_use():
    message = {"id": "m", "content": [{"type": "text", "text": f"Reading.\n{READ_CALL}"}], "stop_reason": "end_turn", "usage": {"output_tokens": 3}}
    rewritten, calls, problems = rewrite_message(message, ANTHROPIC_TOOLS)
    assert calls == 1 and problems == []
    assert rewritten["content"][0] == {"type": "text", "text": "Reading.\n"}
    assert rewritten["content"][1]["name"] == "Read" and rewritten["content"][1]["input"] == {"file_path": "/a.py"}
    assert rewritten["stop_reason"] == "tool_use" and rewritten["usage"] == {"output_tokens": 3}
    assert message["content"][0]["text"].endswith("</tool_call>"), "the input is not modified"


def test_anthropic_message_body_with_structured_tool_use_is_left_alone():
    message = {"content": [{"type": "text", "text": READ_CALL}, {"type": "tool_use", "id": "t", "name": "Read", "input": {}}]}
    assert rewrite_message(message, ANTHROPIC_TOOLS) == (None, 0, [])


def test_openai_completion_body_text_call_becomes_tool_calls():
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": READ_CALL.replace("Read", "read_file")}, "finish_reason": "stop"}]}
    rewritten, calls, _ = rewrite_completion(completion, OPENAI_TOOLS)
    message = rewritten["choices"][0]["message"]
    assert calls == 1 and message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"file_path": "/a.py"}'}
    assert rewritten["choices"][0]["finish_reason"] == "tool_calls"


def test_openai_completion_body_without_calls_is_left_alone():
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "just text"}, "finish_reason": "stop"}]}
    assert rewrite_completion(completion, OPENAI_TOOLS) == (None, 0, [])


# --- the addon's hooks ---------------------------------------------------------------


def anthropic_flow(tools=("Read",), *, content_type="text/event-stream", body: bytes = b"", headers=()) -> tflow.HTTPFlow:
    request = {"model": "m", "stream": True, "messages": [], "tools": [{"name": name, "input_schema": {}} for name in tools]}
    flow = tflow.tflow(req=tutils.treq(method=b"POST", path=b"/v1/messages?beta=true", content=json.dumps(request).encode()))
    flow.response = tutils.tresp(content=body)
    flow.response.headers["content-type"] = content_type
    for name, value in headers:
        flow.response.headers[name] = value
    return flow


def test_a_streamed_reply_to_a_request_with_tools_gets_a_transforming_stream():
    addon = toolcall_stream.ToolCallStream()
    with taddons.context(addon):
        flow = anthropic_flow()
        addon.responseheaders(flow)
        assert callable(flow.response.stream)
        out = b"".join(flow.response.stream(fixture("anthropic_text_then_call.sse"))) + b"".join(flow.response.stream(b""))
        assert [b["type"] for b in anthropic_message(out)["content"]] == ["text", "tool_use"]
        assert "1 text tool call(s) turned into structured calls" in flow.comment and flow.marked


# Streams the addon leaves alone: the flow (`anthropic_flow`'s arguments) and the addon's options.
LEFT_ALONE = {
    "a-request-that-offered-no-tools": ({"tools": ()}, {}),
    "the-addon-switched-off": ({}, {"toolcall_stream": False}),
    "a-compressed-stream": ({"headers": [("content-encoding", "gzip")]}, {}),
}


@pytest.mark.parametrize(("flow_arguments", "options"), LEFT_ALONE.values(), ids=list(LEFT_ALONE))
def test_a_stream_is_left_alone(flow_arguments, options):
    addon = toolcall_stream.ToolCallStream()
    with taddons.context(addon) as tctx:
        if options:
            tctx.configure(addon, **options)
        flow = anthropic_flow(**flow_arguments)
        addon.responseheaders(flow)
        assert flow.response.stream is False


def test_a_stream_with_content_length_is_switched_to_chunked():
    addon = toolcall_stream.ToolCallStream()
    with taddons.context(addon):
        flow = anthropic_flow(headers=[("content-length", "1234")])
        addon.responseheaders(flow)
        assert "content-length" not in flow.response.headers
        assert flow.response.headers["transfer-encoding"] == "chunked"


def test_a_transform_set_by_an_earlier_addon_runs_first_and_both_see_the_end():
    addon = toolcall_stream.ToolCallStream()
    seen = []

    def earlier(chunk: bytes) -> bytes:
        seen.append(chunk)
        return chunk

    with taddons.context(addon):
        flow = anthropic_flow(tools=("Bash", "Glob"))
        flow.response.stream = earlier
        addon.responseheaders(flow)
        data = fixture("anthropic_two_calls.sse")
        out = b"".join(flow.response.stream(data[:100])) + b"".join(flow.response.stream(data[100:]))
        out += b"".join(flow.response.stream(b""))
        assert seen == [data[:100], data[100:], b""]
        assert [b["name"] for b in anthropic_message(out)["content"]] == ["Bash", "Glob"]


def test_the_stream_never_yields_an_empty_chunk_which_would_end_a_chunked_body():
    addon = toolcall_stream.ToolCallStream()
    with taddons.context(addon):
        flow = anthropic_flow()
        addon.responseheaders(flow)
        data = fixture("anthropic_two_calls.sse")
        outputs = [flow.response.stream(data[at : at + 3]) for at in range(0, len(data), 3)] + [flow.response.stream(b"")]
        assert all(chunk for output in outputs for chunk in output)


def test_a_non_streamed_anthropic_reply_is_rewritten_and_the_flow_marked():
    addon = toolcall_stream.ToolCallStream()
    body = {"content": [{"type": "text", "text": READ_CALL}], "stop_reason": "end_turn", "usage": {"output_tokens": 4}}
    with taddons.context(addon):
        flow = anthropic_flow(content_type="application/json", body=json.dumps(body).encode())
        addon.responseheaders(flow)
        assert flow.response.stream is False
        addon.response(flow)
        rewritten = json.loads(flow.response.content)
        assert rewritten["content"][0]["type"] == "tool_use" and rewritten["stop_reason"] == "tool_use"
        assert flow.marked and "turned into structured calls" in flow.comment


def test_a_non_streamed_reply_with_an_unknown_tool_is_left_byte_for_byte_and_the_problem_noted():
    addon = toolcall_stream.ToolCallStream()
    body = json.dumps({"content": [{"type": "text", "text": READ_CALL.replace("Read", "Nope")}]}).encode()
    with taddons.context(addon):
        flow = anthropic_flow(content_type="application/json", body=body)
        addon.response(flow)
        assert flow.response.content == body
        assert "'Nope' was not offered" in flow.comment


def test_an_error_reply_is_left_alone():
    addon = toolcall_stream.ToolCallStream()
    with taddons.context(addon):
        flow = anthropic_flow()
        flow.response.status_code = 500
        addon.responseheaders(flow)
        assert flow.response.stream is False


def test_an_unknown_syntax_name_is_rejected_naming_the_option_and_value():
    addon = toolcall_stream.ToolCallStream()
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError, match=r"toolcall_stream_syntaxes: 'hermes,xml'"):
            tctx.configure(addon, toolcall_stream_syntaxes="hermes,xml")


def test_the_script_file_loads_as_mitmdump_would_load_it():
    with taddons.context() as tctx:
        module = tctx.script(str(Path(toolcall_stream.__file__)))
        [addon] = module.addons
        assert type(addon).__name__ == "ToolCallStream"
        assert tctx.options.toolcall_stream_syntaxes == "hermes,json_fence"


def test_anthropic_thinking_block_before_a_call_keeps_index_zero_and_the_call_takes_one():
    events = [
        {"type": "message_start", "message": {"id": "m", "content": [], "usage": {"input_tokens": 5}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Need the file."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "\n" + READ_CALL}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 20}},
        {"type": "message_stop"},
    ]
    data = b"".join(format_event(event, event["type"]) for event in events)
    message = anthropic_message(run_stream(AnthropicStreamRewriter(ANTHROPIC_TOOLS), data, 6))
    assert [b["type"] for b in message["content"]] == ["thinking", "tool_use"]
    assert message["content"][0]["thinking"] == "Need the file."
    assert message["content"][1]["input"] == {"file_path": "/a.py"}
    assert message["stop_reason"] == "tool_use"
