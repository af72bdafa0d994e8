"""The benchmark's figures, on a hand-made trace whose answers are worked out by hand."""

import pytest

from stable_prefix.bench.measure.metrics import (
    decode_tokens_per_s,
    fan_out_wall_s,
    mark_cold_and_warm,
    median_confidence_interval,
    output_agreement,
    paired_difference_ms,
    paired_fan_out_ratio,
    paired_ratio,
    percentile,
    reuse_efficiency,
    session_wall_s,
    summarize,
    turn_at_length,
    warm_prefill_over_new_content,
    warm_ttft_growth_ms_per_1k_tokens,
)
from stable_prefix.bench.probes.prefill_reference import prefill_seconds
from stable_prefix.bench.workload.prompt_tokens import common_prefix_length, ideal_reusable_tokens


def row(lane, conversation, prompt, ideal, reused, ttft, total=None, output=11):
    return {
        "lane": lane,
        "conversation": conversation,
        "prompt_tokens": prompt,
        "ideal_reusable_tokens": ideal,
        "reused_tokens": reused,
        "ttft_s": ttft,
        "total_s": total if total is not None else ttft + 0.5,
        "output_tokens": output,
    }


@pytest.fixture
def trace():
    # main 1000 -> 1500 -> 2000 tokens, a subagent call in between, then a /clear.
    return mark_cold_and_warm([
        row("main", 0, 1000, 0, 0, 10.0),
        row("sub:explore", 0, 400, 10, 0, 4.0),
        row("main", 0, 1500, 1000, 1000, 2.0),
        row("sub:explore", 0, 600, 400, 400, 1.0),
        row("main", 0, 2000, 1500, 1400, 3.0),  # 100 tokens short of ideal
        row("main", 1, 1100, 600, 600, 6.0),
    ])


def test_first_request_of_each_lane_and_conversation_is_cold(trace):
    assert [r["warm"] for r in trace] == [False, False, True, True, True, False]


def test_reuse_efficiency_is_reused_over_ideal(trace):
    assert reuse_efficiency(trace) == pytest.approx((1000 + 400 + 1400 + 600) / (10 + 1000 + 400 + 1500 + 600))


def test_reuse_efficiency_skips_rows_without_reuse_figures(trace):
    trace[2]["reused_tokens"] = None
    assert reuse_efficiency(trace) == pytest.approx((400 + 1400 + 600) / (10 + 400 + 1500 + 600))


def test_warm_main_prefill_is_measured_against_what_no_cache_could_spare(trace):
    # 1,500 tokens, 1,000 reusable: 500 of 500 prefilled; 2,000 tokens, 1,500 reusable: 600 of 500.
    assert warm_prefill_over_new_content(trace) == {"median": pytest.approx(1.1), "max": pytest.approx(1.2)}
    trace[4]["reused_tokens"] = None  # unknown: left out, not counted as all prefilled
    assert warm_prefill_over_new_content(trace) == {"median": 1.0, "max": 1.0}
    assert summarize(trace)["warm_main_prefill_over_new_content"]["max"] == 1.0


def test_reuse_efficiency_is_none_when_nothing_could_be_reused():
    assert reuse_efficiency(mark_cold_and_warm([row("main", 0, 100, 0, 0, 1.0)])) is None


def test_summary_medians_cold_and_warm_per_lane(trace):
    summary = summarize(trace)
    assert summary["cold_ttft_median_s"] == 6.0  # 10, 4, 6
    assert summary["warm_ttft_median_s"] == 2.0  # 2, 1, 3
    assert summary["lanes"]["main"]["cold_ttft_median_s"] == 8.0  # 10, 6
    assert summary["lanes"]["main"]["warm_ttft_median_s"] == 2.5  # 2, 3
    assert summary["lanes"]["sub:explore"] == {
        "requests": 2, "cold_ttft_median_s": 4.0, "warm_ttft_median_s": 1.0, "cold_turn_median_s": 4.5, "warm_turn_median_s": 1.5,
        "output_tokens": 22, "decode_tokens_per_s": pytest.approx(20.0), "reuse_efficiency": pytest.approx(400 / 410),
    }
    assert summary["tokens_reused"] == 3400
    assert summary["tokens_prefilled"] == 6600 - 3400
    assert summary["prompt_tokens"] == 6600


def test_warm_ttft_growth_is_the_slope_over_prompt_length(trace):
    # warm main rows: (1.5K tokens, 2000 ms), (2.0K tokens, 3000 ms) -> 2000 ms per 1K tokens
    assert warm_ttft_growth_ms_per_1k_tokens(trace) == pytest.approx(2000.0)


