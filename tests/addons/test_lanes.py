"""Lanes: main agent, sub-agents and side requests are told apart."""

import copy

from stable_prefix.addons.lanes import LaneNames, lane_signature
from tests.fixtures import claude_code


def lanes_of(*bodies, api="anthropic"):
    names = LaneNames()
    return [names.name_for(lane_signature(body, api)) for body in bodies]


def test_main_agent_turns_share_one_lane_whatever_the_billing_suffix():
    assert lanes_of(claude_code.main_request(2, billing_suffix="a1", cch="x"), claude_code.main_request(5, billing_suffix="zz", cch="y")) == ["main", "main"]


def test_a_new_conversation_after_clear_stays_in_the_main_lane():
    before = claude_code.main_request(6)
    after_clear = claude_code.main_request(1, git_status="?? notes.txt", topic="something else")
    assert lanes_of(before, after_clear) == ["main", "main"]


def test_each_subagent_type_gets_its_own_lane():
    lanes = lanes_of(claude_code.main_request(), claude_code.subagent_request("explore"), claude_code.subagent_request("general"), claude_code.subagent_request("explore", 3, billing_suffix="c9"))
    assert lanes[0] == "main"
    assert lanes[1].startswith("sub:") and lanes[2].startswith("sub:") and lanes[1] != lanes[2]
    assert lanes[3] == lanes[1]


def test_a_subagent_seen_first_is_still_a_subagent_when_its_billing_header_says_so():
    assert lanes_of(claude_code.subagent_request("general"), claude_code.main_request())[0].startswith("sub:")


def test_a_subagent_without_billing_header_is_recognized_by_its_missing_agent_tool():
    sub = claude_code.subagent_request("general")
    sub["system"] = sub["system"][1:]
    assert lanes_of(claude_code.main_request(), sub)[1].startswith("sub:")


def test_title_request_is_a_side_lane():
    assert lanes_of(claude_code.title_request("first"), claude_code.title_request("second")) == ["side:title", "side:title"]


def test_other_toolless_requests_are_side_lanes_named_by_hash():
    quota = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}
    [name] = lanes_of(quota)
    assert name.startswith("side:") and len(name) == len("side:") + 6


def test_lane_names_are_stable_across_sessions():
    assert lanes_of(claude_code.main_request(), claude_code.subagent_request()) == lanes_of(claude_code.main_request(), claude_code.subagent_request())


def test_openai_requests_get_lanes_from_their_system_messages_and_tools():
    assert lanes_of(claude_code.openai_request(2), claude_code.openai_request(4, billing_suffix="q"), api="openai") == ["main", "main"]


def test_date_and_billing_lines_do_not_split_a_lane():
    one = claude_code.main_request(date="2026-11-30", cch="a")
    other = claude_code.main_request(date="2026-12-01", cch="b")
    assert lane_signature(one, "anthropic").digest == lane_signature(other, "anthropic").digest


def test_a_body_gets_the_same_lane_before_and_after_normalization():
    from stable_prefix.addons import normalize

    raw = claude_code.subagent_request("general")
    forwarded = claude_code.subagent_request("general")
    normalize.normalize(forwarded, "anthropic")
    assert lane_signature(raw, "anthropic").digest == lane_signature(forwarded, "anthropic").digest


def test_a_toolless_request_asking_for_a_title_field_is_the_title_lane():
    title = claude_code.title_request()
    title["system"][1]["text"] = "Summarize the conversation in a few words."
    title["output_config"] = {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"title": {"type": "string"}}}}}
    assert lanes_of(title) == ["side:title"]


def test_odd_output_settings_do_not_break_lane_naming():
    for odd in ({"output_config": "json"}, {"output_config": {"format": {"json_schema": "x"}}}, {"response_format": {"type": "json_object"}}):
        assert lanes_of({"messages": [], **odd})[0].startswith("side:")


def test_a_request_naming_its_subagent_instance_gets_a_lane_of_its_own_in_its_types_group():
    from stable_prefix.addons.lanes import lane_group

    names = LaneNames()
    one = names.name_for(lane_signature(claude_code.modern_subagent_request(task="a"), "anthropic", claude_code.agent_headers("a7268d940648f6d15")))
    other = names.name_for(lane_signature(claude_code.modern_subagent_request(task="b"), "anthropic", claude_code.agent_headers("aac66025dd4825e66")))
    plain = names.name_for(lane_signature(claude_code.modern_subagent_request(task="c"), "anthropic"))
    assert one == f"{plain}@a7268d94" and other == f"{plain}@aac66025"
    assert lane_group(one) == lane_group(other) == plain and plain.startswith("sub:")


