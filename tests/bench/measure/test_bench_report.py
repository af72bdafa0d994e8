"""The report's verdicts and issue 16's targets, on a hand-made result whose answers are worked out by hand."""

import pytest

from stable_prefix.bench.measure.report import markdown, notable_table, targets_table, verdict


def paired(median, low=None, high=None, requests=5, rescaled=0):
    return {"requests": requests, "median": median, "ci95": None if low is None else [low, high], "within_noise": None, "rescaled": rescaled}


def summary(prefilled, fan_out_wall, fan_out_output=300, warm=1.0, cold=2.0):
    lane = {"requests": 4, "cold_ttft_median_s": cold, "warm_ttft_median_s": warm, "cold_turn_median_s": cold + 1, "warm_turn_median_s": warm + 1,
            "output_tokens": 400, "decode_tokens_per_s": 30.0, "reuse_efficiency": 1.0}
    title = dict(lane, warm_ttft_median_s=None, warm_turn_median_s=None)
    return {
        "requests": 8, "cold_ttft_median_s": cold, "warm_ttft_median_s": warm, "cold_turn_median_s": cold + 1, "warm_turn_median_s": warm + 1,
        "output_tokens": 800, "decode_tokens_per_s": 30.0, "ttft_fell_back_to_total": 0, "reuse_efficiency": 1.0, "prompt_tokens": 50_000,
        "ideal_reusable_tokens": 30_000, "tokens_reused": 50_000 - prefilled if prefilled is not None else None, "tokens_prefilled": prefilled,
        "reuse_unknown_requests": 0, "reuse_unknown_prompt_tokens": 0, "fan_out_requests": 9, "fan_out_wall_s": fan_out_wall,
        "fan_out_output_tokens": fan_out_output, "beside": {"requests": 1, "ttft_median_s": 3.0, "turn_median_s": 5.0, "output_tokens": 20},
        "warm_ttft_growth_ms_per_1k_tokens": 100.0, "warm_main_prefill_over_new_content": {"median": 1.0, "max": 1.0},
        "warm_ttft_over_incontext_prefill_median": 1.2, "warm_ttft_minus_incontext_prefill_median_s": 0.1,
        "warm_ttft_over_cold_prefill_of_new_tokens_median": 2.0, "lanes": {"main": lane, "title": title},
    }


def comparison(main_ttft, title_ttft, main_turn=None, title_turn=None):
    level = paired(1.0, 0.9, 1.1)
    return {
        "paired_ttft_ratio": {"all": main_ttft, "lanes": {"main": main_ttft}},
        "paired_cold_ttft_ratio": {"all": level, "lanes": {"title": title_ttft}},
        "paired_turn_ratio": {"all": main_turn or level, "lanes": {"main": main_turn or level}},
        "paired_cold_turn_ratio": {"all": level, "lanes": {"title": title_turn or level}},
        "output_agreement": {"requests": 8, "equal": 8, "differing": [], "unknown": 0},
    }


@pytest.fixture
def result():
    configs = [
        ("4-patched+addon", True, summary(10_000, 9.0)),
        ("7-batched+addon", False, summary(12_000, 12.0)),
        ("9-rapid-mlx+addon", False, summary(11_000, 10.0)),
    ]
    return {
        "session": {"requests": 8, "seed": 0, "scale": 0.2, "main_prefix_tokens": 5000, "largest_prompt_tokens": 9000, "notable_requests": []},
        "model": {"description": "random-weight qwen2", "attention": "plain", "cache_kinds": ["KVCache"]},
        "machine": "2 CPU cores", "command": "python -m stable_prefix.bench.run", "replay": {"max_tokens": "proxy", "temperature": 0},
        "configurations": [{"key": key, "title": key, "ours": ours, "addon": True, "summary": s} for key, ours, s in configs],
        "comparison": {"product": "4-patched+addon", "anchors": {
            "7-batched+addon": comparison(paired(0.9, 0.85, 0.95), paired(1.3, 1.1, 1.5)),
            "9-rapid-mlx+addon": comparison(paired(1.02, 0.97, 1.08), paired(0.8, 0.7, 0.9), main_turn=paired(1.2, 1.1, 1.3, rescaled=3)),
        }},
        "rows": [],
    }


def target(lines, starts):
    return next(line for line in lines if line.startswith(f"| {starts}"))


def test_a_paired_ratio_is_ahead_level_or_behind_by_its_interval():
    assert verdict(paired(0.9, 0.85, 0.95)) == "ahead"
    assert verdict(paired(1.02, 0.97, 1.08)) == "level"
    assert verdict(paired(1.3, 1.1, 1.5)) == "behind"
    # One pair: no interval; within this machine's spread of paired ratios (+-10%) it is level.
    assert verdict(paired(0.85)) == "ahead" and verdict(paired(1.15)) == "behind"
    assert verdict(paired(0.95)) == verdict(paired(1.0)) == verdict(paired(1.05)) == "level"
    assert verdict(paired(None)) == verdict(None) == "unknown"


def test_every_lane_behind_an_anchor_is_named_and_the_target_not_met(result):
    lines = targets_table(result)
    ttft = target(lines, "TTFT on every lane")
    assert "title against 7-batched+addon (1.30x [1.10, 1.50])" in ttft and ttft.endswith("| not met |")
    assert "main" not in ttft.split("behind:")[1]  # ahead of 7, level with 9
    turn = target(lines, "turn time on every lane")
    assert "main against 9-rapid-mlx+addon (1.20x [1.10, 1.30])" in turn and turn.endswith("| not met |")


