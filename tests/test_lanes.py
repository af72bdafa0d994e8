"""Lanes: main agent, sub-agents and side requests are told apart."""

from fixtures import claude_code

from stable_prefix.addons.lanes import LaneNames, lane_signature


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
