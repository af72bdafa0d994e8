"""Which conversation and which subagent an opencode, Qwen Code, Codex or Pi request belongs to, and the causes
the diagnosis names for their breaks (`lanes.AGENTS`; bodies from `tests/fixtures/coding_agents.py`)."""

import copy

import pytest

from stable_prefix.addons import normalize
from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.lanes import CLAUDE_CODE, CODEX, OPENCODE, PI, QWEN_CODE, LaneNames, agent_of, lane_signature, session_of
from stable_prefix.addons.normalize import Rules
from tests.fixtures import claude_code, codex
from tests.fixtures.coding_agents import (
    QWEN_HEADERS,
    opencode_headers,
    opencode_request,
    opencode_subagent_request,
    pi_headers,
    pi_request,
    qwen_request,
    qwen_subagent_request,
)


class Session:
    """Requests through the rules and the diagnosis, as the addon does it."""

    def __init__(self, rules=Rules()):
        self.rules = rules
        self.diagnosis = PrefixDiagnosis(rules)

    def send(self, body, headers):
        body = copy.deepcopy(body)
        snapshot = PromptSnapshot.of(body, "openai", headers)
        normalize.normalize(body, "openai", self.rules)
        return self.diagnosis.observe(snapshot, body)


def lanes_of(*requests):
    names = LaneNames()
    return [names.name_for(lane_signature(body, "openai", headers)) for body, headers in requests]


def test_each_agent_is_told_apart_by_its_user_agent_and_any_other_client_is_read_as_claude_code():
    assert agent_of(opencode_headers("ses_1")) is OPENCODE
    assert agent_of(QWEN_HEADERS) is QWEN_CODE
    assert agent_of(codex.Conversation("Hi.").headers()) is CODEX
    assert agent_of(pi_headers("01a23341")) is PI
    assert agent_of({"user-agent": "claude-cli/2.1.332 (external, cli)"}) is CLAUDE_CODE
    assert agent_of({}) is CLAUDE_CODE and agent_of(None) is CLAUDE_CODE


def test_each_agent_names_its_conversation_in_its_own_header():
    assert session_of({"user-agent": "claude-cli/2.1.332 (external, cli)", "x-claude-code-session-id": "c-1"}) == "c-1"
    assert session_of(opencode_headers("ses_1")) == "ses_1"
    conversation = codex.Conversation("Hi.")
    assert session_of(conversation.headers()) == conversation.session
    assert session_of(QWEN_HEADERS) is None
    assert session_of(pi_headers("01a23341")) == "01a23341"


def test_another_client_of_the_openai_js_sdk_is_not_read_as_pi():
    assert agent_of({"user-agent": "OpenAI/JS 6.26.0"}) is CLAUDE_CODE


# --- lanes ---------------------------------------------------------------------------------------


def test_opencodes_main_agent_is_the_main_lane_because_it_can_start_subagents_with_task():
    explore = opencode_subagent_request("Find the tests.")
    assert lanes_of((explore, opencode_headers("ses_2", parent="ses_1")), (opencode_request(["Hi."]), opencode_headers("ses_1")))[1] == "main"


def test_each_opencode_subagent_session_is_an_instance_lane_of_its_type():
    lanes = lanes_of((opencode_request(["Hi."]), opencode_headers("ses_dceec777aff")),
                     (opencode_subagent_request("Find the tests."), opencode_headers("ses_dceec777affew0s", parent="ses_dceec777aff")),
                     (opencode_subagent_request("Find the docs."), opencode_headers("ses_dceec7720ffeHhc", parent="ses_dceec777aff")),
                     (opencode_subagent_request("Find the tests.", 2), opencode_headers("ses_dceec777affew0s", parent="ses_dceec777aff")))
    assert lanes[0] == "main"
    assert lanes[1] != lanes[2] and lanes[1] == lanes[3], "one lane per child session, though their ids share a long prefix"
    assert lanes[1].split("@")[0] == lanes[2].split("@")[0] and lanes[1].startswith("sub:")


def test_qwen_codes_main_agent_is_the_main_lane_because_it_can_start_subagents_with_agent():
    assert lanes_of((qwen_subagent_request("Find the tests."), QWEN_HEADERS), (qwen_request(["Hi."]), QWEN_HEADERS))[1] == "main"


def test_qwen_code_subagent_instances_are_named_by_their_task_whatever_the_date():
    later_step = qwen_subagent_request("Find the tests.", 2)
    later_step["messages"][1]["content"][0] = {"type": "text", "text": "<system-reminder>\nThe current date is: tomorrow.\n</system-reminder>"}
    lanes = lanes_of((qwen_subagent_request("Find the tests."), QWEN_HEADERS), (qwen_subagent_request("Find the docs."), QWEN_HEADERS),
                     (later_step, QWEN_HEADERS))
    assert lanes[0] != lanes[1] and lanes[0] == lanes[2] and lanes[0].split("@")[0] == lanes[1].split("@")[0]


