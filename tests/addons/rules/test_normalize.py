"""The normalization rules, one behaviour per test, on every body shape."""

import copy

import pytest

from stable_prefix.addons import diagnosis, normalize, request_shape, server_compat
from stable_prefix.addons.normalize import Rules
from stable_prefix.addons.rules import billing_header, date_line, system_messages, tool_order
from stable_prefix.addons.rules.base import Change
from tests.fixtures import claude_code

HEADER = claude_code.billing_text("a3f", cch="9f2c1")


def strip(body, api="anthropic"):
    changes = billing_header.strip_billing_header(body, api)
    return body, changes


# --- which requests are ours --------------------------------------------------


@pytest.mark.parametrize(
    "method, path, api",
    [
        ("POST", "/v1/messages", "anthropic"),
        ("POST", "/v1/messages?beta=true", "anthropic"),
        ("POST", "/anthropic/v1/messages", "anthropic"),
        ("POST", "/v1/chat/completions", "openai"),
        ("GET", "/v1/messages", None),
        ("POST", "/v1/messages/count_tokens", None),
        ("POST", "/v1/completions", None),
        ("POST", "/v1/models", None),
    ],
)
def test_api_is_recognized_by_method_and_path(method, path, api):
    assert request_shape.api_for(method, path) == api


# --- billing header: Anthropic system shapes ----------------------------------


@pytest.mark.parametrize("system", [None, "", [], "You are helpful.", [{"type": "text", "text": "You are helpful."}]])
def test_system_without_header_is_left_alone(system):
    body = {"system": system, "messages": []}
    before = copy.deepcopy(body)
    assert strip(body) == (before, [])


def test_missing_system_is_left_alone():
    assert strip({"messages": []}) == ({"messages": []}, [])


@pytest.mark.parametrize("position", [0, 1, 2])
def test_header_block_is_removed_wherever_it_sits(position):
    blocks = [{"type": "text", "text": "identity"}, {"type": "text", "text": "instructions"}]
    blocks.insert(position, {"type": "text", "text": HEADER})
    body, changes = strip({"system": blocks})
    assert body["system"] == [{"type": "text", "text": "identity"}, {"type": "text", "text": "instructions"}]
    assert changes == [Change("billing_header", f"system[{position}]", "removed billing header block")]


def test_header_block_alone_removes_the_system_field():
    body, changes = strip({"system": [{"type": "text", "text": HEADER}], "messages": []})
    assert body == {"messages": []}
    assert changes[0].path == "system[0]"


def test_header_line_inside_a_longer_block_removes_only_that_line():
    body, changes = strip({"system": [{"type": "text", "text": f"{HEADER}\nYou are helpful.\nBe brief."}]})
    assert body["system"][0]["text"] == "You are helpful.\nBe brief."
    assert changes == [Change("billing_header", "system[0]", "removed billing header line")]


def test_header_as_last_line_leaves_no_trailing_newline():
    body, _ = strip({"system": f"You are helpful.\n{HEADER}"})
    assert body["system"] == "You are helpful."


def test_header_line_in_a_system_string_is_removed():
    body, changes = strip({"system": f"{HEADER}\nYou are helpful."})
    assert body["system"] == "You are helpful."
    assert changes == [Change("billing_header", "system", "removed billing header line")]


def test_system_string_that_is_only_the_header_removes_the_field():
    body, _ = strip({"system": HEADER + "\n", "messages": []})
    assert "system" not in body


def test_cache_control_of_the_other_blocks_is_kept():
    block = {"type": "text", "text": "identity", "cache_control": {"type": "ephemeral"}}
    body, _ = strip({"system": [{"type": "text", "text": HEADER}, block]})
    assert body["system"] == [block]


def test_non_dict_and_non_text_system_items_are_left_alone():
    items = ["a bare string", 7, None, {"type": "image", "source": {}}, {"type": "text", "text": HEADER}]
    body, changes = strip({"system": items})
    assert body["system"] == items[:4]
    assert [c.path for c in changes] == ["system[4]"]


def test_header_mentioned_mid_sentence_is_not_a_header():
    text = "Claude Code sends an x-anthropic-billing-header: line; we strip it."
    body, changes = strip({"system": [{"type": "text", "text": text}]})
    assert body["system"][0]["text"] == text and changes == []


