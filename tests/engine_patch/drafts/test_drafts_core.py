"""The engine-agnostic parts of drafting: where drafts come from, how they are judged, how a request's
acceptance is learnt, and when the verify-cost curve lets a draft pay (no model, no engine)."""

from __future__ import annotations

import numpy as np

from stable_prefix.engine_patch.drafts.acceptance import AcceptanceTracker
from stable_prefix.engine_patch.drafts.cost_gate import (
    MAX_DRAFT,
    RowOutlook,
    VerifyCostCurve,
    break_even_acceptance,
    expected_tokens,
    nominal_curve,
    plan_step,
)
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.drafts.suffix_proposer import FrozenTokens, JoinedLanes, SuffixProposer
from stable_prefix.engine_patch.drafts.verification import accepted_length, emitted

# This CPU as measured for SmolLM2-135M: a forward of k tokens costs about k steps.
COMPUTE_BOUND = VerifyCostCurve({1: 1.0, 2: 1.98, 3: 2.9, 4: 3.8}, "compute-bound")


def lanes(*token_lists) -> JoinedLanes:
    return JoinedLanes([FrozenTokens(tokens) for tokens in token_lists])


# --- the proposer ---------------------------------------------------------------


def test_the_continuation_of_the_longest_earlier_match_in_the_prompt_is_proposed():
    read = [10, 11, 12, 13, 14, 15, 16]
    proposer = SuffixProposer([1, 2, *read, 3, 4])
    proposer.extend([11, 12, 13])  # the reply starts quoting what was read
    assert proposer.propose(3) == [14, 15, 16]


def test_a_longer_agreement_wins_over_a_more_recent_shorter_one():
    proposer = SuffixProposer([7, 8, 9, 50, 51, 0, 9, 60, 61, 0])
    proposer.extend([7, 8, 9])
    assert proposer.propose(2) == [50, 51]


def test_the_reply_s_own_earlier_tokens_are_a_source_too():
    proposer = SuffixProposer([1, 2, 3])
    proposer.extend([40, 41, 42, 43, 5, 40, 41])
    assert proposer.propose(2) == [42, 43]


def test_another_lane_s_tokens_are_proposed_when_the_request_itself_has_no_match():
    proposer = SuffixProposer([1, 2, 3, 20, 21], lanes([9, 20, 21, 22, 23, 24], [5, 6]))
    assert proposer.propose(3) == [22, 23, 24]


def test_the_request_s_own_match_wins_over_a_longer_one_in_another_lane():
    # The other lane shares more of the scaffolding (5, 8) before the copied token: the request's own file comes first.
    proposer = SuffixProposer([8, 30, 31, 32, 5, 8, 30], lanes([5, 8, 30, 40, 41]))
    assert proposer.propose(2) == [31, 32]


def test_a_proposal_from_another_lane_stops_where_that_lane_ends():
    proposer = SuffixProposer([1, 20, 21], lanes([9, 20, 21, 22], [23, 24]))
    assert proposer.propose(4) == [22]


def test_a_single_token_of_agreement_proposes_nothing():
    proposer = SuffixProposer([5, 6, 7, 1, 6])
    assert proposer.propose(4) == []


def test_lookups_cost_the_same_whatever_the_lane_s_length():
    rng = np.random.default_rng(0)
    long_lanes = lanes(*(rng.integers(0, 50_000, 30_000) for _ in range(8)))
    proposer = SuffixProposer(rng.integers(0, 50_000, 20_000).tolist(), long_lanes)
    proposer.extend([1, 2, 3])
    assert isinstance(proposer.propose(MAX_DRAFT), list)


# --- the rule ----------------------------------------------------------------------


def test_a_draft_is_kept_up_to_its_first_disagreement_with_the_target_s_draws():
    assert accepted_length([5, 6, 7], [5, 6, 9, 1]) == 2
    assert emitted([5, 6, 7], [5, 6, 9, 1]) == [5, 6, 9]
    assert emitted([5, 6, 7], [5, 6, 7, 1]) == [5, 6, 7, 1]
    assert emitted([], [4]) == [4]


# --- acceptance ------------------------------------------------------------------


def test_acceptance_rises_with_confirmed_drafts_and_falls_with_cut_ones():
    tracker = AcceptanceTracker()
    start = tracker.rate
    for _ in range(5):
        tracker.judged(8, 8)
    high = tracker.rate
    for _ in range(10):
        tracker.judged(8, 0)
    assert start < high and tracker.rate < start


def test_a_shadow_draft_is_judged_with_the_tokens_produced_without_it():
    tracker = AcceptanceTracker()
    tracker.shadow([1, 2, 3])
    tracker.produced([1, 2])
    assert tracker.shadowing and tracker.drafts_judged == 0
    tracker.produced([9])
    assert not tracker.shadowing and tracker.drafts_judged == 1


