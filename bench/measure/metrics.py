"""What the benchmark reports, computed from per-request rows.

A row is one replayed request in one configuration (see `bench/README.md` for
every field). The figures here are plain functions of rows so that
`tests/bench/measure/test_metrics.py` can check them on a hand-made trace:

- **cold / warm**: the first request of each (lane, conversation) in the run is
  cold: nothing an engine could have cached belongs to it (a new lane, or the
  main lane after the `/clear`-like new conversation, whose git status changes
  the system prompt). Every later request of that lane and conversation is warm.
- **reuse_efficiency** = tokens reused / tokens an ideal cache could have
  reused, summed over the run. The ideal for a request is the longest token
  prefix it shares with any earlier request of the run (`bench.workload.prompt_tokens`),
  over the prompts *that configuration's engine received*. A request whose
  reuse is unknown is left out of every sum (and counted as such), never taken
  as zero reused.
- **TTFT and turn-time figures** leave out the requests of fan-out groups: those
  run concurrently, so their times include waiting for each other; a group is
  measured by its wall time instead (first request sent to last answer ended).
  A title request sent beside its conversation's first main turn is counted in
  its lane: waiting for (or sharing the engine with) that turn is what a user's
  title request does.
- **turn time**: from sending a request to the end of its stream, the whole
  reply (`total_s`). **decode tokens/s**: output tokens after the first over the time after
  the first token, summed over the requests it covers.
- **warm TTFT growth**: the least-squares slope of warm main-lane TTFT against
  prompt length, in ms per 1,000 prompt tokens. An engine that re-prefills the
  history grows; one that prefills only the new tokens stays flat.
- **warm TTFT / in-context prefill** (the fair yardstick): for each warm
  request, its TTFT divided by the time the same model needs to prefill exactly
  its new tokens on top of the prefix it reused (`bench.probes.incontext_prefill`); the
  median is reported.
- **warm TTFT / cold prefill of its new tokens**: the same, divided instead by
  the time the same server needs to prefill as many tokens from nothing
  (`bench.probes.prefill_reference`). New tokens after a long cached context cost more
  than as many from nothing, so this one no cache can bring to 1.
- **warm main-lane prefill / its new content**: for each warm main-lane
  request whose reuse is known, the tokens it prefilled over the tokens no
  cache could have spared it (its prompt minus the ideal reusable prefix: the
  previous reply and the new messages); the median and the largest. 1.0 is
  ideal; a cache that restores only checkpoints pays the way back to one.
- **paired ratios** (the product against an anchor): each warm (or cold)
  request's TTFT, or turn time, in one configuration over the same request's in
  the other, both replayed in the same turn of an interleaved run; the median
  ratio with a bootstrap 95% confidence interval, per lane and over all lanes.
  Turn times compare at equal output length: greedy decoding gives every engine
  the same reply, but where two decoded different numbers of tokens (numerics of
  batched and single decoding differ), the first one's turn time is rescaled to
  the other's length by its own time per decoded token (`turn_at_length`), and
  the pair is counted as rescaled (`output_agreement` lists them).
- **paired differences** (proxy overhead): latency through a proxy minus latency
  direct, paired request by request, as p50 and p95 in ms, with a bootstrap 95%
  confidence interval of the median; a difference whose interval includes zero
  is within noise.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Iterable, Sequence
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
    """Tokens reused / tokens an ideal cache could have reused, over rows whose reuse and ideal are known
    (the ideal is unknown for an engine whose prompts are not rendered)."""
    known = [row for row in rows if row.get("reused_tokens") is not None and row.get("ideal_reusable_tokens") is not None]
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
    warm = [row for row in rows if row["lane"] == lane and row["warm"] and row.get("ttft_s") is not None and row.get("prompt_tokens") is not None]
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
        if row["lane"] == lane and row["warm"] and row.get("reused_tokens") is not None and row.get("ideal_reusable_tokens") is not None
        and row["prompt_tokens"] > row["ideal_reusable_tokens"]
    ]
    return {"median": median(ratios), "max": max(ratios) if ratios else None}


def sequential(rows: Iterable[Row]) -> list[Row]:
    """The rows whose times are the request's own: every one outside a fan-out group."""
    return [row for row in rows if not row.get("fan_out")]


def decoding(row: Row) -> tuple[int, float] | None:
    """(tokens decoded after the first, seconds they took) of a row whose reply had two or more output tokens."""
    tokens, ttft, turn = row.get("output_tokens"), row.get("ttft_s"), row.get("total_s")
    if tokens is None or tokens < 2 or ttft is None or turn is None or turn <= ttft or row.get("ttft_is_total"):
        return None
    return tokens - 1, turn - ttft


def decode_tokens_per_s(rows: Iterable[Row]) -> float | None:
    """Tokens decoded after the first token over the time they took, summed over `rows`."""
    spans = [span for row in rows if (span := decoding(row))]
    seconds = sum(duration for _, duration in spans)
    return sum(tokens for tokens, _ in spans) / seconds if seconds else None


