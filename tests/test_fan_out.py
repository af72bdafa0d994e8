"""The fan-out group the benchmark replays concurrently, derived from the session's own subagent calls."""

import pytest

from stable_prefix.bench.fan_out import FAN_OUT_ID, fan_out_group, subagent_calls, with_fan_out
from stable_prefix.bench.replay import AGENT_ID_HEADER, instances, steps
from stable_prefix.bench.session import EXPLORE_LANE, generate_session


@pytest.fixture(scope="module")
def session():
    return generate_session(0, 0.03)


def test_three_instances_each_replay_one_explore_call_in_order(session):
    group = fan_out_group(session)
    calls = subagent_calls(session, EXPLORE_LANE)
    by_instance = instances(group)
    assert len(by_instance) == 3
    assert len({instance[0].headers[AGENT_ID_HEADER] for instance in by_instance}) == 3
    for instance, call in zip(by_instance, calls):
        assert [r.body["messages"][1:] for r in instance] == [r.body["messages"][1:] for r in call]
        assert all(r.fan_out == FAN_OUT_ID and r.lane == EXPLORE_LANE for r in instance)


def test_each_instance_shares_the_subagents_prompt_and_tools_but_has_its_own_task(session):
    originals = [call[0].body for call in subagent_calls(session, EXPLORE_LANE)]
    first_turns = [instance[0].body for instance in instances(fan_out_group(session))]
    for body, original in zip(first_turns, originals):
        assert body["system"][1:] == original["system"][1:] and body["tools"] == original["tools"]
        assert body["messages"][0]["content"][0]["text"].endswith(original["messages"][0]["content"][0]["text"])
        assert body["messages"][0] != original["messages"][0]
    assert len({body["messages"][0]["content"][0]["text"] for body in first_turns}) == 3
    billing = {body["system"][0]["text"] for body in first_turns}
    assert len(billing) == 3 and not billing & {original["system"][0]["text"] for original in originals}


def test_the_group_follows_the_session_and_is_one_step_of_the_replay(session):
    requests = with_fan_out(session)
    assert [r.index for r in requests] == list(range(len(requests)))
    assert [len(step) for step in steps(requests)][-1] == len(requests) - len(session)
    assert with_fan_out(requests) == requests  # a session that has a group keeps it as it is


def test_a_session_without_that_subagent_gets_no_group(session):
    assert fan_out_group([r for r in session if r.lane != EXPLORE_LANE]) == []
