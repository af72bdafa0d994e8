"""toolcall_stream end to end: a real mitmdump in front of a loopback upstream.

The upstream replays our recorded-shape fixtures in awkward pieces with small
delays; the clients are the official `anthropic` and `openai` SDKs with their
streaming helpers, as an application would use them. One mitmdump serves all
tests of a module (starting one costs seconds on a small CPU).
"""

from __future__ import annotations

import json
import time

import anthropic
import openai
import pytest

from tests.support.processes import free_port, mitmdump_command, running
from tests.support.sse_upstream import sse_upstream

pytestmark = pytest.mark.server

MODEL = "qwen3-coder-30b-a3b"
ANTHROPIC_TOOLS = [
    {"name": name, "description": f"{name} tool", "input_schema": {"type": "object", "properties": {}}}
    for name in ("Read", "Bash", "Glob")
]
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in ("run_tests", "read_file")
]
SCRIPTS = {
    "toolcall_stream alone": ["addons/toolcall_stream.py"],
    # strip_billing also sets `stream` for SSE; the composition must hold in either load order.
    "after strip_billing": ["addons/strip_billing.py", "addons/toolcall_stream.py"],
    "before strip_billing": ["addons/toolcall_stream.py", "addons/strip_billing.py"],
}


@pytest.fixture(scope="module")
def upstream():
    with sse_upstream(delay=0.002) as server:
        yield server


@pytest.fixture(scope="module", params=list(SCRIPTS), ids=list(SCRIPTS))
def proxy(request, upstream, tmp_path_factory):
    port = free_port()
    command = mitmdump_command(SCRIPTS[request.param], upstream.url, port)
    with running("mitmdump", command, port=port, log_dir=tmp_path_factory.mktemp("mitmdump"), startup_timeout=60) as server:
        yield server


def anthropic_client(proxy) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="test-key", max_retries=0, timeout=30)


def openai_client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="test-key", max_retries=0, timeout=30)


def stream_anthropic(proxy, fixture: str, tools=ANTHROPIC_TOOLS, **headers):
    with anthropic_client(proxy).messages.stream(
        model=MODEL,
        max_tokens=256,
        messages=[{"role": "user", "content": "look at app.py"}],
        extra_headers={"x-test-fixture": fixture, **headers},
        **({"tools": tools} if tools else {}),
    ) as stream:
        events = list(stream)
        return stream.get_final_message(), events


def stream_openai(proxy, fixture: str):
    with openai_client(proxy).chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": "run the tests"}],
        tools=OPENAI_TOOLS,
        stream_options={"include_usage": True},
        extra_headers={"x-test-fixture": fixture},
    ) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion()


def test_anthropic_sdk_gets_text_then_a_tool_use_block(proxy):
    message, _ = stream_anthropic(proxy, "anthropic_text_then_call.sse")
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[0].text == "Let me read the file — café ☕ 파일.\n\n"
    assert message.content[1].name == "Read"
    assert message.content[1].input == {"file_path": "/src/app.py", "limit": 40}
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (812, 57)


def test_anthropic_sdk_gets_two_tool_use_blocks(proxy):
    message, _ = stream_anthropic(proxy, "anthropic_two_calls.sse")
    assert [(block.name, block.input) for block in message.content] == [
        ("Bash", {"command": 'grep -n "</tool_call>" *.py'}),
        ("Glob", {"pattern": "**/*.md"}),
    ]
    assert message.stop_reason == "tool_use"


def test_anthropic_sdk_gets_a_fenced_call_between_two_texts(proxy):
    message, _ = stream_anthropic(proxy, "anthropic_fenced_call.sse")
    assert [block.type for block in message.content] == ["text", "tool_use", "text"]
    assert message.content[1].input == {"command": "ls -la"}


def test_anthropic_malformed_call_arrives_as_the_original_text_and_is_logged(proxy):
    message, _ = stream_anthropic(proxy, "anthropic_malformed_call.sse")
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == 'Running it.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "make test"}'
    assert message.stop_reason == "max_tokens"
    assert "JSON does not parse" in proxy.log_text()


def test_anthropic_call_to_a_tool_not_offered_arrives_as_text_and_is_logged(proxy):
    message, _ = stream_anthropic(proxy, "anthropic_unknown_tool.sse")
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text.startswith('<tool_call>\n{"name": "DeleteRepository"')
    assert "'DeleteRepository' was not offered" in proxy.log_text()


def test_anthropic_structured_tool_use_from_upstream_is_untouched(proxy):
    message, _ = stream_anthropic(proxy, "anthropic_structured_call.sse")
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].id == "toolu_upstream01"


