"""What the benchmark reports, computed from per-request rows.

A row is one replayed request in one configuration (see `bench/README.md` for
every field). The figures here are plain functions of rows so that
`tests/test_metrics.py` can check them on a hand-made trace:

- **cold / warm**: the first request of each (lane, conversation) in the run is
  cold: nothing an engine could have cached belongs to it (a new lane, or the
  main lane after the `/clear`-like new conversation, whose git status changes
  the system prompt). Every later request of that lane and conversation is warm.
- **reuse_efficiency** = tokens reused / tokens an ideal cache could have
  reused, summed over the run. The ideal for a request is the longest token
  prefix it shares with any earlier request of the run (`bench.prompt_tokens`),
  over the prompts *that configuration's engine received*. A request whose
  reuse is unknown is left out of every sum (and counted as such), never taken
  as zero reused.
- **TTFT figures** leave out the requests of fan-out groups: those run
  concurrently, so their TTFT includes waiting for each other; a group is
  measured by its wall time instead (first request sent to last answer ended).
- **warm TTFT growth**: the least-squares slope of warm main-lane TTFT against
  prompt length, in ms per 1,000 prompt tokens. An engine that re-prefills the
  history grows; one that prefills only the new tokens stays flat.
- **warm TTFT / in-context prefill** (the fair yardstick): for each warm
  request, its TTFT divided by the time the same model needs to prefill exactly
  its new tokens on top of the prefix it reused (`bench.incontext_prefill`); the
  median is reported.
- **warm TTFT / cold prefill of its new tokens**: the same, divided instead by
  the time the same server needs to prefill as many tokens from nothing
  (`bench.prefill_reference`). New tokens after a long cached context cost more
  than as many from nothing, so this one no cache can bring to 1.
- **warm main-lane prefill / its new content**: for each warm main-lane
  request whose reuse is known, the tokens it prefilled over the tokens no
  cache could have spared it (its prompt minus the ideal reusable prefix: the
  previous reply and the new messages); the median and the largest. 1.0 is
  ideal; a cache that restores only checkpoints pays the way back to one.
- **paired TTFT ratio** (the product against the anchor): each warm request's
  TTFT in one configuration over the same request's in the other, both replayed
  in the same turn of an interleaved run; the median ratio with a bootstrap 95%
  confidence interval, per lane and over all lanes.
- **paired differences** (proxy overhead): latency through a proxy minus latency
  direct, paired request by request, as p50 and p95 in ms, with a bootstrap 95%
  confidence interval of the median; a difference whose interval includes zero
  is within noise.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

Row = dict[str, Any]


def median(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Linear-interpolated percentile (`fraction` in [0, 1]) of `values`; None if empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = fraction * (len(ordered) - 1)
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def mark_cold_and_warm(rows: list[Row]) -> list[Row]:
    """Set `row["warm"]` on rows given in request order (see module docstring)."""
    seen: set[tuple[str, int]] = set()
    for row in rows:
        key = (row["lane"], row["conversation"])
        row["warm"] = key in seen
        seen.add(key)
    return rows


def reuse_efficiency(rows: Iterable[Row]) -> float | None:
    """Tokens reused / tokens an ideal cache could have reused, over rows whose reuse is known."""
    known = [row for row in rows if row.get("reused_tokens") is not None]
    ideal = sum(row["ideal_reusable_tokens"] for row in known)
    if not known or ideal == 0:
        return None
    return sum(row["reused_tokens"] for row in known) / ideal


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys over xs; None with fewer than two distinct xs."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    variance = sum((x - mean_x) ** 2 for x in xs)
    return covariance / variance


def warm_ttft_growth_ms_per_1k_tokens(rows: Iterable[Row], lane: str = "main") -> float | None:
    warm = [row for row in rows if row["lane"] == lane and row["warm"] and row.get("ttft_s") is not None]
    growth = slope([row["prompt_tokens"] / 1000 for row in warm], [row["ttft_s"] * 1000 for row in warm])
    return growth


def warm_ttft_over(rows: Iterable[Row], yardstick: str) -> float | None:
    """Median of TTFT / row[yardstick] over the warm rows where both are known."""
    return median(row["ttft_s"] / row[yardstick] for row in rows if row["warm"] and row.get(yardstick) and row.get("ttft_s") is not None)


def warm_prefill_over_new_content(rows: Iterable[Row], lane: str = "main") -> dict[str, float | None]:
    """Median and largest of prefilled / (prompt - ideal reusable) over the lane's warm rows with known reuse."""
    ratios = [
        (row["prompt_tokens"] - row["reused_tokens"]) / (row["prompt_tokens"] - row["ideal_reusable_tokens"])
        for row in rows
        if row["lane"] == lane and row["warm"] and row.get("reused_tokens") is not None and row["prompt_tokens"] > row["ideal_reusable_tokens"]
    ]
    return {"median": median(ratios), "max": max(ratios) if ratios else None}


def sequential(rows: Iterable[Row]) -> list[Row]:
    """The rows whose TTFT is the request's own: every one outside a fan-out group."""
    return [row for row in rows if not row.get("fan_out")]


def lane_summary(rows: list[Row]) -> dict[str, Any]:
    timed = sequential(rows)
    return {
        "requests": len(rows),
        "cold_ttft_median_s": median(row["ttft_s"] for row in timed if not row["warm"]),
        "warm_ttft_median_s": median(row["ttft_s"] for row in timed if row["warm"]),
        "reuse_efficiency": reuse_efficiency(rows),
    }


