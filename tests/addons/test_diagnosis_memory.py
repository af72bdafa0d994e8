"""What the proxy keeps per lane is bounded: every Claude Code subagent instance is a lane of its own,
and a day of them must not grow the proxy (issue #36, item 4)."""

import copy
import gc
import tracemalloc

from stable_prefix.addons import diagnosis as diagnosis_module
from stable_prefix.addons import normalize
from stable_prefix.addons.diagnosis import MAX_LANE_PROMPT_BYTES, MAX_LANES, PREFERRED_MAIN_LANES, PrefixDiagnosis, PromptSnapshot
from stable_prefix.addons.lanes import LaneNames, lane_signature
from stable_prefix.addons.normalize import Rules
from tests.fixtures import claude_code

# A subagent's task of ~60 KB: the size of a real Claude Code subagent's prompt.
TASK_PADDING = "Read the module and report what each function does. " * 1150


def instance_id(number: int) -> str:
    """A distinct agent id per instance (lanes are named by its first 8 characters)."""
    return f"{number * 2654435761 % 16**8:08x}{number:08x}"


def send(diagnosis: PrefixDiagnosis, body: dict, headers: dict, lane: str | None = None):
    body = copy.deepcopy(body)
    snapshot = PromptSnapshot.of(body, "anthropic", headers)
    normalize.normalize(body, "anthropic", Rules())
    return diagnosis.observe(snapshot, body, lane)


def send_subagent(diagnosis: PrefixDiagnosis, number: int, turns: int = 1):
    body = claude_code.modern_subagent_request("explore", turns, task=f"Task {number}. {TASK_PADDING}")
    return send(diagnosis, body, claude_code.agent_headers(instance_id(number)))


def test_a_day_of_new_subagent_lanes_does_not_grow_what_the_diagnosis_holds():
    diagnosis = PrefixDiagnosis(Rules())
    tracemalloc.start()  # from the first lane: what goes must have been traced coming in
    try:
        for number in range(300):
            send_subagent(diagnosis, number)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for number in range(300, 500):
            send_subagent(diagnosis, number)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Unbounded, these 200 lanes held ~39 MB (~200 KB each: the prompt as sent and as forwarded).
    assert grown < 2_000_000, f"200 more subagent lanes grew the diagnosis by {grown:,} B"
    assert len(diagnosis.lanes) <= MAX_LANES and diagnosis.held_prompt_bytes <= MAX_LANE_PROMPT_BYTES


def test_the_main_lane_outlives_a_day_of_subagents():
    diagnosis = PrefixDiagnosis(Rules(), max_lanes=8)
    send(diagnosis, claude_code.modern_request(3), claude_code.agent_headers())
    for number in range(40):
        send_subagent(diagnosis, number)
    result = send(diagnosis, claude_code.modern_request(4), claude_code.agent_headers())
    assert result.lane == "main" and result.request_in_lane == 2 and result.comparison.prefix_kept


def test_the_least_recently_used_subagent_lane_goes_first():
    diagnosis = PrefixDiagnosis(Rules(), max_lanes=3)
    first, second, third = (send_subagent(diagnosis, number).lane for number in range(3))
    send_subagent(diagnosis, 0, turns=2)  # the first instance goes on: now the second is the least recently used
    fourth = send_subagent(diagnosis, 3).lane
    assert list(diagnosis.lanes) == [third, first, fourth] and second not in diagnosis.lanes


def test_the_byte_bound_lets_lanes_go_before_the_count_bound():
    one_lane = send_subagent(PrefixDiagnosis(Rules()), 0)
    diagnosis = PrefixDiagnosis(Rules(), max_lane_prompt_bytes=5 * 2 * one_lane.total_bytes)  # both forms of five prompts
    for number in range(12):
        send_subagent(diagnosis, number)
    assert len(diagnosis.lanes) <= 5 and diagnosis.held_prompt_bytes <= diagnosis.max_lane_prompt_bytes


def test_a_lane_bigger_than_the_byte_bound_is_still_compared_with_its_last_request():
    diagnosis = PrefixDiagnosis(Rules(), max_lane_prompt_bytes=1000)
    send_subagent(diagnosis, 0)
    result = send_subagent(diagnosis, 0, turns=2)
    assert result.request_in_lane == 2 and result.comparison.prefix_kept


