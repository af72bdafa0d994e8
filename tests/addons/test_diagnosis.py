"""The per-lane diagnosis: what it compares, what it explains, what it prints."""

import copy

import pytest

from stable_prefix.addons import normalize
from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.normalize import Rules
from tests.fixtures import claude_code


class Session:
    """Requests through the rules and the diagnosis, as the addon does it."""

    def __init__(self, rules=Rules()):
        self.rules = rules
        self.diagnosis = PrefixDiagnosis(rules)

    def send(self, body, api="anthropic", headers=None):
        body = copy.deepcopy(body)
        snapshot = PromptSnapshot.of(body, api, headers)
        normalize.normalize(body, api, self.rules)
        return self.diagnosis.observe(snapshot, body)


def test_first_request_of_a_lane_has_nothing_to_compare():
    result = Session().send(claude_code.main_request())
    assert result.comparison is None and not result.prefix_broke
    assert result.line() == f"lane main · first request · {result.total_bytes:,} B"


def test_a_growing_conversation_keeps_its_prefix_and_names_the_first_new_message():
    session = Session()
    session.send(claude_code.main_request(3))
    result = session.send(claude_code.main_request(4))
    comparison = result.comparison
    assert comparison.prefix_kept and not result.prefix_broke
    assert result.line() == (
        f"lane main · prefix stable {comparison.stable_prefix_bytes:,}/{comparison.total_bytes:,} B "
        f"({comparison.stable_prefix_ratio:.1%}) · first change messages[6]"
    )


def test_rotating_billing_header_is_reported_as_stripped():
    session = Session()
    session.send(claude_code.main_request(3, cch="11111"))
    result = session.send(claude_code.main_request(4, cch="22222"))
    offset = claude_code.billing_text("a3f", cch="11111").index("11111")
    assert not result.prefix_broke
    assert result.line().endswith(f" · raw broke at system[0].text byte {offset} (billing header; stripped)")
    assert result.to_json()["neutralized"] == {"rule": "billing_header", "path": "system[0].text", "byte_offset": offset}


def test_with_stripping_off_the_billing_header_is_named_as_the_break():
    session = Session(Rules(strip_billing_header=False))
    session.send(claude_code.main_request(3, cch="11111"))
    result = session.send(claude_code.main_request(4, cch="22222"))
    assert result.prefix_broke and result.explained_by == "billing_header"
    assert "prefix broke at system[0].text byte " in result.line()
    assert "(billing header; strip_billing_header off)" in result.line()


def test_tail_system_message_would_break_the_prefix_and_its_rewrite_is_reported():
    session = Session(Rules(strip_billing_header=False))
    session.send(claude_code.main_request(10))
    result = session.send(claude_code.main_request(11))  # a reminder is appended at turn 10
    assert not result.prefix_broke
    assert result.neutralized.rule == "system_messages"
    assert "(system message; rewritten)" in result.line()


def test_tail_system_message_breaks_the_prefix_when_not_rewritten():
    session = Session(Rules(rewrite_system_messages=False))
    session.send(claude_code.main_request(10))
    result = session.send(claude_code.main_request(11))
    assert result.prefix_broke and result.explained_by == "system_messages"
    assert "(system message; rewrite_system_messages off)" in result.line()


def test_a_new_date_is_named_when_the_date_rule_is_off_and_absent_when_on():
    off, on = Session(), Session(Rules(drop_date_line=True))
    for session in (off, on):
        session.send(claude_code.main_request(3))
    broke = off.send(claude_code.main_request(4, date="2026-12-01"))
    kept = on.send(claude_code.main_request(4, date="2026-12-01"))
    assert broke.explained_by == "date_line" and "(date line; drop_date_line off)" in broke.line()
    assert not kept.prefix_broke and "(date line; dropped)" in kept.line()


def test_reordered_tools_are_named_as_tool_order():
    session = Session()
    session.send(claude_code.main_request(3))
    reordered = claude_code.main_request(4)
    reordered["tools"].reverse()
    result = session.send(reordered)
    assert result.prefix_broke and result.explained_by == "tool_order"
    assert "(tool order; sort_tools off)" in result.line()


