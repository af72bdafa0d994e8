"""The rules for opencode's, Qwen Code's and Pi's volatile parts, on bodies we wrote in their shapes
(`tests/fixtures/coding_agents.py`): conversation context and turn reminders go to the first user
message, every later turn's prompt extends the last one, and nothing else moves."""

import copy

from stable_prefix.addons import normalize
from stable_prefix.addons.normalize import Rules
from stable_prefix.addons.prompt_order import compare, prompt_order
from tests.fixtures import claude_code, coding_agents
from tests.fixtures.coding_agents import WORKDIR, opencode_request, pi_request, qwen_request

ONLY_THE_AGENT_RULES = Rules(strip_billing_header=False, rewrite_system_messages=False, relocate_git_status=False,
                             lead_with_stable_context=False, inline_loaded_tools=False)
WITHOUT_THEM = Rules(relocate_conversation_context=False, pin_turn_reminders=False)


def forwarded(body, rules=Rules()):
    body = copy.deepcopy(body)
    normalize.normalize(body, "openai", rules)
    return body


def texts(message):
    content = message["content"]
    return [content] if isinstance(content, str) else [part["text"] for part in content]


def first_break(before, after, rules=Rules()):
    """Where the forwarded prompt of `after` first differs from that of `before` (None: a prefix)."""
    comparison = compare(prompt_order(forwarded(before, rules), "openai"), prompt_order(forwarded(after, rules), "openai"))
    return None if comparison.prefix_kept else comparison.first_divergence.path


# --- opencode ------------------------------------------------------------------------------------


def test_opencodes_date_line_moves_verbatim_from_the_system_prompt_into_the_first_user_message():
    body = forwarded(opencode_request(["Read the README."]))
    assert "Today's date" not in body["messages"][0]["content"]
    assert body["messages"][0]["content"].endswith("</available_skills>"), "the rest of the system prompt stays"
    assert texts(body["messages"][1]) == ["<system-reminder>\n  Today's date: Tue Dec 01 2026\n</system-reminder>", "Read the README."]


def test_an_opencode_conversation_the_next_day_shares_system_prompt_and_tools():
    today, tomorrow = opencode_request(["Read the README."]), opencode_request(["Read the README.", "Go on."], date="Wed Dec 02 2026")
    assert first_break(today, tomorrow, WITHOUT_THEM) == "messages[0].content", "as sent, the date breaks the system prompt, before the tools"
    assert first_break(today, tomorrow).startswith("messages[1]")


def test_opencodes_plan_mode_reminder_moves_from_the_newest_message_to_the_first():
    body = forwarded(opencode_request(["Plan it.", "Refine the plan."], mode="plan mode"))
    assert texts(body["messages"][3]) == ["Refine the plan."]
    assert texts(body["messages"][1])[1].startswith("<system-reminder>\n# Plan Mode") and texts(body["messages"][1])[-1] == "Plan it."


def test_every_plan_mode_turn_extends_the_last_one_where_opencode_alone_breaks_at_the_previous_message():
    turns = [opencode_request(["Plan it.", "Refine.", "Again."][:n], mode="plan mode") for n in (1, 2, 3)]
    for before, after in zip(turns, turns[1:]):
        assert first_break(before, after) is None
        assert first_break(before, after, WITHOUT_THEM) is not None
    assert first_break(turns[1], turns[2], WITHOUT_THEM) == "messages[3].content"


def test_the_switch_to_build_reminder_stays_put_on_every_later_build_turn():
    after_plan = [opencode_request(["Plan it.", "Build it.", "Thanks."][:n], mode="build after plan") for n in (2, 3)]
    assert first_break(*after_plan) is None


# --- Qwen Code -----------------------------------------------------------------------------------


def test_qwen_codes_current_date_moves_from_the_newest_message_to_the_first_after_its_fixed_reminders():
    body = forwarded(qwen_request(["Read the README.", "Thanks."]))
    first = texts(body["messages"][1])
    assert texts(body["messages"][3]) == ["Thanks."]
    assert [text.split("\n")[1][:24] for text in first[:-1]] == [
        "These skills are availab", "These tools can be reach", "# auto memory", "This is the Qwen Code. W",
        "Git snapshot at conversa", "The current date is: Tue"]
    assert first[-1] == "Read the README."


def test_every_continued_qwen_code_turn_extends_the_last_one_tool_turn_included():
    turns = [qwen_request(["Read the README.", "Thanks.", "Again."][:n], tool_turn=True) for n in (1, 2, 3)]
    for before, after in zip(turns, turns[1:]):
        assert first_break(before, after) is None
    assert first_break(turns[0], turns[1], WITHOUT_THEM) == "messages[1].content[3].text", "as sent: the whole tool turn re-read"