def test_header_quoted_in_user_and_assistant_messages_is_untouched():
    messages = [
        {"role": "user", "content": HEADER},
        {"role": "user", "content": [{"type": "text", "text": HEADER}]},
        {"role": "assistant", "content": [{"type": "text", "text": HEADER}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": HEADER}]},
    ]
    body, changes = strip({"system": "You are helpful.", "messages": copy.deepcopy(messages)})
    assert body["messages"] == messages and changes == []


def test_the_claude_code_shaped_request_loses_exactly_its_billing_block():
    body = claude_code.main_request(cch="9f2c1")
    expected_system = body["system"][1:]
    _, changes = strip(body)
    assert body["system"] == expected_system
    assert [c.path for c in changes] == ["system[0]"]


# --- billing header: OpenAI system message shapes ------------------------------


def test_openai_system_message_string_loses_the_header_line():
    body, changes = strip({"messages": [{"role": "system", "content": f"{HEADER}\nYou are helpful."}, {"role": "user", "content": "hi"}]}, "openai")
    assert body["messages"][0] == {"role": "system", "content": "You are helpful."}
    assert changes == [Change("billing_header", "messages[0].content", "removed billing header line")]


def test_openai_system_message_that_is_only_the_header_is_removed():
    body, _ = strip({"messages": [{"role": "system", "content": HEADER}, {"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}]}, "openai")
    assert body["messages"] == [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}]


def test_openai_system_message_parts_lose_the_header_part():
    parts = [{"type": "text", "text": HEADER}, {"type": "text", "text": "You are helpful."}]
    body, changes = strip({"messages": [{"role": "system", "content": parts}, {"role": "user", "content": "hi"}]}, "openai")
    assert body["messages"][0]["content"] == [{"type": "text", "text": "You are helpful."}]
    assert changes[0].path == "messages[0].content[0]"


def test_openai_header_in_a_user_message_is_untouched():
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": HEADER}]
    body, changes = strip({"messages": copy.deepcopy(messages)}, "openai")
    assert body["messages"] == messages and changes == []


def test_openai_leaves_an_empty_content_list_it_did_not_empty():
    messages = [{"role": "system", "content": []}, {"role": "system", "content": HEADER}, {"role": "user", "content": "hi"}]
    body, _ = strip({"messages": copy.deepcopy(messages)}, "openai")
    assert body["messages"] == [messages[0], messages[2]]


# --- mid-conversation system messages -----------------------------------------


def rewrite(messages, api="anthropic"):
    body = {"messages": messages}
    return body["messages"], system_messages.rewrite_system_messages(body, api)


def test_system_message_after_the_first_user_message_becomes_a_user_reminder():
    messages, changes = rewrite([{"role": "user", "content": "hi"}, {"role": "system", "content": "The user opened a.py."}])
    assert messages[1] == {"role": "user", "content": "<system-reminder>\nThe user opened a.py.\n</system-reminder>"}
    assert changes == [Change("system_messages", "messages[1]", "system message rewritten as user <system-reminder>")]


@pytest.mark.parametrize("position", [0, 1, 3, 4])
def test_system_messages_are_rewritten_in_place_at_any_position(position):
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"}]
    messages.insert(position, {"role": "system", "content": "note"})
    result, changes = rewrite(messages)
    assert [m["role"] for m in result] == ["user", "assistant", "user", "assistant", "user"][:0] + [
        "user" if i == position else m["role"] for i, m in enumerate(messages)
    ]
    assert len(result) == 5 and [c.path for c in changes] == [f"messages[{position}]"]


def test_system_message_block_list_keeps_its_blocks_and_is_wrapped_around_them():
    content = [{"type": "text", "text": "first"}, {"type": "text", "text": "second", "cache_control": {"type": "ephemeral"}}]
    result, _ = rewrite([{"role": "user", "content": "hi"}, {"role": "system", "content": content}])
    assert result[1]["content"] == [
        {"type": "text", "text": "<system-reminder>\nfirst"},
        {"type": "text", "text": "second\n</system-reminder>", "cache_control": {"type": "ephemeral"}},
    ]


def test_system_message_with_unknown_content_shape_is_left_alone():
    odd = {"role": "system", "content": [{"type": "image", "source": {}}]}
    result, changes = rewrite([{"role": "user", "content": "hi"}, copy.deepcopy(odd)])
    assert result[1] == odd and changes == []


def test_rewrite_of_a_message_is_the_same_on_every_later_turn():
    turn_10 = claude_code.main_request(turns=10)
    turn_14 = claude_code.main_request(turns=14)
    system_messages.rewrite_system_messages(turn_10, "anthropic")
    system_messages.rewrite_system_messages(turn_14, "anthropic")
    shared = len(turn_10["messages"]) - 1  # the newest turn carries the moving cache_control
    assert turn_10["messages"][:shared] == turn_14["messages"][:shared]
    assert all(m["role"] != "system" for m in turn_14["messages"])


def test_openai_leading_system_messages_stay_and_later_ones_are_rewritten():
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}, {"role": "system", "content": "note"}]
    result, changes = rewrite(messages, "openai")
    assert result[0] == {"role": "system", "content": "rules"}
    assert result[2]["role"] == "user" and [c.path for c in changes] == ["messages[2]"]


def test_messages_that_are_not_a_list_are_left_alone():
    assert system_messages.rewrite_system_messages({"messages": "oops"}, "anthropic") == []


# --- optional rules -----------------------------------------------------------


def test_date_line_is_dropped_from_the_system_prompt_only():
    body = claude_code.main_request()
    body["messages"][0]["content"] = "Today's date is 2026-11-30."
    changes = date_line.drop_date_line(body, "anthropic")
    assert "Today's date" not in body["system"][2]["text"]
    assert body["messages"][0]["content"] == "Today's date is 2026-11-30."
    assert [c.path for c in changes] == ["system[2]"]


def test_tools_are_sorted_by_name():
    body = {"tools": [{"name": "Write"}, {"name": "Bash"}, {"type": "function", "function": {"name": "Edit"}}]}
    changes = tool_order.sort_tools(body, "anthropic")
    assert request_shape.tool_names(body) == ["Bash", "Edit", "Write"]
    assert changes == [Change("tool_order", "tools", "sorted 3 tools by name")]


def test_sorted_tools_report_no_change():
    assert tool_order.sort_tools({"tools": [{"name": "A"}, {"name": "B"}]}, "anthropic") == []


def test_optional_rules_are_off_by_default():
    body = claude_code.main_request()
    body["tools"].reverse()
    normalize.normalize(body, "anthropic")
    assert "Today's date is" in body["system"][1]["text"]
    assert request_shape.tool_names(body)[0] == "TodoWrite"


# --- compatibility rules ------------------------------------------------------


def test_model_map_first_matching_pattern_wins():
    rules = Rules(model_map=server_compat.parse_model_map("claude-*haiku*=small-coder,claude-*=big-coder"))
    haiku, opus = {"model": "claude-haiku-4-5"}, {"model": "claude-opus-4-8"}
    normalize.normalize(haiku, "anthropic", rules)
    changes = normalize.normalize(opus, "anthropic", rules)
    assert (haiku["model"], opus["model"]) == ("small-coder", "big-coder")
    assert changes == [Change("model", "model", "claude-opus-4-8 -> big-coder")]


def test_model_not_matching_any_pattern_is_kept():
    body = {"model": "local-model"}
    assert server_compat.map_model(body, (("claude-*", "x"),)) == [] and body["model"] == "local-model"


@pytest.mark.parametrize("spec", ["claude-*", "=x", "claude-*=", "a=b,c"])
def test_malformed_model_map_is_rejected_naming_the_entry(spec):
    with pytest.raises(ValueError, match="pattern=served-model-name"):
        server_compat.parse_model_map(spec)


def test_max_tokens_above_the_cap_is_capped_and_below_is_kept():
    high, low = {"max_tokens": 64000}, {"max_tokens": 512, "max_completion_tokens": 40000}
    assert server_compat.cap_max_tokens(high, 8192) == [Change("max_tokens", "max_tokens", "64000 -> 8192")]
    server_compat.cap_max_tokens(low, 8192)
    assert (high["max_tokens"], low["max_tokens"], low["max_completion_tokens"]) == (8192, 512, 8192)


# --- the pipeline -------------------------------------------------------------


def test_default_rules_change_only_the_prompt_rules_that_are_on():
    body = claude_code.main_request(turns=12)
    changes = normalize.normalize(body, "anthropic")
    assert {c.rule for c in changes} == {"billing_header", "git_status", "initial_context", "system_messages"}
    assert body["model"] == "claude-opus-4-8" and body["max_tokens"] == 64000


def test_default_rules_on_todays_claude_code_request():
    body = claude_code.modern_request(turns=4, load_tools_at={2: ("WebFetch",)})
    changes = normalize.normalize(body, "anthropic")
    assert {c.rule for c in changes} == {"billing_header", "initial_context", "loaded_tools"}


def test_all_rules_disabled_change_nothing():
    body = claude_code.main_request(turns=12)
    before = copy.deepcopy(body)
    off = Rules(strip_billing_header=False, rewrite_system_messages=False, relocate_git_status=False, lead_with_stable_context=False, inline_loaded_tools=False)
    assert normalize.normalize(body, "anthropic", off) == []
    assert body == before


@pytest.mark.parametrize(
    "line, rule",
    [
        (HEADER, "billing_header"),
        ("  x-anthropic-billing-header: cc_version=1", "billing_header"),
        ("Today's date is 2026-11-30.", "date_line"),
        ("We mention x-anthropic-billing-header: here.", None),
        ("gitStatus: Current branch: main", None),
    ],
)
def test_a_system_line_is_attributed_to_the_rule_that_drops_it(line, rule):
    assert diagnosis.rule_for_line(line) == rule