def test_lanes_let_go_still_count_in_their_groups_totals():
    diagnosis = PrefixDiagnosis(Rules(), max_lanes=4)
    for number in range(10):
        send_subagent(diagnosis, number)
        send_subagent(diagnosis, number, turns=2)
    [(group, total)] = diagnosis.group_totals().items()
    assert total["instances"] == 10 and total["requests"] == 20 and total["prefix_kept"] == 10
    assert any(line.startswith(f"lanes {group}@* · 10 instances · 20 requests") for line in diagnosis.summary_lines())


def test_lane_names_remember_a_bounded_number_of_instances():
    names = LaneNames(max_instances=16)
    body = claude_code.modern_subagent_request("explore")
    lanes = [names.name_for(lane_signature(body, "anthropic", claude_code.agent_headers(instance_id(number)))) for number in range(100)]
    assert len(set(lanes)) == 100 and len(names._instances) == 16


def test_an_instance_named_again_keeps_its_name():
    names = LaneNames(max_instances=2)
    body = claude_code.modern_subagent_request("explore")
    name = names.name_for(lane_signature(body, "anthropic", claude_code.agent_headers(instance_id(0))))
    for number in range(1, 5):
        names.name_for(lane_signature(body, "anthropic", claude_code.agent_headers(instance_id(number))))
    assert names.name_for(lane_signature(body, "anthropic", claude_code.agent_headers(instance_id(0)))) == name


def test_main_lanes_beyond_the_most_recently_used_go_as_any_other_lane():
    diagnosis = PrefixDiagnosis(Rules(), max_lanes=PREFERRED_MAIN_LANES + 2)
    mains = [send(diagnosis, claude_code.modern_request(3), claude_code.agent_headers(), lane=f"main-{number}").lane
             for number in range(PREFERRED_MAIN_LANES + 2)]  # e.g. two MCP servers' tool sets: `main-<hash>` lanes
    for number in range(5):
        send_subagent(diagnosis, number)
    assert [lane for lane in diagnosis.lanes if lane in mains] == mains[2:]


def test_a_side_lane_let_go_keeps_its_counts_under_its_name():
    diagnosis = PrefixDiagnosis(Rules(), max_lanes=1)
    title = send(diagnosis, claude_code.title_request("prompt 1"), claude_code.agent_headers()).lane
    send_subagent(diagnosis, 0)  # the one slot goes to it: the title lane is let go
    assert title not in diagnosis.lanes and diagnosis.totals()[title]["requests"] == 1
    send(diagnosis, claude_code.title_request("prompt 2"), claude_code.agent_headers())
    assert diagnosis.totals()[title]["requests"] == 2


def test_the_counts_of_lanes_let_go_are_bounded_and_still_add_up(monkeypatch):
    monkeypatch.setattr(diagnosis_module, "MAX_RETIRED", 4)
    diagnosis = PrefixDiagnosis(Rules(), max_lanes=1)
    for number in range(10):
        send(diagnosis, claude_code.title_request(f"prompt {number}"), claude_code.agent_headers(), lane=f"side:{number}")
        send(diagnosis, claude_code.title_request(f"prompt {number}"), claude_code.agent_headers(), lane=f"sub:{number}@{instance_id(number)}")
    assert len(diagnosis.retired_lanes) <= 4 and len(diagnosis.retired) <= 5
    lanes = sum(total["requests"] for lane, total in diagnosis.totals().items() if total["group"] == lane)
    groups = sum(total["requests"] for total in diagnosis.group_totals().values())
    assert lanes + groups == 20 and diagnosis_module.OLDER_LANES in diagnosis.group_totals()


def side_request(number: int) -> dict:
    """A side request of a type of its own (no tools, a system prompt of its own)."""
    return {"model": "claude-haiku-4-5", "max_tokens": 64, "system": f"You summarise file number {number} in one line.",
            "messages": [{"role": "user", "content": "Go."}]}


def test_lane_names_remember_a_bounded_number_of_lane_types_the_main_one_last():
    names = LaneNames(max_types=4)
    main = names.name_for(lane_signature(claude_code.modern_request(1), "anthropic", claude_code.agent_headers()))
    sides = [names.name_for(lane_signature(side_request(number), "anthropic", claude_code.agent_headers())) for number in range(10)]
    assert len(names._names) == 4 and len(set(sides)) == 10
    assert names.name_for(lane_signature(claude_code.modern_request(2), "anthropic", claude_code.agent_headers())) == main == "main"
    assert names.name_for(lane_signature(side_request(0), "anthropic", claude_code.agent_headers())) == sides[0]  # named again alike
