"""Responses API requests in prompt order, their lanes, and the causes the diagnosis names."""

import copy

from stable_prefix.addons import normalize
from stable_prefix.addons.diagnosis import PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.normalize import Rules
from stable_prefix.addons.prompt_order import compare, prompt_order
from stable_prefix.addons.response_chains import ResponseChains
from tests.fixtures import codex


class Session:
    """Requests through the rules, the chains and the diagnosis, as the addon does it."""

    def __init__(self, rules=Rules()):
        self.rules = rules
        self.diagnosis = PrefixDiagnosis(rules)
        self.chains = ResponseChains()

    def send(self, body, headers=None):
        body = copy.deepcopy(body)
        snapshot = PromptSnapshot.of(self.chains.resolved(body), "responses", headers)
        normalize.normalize(body, "responses", self.rules)
        return self.diagnosis.observe(snapshot, self.chains.resolved(body)), body


def answered(body: dict, response_id: str, text: str) -> dict:
    """The response object a server returns for `body`."""
    return {"id": response_id, "object": "response",
            "output": [{"type": "message", "id": f"msg_{response_id}", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}]}


def test_instructions_and_developer_items_come_first_wherever_they_sit_then_tools_then_the_rest():
    body = codex.Conversation("Hi.").answer("Hello.").change_sandbox("workspace-write").ask("Edit.").request()
    body["instructions"] = "Be brief."
    paths = [segment.path for segment in prompt_order(body, "responses").segments]
    developer_at = [f"input[{i}]" for i, item in enumerate(body["input"]) if item["role"] == "developer"]
    assert paths[: 1 + len(developer_at)] == ["instructions", *developer_at]
    assert paths[len(developer_at) + 1 : len(developer_at) + 5] == ["tools[0]", "tools[1]", "tools[2]", "tools[3]"]


def test_item_ids_and_statuses_are_not_part_of_the_prompt():
    """Codex gives the same instructions a new id in every conversation; servers never render it."""
    one, other = codex.Conversation("Hi."), codex.Conversation("Hi.")
    assert one.items[0]["id"] != other.items[0]["id"]
    assert prompt_order(one.request(), "responses").to_bytes() == prompt_order(other.request(), "responses").to_bytes()


def test_a_string_input_reads_as_the_user_message_a_later_request_holds():
    first = {"model": "m", "input": "hi"}
    later = {"model": "m", "input": [{"type": "message", "role": "user", "content": "hi"}, {"type": "message", "role": "assistant", "content": "yo"}]}
    assert compare(prompt_order(first, "responses"), prompt_order(later, "responses")).prefix_kept


def test_every_continued_codex_turn_keeps_its_prefix_in_one_main_lane():
    session, conversation = Session(), codex.Conversation("Say hello.")
    lanes = []
    for prompt in ("In French.", "In German.", "In Italian."):
        result, _ = session.send(conversation.request(), conversation.headers())
        lanes.append(result.lane)
        assert not result.prefix_broke
        conversation.answer("Hello.").ask(prompt)
    assert set(lanes) == {"main"}


def test_a_new_codex_conversation_is_named_one_and_shares_everything_before_its_prompt():
    session = Session()
    first = codex.Conversation("Say hello.")
    session.send(first.request(), first.headers())
    session.send(first.answer("Hello.").ask("Again.").request(), first.headers())
    second = codex.Conversation("Say goodbye.")
    result, _ = session.send(second.request(), second.headers())
    assert result.lane == "main" and result.cause == "new conversation"
    assert result.comparison.first_divergence.path == "input[3].content"  # one text part reads as its text


def test_a_codex_conversation_restarted_under_its_own_session_is_a_compaction():
    session, conversation = Session(), codex.Conversation("Say hello.")
    session.send(conversation.answer("Hello.").ask("Go on.").request(), conversation.headers())
    restarted = codex.Conversation("Summary so far.")
    restarted.session = conversation.session
    result, _ = session.send(restarted.request(), restarted.headers())
    assert result.cause == "compaction"


def test_a_mid_conversation_developer_message_is_reported_as_rewritten_or_as_the_rule_being_off():
    conversation = codex.Conversation("Say hello.").answer("Hello.")
    before = conversation.ask("Go on.").request()
    after = conversation.answer("Done.").change_sandbox("workspace-write").ask("Edit.").request()
    on = Session()
    on.send(before, conversation.headers())
    kept, _ = on.send(after, conversation.headers())
    assert not kept.prefix_broke and kept.neutralized.rule == "system_messages"
    off = Session(Rules(rewrite_system_messages=False))
    off.send(before, conversation.headers())
    broke, _ = off.send(after, conversation.headers())
    assert broke.prefix_broke and broke.cause == "system message; rewrite_system_messages off"


def test_a_new_date_in_the_environment_context_is_named_environment():
    session = Session()
    today = codex.Conversation("Say hello.", date="2026-12-01")
    session.send(today.request(), today.headers())
    tomorrow = codex.Conversation("Say hello.", date="2026-12-02")
    result, _ = session.send(tomorrow.request(), tomorrow.headers())
    assert result.cause == "environment" and result.comparison.first_divergence.path == "input[2].content"


def test_a_request_continuing_a_stored_response_is_read_with_the_history_it_continues():
    session = Session()
    first = {"model": "m", "instructions": "Be brief.", "input": "Say hello."}
    _, forwarded = session.send(first)
    session.chains.remember(forwarded, answered(forwarded, "resp_1", "Hello."))
    result, _ = session.send({"model": "m", "instructions": "Be brief.", "previous_response_id": "resp_1", "input": "In French."})
    assert not result.prefix_broke
    assert result.comparison.first_divergence.path == "input[1]"  # the held answer, after the held prompt


def test_a_stored_response_the_proxy_never_saw_is_named_as_history_held_by_the_server():
    session = Session()
    session.send({"model": "m", "instructions": "Be brief.", "previous_response_id": "resp_a", "input": "One."})
    result, _ = session.send({"model": "m", "instructions": "Be brief.", "previous_response_id": "resp_b", "input": "Two."})
    assert result.prefix_broke and result.cause == "history held by the server"


def test_nothing_is_held_for_a_response_that_was_not_stored():
    chains = ResponseChains()
    body = {"model": "m", "input": "hi", "store": False}
    chains.remember(body, answered(body, "resp_1", "yo"))
    continued = {"model": "m", "previous_response_id": "resp_1", "input": "more"}
    assert chains.resolved(continued) is continued


def test_held_histories_are_bounded():
    chains = ResponseChains(kept=2)
    for number in range(3):
        body = {"model": "m", "input": f"turn {number}"}
        chains.remember(body, answered(body, f"resp_{number}", "ok"))
    assert chains.resolved({"previous_response_id": "resp_0", "input": "x"}) == {"previous_response_id": "resp_0", "input": "x"}
    assert chains.resolved({"previous_response_id": "resp_2", "input": "x"})["input"][0]["content"] == "turn 2"