def test_clear_breaks_the_main_lane_as_a_new_conversation_without_a_rule_to_blame():
    session = Session()
    session.send(claude_code.main_request(6))
    result = session.send(claude_code.main_request(1, git_status="?? notes.txt", topic="other work"))
    assert result.lane == "main" and result.prefix_broke and result.explained_by is None and result.cause == "new conversation"
    assert result.line().startswith("lane main · prefix broke at messages[1].content[0].text byte ")
    assert "(new conversation)" in result.line()


def test_subagent_calls_do_not_break_the_main_lane():
    session = Session()
    session.send(claude_code.main_request(2, cch="a"))
    sub = session.send(claude_code.subagent_request("explore"))
    session.send(claude_code.title_request())
    main = session.send(claude_code.main_request(3, cch="b"))
    assert sub.lane.startswith("sub:") and sub.comparison is None
    assert main.lane == "main" and not main.prefix_broke and main.request_in_lane == 2


def test_identical_request_is_reported_as_identical():
    session = Session()
    session.send(claude_code.main_request(3))
    assert session.send(claude_code.main_request(3)).line().endswith("· identical")


def test_json_has_the_fields_the_cli_promises():
    session = Session()
    session.send(claude_code.main_request(3))
    record = session.send(claude_code.main_request(4)).to_json()
    assert {"lane", "first_divergence", "stable_prefix_bytes", "total_bytes", "stable_prefix_ratio", "explained_by"} <= set(record)
    assert set(record["first_divergence"]) == {"path", "byte_offset"}
    assert record["stable_prefix_ratio"] == round(record["stable_prefix_bytes"] / record["total_bytes"], 6)


def test_session_totals_per_lane():
    session = Session()
    for turns in (1, 2, 3):
        session.send(claude_code.main_request(turns, cch=f"c{turns}"))
    session.send(claude_code.main_request(1, git_status="?? notes.txt"))
    session.send(claude_code.subagent_request())
    totals = session.diagnosis.totals()
    assert totals["main"]["requests"] == 4 and totals["main"]["prefix_kept"] == 2 and totals["main"]["prefix_broke"] == 1
    assert totals["main"]["breaks"] == {"new conversation": 1} and totals["main"]["neutralized"] == {"billing_header": 3}
    summary = session.diagnosis.summary_lines()
    assert summary[0].startswith("lane main · 4 requests · prefix kept 2/3 · ")
    assert summary[1].endswith("· 1 requests")


def test_the_totals_of_a_lane_whose_prompts_hold_no_bytes_are_printed_without_a_ratio():
    session = Session()
    for _ in range(2):
        session.send({"model": "m", "messages": []}, "openai")
    [line] = session.diagnosis.summary_lines()
    assert line.endswith(" · 2 requests · prefix kept 1/1 · 0/0 B stable")


def test_reusing_the_clients_untouched_segments_gives_the_same_order_as_serializing_anew():
    from stable_prefix.addons.diagnosis import untouched_segments
    from stable_prefix.addons.prompt_order import prompt_order

    cases = [
        ("anthropic", claude_code.main_request(12, cch="x"), Rules()),
        ("anthropic", claude_code.main_request(12), Rules(drop_date_line=True, sort_tools=True)),
        ("anthropic", claude_code.subagent_request("general", 3), Rules(rewrite_system_messages=False)),
        ("openai", claude_code.openai_request(4), Rules()),
        ("anthropic", claude_code.modern_request(6, load_tools_at={2: ("WebFetch",)}), Rules()),
        ("anthropic", claude_code.compacted_request(), Rules()),
        ("anthropic", claude_code.modern_subagent_request("general", 3), Rules(lead_with_stable_context=False)),
        ("openai", claude_code.modern_openai_request(5, load_tools_at={2: ("WebFetch",)}), Rules()),
    ]
    for api, body, rules in cases:
        snapshot = PromptSnapshot.of(body, api)
        changes = normalize.normalize(body, api, rules)
        reused = prompt_order(body, api, untouched_segments(snapshot, changes))
        assert reused == prompt_order(body, api)
        if api == "anthropic":
            tools_changed = any(change.path == "tools" for change in changes)
            assert any(segment.path.startswith("tools[") for segment in untouched_segments(snapshot, changes).values()) != tools_changed