def test_qwen_codes_main_lane_has_no_instance_of_its_own():
    assert lanes_of((qwen_request(["Hi."]), QWEN_HEADERS), (qwen_request(["Other work."]), QWEN_HEADERS)) == ["main", "main"]


# --- causes --------------------------------------------------------------------------------------


def test_a_new_opencode_session_is_a_new_conversation_and_the_same_session_restarting_a_compaction():
    session = Session()
    session.send(opencode_request(["Hi.", "Go on."]), opencode_headers("ses_1"))
    assert session.send(opencode_request(["Other work."]), opencode_headers("ses_2")).cause == "new conversation"
    session.send(opencode_request(["Other work.", "Go on."]), opencode_headers("ses_2"))
    assert session.send(opencode_request(["Summary of the work so far."]), opencode_headers("ses_2")).cause == "compaction"


def test_switching_opencode_from_plan_to_build_is_a_mode_switch():
    session = Session()
    session.send(opencode_request(["Plan it.", "Refine."], mode="plan mode"), opencode_headers("ses_1"))
    result = session.send(opencode_request(["Plan it.", "Refine.", "Build it."], mode="build after plan"), opencode_headers("ses_1"))
    assert result.prefix_broke and result.cause == "mode switch"
    assert result.comparison.first_divergence.path.startswith("tools["), "the task tool lists the build mode's subagents"


def test_a_plan_turn_keeps_its_prefix_and_says_the_turn_reminder_was_pinned():
    session = Session()
    session.send(opencode_request(["Plan it."], mode="plan mode"), opencode_headers("ses_1"))
    result = session.send(opencode_request(["Plan it.", "Refine."], mode="plan mode"), opencode_headers("ses_1"))
    assert not result.prefix_broke
    assert result.neutralized.rule == "turn_reminders" and "(turn reminder; pinned to the first user message)" in result.line()


def test_with_pin_turn_reminders_off_the_break_names_its_option():
    session = Session(Rules(pin_turn_reminders=False))
    session.send(qwen_request(["Hi."]), QWEN_HEADERS)
    result = session.send(qwen_request(["Hi.", "Go on."]), QWEN_HEADERS)
    assert result.cause == "turn reminder; pin_turn_reminders off"


# The agents that write the date into their first message: their request, their session's headers, and the next
# day's date as each writes it.
DATED_AGENTS = {
    "opencode": (opencode_request, opencode_headers("ses_1"), "Wed Dec 02 2026"),
    "pi": (pi_request, pi_headers("s-1"), "2026-12-02"),
}


@pytest.mark.parametrize("agent", list(DATED_AGENTS))
def test_with_relocate_conversation_context_off_a_date_change_names_its_option(agent):
    request, headers, next_day = DATED_AGENTS[agent]
    session = Session(Rules(relocate_conversation_context=False))
    session.send(request(["Hi."]), headers)
    result = session.send(request(["Hi.", "Go on."], date=next_day), headers)
    assert result.comparison.first_divergence.path == "messages[0].content"
    assert result.cause == "conversation context; relocate_conversation_context off"


@pytest.mark.parametrize("agent", list(DATED_AGENTS))
def test_a_conversation_continued_past_midnight_breaks_at_its_first_message_for_the_date(agent):
    request, headers, next_day = DATED_AGENTS[agent]
    session = Session()
    session.send(request(["Hi."]), headers)
    result = session.send(request(["Hi.", "Go on."], date=next_day), headers)
    assert result.comparison.first_divergence.path.startswith("messages[1]") and result.cause == "environment"


def test_a_continued_qwen_code_conversation_whose_startup_context_changed_is_not_a_new_one():
    session = Session()
    session.send(qwen_request(["Hi.", "Go on."]), QWEN_HEADERS)
    result = session.send(qwen_request(["Hi.", "Go on.", "After the commit."], files=("notes.md", "README.md")), QWEN_HEADERS)
    assert result.cause == "context changed"
    assert session.send(qwen_request(["Something new."], files=("notes.md", "README.md")), QWEN_HEADERS).cause == "new conversation"


def test_claude_codes_instances_keep_their_agent_id_prefix_as_name():
    body = claude_code.modern_subagent_request("explore", 1, task="Find the tests.")
    signature = lane_signature(body, "anthropic", claude_code.agent_headers(agent_id="a5f1c0ffee1234"))
    assert signature.instance == "a5f1c0ff"


def test_a_new_pi_session_is_a_new_conversation_that_parts_at_its_first_prompt():
    session = Session()
    session.send(pi_request(["Hi.", "Go on."]), pi_headers("s-1"))
    result = session.send(pi_request(["Other work."]), pi_headers("s-2"))
    assert result.cause == "new conversation" and result.comparison.first_divergence.path.startswith("messages[1]")
