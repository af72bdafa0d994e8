"""The benchmark's figures, on a hand-made trace whose answers are worked out by hand."""

import pytest

from stable_prefix.bench.metrics import (
    fan_out_wall_s,
    mark_cold_and_warm,
    median_confidence_interval,
    paired_difference_ms,
    paired_ttft_ratio,
    percentile,
    reuse_efficiency,
    summarize,
    warm_prefill_over_new_content,
    warm_ttft_growth_ms_per_1k_tokens,
)
from stable_prefix.bench.prefill_reference import prefill_seconds
from stable_prefix.bench.prompt_tokens import common_prefix_length, ideal_reusable_tokens


def row(lane, conversation, prompt, ideal, reused, ttft, total=None):
    return {
        "lane": lane,
        "conversation": conversation,
        "prompt_tokens": prompt,
        "ideal_reusable_tokens": ideal,
        "reused_tokens": reused,
        "ttft_s": ttft,
        "total_s": total if total is not None else ttft + 0.5,
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
        "requests": 2, "cold_ttft_median_s": 4.0, "warm_ttft_median_s": 1.0, "reuse_efficiency": pytest.approx(400 / 410),
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


def test_the_paired_ttft_ratio_compares_each_warm_request_with_itself_in_the_other_configuration(trace):
    for index, each in enumerate(trace):
        each["index"] = index
    other = [dict(each, ttft_s=each["ttft_s"] * 2) for each in trace]  # twice as slow on every request
    other[3]["ttft_s"] = trace[3]["ttft_s"]  # ... but one: the same
    comparison = paired_ttft_ratio(trace, other)
    assert comparison["all"]["requests"] == 3  # the warm ones
    assert comparison["all"]["median"] == 0.5
    assert comparison["lanes"]["main"] == {"requests": 2, "median": 0.5, "ci95": [0.5, 0.5], "within_noise": False}
    assert comparison["lanes"]["sub:explore"]["median"] == 1.0 and comparison["lanes"]["sub:explore"]["ci95"] is None
