"""Prompt order: system text, then tools, then messages; cache_control ignored."""

import json

from stable_prefix.addons import normalize
from stable_prefix.addons.prompt_order import compare, line_at, prompt_order
from tests.fixtures import claude_code


def order(body, api="anthropic"):
    return prompt_order(body, api)


def test_order_is_system_then_tools_then_messages():
    body = claude_code.main_request(turns=2)
    paths = [segment.path for segment in order(body).segments]
    assert paths[:3] == ["system[0]", "system[1]", "system[2]"]
    assert paths[3] == "messages[1]"  # the role:system message is hoisted, as vllm-mlx does
    assert paths[4:12] == [f"tools[{i}]" for i in range(8)]
    assert paths[12:] == ["messages[0]", "messages[2]", "messages[3]"]


def test_json_key_order_of_the_request_does_not_matter():
    body = claude_code.main_request(turns=2)
    reordered = json.loads(json.dumps({key: body[key] for key in reversed(body)}))
    reordered["tools"] = [dict(reversed(tool.items())) for tool in reordered["tools"]]
    assert order(body).to_bytes() == order(reordered).to_bytes()


def test_cache_control_markers_are_ignored():
    body = claude_code.main_request(turns=2)
    moved = claude_code.main_request(turns=2)
    for block in moved["system"]:
        block.pop("cache_control", None)
    moved["messages"][2]["content"][0]["cache_control"] = {"type": "ephemeral"}
    assert order(body).to_bytes() == order(moved).to_bytes()


def test_a_one_text_block_list_reads_as_its_string():
    as_list = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]}
    as_string = {"messages": [{"role": "user", "content": "hi"}]}
    assert order(as_list).to_bytes() == order(as_string).to_bytes()


def test_lists_of_several_blocks_and_blocks_with_more_fields_stay_lists():
    two = {"messages": [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]}
    image = {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}
    assert order(two).to_bytes() != order({"messages": [{"role": "user", "content": "hi"}]}).to_bytes()
    assert b'"content":[{' in order(image).to_bytes()


def test_the_message_that_lost_its_marker_and_list_form_keeps_the_prefix():
    first_turn, second_turn = claude_code.main_request(turns=1), claude_code.main_request(turns=2)
    assert isinstance(first_turn["messages"][0]["content"], list) and isinstance(second_turn["messages"][0]["content"], str)
    assert compare(order(first_turn), order(second_turn)).prefix_kept


def test_system_text_is_serialized_as_text():
    body = {"system": [{"type": "text", "text": "line one\nline two"}], "messages": []}
    assert order(body).to_bytes() == b"line one\nline two\n"


def test_openai_system_messages_come_first_then_tools():
    paths = [segment.path for segment in order(claude_code.openai_request(turns=2), "openai").segments]
    assert paths[:2] == ["messages[0]", "messages[2]"]
    assert paths[2] == "tools[0]"
    assert paths[-3:] == ["messages[1]", "messages[3]", "messages[4]"]


def test_a_grown_conversation_keeps_the_whole_previous_prompt_as_prefix():
    before, after = claude_code.main_request(turns=3), claude_code.main_request(turns=4)
    comparison = compare(order(before), order(after))
    assert comparison.prefix_kept
    assert comparison.stable_prefix_bytes == order(before).total_bytes
    assert comparison.total_bytes == order(after).total_bytes
    assert comparison.first_divergence.path == "messages[6]"  # the first new message
    assert comparison.first_divergence.byte_offset == comparison.stable_prefix_bytes


def test_a_rotating_billing_header_breaks_the_prefix_at_its_first_differing_byte():
    before = claude_code.main_request(turns=3, cch="11111")
    after = claude_code.main_request(turns=4, cch="22222")
    comparison = compare(order(before), order(after))
    header = claude_code.billing_text("a3f", cch="11111")
    assert not comparison.prefix_kept
    assert comparison.first_divergence.path == "system[0].text"
    assert comparison.first_divergence.byte_offset == header.index("11111")
    assert comparison.stable_prefix_ratio < 0.05


def test_stripping_the_header_makes_the_prefix_stable():
    before = claude_code.main_request(turns=3, cch="11111")
    after = claude_code.main_request(turns=4, cch="22222")
    for body in (before, after):
        normalize.normalize(body, "anthropic")
    assert compare(order(before), order(after)).prefix_kept


def test_a_new_tail_system_message_breaks_the_raw_prefix_after_the_system_text():
    before = claude_code.main_request(turns=10, tail_system_every=10)  # no reminder yet
    after = claude_code.main_request(turns=11, tail_system_every=10)  # reminder at the tail
    comparison = compare(order(before), order(after))
    assert not comparison.prefix_kept
    assert comparison.first_divergence.path.startswith("messages[")
    hoisted = order(after).segments[comparison.first_divergence.segment_index]
    assert hoisted.value["role"] == "system"


def test_identical_requests_have_no_divergence():
    body = claude_code.main_request(turns=3)
    comparison = compare(order(body), order(body))
    assert comparison.first_divergence is None and comparison.stable_prefix_ratio == 1.0


def test_a_shorter_request_diverges_where_it_ends():
    before, after = claude_code.main_request(turns=4), claude_code.main_request(turns=3)
    comparison = compare(order(before), order(after))
    assert not comparison.prefix_kept
    assert comparison.first_divergence.byte_offset == comparison.stable_prefix_bytes


def test_divergence_path_goes_down_to_the_differing_field():
    before, after = claude_code.main_request(turns=3), claude_code.main_request(turns=3)
    after["messages"][2]["content"][1]["input"]["file_path"] = "src/other.py"
    assert compare(order(before), order(after)).first_divergence.path == "messages[2].content[1].input.file_path"


def test_line_at_finds_the_line_holding_an_offset():
    segment = order({"system": "first\nsecond line\nthird"}).segments[0]
    assert line_at(segment, segment.data.index(b"cond")) == "second line"