# --- the gate ----------------------------------------------------------------------


def test_where_k_tokens_cost_k_steps_no_acceptance_pays_at_short_drafts():
    assert break_even_acceptance(COMPUTE_BOUND)[1] is None
    assert plan_step([RowOutlook(0.8, MAX_DRAFT)], COMPUTE_BOUND).width == 1


def test_where_verifying_is_nearly_free_a_good_request_drafts_long_and_a_poor_one_short_or_not_at_all():
    curve = nominal_curve()
    assert plan_step([RowOutlook(0.9, MAX_DRAFT)], curve).drafts == [MAX_DRAFT]
    assert 0 < plan_step([RowOutlook(0.4, MAX_DRAFT)], curve).drafts[0] < MAX_DRAFT
    assert plan_step([RowOutlook(0.05, MAX_DRAFT)], curve, min_gain=0.05).width == 1


def test_rows_without_drafts_ride_along_in_a_batch_step_whose_width_the_drafting_rows_pay_for():
    plan = plan_step([RowOutlook(0.9, 6), RowOutlook(0.5, 0), RowOutlook(0.9, 2)], nominal_curve())
    assert plan.width > 1 and plan.drafts[1] == 0 and plan.drafts[0] == plan.width - 1 and plan.gain > 1
    # One row alone with the same draft may go wider: the width costs less when fewer rows pay for it.
    assert plan_step([RowOutlook(0.9, 6)], nominal_curve()).width >= plan.width


def test_tokens_left_unfed_by_a_rollback_are_fed_even_when_no_draft_pays():
    plan = plan_step([RowOutlook(0.1, 0, head=3), RowOutlook(0.1, 4)], COMPUTE_BOUND)
    assert plan.width >= 3


def test_expected_tokens_is_a_geometric_run():
    assert expected_tokens(0.5, 2) == 1.75 and expected_tokens(1.0, 4) == 5


def test_auto_without_a_curve_drafts_nothing_and_says_why():
    drafting = Drafting("auto")
    assert drafting.session([1, 2, 3]) is None
    assert drafting.decision()["drafting"] == "off" and "not yet" in drafting.decision()["reason"]


def test_off_never_opens_a_session_and_on_reports_its_nominal_curve():
    assert Drafting("off").session([1, 2]) is None
    decision = Drafting("on").decision()
    assert decision["drafting"] == "on" and decision["verify_cost"]["source"].startswith("nominal")


# --- code quoted in a tool call's JSON -------------------------------------------------


def forwards_to_write(proposer: SuffixProposer, reply: list[int], draft: int = MAX_DRAFT) -> int:
    """Forward passes a greedy decode of `reply` takes when every step drafts the proposer's next `draft` tokens."""
    done, forwards = 1, 0
    proposer.extend(reply[:1])
    while done < len(reply):
        proposed = proposer.propose(draft)
        emitted_now = emitted(proposed, reply[done:] + [-1])[: len(reply) - done]
        proposer.extend(emitted_now)
        done += len(emitted_now)
        forwards += 1
    return forwards


def test_an_edit_s_json_escaped_old_string_is_drafted_from_the_prompt_s_code():
    from transformers import AutoTokenizer

    from stable_prefix.engine_patch.drafts.json_string_view import json_string_view
    from tests.support.models import require_model

    tokenizer = AutoTokenizer.from_pretrained(str(require_model()))
    import inspect
    import shlex

    code = inspect.getsource(shlex.quote)
    prompt = tokenizer.encode(f"Read shlex.py:\n{code}\nReplace its docstring.")
    import json

    reply = tokenizer.encode('{"name": "Edit", "arguments": {"old_string": ' + json.dumps(code) + "}}")
    plain = forwards_to_write(SuffixProposer(prompt), reply)
    quoted = forwards_to_write(SuffixProposer(prompt, quoted=FrozenTokens(json_string_view(tokenizer, prompt))), reply)
    assert quoted < 0.5 * plain, (quoted, plain, len(reply))


def test_a_failing_proposer_stops_drafting_for_its_request_and_is_counted(caplog):
    class Broken:
        def extend(self, tokens):
            pass

        def propose(self, count):
            raise IndexError("injected proposer fault")

    drafting = Drafting("on", proposer=lambda prompt, lanes=None, quoted=None: Broken())
    session = drafting.session([1, 2, 3])
    assert session.outlook(remaining=10).available == 0
    assert not session.may_draft and drafting.stats.figures()["draft_bypassed"] == {"proposer fault": 1}
    assert "injected proposer fault" in caplog.text
