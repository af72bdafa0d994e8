"""The rules on Responses API bodies (`POST /v1/responses`, what Codex CLI sends), one behaviour each."""

import copy

import pytest

from stable_prefix.addons import normalize, request_shape, server_compat
from stable_prefix.addons.normalize import Rules
from stable_prefix.addons.prompt_order import prompt_order
from stable_prefix.addons.rules import billing_header, git_status, initial_context, system_messages, tool_order
from stable_prefix.addons.rules.base import Change
from tests.fixtures import claude_code, codex


def developer(text: str) -> dict:
    return {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text}]}


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


@pytest.mark.parametrize("path, api", [
    ("/v1/responses", "responses"),
    ("/openai/v1/responses", "responses"),
    ("/v1/responses/input_tokens", None),
    ("/v1/responses/resp_1/cancel", None),
])
def test_the_responses_path_is_recognized_and_its_side_routes_are_not(path, api):
    assert request_shape.api_for("POST", path) == api


def test_a_continued_codex_turn_is_changed_only_in_its_model_name():
    body = codex.Conversation("Say hello.").answer("Hello.").ask("In French.").request()
    before = copy.deepcopy(body)
    changes = normalize.normalize(body, "responses", Rules(model_map=(("*", "tiny"),)))
    assert changes == [Change("model", "model", "gpt-5.4 -> tiny")]
    assert body == {**before, "model": "tiny"}


def test_leading_developer_messages_are_the_system_prompt_and_stay():
    body = codex.Conversation("Say hello.").request()
    before = copy.deepcopy(body)
    assert system_messages.rewrite_system_messages(body, "responses") == []
    assert initial_context.lead_with_stable_context(body, "responses") == []
    assert body == before


def test_a_developer_message_appended_mid_conversation_becomes_a_user_reminder_in_place():
    conversation = codex.Conversation("Say hello.").answer("Hello.").change_sandbox("workspace-write").ask("Now edit it.")
    body = conversation.request()
    index = next(i for i, item in enumerate(body["input"]) if i > 1 and item.get("role") == "developer")
    item_id = body["input"][index]["id"]
    changes = system_messages.rewrite_system_messages(body, "responses")
    assert changes == [Change("system_messages", f"input[{index}]", "developer message rewritten as user <system-reminder>")]
    assert body["input"][index] == {
        "type": "message", "id": item_id, "role": "user",
        "content": [{"type": "input_text", "text": "<system-reminder>\n" + codex.permissions("workspace-write") + "\n</system-reminder>"}]}


def test_the_rewritten_turn_keeps_the_previous_turn_as_its_prefix():
    """Without the rule vllm-mlx merges the new developer message into the system
    message in front, and the whole prompt after byte 0 changes."""
    conversation = codex.Conversation("Say hello.").answer("Hello.")
    before = conversation.ask("Go on.").request()
    after = conversation.answer("Done.").change_sandbox("workspace-write").ask("Now edit it.").request()
    for body in (before, after):
        normalize.normalize(body, "responses")
    previous, current = prompt_order(before, "responses").to_bytes(), prompt_order(after, "responses").to_bytes()
    assert current.startswith(previous)


def test_a_system_message_before_the_first_answer_moves_before_the_first_user_message():
    body = {"model": "m", "input": [developer("Base."), user("Hi."), {"role": "system", "content": "Context."}]}
    changes = initial_context.lead_with_stable_context(body, "responses")
    assert [change.rule for change in changes] == ["initial_context"]
    assert body["input"] == [developer("Base."), {"role": "user", "content": "<system-reminder>\nContext.\n</system-reminder>"}, user("Hi.")]


def test_after_a_stored_response_no_item_is_leading_system_text():
    """A request continuing `previous_response_id` follows the stored history."""
    body = {"model": "m", "previous_response_id": "resp_1", "input": [developer("New rules."), user("Next.")]}
    system_messages.rewrite_system_messages(body, "responses")
    assert body["input"][0]["role"] == "user"


def test_the_billing_header_is_stripped_from_instructions():
    body = {"model": "m", "instructions": claude_code.billing_text() + "\nYou are helpful.", "input": "hi"}
    changes = billing_header.strip_billing_header(body, "responses")
    assert body["instructions"] == "You are helpful."
    assert changes == [Change("billing_header", "instructions", "removed billing header line")]


def test_instructions_holding_only_a_billing_header_go_entirely():
    body = {"model": "m", "instructions": claude_code.billing_text(), "input": "hi"}
    billing_header.strip_billing_header(body, "responses")
    assert "instructions" not in body


def test_a_git_status_in_the_instructions_moves_into_the_first_user_message_as_input_text():
    body = {"model": "m", "instructions": "Be brief.\ngitStatus: Current branch: main\nStatus:\nM a.py", "input": [user("Hi.")]}
    git_status.relocate_git_status(body, "responses")
    assert body["instructions"] == "Be brief."
    assert body["input"][0]["content"] == [
        {"type": "input_text", "text": "<system-reminder>\ngitStatus: Current branch: main\nStatus:\nM a.py\n</system-reminder>"},
        {"type": "input_text", "text": "Hi."}]


def test_max_output_tokens_is_capped():
    body = {"model": "m", "input": "hi", "max_output_tokens": 32000}
    assert server_compat.cap_max_tokens(body, 512) == [Change("max_tokens", "max_output_tokens", "32000 -> 512")]
    assert body["max_output_tokens"] == 512


def test_tool_calls_their_outputs_and_unknown_items_are_left_as_they_are():
    conversation = codex.Conversation("List the files.").call("exec_command", '{"cmd": "ls"}', "README.md")
    body = conversation.request()
    body["input"].append({"type": "item_reference", "id": "ref_1"})
    before = copy.deepcopy(body)
    assert normalize.normalize(body, "responses") == []
    assert body == before


def test_a_string_input_is_left_as_it_is():
    body = {"model": "m", "instructions": "Be brief.", "input": "hi"}
    assert normalize.normalize(body, "responses") == []
    assert body == {"model": "m", "instructions": "Be brief.", "input": "hi"}


def test_tools_sort_by_name_when_asked_with_unnamed_hosted_tools_first():
    body = codex.Conversation("Hi.").request()
    tool_order.sort_tools(body, "responses")
    assert [tool.get("name") for tool in body["tools"]] == [None, "agents", "apply_patch", "exec_command"]
