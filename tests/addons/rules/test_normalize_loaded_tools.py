"""Inline loaded tools: a deferred tool that ToolSearch loaded leaves `tools`
for the tool result that loaded it, and stays callable."""

import copy
import json

import pytest

from stable_prefix.addons import normalize, request_shape, toolcall_stream
from stable_prefix.addons.normalize import Rules
from stable_prefix.addons.prompt_order import compare, prompt_order
from stable_prefix.addons.rules import loaded_tools
from stable_prefix.addons.rules.base import Change
from stable_prefix.addons.rules.loaded_tools import INLINED_TOOLS_CLOSE, INLINED_TOOLS_OPEN
from tests.fixtures import claude_code


def loaded_at_2(turns=3):
    return claude_code.modern_request(turns, load_tools_at={2: ("WebFetch",)})


def schema_line(tool):
    entry = {"description": tool["description"], "name": tool["name"], "parameters": tool["input_schema"]}
    return f"<function>{json.dumps(entry, ensure_ascii=False)}</function>"


def search_result(body):
    """The tool_result block of the ToolSearch call."""
    return next(block for message in body["messages"] if message["role"] == "user" and isinstance(message["content"], list)
                for block in message["content"] if block.get("type") == "tool_result" and block["tool_use_id"].startswith("toolu_search"))


def forwarded_tools(body):
    body = copy.deepcopy(body)
    loaded_tools.inline_loaded_tools(body, "anthropic")
    return body["tools"]


def test_a_loaded_deferred_tool_leaves_tools_for_the_tool_result_that_loaded_it():
    body = loaded_at_2()
    changes = loaded_tools.inline_loaded_tools(body, "anthropic")
    assert "WebFetch" not in request_shape.tool_names(body)
    web_fetch = claude_code.DEFERRED_TOOLS["WebFetch"]
    assert search_result(body)["content"] == [{"type": "text", "text": f"{INLINED_TOOLS_OPEN}{schema_line(web_fetch)}\n{INLINED_TOOLS_CLOSE}"}]
    assert changes[:2] == [Change("loaded_tools", "messages[5]", "schema of WebFetch written into the tool result that loaded it"),
                           Change("loaded_tools", "tools", "loaded tool WebFetch taken out of tools")]


def test_a_deferred_tool_nothing_loads_goes_last():
    body = claude_code.modern_request(1)
    changes = loaded_tools.inline_loaded_tools(body, "anthropic")
    assert body["tools"][-1] == claude_code.PLACEHOLDER_TOOL
    assert request_shape.tool_names(body)[:-1] == [name for name in request_shape.tool_names(claude_code.modern_request(1)) if name != "DeferredPlaceholder"]
    assert changes == [Change("loaded_tools", "tools", "deferred tool DeferredPlaceholder, loaded by no tool_reference, put last")]


def test_after_compact_a_tool_loaded_earlier_goes_last_and_the_tools_sent_in_full_still_lead():
    compacted = claude_code.compacted_request()
    compacted["tools"] = loaded_at_2(4)["tools"]  # the tool stays loaded; the ToolSearch result is summarized away
    in_full = len(claude_code.MODERN_TOOLS)
    start, after = forwarded_tools(claude_code.modern_request(1)), forwarded_tools(compacted)
    assert after[:in_full] == start[:in_full] == claude_code.MODERN_TOOLS
    assert [tool["name"] for tool in after[in_full:]] == ["WebFetch", "DeferredPlaceholder"]


def test_tools_after_a_load_are_byte_for_byte_those_the_conversation_started_with():
    assert forwarded_tools(loaded_at_2(5)) == forwarded_tools(claude_code.modern_request(1))


def test_the_turn_after_a_load_keeps_the_whole_prefix():
    before, after = claude_code.modern_request(2), loaded_at_2(3)
    as_sent = compare(prompt_order(before, "anthropic"), prompt_order(after, "anthropic"))
    for body in (before, after):
        normalize.normalize(body, "anthropic")
    inlined = compare(prompt_order(before, "anthropic"), prompt_order(after, "anthropic"))
    assert as_sent.first_divergence.path.startswith("tools[")
    assert inlined.prefix_kept


