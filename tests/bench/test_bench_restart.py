"""Which requests the restart scenario replays before and after the restart."""

import pytest

from stable_prefix.bench.restart import scenario_requests
from stable_prefix.bench.workload.session import generate_session


@pytest.mark.parametrize("shape", ["2.1.332", "2.1.197"])
def test_the_resumed_conversation_starts_with_the_main_agents_next_turn(shape):
    requests = generate_session(0, 0.04, shape=shape)
    before, scenarios = scenario_requests(requests, before=8, after=4)
    assert len(before) >= 8 and {request.conversation for request in before} == {0}
    assert scenarios["resume"][0].lane == "main" and scenarios["resume"][0].conversation == 0
    # No fan-out group is cut in two by the restart.
    groups_before = {request.fan_out for request in before if request.fan_out}
    assert not any(request.fan_out in groups_before for request in scenarios["resume"])
    assert [request.conversation for request in scenarios["new_conversation"]] == [1] * 4
    assert scenarios["new_conversation"][0].lane == "main"