def test_openai_system_prompt_change_is_not_blamed_on_the_system_message_rule():
    session = Session()
    first, edited = claude_code.openai_request(2), claude_code.openai_request(3)
    for body in (first, edited):  # a system prompt long enough that its end is not part of the lane's identity
        body["messages"][0]["content"] += "\n" + "Keep answers short. " * 20
    session.send(first, "openai")
    edited["messages"][0]["content"] += "\nA new instruction."
    result = session.send(edited, "openai")
    assert result.prefix_broke and result.explained_by is None


def test_openai_mid_conversation_system_message_is_explained_when_not_rewritten():
    session = Session(Rules(rewrite_system_messages=False))
    session.send(claude_code.openai_request(2), "openai")
    later = claude_code.openai_request(3)
    later["messages"].append({"role": "system", "content": "Reminder: tests are failing."})
    result = session.send(later, "openai")
    assert result.prefix_broke and result.explained_by == "system_messages"


# --- causes: every break gets a name ----------------------------------------------------------------

HEADERS = claude_code.agent_headers()  # the main agent: a session id, no agent id


def test_a_new_session_in_the_same_repository_is_a_new_conversation_that_shares_almost_everything():
    session = Session()
    session.send(claude_code.modern_request(6), headers=claude_code.agent_headers(session="s-1"))
    result = session.send(claude_code.modern_request(1, git_status="M src/app.py", prompt="Now the docs."), headers=claude_code.agent_headers(session="s-2"))
    assert result.cause == "new conversation" and result.lane == "main"
    assert result.comparison.first_divergence.path.startswith("messages[1].content[0].text")  # the git status, behind the environment
    assert result.comparison.stable_prefix_ratio > 0.9


def test_a_restart_in_the_same_session_is_a_compaction():
    session = Session()
    session.send(claude_code.modern_request(6), headers=HEADERS)
    result = session.send(claude_code.compacted_request(), headers=HEADERS)
    assert result.cause == "compaction" and result.explained_by is None


def test_the_empty_system_message_after_compact_says_compaction_without_headers_and_blames_no_rule():
    session = Session()
    session.send(claude_code.modern_request(6))
    result = session.send(claude_code.compacted_request())
    assert result.cause == "compaction" and "rewrite_system_messages off" not in result.line()


def test_compaction_is_named_even_where_a_tool_loaded_before_it_moved():
    session = Session()
    session.send(claude_code.modern_request(4, load_tools_at={2: ("WebFetch",)}))
    compacted = claude_code.compacted_request()
    compacted["tools"] = claude_code.modern_request(4, load_tools_at={2: ("WebFetch",)})["tools"]
    result = session.send(compacted)
    assert result.comparison.first_divergence.path.startswith("tools[") and result.cause == "compaction"


def test_a_conversation_cut_back_to_an_earlier_message_and_changed_is_history_edited():
    session = Session()
    session.send(claude_code.modern_request(6))
    rewound = claude_code.modern_request(4)
    rewound["messages"][-1]["content"][0]["content"] = "a different result"
    result = session.send(rewound)
    assert result.cause == "history edited"


def test_a_subagent_lane_whose_first_message_changes_has_a_new_task():
    session = Session()
    session.send(claude_code.modern_subagent_request("explore", 2, task="Find the tests."))
    result = session.send(claude_code.modern_subagent_request("explore", 1, task="Find the docs."))
    assert result.lane.startswith("sub:") and result.cause == "new task"


def test_every_title_request_is_a_new_task_of_the_title_lane():
    session = Session()
    session.send(claude_code.title_request("first prompt"), headers=HEADERS)
    result = session.send(claude_code.title_request("second prompt"), headers=HEADERS)
    assert result.lane == "side:title" and result.cause == "new task"


@pytest.mark.parametrize("change", [{"date": "2026-12-01"}, {"workdir": "/home/dev/other"}])
def test_a_changed_environment_line_is_named_environment(change):
    session = Session()
    session.send(claude_code.modern_request(4), headers=claude_code.agent_headers(session="s-1"))
    result = session.send(claude_code.modern_request(1, **change), headers=claude_code.agent_headers(session="s-2"))
    assert result.cause == "environment"
    assert result.comparison.first_divergence.path.startswith("messages[0]")  # the environment, first in the conversation


