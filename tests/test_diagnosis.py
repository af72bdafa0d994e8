"""The per-lane diagnosis: what it compares, what it explains, what it prints."""

import copy

from fixtures import claude_code

from stable_prefix.addons import normalize
from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.normalize import Rules


class Session:
    """Requests through the rules and the diagnosis, as the addon does it."""

    def __init__(self, rules=Rules()):
        self.rules = rules
        self.diagnosis = PrefixDiagnosis()

    def send(self, body, api="anthropic"):
        body = copy.deepcopy(body)
        snapshot = PromptSnapshot.of(body, api)
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


def test_clear_breaks_the_main_lane_without_a_rule_to_blame():
    session = Session()
    session.send(claude_code.main_request(6))
    result = session.send(claude_code.main_request(1, git_status="?? notes.txt", topic="other work"))
    assert result.lane == "main" and result.prefix_broke and result.explained_by is None
    assert result.line().startswith("lane main · prefix broke at system[1].text byte ")


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
    assert totals["main"]["breaks"] == {"unexplained": 1} and totals["main"]["neutralized"] == {"billing_header": 3}
    summary = session.diagnosis.summary_lines()
    assert summary[0].startswith("lane main · 4 requests · prefix kept 2/3 · ")
    assert summary[1].endswith("· 1 requests")


def test_reusing_the_clients_untouched_segments_gives_the_same_order_as_serializing_anew():
    from stable_prefix.addons.diagnosis import untouched_segments
    from stable_prefix.addons.prompt_order import prompt_order

    cases = [
        ("anthropic", claude_code.main_request(12, cch="x"), Rules()),
        ("anthropic", claude_code.main_request(12), Rules(drop_date_line=True, sort_tools=True)),
        ("anthropic", claude_code.subagent_request("general", 3), Rules(rewrite_system_messages=False)),
        ("openai", claude_code.openai_request(4), Rules()),
    ]
    for api, body, rules in cases:
        snapshot = PromptSnapshot.of(body, api)
        changes = normalize.normalize(body, api, rules)
        reused = prompt_order(body, api, untouched_segments(snapshot, changes))
        assert reused == prompt_order(body, api)
        if api == "anthropic":
            assert any(segment.path.startswith("tools[") for segment in untouched_segments(snapshot, changes).values()) != rules.sort_tools


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