def test_qwen_codes_git_snapshot_and_memory_section_leave_the_system_prompt():
    body = forwarded(qwen_request(["Hi."]))
    system = body["messages"][0]["content"]
    assert "Git snapshot" not in system and "# auto memory" not in system and system.startswith("You are a coding agent")


def test_a_qwen_code_conversation_after_a_commit_and_a_new_file_parts_after_the_fixed_reminders():
    before = qwen_request(["Hi."])
    after = qwen_request(["Hi again."], commits=("425465c notes", "ff901f0 start"), files=("notes.md", "README.md"))
    assert first_break(before, after, WITHOUT_THEM) == "messages[0].content"
    assert first_break(before, after) == "messages[1].content[3].text", "skills, deferred tools and memory stay shared"


def test_a_saved_memory_no_longer_breaks_the_system_prompt():
    before, after = qwen_request(["Hi."]), qwen_request(["Hi."], memories=("[Tests first](tests-first.md)",))
    assert first_break(before, after, WITHOUT_THEM) == "messages[0].content"
    assert first_break(before, after) == "messages[1].content[2].text"


# --- what the rules leave alone ------------------------------------------------------------------


def test_a_newest_message_holding_only_a_turn_reminder_is_left_as_it_is():
    body = qwen_request(["Hi.", "Go on."])
    body["messages"][-1]["content"] = [coding_agents.qwen_date()]
    assert forwarded(body, ONLY_THE_AGENT_RULES)["messages"][-1] == body["messages"][-1]


def test_a_reminder_opening_quoted_inside_a_longer_text_is_not_a_turn_reminder():
    body = opencode_request(["Plan it."])
    body["messages"][-1]["content"] = [{"type": "text", "text": "Why did you write <system-reminder>\n# Plan Mode</system-reminder> here?"}]
    assert forwarded(body, Rules(relocate_conversation_context=False))["messages"][-1] == body["messages"][-1]


def test_claude_code_requests_are_untouched_by_the_agent_rules():
    for body in (claude_code.main_request(3), claude_code.modern_request(3), claude_code.modern_openai_request(3)):
        api = "openai" if "system" not in body else "anthropic"
        assert normalize.normalize(copy.deepcopy(body), api, ONLY_THE_AGENT_RULES) == []


def test_with_both_rules_off_opencode_and_qwen_code_requests_go_through_as_sent():
    for body in (opencode_request(["Plan it.", "Again."], mode="plan mode"), qwen_request(["Hi.", "Again."])):
        assert forwarded(body, WITHOUT_THEM) == body


def test_each_change_names_its_rule_and_what_moved():
    changes = normalize.normalize(qwen_request(["Hi.", "Again."]), "openai", ONLY_THE_AGENT_RULES)
    assert [str(change) for change in changes] == [
        "conversation_context messages[0].content: git snapshot, memory section taken out",
        "conversation_context messages[1]: conversation context put after its leading reminders, in a <system-reminder>",
        "turn_reminders messages[3]: current date reminder moved to messages[1], after its leading reminders",
    ]


# --- Pi ------------------------------------------------------------------------------------------


def test_pis_date_and_working_directory_lines_move_verbatim_into_the_first_user_message_directory_first():
    body = forwarded(pi_request(["Read the README."]))
    assert "Current date" not in body["messages"][0]["content"] and "Current working directory" not in body["messages"][0]["content"]
    assert body["messages"][0]["content"].endswith("- Show file paths clearly.\n"), "the rest of the system prompt stays"
    assert texts(body["messages"][1]) == [f"<system-reminder>\nCurrent working directory: {WORKDIR}\n</system-reminder>",
                                          "<system-reminder>\nCurrent date: 2026-12-01\n</system-reminder>", "Read the README."]


def test_a_pi_conversation_the_next_day_or_in_another_project_shares_system_prompt_and_tools():
    today = pi_request(["Read the README."])
    for later in (pi_request(["Read the README.", "Go on."], date="2026-12-02"), pi_request(["Read the README."], workdir="/home/dev/other")):
        assert first_break(today, later, WITHOUT_THEM) == "messages[0].content", "as sent, the line breaks the system prompt, before the tools"
        assert first_break(today, later).startswith("messages[1]")


def test_every_pi_turn_extends_the_last_one():
    turns = [pi_request(["Read the README.", "Go on.", "Thanks."][:n]) for n in (1, 2, 3)]
    for before, after in zip(turns, turns[1:]):
        assert first_break(before, after) is None