def test_header_names_are_matched_whatever_their_case():
    headers = {"X-Claude-Code-Agent-Id": "b1c2d3e4f5"}
    assert lane_signature(claude_code.modern_subagent_request(), "anthropic", headers).instance == "b1c2d3e4"


def test_an_agent_id_makes_a_subagent_even_when_seen_first():
    assert lanes_of_with_headers((claude_code.modern_subagent_request("general"), claude_code.agent_headers("f00f00f00")))[0].startswith("sub:")


def test_a_tool_loaded_through_tool_search_does_not_change_the_main_lane():
    before = claude_code.modern_request(2)
    after = claude_code.modern_request(4, load_tools_at={2: ("WebFetch",), 3: ("NotebookEdit",)})
    assert lanes_of(before, after) == ["main", "main"]


def test_a_tool_loaded_on_the_openai_path_does_not_change_the_main_lane():
    before = claude_code.modern_openai_request(2)
    after = claude_code.modern_openai_request(3, load_tools_at={2: ("WebFetch",)})
    assert lanes_of(before, after, api="openai") == ["main", "main"]


def lanes_of_with_headers(*bodies_and_headers):
    names = LaneNames()
    return [names.name_for(lane_signature(body, "anthropic", headers)) for body, headers in bodies_and_headers]


# --- what Claude Code 2.1.332 says in its headers (CLAUDE_CODE_GATEWAY_HINT_HEADERS=1) -------------------


def test_a_fork_the_client_names_gets_a_lane_of_its_own_named_as_a_fork_of_the_main_lane():
    assert lanes_of_with_headers(
        (claude_code.modern_request(3), claude_code.hint_headers("main")),
        (claude_code.fork_request(3), claude_code.hint_headers("subagent", agent_id="a9c212f5b4adf0d5d", agent_type="fork")),
        (claude_code.modern_request(4), claude_code.hint_headers("main")),
    ) == ["main", "fork:main@a9c212f5", "main"]


def test_a_fork_is_told_without_its_type_by_an_agent_id_on_the_main_lanes_signature():
    lanes = lanes_of_with_headers((claude_code.modern_request(3), claude_code.agent_headers()),
                                  (claude_code.fork_request(3), claude_code.agent_headers("a87815867ad8e0be2")))
    assert lanes == ["main", "fork:main@a8781586"]


def test_a_fork_started_by_a_subagent_is_named_after_that_subagents_lane():
    sub = claude_code.modern_subagent_request("general")
    inherited = copy.deepcopy(sub)
    inherited["messages"].append({"role": "assistant", "content": "A side job for a fork."})
    lanes = lanes_of_with_headers(
        (claude_code.modern_request(), claude_code.hint_headers("main")),
        (sub, claude_code.hint_headers("subagent", agent_id="b0b0b0b0b0b0", agent_type="general-purpose")),
        (inherited, claude_code.hint_headers("subagent", agent_id="f0f0f0f0f0f0", agent_type="fork", parent_agent_id="b0b0b0b0b0b0")),
    )
    assert lanes[1:] == ["sub:general-purpose@b0b0b0b0", "fork:sub:general-purpose@b0b0b0b0@f0f0f0f0"]


def test_the_subagent_type_the_client_names_is_its_lane_name_and_a_second_signature_of_it_gets_a_hash():
    explore, other_tools = claude_code.modern_subagent_request("explore"), claude_code.modern_subagent_request("general")
    lanes = lanes_of_with_headers((explore, claude_code.hint_headers("subagent", agent_id="a1a1a1a1a1", agent_type="Explore")),
                                  (explore, claude_code.hint_headers("subagent", agent_id="a2a2a2a2a2", agent_type="Explore")),
                                  (other_tools, claude_code.hint_headers("subagent", agent_id="a3a3a3a3a3", agent_type="Explore")))
    assert lanes[:2] == ["sub:Explore@a1a1a1a1", "sub:Explore@a2a2a2a2"]
    assert lanes[2].startswith("sub:Explore-") and lanes[2].endswith("@a3a3a3a3")


def test_an_agent_type_that_is_not_a_short_word_is_not_put_into_a_lane_name():
    headers = claude_code.hint_headers("subagent", agent_id="a1a1a1a1a1", agent_type="two words\nand a line")
    [lane] = lanes_of_with_headers((claude_code.modern_subagent_request(), headers))
    assert lane.startswith("sub:") and "words" not in lane


def test_an_auxiliary_request_the_client_names_is_a_side_lane_named_from_its_type():
    quota = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "remember this"}]}
    lanes = lanes_of_with_headers((quota, claude_code.hint_headers("auxiliary", auxiliary_type="memory_save")),
                                  (claude_code.title_request(), claude_code.hint_headers("auxiliary")))
    assert lanes == ["side:memory_save", "side:title"]
