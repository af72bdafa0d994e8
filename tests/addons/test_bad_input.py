"""Bodies a client got wrong, in process: what the probe of issue 18 found, kept as specifications.

Each goes through strip_billing and capture as `stable-prefix up` loads them
(tests/support/addon_pipeline.py); tests/addons/test_fuzz_proxy.py sends the same
ones through a real mitmdump.
"""

from __future__ import annotations

import json

import pytest

from stable_prefix.addons.request_body import MAX_NESTING, parse_json
from tests.support.addon_pipeline import SERVED_MODEL, addon_pipeline

PATH = "/v1/messages?beta=true"
JSON = [("content-type", "application/json")]
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.a3f; cc_entrypoint=cli; cc_prev_req=req_011; cc_prompt_id=5c1e; cc_is_subagent=true;"


def turn(*texts: str) -> dict:
    return {"model": "claude-opus-4-8", "max_tokens": 100, "system": [{"type": "text", "text": BILLING}, {"type": "text", "text": "You code."}],
            "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i, text in enumerate(texts)]}


def escaped(body: dict) -> bytes:
    return json.dumps(body).encode()  # ASCII: a lone surrogate as its \\u escape, as JSON.stringify writes it


@pytest.fixture
def pipeline(tmp_path):
    with addon_pipeline(tmp_path) as pipeline:
        yield pipeline


def test_a_lone_surrogate_escape_is_forwarded_as_an_escape_in_valid_utf8(pipeline):
    result = pipeline.send(PATH, escaped(turn("fix the emoji \ud83d cut in half")), JSON)
    forwarded = result.request.raw_content
    assert b"\\ud83d" in forwarded and b"\xed\xa0\xbd" not in forwarded
    body = json.loads(forwarded.decode("utf-8"))  # strict UTF-8
    assert body["messages"][0]["content"] == "fix the emoji \ud83d cut in half"
    assert body["model"] == SERVED_MODEL and BILLING not in json.dumps(body)


def test_a_lone_surrogate_is_captured_on_its_turn_and_every_later_one(pipeline):
    first = pipeline.send(PATH, escaped(turn("cut \ud83d")), JSON)
    later = pipeline.send(PATH, escaped(turn("cut \ud83d", "done", "thanks")), JSON)
    for result in (first, later):
        [record] = result.records
        assert json.loads(record.read_bytes().decode("utf-8"))["client_body"]["messages"][0]["content"] == "cut \ud83d"
        assert result.leftovers == []
    assert [path.suffix for path in pipeline.session_dir.iterdir()] == [".json", ".json"]


def test_a_body_nested_past_the_recursion_limit_passes_untouched_logged_once_and_is_captured(pipeline):
    deep = b'{"model":"claude-opus-4-8","messages":[{"role":"user","content":' + b"[" * 5000 + b"]" * 5000 + b"}]}"
    result = pipeline.send(PATH, deep, JSON)
    assert result.request.raw_content == deep
    assert result.warnings == [f"POST {PATH}: body is not valid JSON (nested deeper than {MAX_NESTING} levels); passed through unchanged"]
    [record] = result.records
    assert json.loads(record.read_text())["client_body_text"] == deep.decode()


def test_a_body_nested_as_deep_as_the_limit_is_read_and_normalized(pipeline):
    body = {**turn("hello"), "metadata": json.loads("[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1))}
    result = pipeline.send(PATH, escaped(body), JSON)
    assert json.loads(result.request.content)["model"] == SERVED_MODEL
    assert result.warnings == []


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_of_another_content_type_passes_untouched_and_says_once_it_was_not_read(pipeline, content_type):
    raw = escaped(turn("hello"))
    result = pipeline.send(PATH, raw, [("content-type", content_type)])
    assert result.request.raw_content == raw
    assert result.warnings == [f"POST {PATH}: content-type is {content_type!r}, not JSON, so the body was not read; passed through unchanged"]


@pytest.mark.parametrize(("raw", "reason"), [
    (b'{"model":"a","model":"b","messages":[]}', "key 'model' appears twice in one object"),
    (b'{"model":"a","temperature":NaN,"messages":[]}', "NaN is not JSON"),
    (b'{"model":"a","temperature":1e999,"messages":[]}', "number 1e999 is out of range"),
    (b'{"model":"caf\xe9","messages":[]}', "not UTF-8"),
    (b'{"model":"\xed\xa0\xbd","messages":[]}', "not UTF-8"),  # the raw bytes the proxy used to write for a surrogate
])
def test_json_a_re_encoding_would_change_passes_untouched_with_the_reason(pipeline, raw, reason):
    result = pipeline.send(PATH, raw, JSON)
    assert result.request.raw_content == raw
    [warning] = result.warnings
    assert reason in warning and warning.endswith("; passed through unchanged")


def test_a_billing_line_in_user_text_stays_and_one_in_the_middle_of_a_system_block_goes(pipeline):
    body = turn(f"why does my prompt say\n{BILLING}\nhere?")
    body["system"] = [{"type": "text", "text": f"You code.\n{BILLING}\nBe brief."}]
    forwarded = json.loads(pipeline.send(PATH, escaped(body), JSON).request.content)
    assert forwarded["system"] == [{"type": "text", "text": "You code.\nBe brief."}]
    assert forwarded["messages"][0]["content"] == body["messages"][0]["content"]


def test_parse_json_reads_exactly_the_limit_and_refuses_one_more():
    assert parse_json(b"[" * MAX_NESTING + b"]" * MAX_NESTING) is not None
    with pytest.raises(ValueError, match="nested deeper"):
        parse_json(b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1))


def test_a_line_ends_at_a_newline_only_so_a_billing_header_after_another_separator_stays(pipeline):
    body = turn("hello")
    body["system"] = [{"type": "text", "text": f"You code.\u2028{BILLING}\n{BILLING}\r\nBe brief."}]
    forwarded = json.loads(pipeline.send(PATH, escaped(body), JSON).request.content)
    assert forwarded["system"] == [{"type": "text", "text": f"You code.\u2028{BILLING}\nBe brief."}]


def test_a_loaded_tools_schema_with_a_line_separator_in_its_description_is_inlined_whole(pipeline):
    fetch = {"type": "function", "function": {"name": "WebFetch", "description": "Fetch\u2028a page.", "parameters": {"type": "object"}}}
    body = {"model": "m", "tools": [fetch], "messages": [
        {"role": "user", "content": "load it"},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps([{"type": "tool_reference", "tool_name": "WebFetch"}])}]}
    forwarded = json.loads(pipeline.send("/v1/chat/completions", escaped(body), JSON).request.content)
    assert forwarded["tools"] == []
    assert forwarded["messages"][1]["content"] == (
        '<functions>\n<function>{"description": "Fetch\u2028a page.", "name": "WebFetch", "parameters": {"type": "object"}}</function>\n</functions>')
