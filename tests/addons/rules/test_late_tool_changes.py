"""Claude Code's late tool changes (betas `mid-conversation-tool-changes-...`, `inline-tools-...`): a
system message inside the conversation that adds or removes a tool. The definition stays where it
came, as text; `tools` stays what the conversation began with; a break the client itself causes by
growing `tools` is named."""

import copy
import json

from stable_prefix.addons import normalize
from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.normalize import Rules
from stable_prefix.addons.rules import system_messages
from tests.fixtures import claude_code


def forwarded(body):
    body = copy.deepcopy(body)
    normalize.normalize(body, "anthropic")
    return body


def test_a_tool_added_by_value_is_written_where_it_came_as_toolsearchs_encoding():
    body = forwarded(claude_code.late_tool_request())
    message = body["messages"][-2]
    assert message["role"] == "user"
    texts = [block["text"] for block in message["content"]]
    assert texts[0].startswith("<system-reminder>\n") and texts[-1].endswith("</system-reminder>")
    assert "<functions>\n<function>" in texts[1] and json.dumps(claude_code.LATE_TOOL["input_schema"]) in texts[1]


def test_tools_stay_what_the_conversation_began_with():
    before, after = forwarded(claude_code.modern_request(3)), forwarded(claude_code.late_tool_request())
    assert after["tools"] == before["tools"]


def test_the_messages_before_the_tool_change_are_forwarded_as_on_the_turn_before():
    before, after = forwarded(claude_code.modern_request(3)), forwarded(claude_code.late_tool_request())
    assert after["messages"][: len(before["messages"]) - 1] == before["messages"][:-1]


def test_a_tool_added_by_reference_is_named_in_place():
    body = forwarded(claude_code.late_tool_request(by_value=False))
    assert "Tool added: mcp__notes__search" in json.dumps(body["messages"][-2])


def test_a_system_message_with_an_unknown_block_beside_a_tool_change_is_left_alone():
    body = claude_code.late_tool_request()
    body["messages"][-2]["content"].append({"type": "image", "source": {}})
    assert forwarded(body)["messages"][-2]["role"] == "system"


def test_late_tool_names_are_the_tools_system_messages_add():
    assert system_messages.late_tool_names(claude_code.late_tool_request(by_value=False), "anthropic") == {"mcp__notes__search"}


def test_tools_the_client_grew_with_a_late_tool_change_are_named_as_the_cause():
    diagnosis = PrefixDiagnosis(Rules())
    for body in (claude_code.modern_request(3), claude_code.late_tool_request(into_tools=True)):
        snapshot = PromptSnapshot.of(copy.deepcopy(body), "anthropic")
        result = diagnosis.observe(snapshot, forwarded(body))
    assert result.prefix_broke and result.cause == "late tool change"