def test_an_environment_line_in_an_older_system_prompt_is_named_environment():
    session = Session()
    first, moved = claude_code.main_request(3), claude_code.main_request(3)
    for body in (first, moved):  # instructions as long as real ones: the environment lies past the lane's opening
        body["system"][2]["text"] = "Keep answers short.\n" * 20 + body["system"][2]["text"]
    moved["system"][2]["text"] = moved["system"][2]["text"].replace("/home/dev/project", "/home/dev/elsewhere")
    session.send(first)
    assert session.send(moved).cause == "environment"


def test_a_git_status_break_names_its_rule_when_the_rule_is_off():
    session = Session(Rules(relocate_git_status=False))
    session.send(claude_code.main_request(6))
    result = session.send(claude_code.main_request(1, git_status="?? notes.txt", topic="other work"))
    assert result.explained_by == "git_status" and result.cause == "git status; relocate_git_status off"


def test_a_tool_search_load_names_its_rule_when_the_rule_is_off_and_is_neutralized_when_on():
    off, on = Session(Rules(inline_loaded_tools=False)), Session()
    for session in (off, on):
        session.send(claude_code.modern_request(2))
    broke = off.send(claude_code.modern_request(3, load_tools_at={2: ("WebFetch",)}))
    kept = on.send(claude_code.modern_request(3, load_tools_at={2: ("WebFetch",)}))
    assert broke.cause == "loaded tool; inline_loaded_tools off" and broke.comparison.first_divergence.path.startswith("tools[")
    assert not kept.prefix_broke and kept.neutralized.rule == "loaded_tools" and "(loaded tool; inlined)" in kept.line()


def test_an_edited_instruction_is_unexplained():
    session = Session()
    session.send(claude_code.modern_request(3))
    edited = claude_code.modern_request(4)
    edited["system"][2]["text"] = edited["system"][2]["text"].replace("conventions to new ones", "conventions to fresh ones")
    result = session.send(edited)
    assert result.cause == "unexplained" and result.explained_by is None


def test_a_rule_that_is_on_is_never_blamed():
    session = Session()
    session.send(claude_code.modern_request(3))
    odd = claude_code.modern_request(4)
    odd["messages"].append({"role": "system", "content": [{"type": "image", "source": {}}]})  # a shape the rule leaves alone
    result = session.send(odd)
    assert result.prefix_broke and result.explained_by is None and result.cause == "unexplained"


def test_breaks_are_counted_by_cause_per_lane():
    session = Session()
    session.send(claude_code.modern_request(4), headers=claude_code.agent_headers(session="s-1"))
    session.send(claude_code.compacted_request(), headers=claude_code.agent_headers(session="s-1"))
    session.send(claude_code.modern_request(1, prompt="Other work."), headers=claude_code.agent_headers(session="s-2"))
    assert session.diagnosis.totals()["main"]["breaks"] == {"compaction": 1, "new conversation": 1}
    assert "breaks: compaction ×1, new conversation ×1" in session.diagnosis.summary_lines()[0]


# --- cross-conversation reuse -------------------------------------------------------------------------


def test_a_new_instance_reports_what_it_shares_with_an_earlier_instance():
    session = Session()
    first = session.send(claude_code.modern_subagent_request(task="Find the tests."), headers=claude_code.agent_headers("a1111111111"))
    second = session.send(claude_code.modern_subagent_request(task="Find the docs."), headers=claude_code.agent_headers("b2222222222"))
    assert second.comparison is None and second.shared.lane == first.lane and second.shared.stable_prefix_bytes > 0.8 * second.total_bytes
    assert f"shared with lane {first.lane} #1" in second.line()
    assert second.to_json()["shared_with_earlier"]["lane"] == first.lane