def test_flat_warm_ttft_has_zero_growth():
    rows = mark_cold_and_warm([row("main", 0, n, 0, 0, 0.5) for n in (1000, 2000, 3000, 4000)])
    assert warm_ttft_growth_ms_per_1k_tokens(rows) == pytest.approx(0.0)


def test_warm_ttft_is_compared_with_a_cold_prefill_of_its_new_tokens(trace):
    trace[2]["cold_prefill_of_new_tokens_s"] = 1.0  # warm, TTFT 2.0 -> 2.0
    trace[4]["cold_prefill_of_new_tokens_s"] = 2.0  # warm, TTFT 3.0 -> 1.5
    trace[3]["cold_prefill_of_new_tokens_s"] = 4.0  # warm, TTFT 1.0 -> 0.25
    trace[0]["cold_prefill_of_new_tokens_s"] = 1.0  # cold: not counted
    summary = summarize(trace)
    assert summary["warm_ttft_over_cold_prefill_of_new_tokens_median"] == 1.5
    assert summary["warm_ttft_over_incontext_prefill_median"] is None  # not measured: not made up


def test_warm_ttft_is_compared_with_prefilling_its_new_tokens_on_top_of_its_reused_prefix(trace):
    trace[2]["incontext_prefill_s"] = 1.6  # warm, TTFT 2.0 -> 1.25
    trace[3]["incontext_prefill_s"] = 0.5  # warm, TTFT 1.0 -> 2.0
    trace[4]["incontext_prefill_s"] = None  # warm but not measured: left out
    trace[0]["incontext_prefill_s"] = 0.1  # cold: not counted
    summary = summarize(trace)
    assert summary["warm_ttft_over_incontext_prefill_median"] == pytest.approx(1.625)
    assert summary["warm_ttft_minus_incontext_prefill_median_s"] == pytest.approx(0.45)  # 0.4 and 0.5


def test_prefill_reference_interpolates_and_extends_the_last_slope():
    reference = [(1000, 2.0), (100, 0.2), (2000, 5.0)]
    assert prefill_seconds(reference, 550) == pytest.approx(1.1)
    assert prefill_seconds(reference, 3000) == pytest.approx(8.0)


def test_unknown_reuse_is_left_out_of_every_sum_and_counted(trace):
    trace[4]["reused_tokens"] = None  # main, 2,000 tokens, ideal 1,500
    summary = summarize(trace)
    assert summary["reuse_unknown_requests"] == 1
    assert summary["reuse_unknown_prompt_tokens"] == 2000
    assert summary["tokens_reused"] == 3400 - 1400
    assert summary["tokens_prefilled"] == (6600 - 2000) - (3400 - 1400)
    assert summary["ideal_reusable_tokens"] == (10 + 1000 + 400 + 1500 + 600) - 1500
    assert summary["prompt_tokens"] == 6600  # what was sent, known or not


def test_a_run_whose_reuse_is_all_unknown_has_unknown_totals(trace):
    for each in trace:
        each["reused_tokens"] = None
    summary = summarize(trace)
    assert summary["tokens_prefilled"] is None and summary["tokens_reused"] is None and summary["reuse_efficiency"] is None


def test_ttfts_that_fell_back_to_the_total_time_are_counted(trace):
    trace[2]["ttft_is_total"] = True
    assert summarize(trace)["ttft_fell_back_to_total"] == 1


def fan_out_rows():
    # Three instances sent at 0.0 s, their second turns after each first one ended.
    return [
        dict(row("sub:explore", 0, 700, 400, 400, 9.0, total=1.0), fan_out="g", started_s=0.0),
        dict(row("sub:explore", 0, 700, 400, 400, 9.0, total=2.0), fan_out="g", started_s=0.0),
        dict(row("sub:explore", 0, 700, 400, 400, 9.0, total=3.0), fan_out="g", started_s=0.0),
        dict(row("sub:explore", 0, 900, 700, 700, 9.0, total=1.5), fan_out="g", started_s=1.0),
        dict(row("sub:explore", 0, 900, 700, 700, 9.0, total=0.5), fan_out="g", started_s=3.2),
    ]


def test_fan_out_wall_time_runs_from_the_first_request_sent_to_the_last_answer_ended():
    assert fan_out_wall_s(fan_out_rows()) == {"g": pytest.approx(3.7)}