def test_level_within_noise_on_every_lane_meets_the_target(result):
    anchor = result["comparison"]["anchors"]["7-batched+addon"]
    anchor["paired_cold_ttft_ratio"]["lanes"]["title"] = paired(1.05, 0.95, 1.15)
    result["comparison"]["anchors"]["9-rapid-mlx+addon"]["paired_turn_ratio"]["lanes"]["main"] = paired(0.8, 0.7, 0.9)
    lines = targets_table(result)
    assert target(lines, "TTFT on every lane").endswith("| ahead or level everywhere | met |")
    assert target(lines, "turn time on every lane").endswith("| met |")


def test_tokens_prefilled_are_held_against_the_anchor_that_prefilled_fewest(result):
    assert target(targets_table(result), "tokens prefilled").endswith("9-rapid-mlx+addon 11,000 (0.91x) | met |")
    result["configurations"][2]["summary"]["tokens_prefilled"] = None
    assert target(targets_table(result), "tokens prefilled").endswith("unknown for 9-rapid-mlx+addon | unknown |")  # not taken as zero


def test_the_fan_out_target_is_the_best_anchor_on_plain_attention_and_the_batched_one_on_a_hybrid(result):
    plain = target(targets_table(result), "fan-out wall time")
    assert "<= 0.95x the best anchor's" in plain and "9-rapid-mlx+addon: 10.00 s (0.90x)" in plain and plain.endswith("| met |")
    result["model"] |= {"attention": "hybrid", "cache_kinds": ["ArraysCache", "KVCache"]}
    result["configurations"][0]["summary"]["fan_out_wall_s"] = 8.0
    hybrid = target(targets_table(result), "fan-out wall time")
    assert "<= 0.6x the batched anchor's (7" in hybrid and "7-batched+addon: 12.00 s (0.67x)" in hybrid and hybrid.endswith("| not met |")


def test_issue_23s_session_targets_hold_the_whole_session_against_rapid_mlx_and_the_batched_anchor(result):
    for key, wall in zip(("4-patched+addon", "7-batched+addon", "9-rapid-mlx+addon"), (20.0, 25.0, 21.0)):
        next(c for c in result["configurations"] if c["key"] == key)["summary"]["session_wall_s"] = wall
    lines = targets_table(result)
    assert target(lines, "session wall time <= 1.0x 9-rapid-mlx+addon's (issue 23, plain)").endswith("(0.95x, one sample) | met |")
    assert target(lines, "session wall time <= 0.9x 7-batched+addon's").endswith("(0.80x, one sample) | met |")
    result["model"] |= {"attention": "hybrid", "cache_kinds": ["ArraysCache", "KVCache"]}
    lines = targets_table(result)
    assert target(lines, "session wall time <= 0.95x 9-rapid-mlx+addon's (issue 23, hybrid)").endswith("| not met |")
    assert target(lines, "session wall time <= 0.6x 7-batched+addon's").endswith("| not met |")
    result["configurations"][1]["summary"]["session_wall_s"] = None
    assert target(targets_table(result), "session wall time <= 0.6x").endswith("| unknown |")  # never taken as met


def test_a_fan_out_group_that_decoded_other_replies_says_the_work_differs(result):
    result["configurations"][2]["summary"]["fan_out_output_tokens"] = 120
    assert "the group decoded 300 tokens, 9-rapid-mlx+addon 120: not equal work" in target(targets_table(result), "fan-out wall time")


def test_the_report_leads_with_tokens_prefilled_ttft_and_turn_time_and_says_how_replies_were_decoded(result):
    report = markdown(result)
    assert "Replies: greedy (temperature 0), max_tokens as the addon caps it" in report
    header = next(line for line in report.splitlines() if line.startswith("| configuration | tokens prefilled"))
    assert header.split(" | ")[1:5] == ["tokens prefilled", "warm TTFT", "warm turn time", "cold TTFT"]
    assert "| warm turn time, main | 1.00x [0.90, 1.10] level (5) | 1.20x [1.10, 1.30] behind (5, 3 rescaled) |" in report
    assert "| requests that decoded the same number of tokens (greedy) | 8 of 8 | 8 of 8 |" in report


def test_a_notable_request_that_was_refused_shows_its_status_not_figures(result):
    result["session"]["notable_requests"] = [{"index": 3, "what": "main turn with the longest history"}]
    answered = {"index": 3, "status": 200, "error": None, "ttft_s": 0.5, "total_s": 1.5, "reused_tokens": 900,
                "prompt_tokens": 1000, "output_tokens": 20}
    refused = {"index": 3, "status": 400, "error": "HTTP 400: prompt is too long", "ttft_s": 0.0, "total_s": 0.07,
               "reused_tokens": None, "prompt_tokens": None, "output_tokens": None}
    result["rows"] = [{**answered, "configuration": "4-patched+addon"}, {**refused, "configuration": "9-rapid-mlx+addon"}]
    line = next(line for line in notable_table(result) if line.startswith("| #3"))
    assert "0.50 s / 1.50 s (900 / 1,000; 20)" in line and "HTTP 400" in line and "| - |" in line