def turn_at_length(row: Row, output_tokens: int) -> float | None:
    """The row's turn time had it decoded `output_tokens` tokens: its TTFT plus its own
    time per decoded token for each one after the first."""
    if row.get("output_tokens") == output_tokens:
        return row.get("total_s")
    span = decoding(row)
    if span is None or output_tokens < 1:
        return None
    tokens, seconds = span
    return row["ttft_s"] + seconds / tokens * (output_tokens - 1)


def timing_summary(rows: list[Row]) -> dict[str, Any]:
    """TTFT and turn-time medians (cold, warm), output tokens and decode rate of `rows` outside fan-out groups."""
    timed = sequential(rows)
    cold, warm = [row for row in timed if not row["warm"]], [row for row in timed if row["warm"]]
    return {
        "cold_ttft_median_s": median(row["ttft_s"] for row in cold),
        "warm_ttft_median_s": median(row["ttft_s"] for row in warm),
        "cold_turn_median_s": median(row.get("total_s") for row in cold),
        "warm_turn_median_s": median(row.get("total_s") for row in warm),
        "output_tokens": known_sum(row.get("output_tokens") for row in rows),
        "decode_tokens_per_s": decode_tokens_per_s(timed),
    }


def known_sum(values: Iterable[int | None]) -> int | None:
    """The sum of the values, or None (unknown) when any is unknown."""
    present = list(values)
    return None if any(value is None for value in present) else sum(present)


def lane_summary(rows: list[Row]) -> dict[str, Any]:
    return {"requests": len(rows), **timing_summary(rows), "reuse_efficiency": reuse_efficiency(rows)}


def beside_summary(rows: list[Row]) -> dict[str, Any] | None:
    """The requests sent beside another (title requests beside a main turn): TTFT and turn time medians."""
    beside = [row for row in rows if row.get("beside") is not None]
    if not beside:
        return None
    return {
        "requests": len(beside),
        "ttft_median_s": median(row["ttft_s"] for row in beside),
        "turn_median_s": median(row.get("total_s") for row in beside),
        "output_tokens": known_sum(row.get("output_tokens") for row in beside),
    }


def _spans(rows: Iterable[Row], key: Callable[[Row], Any]) -> dict[Any, float]:
    """{key(row): seconds from the first of its requests sent to the last answer ended}."""
    spans: dict[Any, list[float]] = {}
    for row in rows:
        span = spans.setdefault(key(row), [row["started_s"], row["started_s"] + row["total_s"]])
        span[0], span[1] = min(span[0], row["started_s"]), max(span[1], row["started_s"] + row["total_s"])
    return {group: end - start for group, (start, end) in spans.items()}


def fan_out_wall_s(rows: Iterable[Row]) -> dict[str, float]:
    """{group: seconds from its first request sent to its last answer ended}."""
    return _spans((row for row in rows if row.get("fan_out") and row.get("total_s") is not None), lambda row: row["fan_out"])


def step_key(row: Row) -> tuple[str, Any]:
    """Which step of the replay a row was sent in: its fan-out group, the request it was sent
    beside, or its own (`replay.steps` sends them so)."""
    if row.get("fan_out"):
        return ("fan_out", row["fan_out"])
    return ("request", row["beside"] if row.get("beside") is not None else row["index"])


def session_wall_s(rows: Iterable[Row]) -> float | None:
    """The session as a user waits for it: each step from its first request sent to its last
    answer ended, summed (a title beside its main turn and a fan-out group's instances overlap);
    unknown if any request has no time."""
    rows = list(rows)
    if not rows or any(row.get("total_s") is None or row.get("started_s") is None for row in rows):
        return None
    return sum(_spans(rows, step_key).values())


