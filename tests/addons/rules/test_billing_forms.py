"""Every form of Claude Code 2.1.332's billing line leaves the prompt: against a custom base URL
(no `cch`), a scheduled run, a subagent, and against a first-party host (`cch` and the per-request
fields); as a system block and as one line of an OpenAI system message."""

import copy

import pytest

from stable_prefix.addons import diagnosis
from stable_prefix.addons.lanes import lane_signature
from stable_prefix.addons.rules import billing_header
from stable_prefix.addons.rules.base import Change
from tests.fixtures import claude_code

FORMS = pytest.mark.parametrize("line", claude_code.BILLING_FORMS.values(), ids=claude_code.BILLING_FORMS.keys())


@FORMS
def test_a_billing_block_of_every_form_is_removed(line):
    body = claude_code.modern_request()
    body["system"][0]["text"] = line
    expected = copy.deepcopy(body["system"][1:])
    changes = billing_header.strip_billing_header(body, "anthropic")
    assert body["system"] == expected
    assert changes == [Change("billing_header", "system[0]", "removed billing header block")]


@FORMS
def test_a_billing_line_of_every_form_leaves_an_openai_system_message_and_only_that_line(line):
    body = {"messages": [{"role": "system", "content": f"{line}\nYou are a careful coding agent."}, {"role": "user", "content": "hi"}]}
    changes = billing_header.strip_billing_header(body, "openai")
    assert body["messages"][0] == {"role": "system", "content": "You are a careful coding agent."}
    assert changes == [Change("billing_header", "messages[0].content", "removed billing header line")]


@FORMS
def test_every_form_is_named_by_the_diagnosis_as_the_billing_header(line):
    assert diagnosis.rule_for_line(line) == "billing_header"


@pytest.mark.parametrize("form", ["subagent", "first-party subagent"])
def test_a_subagent_form_says_subagent_to_the_lanes(form):
    body = claude_code.modern_subagent_request()
    body["system"][0]["text"] = claude_code.BILLING_FORMS[form]
    assert lane_signature(body, "anthropic").says_subagent


def test_two_requests_whose_billing_lines_differ_in_every_first_party_field_share_one_lane_signature():
    one, other = claude_code.modern_request(), claude_code.modern_request()
    one["system"][0]["text"] = claude_code.BILLING_FORMS["first-party"]
    other["system"][0]["text"] = claude_code.BILLING_FORMS["first-party"].replace("cc_turn_index=3", "cc_turn_index=4").replace("4f0a2", "77aa1")
    assert lane_signature(one, "anthropic") == lane_signature(other, "anthropic")
