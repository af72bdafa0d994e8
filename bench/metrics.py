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
  prefix it shares with any earlier request of the run (`bench.prompt_tokens`).
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
- **proxy overhead**: latency through the addon minus latency direct, paired
  request by request against the same fast upstream, as p50 and p95 in ms.
"""

from __future__ import annotations

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


def lane_summary(rows: list[Row]) -> dict[str, Any]:
    return {
        "requests": len(rows),
        "cold_ttft_median_s": median(row["ttft_s"] for row in rows if not row["warm"]),
        "warm_ttft_median_s": median(row["ttft_s"] for row in rows if row["warm"]),
        "reuse_efficiency": reuse_efficiency(rows),
    }


def summarize(rows: list[Row]) -> dict[str, Any]:
    """The per-configuration summary written to latest.json (rows already marked cold/warm)."""
    lanes: dict[str, list[Row]] = {}
    for row in rows:
        lanes.setdefault(row["lane"], []).append(row)
    known = [row for row in rows if row.get("reused_tokens") is not None]
    return {
        "requests": len(rows),
        "cold_ttft_median_s": median(row["ttft_s"] for row in rows if not row["warm"]),
        "warm_ttft_median_s": median(row["ttft_s"] for row in rows if row["warm"]),
        "reuse_efficiency": reuse_efficiency(rows),
        "prompt_tokens": sum(row["prompt_tokens"] for row in rows),
        "ideal_reusable_tokens": sum(row["ideal_reusable_tokens"] for row in rows),
        "tokens_reused": sum(row["reused_tokens"] for row in known) if known else None,
        "tokens_prefilled": sum(row["prompt_tokens"] - row["reused_tokens"] for row in known) if known else None,
        "warm_ttft_growth_ms_per_1k_tokens": warm_ttft_growth_ms_per_1k_tokens(rows),
        "warm_ttft_over_incontext_prefill_median": warm_ttft_over(rows, "incontext_prefill_s"),
        # What a warm request costs beyond its unavoidable compute (HTTP, chat template, tokenizing, lookup).
        "warm_ttft_minus_incontext_prefill_median_s": median(
            row["ttft_s"] - row["incontext_prefill_s"] for row in rows if row["warm"] and row.get("incontext_prefill_s") and row.get("ttft_s") is not None
        ),
        "warm_ttft_over_cold_prefill_of_new_tokens_median": warm_ttft_over(rows, "cold_prefill_of_new_tokens_s"),
        "total_time_s": sum(row["total_s"] for row in rows if row.get("total_s") is not None),
        "lanes": {lane: lane_summary(lane_rows) for lane, lane_rows in lanes.items()},
    }


def proxy_overhead_ms(direct_s: Sequence[float], proxied_s: Sequence[float]) -> dict[str, float | None]:
    """p50/p95 of the per-pair added latency (proxied - direct), in milliseconds."""
    if len(direct_s) != len(proxied_s):
        raise ValueError(f"proxy overhead: {len(direct_s)} direct vs {len(proxied_s)} proxied timings; they must pair up")
    added = [(proxied - direct) * 1000 for direct, proxied in zip(direct_s, proxied_s)]
    return {"p50": percentile(added, 0.5), "p95": percentile(added, 0.95), "samples": len(added)}