def paired_fan_out_ratio(rows: Iterable[Row], other: Iterable[Row]) -> dict[str, Any]:
    """Median over the fan-out groups both ran (a round each, in the rounds session) of
    wall(rows) / wall(other), with its 95% confidence interval, and whether the groups decoded the
    same number of tokens in both (greedy: then they compare at equal output length)."""
    rows, other = list(rows), list(other)
    mine, theirs = fan_out_wall_s(rows), fan_out_wall_s(other)

    def tokens(of: list[Row], group: str) -> int | None:
        return known_sum(row.get("output_tokens") for row in of if row.get("fan_out") == group)

    groups = [group for group in mine if theirs.get(group)]
    ratios = [mine[group] / theirs[group] for group in groups]
    interval = median_confidence_interval(ratios)
    return {
        "groups": len(ratios),
        "median": median(ratios),
        "ci95": list(interval) if interval else None,
        "within_noise": None if interval is None else interval[0] <= 1 <= interval[1],
        "equal_output": sum(1 for group in groups if tokens(rows, group) is not None and tokens(rows, group) == tokens(other, group)),
    }


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
        **timing_summary(rows),
        # TTFTs that are the total time (no output event reached the client): upper bounds, kept in the medians.
        "ttft_fell_back_to_total": sum(1 for row in rows if row.get("ttft_is_total")),
        "reuse_efficiency": reuse_efficiency(rows),
        "prompt_tokens": sum(row["prompt_tokens"] for row in rows if row.get("prompt_tokens") is not None),
        "ideal_reusable_tokens": known_sum(row.get("ideal_reusable_tokens") for row in known),
        "tokens_reused": sum(row["reused_tokens"] for row in known) if known else None,
        "tokens_prefilled": sum(row["prompt_tokens"] - row["reused_tokens"] for row in known) if known else None,
        # Left out of the three sums above (and of reuse_efficiency): unknown, not zero.
        "reuse_unknown_requests": len(unknown),
        "reuse_unknown_prompt_tokens": sum(row["prompt_tokens"] for row in unknown if row.get("prompt_tokens") is not None),
        "fan_out_requests": len(fan_out),
        "fan_out_wall_s": sum(walls.values()) if walls else None,
        "fan_out_output_tokens": known_sum(row.get("output_tokens") for row in fan_out) if fan_out else None,
        "beside": beside_summary(rows),
        "warm_ttft_growth_ms_per_1k_tokens": warm_ttft_growth_ms_per_1k_tokens(timed),
        "warm_main_prefill_over_new_content": warm_prefill_over_new_content(rows),
        "warm_ttft_over_incontext_prefill_median": warm_ttft_over(timed, "incontext_prefill_s"),
        # What a warm request costs beyond its unavoidable compute (HTTP, chat template, tokenizing, lookup).
        "warm_ttft_minus_incontext_prefill_median_s": median(
            row["ttft_s"] - row["incontext_prefill_s"] for row in timed if row["warm"] and row.get("incontext_prefill_s") and row.get("ttft_s") is not None
        ),
        "warm_ttft_over_cold_prefill_of_new_tokens_median": warm_ttft_over(timed, "cold_prefill_of_new_tokens_s"),
        "total_time_s": sum(row["total_s"] for row in rows if row.get("total_s") is not None),
        "session_wall_s": session_wall_s(rows),
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


PAIRED_FIGURES = ("ttft_s", "total_s")  # TTFT, turn time


def paired_ratio(rows: Iterable[Row], other: Iterable[Row], figure: str = "ttft_s", warm: bool = True) -> dict[str, Any]:
    """Median over the warm (or cold) requests outside the fan-out of figure(rows) / figure(other)
    for the same request (`figure`: "ttft_s", or "total_s", the turn time, at the other's output
    length, see the module docstring), with the median's 95% confidence interval;
    `within_noise` when that interval includes 1. Per lane under "lanes", all lanes under
    "all"; "rescaled" counts the turn-time pairs of unequal output length."""
    if figure not in PAIRED_FIGURES:
        raise ValueError(f"paired ratio of {figure!r}: choose from {', '.join(PAIRED_FIGURES)}")
    theirs = {row["index"]: row for row in other}
    pairs: dict[str, list[float]] = {}
    rescaled: dict[str, int] = {}
    for row in sequential(rows):
        match = theirs.get(row["index"])
        if row["warm"] != warm or not match or not match.get(figure):
            continue
        mine = row.get(figure)
        if figure == "total_s" and row.get("output_tokens") != match.get("output_tokens"):
            mine = None if match.get("output_tokens") is None else turn_at_length(row, match["output_tokens"])
            for lane in (row["lane"], ""):
                rescaled[lane] = rescaled.get(lane, 0) + (mine is not None)
        if mine:
            for lane in (row["lane"], ""):
                pairs.setdefault(lane, []).append(mine / match[figure])

    def summary(lane: str) -> dict[str, Any]:
        ratios = pairs.get(lane, [])
        interval = median_confidence_interval(ratios)
        return {
            "requests": len(ratios),
            "median": median(ratios),
            "ci95": list(interval) if interval else None,
            "within_noise": None if interval is None else interval[0] <= 1 <= interval[1],
            "rescaled": rescaled.get(lane, 0),
        }

    return {"all": summary(""), "lanes": {lane: summary(lane) for lane in sorted(pairs) if lane}}


def output_agreement(rows: Iterable[Row], other: Iterable[Row]) -> dict[str, Any]:
    """Whether two configurations decoded the same number of tokens for each request both answered."""
    theirs = {row["index"]: row.get("output_tokens") for row in other}
    compared = [(row["index"], row.get("output_tokens"), theirs.get(row["index"])) for row in rows if row["index"] in theirs]
    known = [(index, mine, other_count) for index, mine, other_count in compared if mine is not None and other_count is not None]
    return {
        "requests": len(known),
        "equal": sum(1 for _, mine, other_count in known if mine == other_count),
        "differing": [index for index, mine, other_count in known if mine != other_count],
        "unknown": len(compared) - len(known),
    }