def test_a_deferred_tool_nothing_loaded_stays_in_tools():
    body = loaded_at_2()
    loaded_tools.inline_loaded_tools(body, "anthropic")
    assert claude_code.PLACEHOLDER_TOOL in body["tools"]


def test_a_reference_to_a_tool_that_is_not_deferred_changes_nothing():
    body = loaded_at_2()
    for tool in body["tools"]:
        tool.pop("defer_loading", None)
    before = copy.deepcopy(body)
    assert loaded_tools.inline_loaded_tools(body, "anthropic") == [] and body == before


def test_a_reference_to_a_tool_missing_from_tools_is_left_as_it_is():
    body = loaded_at_2()
    body["tools"] = [tool for tool in body["tools"] if tool["name"] != "WebFetch"]
    before = copy.deepcopy(body)
    loaded_tools.inline_loaded_tools(body, "anthropic")
    assert body["messages"] == before["messages"]


def test_two_tools_loaded_at_once_share_one_text_block_in_reference_order():
    body = claude_code.modern_request(3, load_tools_at={2: ("WebFetch", "NotebookEdit")})
    loaded_tools.inline_loaded_tools(body, "anthropic")
    [block] = search_result(body)["content"]
    assert block["text"].splitlines()[1:3] == [schema_line(claude_code.DEFERRED_TOOLS[name]) for name in ("WebFetch", "NotebookEdit")]
    assert "WebFetch" not in request_shape.tool_names(body) and "NotebookEdit" not in request_shape.tool_names(body)


def test_a_tool_loaded_twice_is_written_into_both_results():
    body = claude_code.modern_request(5, load_tools_at={2: ("WebFetch",), 4: ("WebFetch",)})
    loaded_tools.inline_loaded_tools(body, "anthropic")
    texts = [json.dumps(message) for message in body["messages"] if "toolu_search" in json.dumps(message) and message["role"] == "user"]
    assert len(texts) == 2 and all("<function>" in text for text in texts)


def test_other_blocks_of_the_tool_result_stay_around_the_schema():
    body = loaded_at_2()
    result = search_result(body)
    result["content"] = [{"type": "text", "text": "Found one."}, *result["content"], {"type": "text", "text": "Done."}]
    loaded_tools.inline_loaded_tools(body, "anthropic")
    texts = [block["text"] for block in search_result(body)["content"]]
    assert texts[0] == "Found one." and texts[1].startswith(INLINED_TOOLS_OPEN) and texts[2] == "Done."


def test_tool_results_without_references_are_untouched():
    body = claude_code.modern_request(4)
    before = copy.deepcopy(body)
    loaded_tools.inline_loaded_tools(body, "anthropic")
    assert body["messages"] == before["messages"]


def test_a_body_without_tools_is_left_alone():
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert loaded_tools.inline_loaded_tools(body, "anthropic") == []


def test_with_the_rule_off_the_loaded_tool_stays_in_tools():
    body = loaded_at_2()
    normalize.normalize(body, "anthropic", Rules(inline_loaded_tools=False))
    assert "WebFetch" in request_shape.tool_names(body)


# --- the OpenAI path (claude-code-router) ----------------------------------------------------------


def test_openai_reference_sent_as_json_text_is_replaced_and_the_tool_leaves_tools():
    body = claude_code.modern_openai_request(3, load_tools_at={2: ("WebFetch",)})
    loaded_tools.inline_loaded_tools(body, "openai")
    result = next(m for m in body["messages"] if m["role"] == "tool" and m["tool_call_id"].startswith("toolu_search"))
    assert result["content"].startswith(INLINED_TOOLS_OPEN) and '"name": "WebFetch"' in result["content"]
    assert "WebFetch" not in request_shape.tool_names(body)


