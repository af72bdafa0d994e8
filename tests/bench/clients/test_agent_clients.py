"""The team bench's users behave as each agent's real CLI was measured to (bench/probes/agent_cuts.py's committed run)."""

import json

import pytest

from stable_prefix.bench.clients.agent_clients import CLIENTS, MEASURED_IN, RESUMED, STREAMED, loss_kind, resend_as
from stable_prefix.bench.clients.replay import Reply
from stable_prefix.bench.probes.agent_cuts import FORMS
from tests.support.processes import REPO_ROOT

MEASURED = json.loads((REPO_ROOT / MEASURED_IN).read_text())


def measured(agent: str, error_event: bool) -> set[str | None]:
    """How the agent sent the cut request again in each measured form of this kind (the proxy's recovery off);
    a resumption (the partial answer sent back) is a streamed request as a bench client sends it."""
    return {STREAMED if run["resent_as"] == RESUMED else run["resent_as"] for run in MEASURED["runs"]
            if run["agent"] == agent and run["recovery"] == "off" and FORMS[run["form"]].error_event == error_event}


@pytest.mark.parametrize("agent", list(CLIENTS))
def test_each_client_resends_as_its_agent_was_measured_to(agent):
    assert measured(agent, error_event=True) == {CLIENTS[agent].after_error_event}
    assert measured(agent, error_event=False) == {CLIENTS[agent].after_silent_cut}


def test_a_cut_looks_as_it_ended_to_the_client():
    assert loss_kind(Reply(200, 1.0, 2.0, stop_reason="end_turn")) is None
    assert loss_kind(Reply(200, 1.0, 2.0, error='{"type": "api_error"}')) == "error event"
    assert loss_kind(Reply(200, 1.0, 2.0, error="stream cut: IncompleteRead(...)")) == "cut"
    assert loss_kind(Reply(200, 1.0, 2.0)) == "cut"
    assert loss_kind(Reply(502, None, 2.0, error="HTTP 502")) == "refused"


def test_a_client_sends_again_only_what_it_was_measured_to():
    error_event = Reply(200, 1.0, 2.0, error='{"type": "api_error"}')
    assert resend_as(CLIENTS["claude"], error_event) == CLIENTS["claude"].after_error_event
    assert resend_as(CLIENTS["claude"], Reply(200, 1.0, 2.0)) == STREAMED == CLIENTS["claude"].after_silent_cut
    assert resend_as(CLIENTS["claude"], Reply(502, None, 2.0, error="HTTP 502")) is None
