"""What `make demo` prints after its rows: one line per lane, and a fan-out group as a whole."""

from stable_prefix.bench.demo import summary_lines
from stable_prefix.bench.measure.metrics import mark_cold_and_warm


def row(index, lane, prompt, reused, ttft, started, fan_out=None):
    return {"index": index, "lane": lane, "conversation": 0, "prompt_tokens": prompt, "ideal_reusable_tokens": reused,
            "reused_tokens": reused, "ttft_s": ttft, "total_s": ttft + 1.0, "started_s": started, "fan_out": fan_out}


def test_a_fan_out_group_is_one_line_with_its_wall_time_and_its_instances_get_none():
    rows = mark_cold_and_warm([
        row(0, "main", 1000, 0, 8.0, 0.0),
        row(1, "sub:explore@1", 500, 18, 2.0, 10.0, "explore-0-2"),
        row(2, "sub:explore@2", 500, 480, 3.0, 10.1, "explore-0-2"),
        row(3, "main", 1200, 1000, 1.0, 20.0),
    ])
    text = "\n".join(summary_lines(rows))
    assert "sub:explore@" not in text
    assert "fan-out explore-0-2: 2 concurrent instances, 2 requests, 4.10 s from the first sent to the last answered" in text
    assert "main                  2 requests   cold   8.00 s   warm   1.00 s  (8.0x faster warm)" in text


def test_no_speedup_is_claimed_when_the_first_request_was_already_served_from_the_cache():
    rows = mark_cold_and_warm([row(0, "sub:explore", 2571, 2530, 0.3, 0.0), row(1, "sub:explore", 2822, 2571, 0.6, 1.0)])
    assert "faster warm" not in "\n".join(summary_lines(rows))