def test_openai_json_text_holding_other_blocks_is_left_alone_and_so_is_its_tool():
    body = claude_code.modern_openai_request(3, load_tools_at={2: ("WebFetch",)})
    result = next(m for m in body["messages"] if m["role"] == "tool" and m["tool_call_id"].startswith("toolu_search"))
    result["content"] = json.dumps([{"type": "tool_reference", "tool_name": "WebFetch"}, {"type": "image", "source": {}}])
    before = copy.deepcopy(body)
    assert loaded_tools.inline_loaded_tools(body, "openai") == [] and body == before


@pytest.mark.parametrize("content", ["[not json", "[1, 2]", "plain text with tool_reference in it"])
def test_openai_tool_results_that_are_not_reference_lists_are_untouched(content):
    body = claude_code.modern_openai_request(3, load_tools_at={2: ("WebFetch",)})
    result = next(m for m in body["messages"] if m["role"] == "tool" and m["tool_call_id"].startswith("toolu_search"))
    result["content"] = content
    assert loaded_tools.inline_loaded_tools(body, "openai") == []


# --- still callable ----------------------------------------------------------------------------------


@pytest.mark.parametrize("api, body", [
    ("anthropic", loaded_at_2()),
    ("openai", claude_code.modern_openai_request(3, load_tools_at={2: ("WebFetch",)})),
])
def test_inlined_tools_are_found_in_the_forwarded_body(api, body):
    normalize.normalize(body, api)
    assert loaded_tools.inlined_tool_names(body, api) == {"WebFetch"}
    assert loaded_tools.inlined_tool_names(claude_code.modern_request(3), "anthropic") == set()


def test_the_toolcall_addon_counts_inlined_tools_as_offered():
    from mitmproxy.test import tutils

    body = loaded_at_2()
    normalize.normalize(body, "anthropic")
    request = tutils.treq(path="/v1/messages", content=json.dumps(body).encode(), headers=[(b"content-type", b"application/json")])
    assert "WebFetch" in toolcall_stream.offered_tools("anthropic", request)
    assert "Read" in toolcall_stream.offered_tools("anthropic", request)


def test_no_tools_are_offered_when_tool_choice_is_none_even_with_inlined_ones():
    from mitmproxy.test import tutils

    body = loaded_at_2()
    normalize.normalize(body, "anthropic")
    body["tool_choice"] = {"type": "none"}
    request = tutils.treq(path="/v1/messages", content=json.dumps(body).encode(), headers=[(b"content-type", b"application/json")])
    assert toolcall_stream.offered_tools("anthropic", request) == frozenset()


@pytest.mark.parametrize("parser", ["qwen", "hermes"])
def test_vllm_mlx_parses_a_call_to_a_tool_that_is_not_in_tools(parser):
    """What the rule relies on: vllm-mlx 0.6.0's tool parsers (the same code
    behind /v1/messages and /v1/chat/completions) return a call whatever its
    name, streamed or not; the name is never checked against `tools`."""
    from vllm_mlx.tool_parsers import ToolParserManager

    parser_class = ToolParserManager.get_tool_parser(parser)
    request = {"tools": [{"type": "function", "function": {"name": "Read", "parameters": {"type": "object", "properties": {}}}}]}
    output = '<tool_call>\n{"name": "WebFetch", "arguments": {"url": "http://127.0.0.1/"}}\n</tool_call>'
    whole = parser_class(None).extract_tool_calls(output, request)
    assert whole.tools_called and [call["name"] for call in whole.tool_calls] == ["WebFetch"]
    streaming, previous, deltas = parser_class(None), "", []
    for end in range(7, len(output) + 7, 7):
        current = output[:end]
        deltas.append(streaming.extract_tool_calls_streaming(previous, current, current[len(previous) :], request=request))
        previous = current
    names = [call["function"]["name"] for delta in deltas if delta and "tool_calls" in delta for call in delta["tool_calls"] if call.get("function", {}).get("name")]
    assert names == ["WebFetch"]