def fan_out_wall_s(rows: Iterable[Row]) -> dict[str, float]:
    """{group: seconds from its first request sent to its last answer ended}."""
    spans: dict[str, list[float]] = {}
    for row in rows:
        if row.get("fan_out") and row.get("total_s") is not None:
            span = spans.setdefault(row["fan_out"], [row["started_s"], row["started_s"] + row["total_s"]])
            span[0], span[1] = min(span[0], row["started_s"]), max(span[1], row["started_s"] + row["total_s"])
    return {group: end - start for group, (start, end) in spans.items()}


def summarize(rows: list[Row]) -> dict[str, Any]:
    """The per-configuration summary written to latest.json (rows already marked cold/warm)."""
    lanes: dict[str, list[Row]] = {}
    for row in rows:
        lanes.setdefault(row["lane"], []).append(row)
    known = [row for row in rows if row.get("reused_tokens") is not None]
    unknown = [row for row in rows if row.get("reused_tokens") is None]
    timed = sequential(rows)
    fan_out = [row for row in rows if row.get("fan_out")]
    walls = fan_out_wall_s(rows)
    return {
        "requests": len(rows),
        "cold_ttft_median_s": median(row["ttft_s"] for row in timed if not row["warm"]),
        "warm_ttft_median_s": median(row["ttft_s"] for row in timed if row["warm"]),
        # TTFTs that are the total time (no output event reached the client): upper bounds, kept in the medians.
        "ttft_fell_back_to_total": sum(1 for row in rows if row.get("ttft_is_total")),
        "reuse_efficiency": reuse_efficiency(rows),
        "prompt_tokens": sum(row["prompt_tokens"] for row in rows if row.get("prompt_tokens") is not None),
        "ideal_reusable_tokens": sum(row["ideal_reusable_tokens"] for row in known),
        "tokens_reused": sum(row["reused_tokens"] for row in known) if known else None,
        "tokens_prefilled": sum(row["prompt_tokens"] - row["reused_tokens"] for row in known) if known else None,
        # Left out of the three sums above (and of reuse_efficiency): unknown, not zero.
        "reuse_unknown_requests": len(unknown),
        "reuse_unknown_prompt_tokens": sum(row["prompt_tokens"] for row in unknown if row.get("prompt_tokens") is not None),
        "fan_out_requests": len(fan_out),
        "fan_out_wall_s": sum(walls.values()) if walls else None,
        "warm_ttft_growth_ms_per_1k_tokens": warm_ttft_growth_ms_per_1k_tokens(timed),
        "warm_main_prefill_over_new_content": warm_prefill_over_new_content(rows),
        "warm_ttft_over_incontext_prefill_median": warm_ttft_over(timed, "incontext_prefill_s"),
        # What a warm request costs beyond its unavoidable compute (HTTP, chat template, tokenizing, lookup).
        "warm_ttft_minus_incontext_prefill_median_s": median(
            row["ttft_s"] - row["incontext_prefill_s"] for row in timed if row["warm"] and row.get("incontext_prefill_s") and row.get("ttft_s") is not None
        ),
        "warm_ttft_over_cold_prefill_of_new_tokens_median": warm_ttft_over(timed, "cold_prefill_of_new_tokens_s"),
        "total_time_s": sum(row["total_s"] for row in rows if row.get("total_s") is not None),
        "lanes": {lane: lane_summary(lane_rows) for lane, lane_rows in lanes.items()},
    }


def median_confidence_interval(values: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """Bootstrap (percentile method) confidence interval of the median; seeded, so reruns on the same data agree."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return percentile(medians, tail), percentile(medians, 1 - tail)


def paired_difference_ms(baseline_s: Sequence[float], measured_s: Sequence[float]) -> dict[str, Any]:
    """The per-pair added latency (measured - baseline) in ms: p50, p95, the median's 95%
    confidence interval, and whether that interval includes zero (`within_noise`)."""
    if len(baseline_s) != len(measured_s):
        raise ValueError(f"paired difference: {len(baseline_s)} baseline vs {len(measured_s)} measured timings; they must pair up")
    added = [(measured - baseline) * 1000 for baseline, measured in zip(baseline_s, measured_s)]
    interval = median_confidence_interval(added)
    return {
        "p50": percentile(added, 0.5),
        "p95": percentile(added, 0.95),
        "p50_ci95": list(interval) if interval else None,
        "within_noise": None if interval is None else interval[0] <= 0 <= interval[1],
        "samples": len(added),
    }


def paired_ttft_ratio(rows: Iterable[Row], other: Iterable[Row], warm: bool = True) -> dict[str, Any]:
    """Median over the warm (or cold) requests outside the fan-out of TTFT(rows) / TTFT(other)
    for the same request, with the median's 95% confidence interval; `within_noise` when
    that interval includes 1. Per lane under "lanes", all lanes under "all"."""
    theirs = {row["index"]: row for row in other}
    pairs: dict[str, list[float]] = {}
    for row in sequential(rows):
        match = theirs.get(row["index"])
        if row["warm"] == warm and match and row.get("ttft_s") and match.get("ttft_s"):
            ratio = row["ttft_s"] / match["ttft_s"]
            pairs.setdefault(row["lane"], []).append(ratio)
            pairs.setdefault("", []).append(ratio)

    def summary(ratios: list[float]) -> dict[str, Any]:
        interval = median_confidence_interval(ratios)
        return {
            "requests": len(ratios),
            "median": median(ratios),
            "ci95": list(interval) if interval else None,
            "within_noise": None if interval is None else interval[0] <= 1 <= interval[1],
        }

    return {"all": summary(pairs.pop("", [])), "lanes": {lane: summary(ratios) for lane, ratios in sorted(pairs.items())}}
