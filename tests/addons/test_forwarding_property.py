"""The fuzz tests' property itself: it accepts what the rules document and names everything else."""

from __future__ import annotations

import copy
import json

import pytest

from stable_prefix.addons import normalize
from tests.fixtures.coding_agents import opencode_request, qwen_date, qwen_request
from tests.support.forwarding_property import problems
from tests.support.fuzz_bodies import anthropic_system_texts, openai_system_texts

BILLING = "x-anthropic-billing-header: cc_version=2.1.332.a3f; cc_is_subagent=true;"
READ = {"name": "Read", "description": "Read a file.", "input_schema": {"type": "object"}}
FETCH = {"name": "WebFetch", "description": "Fetch a page.", "input_schema": {"type": "object"}, "defer_loading": True}
CLIENT = {
    "model": "claude-opus-4-8", "max_tokens": 64000,
    "system": [{"type": "text", "text": f"You code.\n{BILLING}\nBe brief."}],
    "tools": [READ, FETCH],
    "messages": [
        {"role": "user", "content": f"why does it say\n{BILLING}"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "fetch"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_reference", "tool_name": "WebFetch"}]}]},
        {"role": "system", "content": "Today is Tuesday."},
    ],
}


def check(forwarded: dict) -> list[str]:
    return problems(CLIENT, forwarded, anthropic_system_texts, served_model="served", max_tokens_cap=4096)


def normalized() -> dict:
    body = copy.deepcopy(CLIENT)
    normalize.normalize(body, "anthropic", normalize.Rules(model_map=(("*", "served"),), max_tokens_cap=4096))
    return body


def test_the_body_after_the_documented_rules_passes():
    assert check(normalized()) == []


@pytest.mark.parametrize(("damage", "named"), [
    (lambda body: body["messages"][0].update(content="why does it say"), "line lost: 'x-anthropic-billing-header"),
    (lambda body: body["messages"].pop(), "line lost: 'Today is Tuesday.'"),
    (lambda body: body["messages"][0].update(content=body["messages"][0]["content"] + "\nan invented line"), "line added: 'an invented line'"),
    (lambda body: body["tools"].clear(), "tool neither offered nor inlined: 'Read'"),
    (lambda body: body["tools"].append({"name": "Bash", "input_schema": {}}), "tool added or changed"),
    (lambda body: body["messages"][1]["content"][0].update(id="toolu_2"), "ids differ"),
    (lambda body: body.update(temperature=0.5), "fields added: ['temperature']"),
    (lambda body: body.update(model="claude-opus-4-8"), "model 'claude-opus-4-8' forwarded as 'claude-opus-4-8', expected 'served'"),
    (lambda body: body.update(max_tokens=64000), "max_tokens 64000 forwarded as 64000, expected 4096"),
    (lambda body: body["messages"][2]["content"][0].update(content=json.dumps([{"type": "text", "text": "<functions>\n</functions>"}])),
     "tool neither offered nor inlined: 'WebFetch'"),
])
def test_anything_else_is_named(damage, named):
    body = normalized()
    damage(body)
    assert any(problem.startswith(named) for problem in check(body)), check(body)


def agent_check(client: dict, forwarded: dict) -> list[str]:
    return problems(client, forwarded, openai_system_texts)


def agent_normalized(client: dict) -> dict:
    body = copy.deepcopy(client)
    normalize.normalize(body, "openai", normalize.Rules())
    return body


def test_conversation_context_and_turn_reminders_moved_as_documented_pass():
    qwen = qwen_request(["Look around.", "Go on."])
    opencode = opencode_request(["Plan it.", "Plan more."], mode="plan mode")
    for client in (qwen, opencode):
        forwarded = agent_normalized(client)
        assert forwarded["messages"] != client["messages"]  # the rules moved something
        assert agent_check(client, forwarded) == []


def test_a_turn_reminder_sent_on_two_messages_may_be_forwarded_once():
    client = qwen_request(["Look around.", "Go on."])
    client["messages"][1]["content"].insert(3, qwen_date())  # the same date reminder on the first prompt too
    forwarded = agent_normalized(client)
    assert sum(part == qwen_date() for message in forwarded["messages"] for part in message["content"] if isinstance(part, dict)) == 1
    assert agent_check(client, forwarded) == []


def test_a_turn_reminder_no_copy_of_which_is_left_is_named():
    client = qwen_request(["Look around.", "Go on."])
    client["messages"][1]["content"].insert(3, qwen_date())
    forwarded = agent_normalized(client)
    forwarded["messages"][1]["content"] = [part for part in forwarded["messages"][1]["content"] if part != qwen_date()]
    assert any(problem.startswith("turn reminder lost: '<system-reminder>\\nThe current date is:") for problem in agent_check(client, forwarded))