def test_anthropic_call_the_server_repeats_as_tool_use_reaches_the_client_once(proxy):
    message, _ = stream_anthropic(proxy, "anthropic_call_in_text_and_repeated.sse")
    assert [(block.type, getattr(block, "input", None)) for block in message.content] == [
        ("text", None),
        ("tool_use", {"file_path": "/src/a.py"}),
        ("tool_use", {"file_path": "/src/b.py"}),
    ]
    assert "1 repeat(s) of them the server sent as well were dropped" in proxy.log_text()


def test_anthropic_request_without_tools_gets_the_text_as_it_was(proxy):
    message, _ = stream_anthropic(proxy, "anthropic_text_then_call.sse", tools=None)
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text.endswith('"limit": 40}}\n</tool_call>')
    assert message.stop_reason == "end_turn"


def test_anthropic_text_before_a_call_reaches_the_client_before_the_call_is_sent(proxy):
    pause = 1.5
    started = time.monotonic()
    events = []
    with anthropic_client(proxy).messages.stream(
        model=MODEL,
        max_tokens=256,
        messages=[{"role": "user", "content": "look at app.py"}],
        tools=ANTHROPIC_TOOLS,
        extra_headers={
            "x-test-fixture": "anthropic_text_then_call.sse",
            # The upstream stops right after "<tool" and before the rest of the call.
            "x-test-pause-before": '_call>\\n{\\"name',
            "x-test-pause-seconds": str(pause),
        },
    ) as stream:
        for event in stream:
            events.append((time.monotonic() - started, event))
    text_seen = [at for at, event in events if event.type == "text" and "파일" in event.text]
    tool_seen = [at for at, event in events if event.type == "content_block_start" and event.content_block.type == "tool_use"]
    assert text_seen and tool_seen
    assert text_seen[0] < pause, f"text arrived after {text_seen[0]:.2f}s: held back with the call"
    assert tool_seen[0] >= pause


def test_openai_sdk_gets_content_then_tool_calls(proxy):
    completion = stream_openai(proxy, "openai_text_then_call.sse")
    choice = completion.choices[0]
    assert choice.message.content == "Checking the tests — naïve ✓ 테스트.\n"
    [call] = choice.message.tool_calls
    assert call.function.name == "run_tests"
    assert json.loads(call.function.arguments) == {"path": "tests/", "verbose": True}
    assert choice.finish_reason == "tool_calls"
    assert completion.usage.total_tokens == 479


def test_openai_sdk_gets_two_tool_calls(proxy):
    completion = stream_openai(proxy, "openai_two_calls.sse")
    calls = completion.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "b.txt"}),
    ]
    assert len({c.id for c in calls}) == 2
    assert completion.choices[0].finish_reason == "tool_calls"


def test_openai_malformed_call_arrives_as_the_original_text(proxy):
    completion = stream_openai(proxy, "openai_malformed_call.sse")
    choice = completion.choices[0]
    assert choice.message.content == 'Let me check.\n<tool_call>\n{"name": "run_tests", "arguments": {"path": "tests/'
    assert not choice.message.tool_calls and choice.finish_reason == "stop"


def test_openai_call_to_a_tool_not_offered_arrives_as_text(proxy):
    completion = stream_openai(proxy, "openai_unknown_tool.sse")
    assert completion.choices[0].message.content.startswith('<tool_call>\n{"name": "format_disk"')
    assert "'format_disk' was not offered" in proxy.log_text()


def test_openai_structured_tool_calls_from_upstream_are_untouched(proxy):
    completion = stream_openai(proxy, "openai_structured_call.sse")
    [call] = completion.choices[0].message.tool_calls
    assert call.id == "call_upstream01" and call.function.arguments == '{"path": "tests/"}'


def test_openai_call_the_server_repeats_as_tool_calls_reaches_the_client_once(proxy):
    completion = stream_openai(proxy, "openai_call_in_text_and_repeated.sse")
    calls = completion.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == [{"path": "a.txt"}, {"path": "b.txt"}]
    assert completion.choices[0].message.content == "Both files.\n"


def test_anthropic_non_streamed_reply_gets_a_tool_use_block(proxy):
    message = anthropic_client(proxy).messages.create(
        model=MODEL,
        max_tokens=256,
        messages=[{"role": "user", "content": "look"}],
        tools=ANTHROPIC_TOOLS,
        extra_headers={"x-test-fixture": "anthropic_text_then_call.json"},
    )
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"file_path": "/src/app.py"}
    assert message.stop_reason == "tool_use" and message.usage.output_tokens == 41


def test_openai_non_streamed_reply_gets_tool_calls(proxy):
    completion = openai_client(proxy).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "run"}],
        tools=OPENAI_TOOLS,
        extra_headers={"x-test-fixture": "openai_text_then_call.json"},
    )
    choice = completion.choices[0]
    assert choice.message.content == "Checking.\n"
    assert choice.message.tool_calls[0].function.name == "run_tests"
    assert choice.finish_reason == "tool_calls"