def test_fan_out_requests_count_in_tokens_but_not_in_ttft_medians(trace):
    summary = summarize(mark_cold_and_warm(trace + fan_out_rows()))
    assert summary["warm_ttft_median_s"] == 2.0  # as without the group, whose TTFTs are 9 s
    assert summary["lanes"]["sub:explore"]["warm_ttft_median_s"] == 1.0
    assert summary["tokens_reused"] == 3400 + 3 * 400 + 2 * 700
    assert summary["fan_out_requests"] == 5
    assert summary["fan_out_wall_s"] == pytest.approx(3.7)


def test_the_session_wall_time_counts_a_fan_out_group_and_a_title_beside_its_turn_once():
    main = dict(row("main", 0, 900, 0, 0, 0.5, total=2.0), index=0, started_s=0.0)
    title = dict(row("title", 0, 100, 0, 0, 0.2, total=1.0), index=1, beside=0, started_s=0.1)
    later = dict(row("main", 0, 950, 900, 900, 0.1, total=1.5), index=2, started_s=2.5)
    group = [dict(r, index=3 + n) for n, r in enumerate(fan_out_rows())]
    assert session_wall_s([main, title, later, *group]) == pytest.approx(2.0 + 1.5 + 3.7)
    assert session_wall_s([main, dict(later, total_s=None)]) is None  # unknown, never short


def test_fan_out_groups_pair_round_by_round_and_say_where_the_output_differed():
    def rounds(walls, output=11):
        return [dict(row("sub:explore", 0, 700, 0, 0, 0.1, total=wall, output=output), fan_out=f"r{n}", started_s=10.0 * n) for n, wall in enumerate(walls)]
    pairs = paired_fan_out_ratio(rounds([1.0, 2.0, 3.0]), rounds([2.0, 2.5, 4.0]))
    assert pairs["groups"] == 3 and pairs["median"] == pytest.approx(0.75) and pairs["equal_output"] == 3
    assert paired_fan_out_ratio(rounds([1.0]), rounds([2.0], output=12))["equal_output"] == 0


def test_paired_difference_pairs_each_measured_request_with_its_baseline():
    overhead = paired_difference_ms([0.010, 0.010, 0.020, 0.010], [0.011, 0.012, 0.021, 0.015])
    assert overhead["p50"] == pytest.approx(1.5)  # added: 1, 2, 1, 5 ms
    assert overhead["p95"] == pytest.approx(4.55)
    assert overhead["samples"] == 4


def test_paired_difference_refuses_unpaired_timings():
    with pytest.raises(ValueError, match="3 baseline vs 2 measured"):
        paired_difference_ms([1, 2, 3], [1, 2])


def test_a_difference_whose_interval_includes_zero_is_within_noise():
    baseline = [0.010] * 40
    noisy = [0.010 + d / 1000 for d in (-2, 1, -1, 2, 0) * 8]  # +-2 ms around zero
    shifted = [0.015 + d / 1000 for d in (-2, 1, -1, 2, 0) * 8]  # 5 ms, same spread
    assert paired_difference_ms(baseline, noisy)["within_noise"] is True
    assert paired_difference_ms(baseline, shifted)["within_noise"] is False
    low, high = paired_difference_ms(baseline, shifted)["p50_ci95"]
    assert low <= 5.0 <= high


def test_the_median_interval_is_reproducible_and_needs_two_values():
    values = [1.0, 4.0, 2.0, 8.0, 5.0, 7.0]
    assert median_confidence_interval(values) == median_confidence_interval(values)
    assert median_confidence_interval([3.0]) is None


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert percentile([1, 2], 0.95) == pytest.approx(1.95)
    assert percentile([], 0.5) is None


def test_common_prefix_length_of_token_lists():
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([5], [6]) == 0
    assert common_prefix_length([], [1]) == 0


def test_ideal_reuse_takes_the_best_earlier_prompt_of_any_lane():
    main_1 = [1, 2, 3, 4, 5]
    sub_1 = [1, 9, 9, 9]
    main_2 = [1, 2, 3, 4, 5, 6, 7]  # extends main_1
    sub_2 = [1, 9, 9, 9, 8]  # extends sub_1, not the latest prompt
    clear = [1, 2, 3, 7, 7]  # a new conversation shares the start of main's system prompt
    assert ideal_reusable_tokens([main_1, sub_1, main_2, sub_2, clear]) == [0, 1, 5, 4, 3]


def test_ideal_reuse_leaves_the_last_token_of_a_repeated_prompt_to_compute():
    assert ideal_reusable_tokens([[1, 2, 3], [1, 2, 3]]) == [0, 2]


