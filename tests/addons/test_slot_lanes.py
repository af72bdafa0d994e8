"""Which llama.cpp slot each lane gets, and what is saved and restored first (addons/slot_lanes.py, no server)."""

import pytest

from stable_prefix.addons.slot_lanes import SlotLanes, SlotPlan, slot_file

MAIN, EXPLORE_A, EXPLORE_B, TITLE = "main", "sub:Explore@aaaa1111", "sub:Explore@bbbb2222", "side:title"


def run(slots: SlotLanes, lane: str) -> SlotPlan:
    """One request of `lane`, answered: its plan, the slot released."""
    plan = slots.plan(lane)
    assert plan is not None, f"{lane} would wait"
    if plan.save:
        slots.saved_to(*plan.save)
    if plan.head:
        slots.saved_to(plan.head[1], plan.head[2])
    slots.release(plan)
    return plan


def test_lanes_take_free_slots_first_the_highest_first_as_llama_server_does():
    slots = SlotLanes(2)
    assert [run(slots, MAIN).slot, run(slots, EXPLORE_A).slot] == [1, 0]


def test_a_lane_keeps_its_slot_and_moves_nothing_while_there_are_slots():
    slots = SlotLanes(2)
    first = run(slots, MAIN)
    run(slots, EXPLORE_A)
    again = run(slots, MAIN)
    assert again == SlotPlan(MAIN, first.slot)


def test_a_lane_seen_first_tries_its_file_from_an_earlier_run_whose_absence_is_a_cold_start():
    plan = SlotLanes(2).plan(MAIN)
    assert plan.restore == slot_file(MAIN) and plan.restore_may_be_missing


def test_a_title_takes_the_least_recently_used_lanes_slot_after_saving_that_lane():
    slots = SlotLanes(2)
    main_slot = run(slots, MAIN).slot
    run(slots, EXPLORE_A)
    title = run(slots, TITLE)
    assert title.slot == main_slot and title.save == (MAIN, slot_file(MAIN))


def test_the_main_lane_comes_back_from_its_file_into_the_slot_of_the_lane_used_least_recently():
    slots = SlotLanes(2)
    run(slots, MAIN)
    explore_slot = run(slots, EXPLORE_A).slot
    run(slots, TITLE)
    back = run(slots, MAIN)
    assert back.slot == explore_slot
    assert back.save == (EXPLORE_A, slot_file(EXPLORE_A)) and back.restore == slot_file(MAIN) and not back.restore_may_be_missing


def test_a_new_subagent_instance_starts_from_its_type_head_saved_from_a_peers_idle_slot():
    slots = SlotLanes(3)
    run(slots, MAIN)
    peer_slot = run(slots, EXPLORE_A).slot
    plan = run(slots, EXPLORE_B)
    assert plan.head == (peer_slot, EXPLORE_A, slot_file(EXPLORE_A)) and plan.restore == slot_file(EXPLORE_A)
    assert plan.slot not in (peer_slot, slots.slot_of(MAIN))


def test_a_new_subagent_instance_starts_from_its_peers_file_when_the_peer_holds_no_slot():
    slots = SlotLanes(1)
    run(slots, EXPLORE_A)
    run(slots, MAIN)  # EXPLORE_A saved
    plan = run(slots, EXPLORE_B)
    assert plan.head is None and plan.restore == slot_file(EXPLORE_A)


def test_a_busy_slot_is_never_planned_for_and_its_lane_waits_for_it():
    slots = SlotLanes(1)
    held = slots.plan(MAIN)
    assert slots.plan(MAIN) is None and slots.plan(TITLE) is None
    slots.release(held)
    assert slots.plan(TITLE) is not None


def test_a_peers_slot_saved_for_a_head_is_busy_until_the_plan_ends():
    slots = SlotLanes(2)
    run(slots, EXPLORE_A)
    plan = slots.plan(EXPLORE_B)
    assert plan.head is not None and slots.plan(EXPLORE_A) is None
    slots.release(plan)
    assert slots.plan(EXPLORE_A) is not None


def test_a_slot_whose_save_or_restore_failed_is_no_lanes_and_is_not_saved_as_one():
    slots = SlotLanes(1)
    plan = slots.plan(MAIN)
    slots.lost(plan.slot)
    slots.release(plan)
    assert slots.plan(TITLE).save is None


def test_slot_file_names_are_what_llama_server_accepts_and_differ_per_lane():
    names = {slot_file(lane) for lane in (MAIN, EXPLORE_A, EXPLORE_B, TITLE, "fork:main@ab/../x", "sub:Explore@aaaa1111 ")}
    assert len(names) == 6
    assert all(name.endswith(".bin") and all(c.isalnum() or c in "_.-" for c in name) and not name.startswith(".") for name in names)


def test_no_slots_is_an_error():
    with pytest.raises(ValueError):
        SlotLanes(0)


def test_without_files_lanes_are_pinned_and_nothing_is_saved_or_restored():
    slots = SlotLanes(2, files=False)
    plans = [run(slots, lane) for lane in (MAIN, EXPLORE_A, TITLE, MAIN, EXPLORE_B)]
    assert [plan.slot for plan in plans] == [1, 0, 1, 0, 1]
    assert all(plan.save is None and plan.head is None and plan.restore is None for plan in plans)


def test_a_new_instance_taking_its_peers_slot_keeps_the_head_there_and_saves_the_peer():
    slots = SlotLanes(1)
    run(slots, EXPLORE_A)
    plan = run(slots, EXPLORE_B)
    assert plan.save == (EXPLORE_A, slot_file(EXPLORE_A)) and plan.restore is None and plan.head is None