def test_a_break_reports_the_best_earlier_request_of_any_lane():
    session = Session()
    session.send(claude_code.modern_request(3), headers=claude_code.agent_headers(session="s-1"))
    session.send(claude_code.modern_request(4, topic="other"), headers=claude_code.agent_headers(session="s-1"))  # breaks at turn 1's tool call
    result = session.send(claude_code.modern_request(3), headers=claude_code.agent_headers(session="s-2"))
    assert result.prefix_broke and result.shared.request_in_lane == 1 and result.shared.ratio == 1.0
    assert "shared with lane main #1" in result.line()


def test_only_a_bounded_number_of_earlier_requests_is_kept():
    from stable_prefix.addons.diagnosis import RECENT_REQUESTS

    session = Session()
    for turn in range(RECENT_REQUESTS + 5):
        session.send(claude_code.title_request(f"prompt {turn}"))
    assert len(session.diagnosis.recent) == RECENT_REQUESTS


# --- subagent instances -------------------------------------------------------------------------------


def test_concurrent_instances_of_one_subagent_type_each_keep_their_prefix():
    session = Session()
    tasks = {"a1111111111": "Find the tests.", "b2222222222": "Find the docs.", "c3333333333": "Find the config."}
    results = []
    for turns in (1, 2, 3):  # interleaved, as they run at once
        for agent_id, task in tasks.items():
            results.append(session.send(claude_code.modern_subagent_request("explore", turns, task=task), headers=claude_code.agent_headers(agent_id)))
    lanes = {result.lane for result in results}
    assert len(lanes) == 3 and len({lane.split("@")[0] for lane in lanes}) == 1
    assert not any(result.prefix_broke for result in results)
    groups = session.diagnosis.group_totals()
    [(group, total)] = groups.items()
    assert total["instances"] == 3 and total["requests"] == 9 and total["prefix_kept"] == 6
    assert any(line.startswith(f"lanes {group}@* · 3 instances · 9 requests · prefix kept 6/6") for line in session.diagnosis.summary_lines())


def test_without_agent_ids_interleaved_instances_break_each_other():
    session = Session()
    results = [session.send(claude_code.modern_subagent_request("explore", turns, task=task)) for turns in (1, 2) for task in ("Find the tests.", "Find the docs.")]
    assert [result.cause for result in results[1:]] == ["new task", "new task", "new task"]


# --- what the client says (Claude Code's hint headers) ------------------------------------------


def test_the_summary_request_of_a_compaction_is_named_a_compaction_from_its_header():
    session = Session()
    session.send(claude_code.modern_request(6), headers=claude_code.hint_headers("main"))
    summary = claude_code.modern_request(4)
    summary["messages"][-1]["content"][0]["content"] = "Write a summary of the conversation so far."
    result = session.send(summary, headers=claude_code.hint_headers("compaction", compaction="manual"))
    assert result.cause == "compaction"


def test_the_same_cut_back_conversation_without_the_header_is_history_edited():
    session = Session()
    session.send(claude_code.modern_request(6), headers=claude_code.hint_headers("main"))
    summary = claude_code.modern_request(4)
    summary["messages"][-1]["content"][0]["content"] = "Write a summary of the conversation so far."
    assert session.send(summary, headers=claude_code.hint_headers("main")).cause == "history edited"


def test_a_request_the_client_says_follows_a_compaction_is_named_a_compaction_in_a_new_session_too():
    session = Session()
    session.send(claude_code.modern_request(6), headers=claude_code.hint_headers("main", session="s-1"))
    after = claude_code.modern_request(1, prompt="Carry on from the summary.")
    result = session.send(after, headers=claude_code.hint_headers("main", session="s-2", context_compacted="true"))
    assert result.cause == "compaction"


def test_a_forks_first_request_is_the_first_of_its_lane_and_shares_all_of_the_main_lanes_prompt():
    session = Session()
    main = session.send(claude_code.modern_request(3), headers=claude_code.hint_headers("main"))
    fork_headers = claude_code.hint_headers("subagent", agent_id="a9c212f5b4adf0d5d", agent_type="fork")
    fork = session.send(claude_code.fork_request(3), headers=fork_headers)
    assert fork.lane == "fork:main@a9c212f5" and fork.comparison is None
    assert fork.shared.lane == "main" and fork.shared.stable_prefix_bytes == main.total_bytes