def indexed(rows):
    for index, each in enumerate(rows):
        each["index"] = index
    return rows


def test_the_paired_ttft_ratio_compares_each_warm_request_with_itself_in_the_other_configuration(trace):
    indexed(trace)
    other = [dict(each, ttft_s=each["ttft_s"] * 2) for each in trace]  # twice as slow on every request
    other[3]["ttft_s"] = trace[3]["ttft_s"]  # ... but one: the same
    comparison = paired_ratio(trace, other)
    assert comparison["all"]["requests"] == 3  # the warm ones
    assert comparison["all"]["median"] == 0.5
    assert comparison["lanes"]["main"] == {"requests": 2, "median": 0.5, "ci95": [0.5, 0.5], "within_noise": False, "rescaled": 0}
    assert comparison["lanes"]["sub:explore"]["median"] == 1.0 and comparison["lanes"]["sub:explore"]["ci95"] is None


def test_the_turn_time_is_until_the_reply_ends_and_decoding_is_the_time_after_the_first_token(trace):
    summary = summarize(trace)
    assert summary["warm_turn_median_s"] == 2.5  # 2.5, 1.5, 3.5
    assert summary["cold_turn_median_s"] == 6.5  # 10.5, 4.5, 6.5
    assert summary["output_tokens"] == 66
    assert summary["decode_tokens_per_s"] == pytest.approx(20.0)  # 10 tokens after the first in 0.5 s, every request


def test_decode_rate_sums_tokens_and_seconds_and_skips_replies_of_one_token():
    rows = [row("main", 0, 10, 0, 0, 1.0, total=2.0, output=11), row("main", 0, 10, 0, 0, 1.0, total=5.0, output=41), row("main", 0, 10, 0, 0, 1.0, output=1)]
    assert decode_tokens_per_s(rows) == pytest.approx((10 + 40) / (1.0 + 4.0))
    assert decode_tokens_per_s(rows[2:]) is None


def test_an_unknown_output_count_makes_the_total_unknown_not_smaller(trace):
    trace[1]["output_tokens"] = None
    assert summarize(trace)["output_tokens"] is None


def test_a_turn_time_is_rescaled_to_another_length_by_its_own_time_per_decoded_token():
    reply = row("main", 0, 10, 0, 0, 1.0, total=3.0, output=21)  # 20 tokens after the first in 2 s
    assert turn_at_length(reply, 21) == 3.0
    assert turn_at_length(reply, 11) == pytest.approx(2.0)
    assert turn_at_length(reply, 41) == pytest.approx(5.0)
    assert turn_at_length(row("main", 0, 10, 0, 0, 1.0, output=1), 5) is None  # no decode rate to rescale by


def test_turn_times_pair_at_equal_output_length_and_say_how_many_were_rescaled(trace):
    indexed(trace)
    other = [dict(each, total_s=each["total_s"] * 2) for each in trace]
    other[2]["output_tokens"] = 21  # the anchor decoded twice as many tokens for #2: 4.0 s, against 2.0 + 20 * 0.05 = 3.0 s
    comparison = paired_ratio(trace, other, "total_s")
    assert comparison["lanes"]["main"]["rescaled"] == 1 and comparison["all"]["rescaled"] == 1
    ratios = sorted([3.0 / 5.0, 3.5 / 7.0])  # #2 rescaled to 21 tokens: 3.0 s against 5.0 s; #4 as measured
    assert comparison["lanes"]["main"]["median"] == pytest.approx(sum(ratios) / 2)
    assert comparison["lanes"]["sub:explore"] == {"requests": 1, "median": 0.5, "ci95": None, "within_noise": None, "rescaled": 0}


def test_a_paired_ratio_of_an_unknown_figure_is_refused(trace):
    with pytest.raises(ValueError, match="'output_tokens'"):
        paired_ratio(trace, trace, "output_tokens")


def test_output_agreement_lists_the_requests_that_decoded_different_lengths(trace):
    indexed(trace)
    other = [dict(each) for each in trace]
    other[2]["output_tokens"], other[5]["output_tokens"] = 30, None
    assert output_agreement(trace, other) == {"requests": 5, "equal": 4, "differing": [2], "unknown": 1}


def test_requests_sent_beside_another_are_summarized_as_such(trace):
    trace[1]["beside"] = 0  # the subagent's first request, as if sent beside the first main turn
    assert summarize(trace)["beside"] == {"requests": 1, "ttft_median_s": 4.0, "turn_median_s": 4.5, "output_tokens": 11}
    assert summarize(trace[2:])["beside"] is None
