"""Write a benchmark result as `latest.json`, `latest.md` and `latest.png`.

The JSON schema is documented in `bench/README.md`; the Markdown is the table
the project README quotes; the plot shows TTFT per request, one line per
configuration, with a marker per lane.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OVERHEAD_VARIANTS = {
    "mitmproxy_alone": "mitmdump with no script (mitmproxy's own cost)",
    "addon": "strip_billing.py (the product)",
    "addon_without_diagnosis": "strip_billing.py, `--set prefix_diagnosis=false`",
    "addon_with_capture": "strip_billing.py + capture.py",
}
LANE_MARKERS = {"main": "o", "title": "*", "sub:explore": "^", "sub:general-purpose": "s"}
PRODUCT_NUMBER, ANCHOR_NUMBER = "4", "7"  # the product, and vllm-mlx --continuous-batching behind the addon


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _growth(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.0f} ms"


def _tokens(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def _interval(values: list[float] | None) -> str:
    return "" if not values else f" [{values[0]:.1f}, {values[1]:.1f}]"


def markdown(result: dict[str, Any]) -> str:
    session, model = result["session"], result["model"]
    fan_out = session.get("fan_out") or {}
    lines = [
        f"Session: {session['requests']} requests (seed {session['seed']}, scale {session['scale']}: "
        f"main prefix {session['main_prefix_tokens']:,} tokens, largest prompt {session['largest_prompt_tokens']:,} tokens"
        + (f"; first {session['limit']} requests of the session" if session.get("limit") else "")
        + (f"; a fan-out group of {fan_out['instances']} concurrent subagent instances, {fan_out['requests']} requests" if fan_out.get("requests") else "")
        + f"); model: {model['description']}; machine: {result['machine']}.",
        f"Command: `{result['command']}`",
        "",
        "| configuration | tokens prefilled | warm TTFT (median) | cold TTFT (median) | fan-out wall time | reuse efficiency (of its own prompts) "
        "| warm TTFT / prefill of its new tokens on top of its reused prefix (median) | warm TTFT growth per 1K prompt tokens "
        "| warm TTFT / cold prefill of as many tokens from nothing (median) | proxy added TTFT p50 [95% CI] / p95 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for config in result["configurations"]:
        summary = config["summary"]
        overhead = "-"
        if config["addon"]:
            overhead = f"{_ms(summary.get('proxy_overhead_ms_p50'))}{_interval(summary.get('proxy_overhead_ms_p50_ci95'))} / {_ms(summary.get('proxy_overhead_ms_p95'))}"
        lines.append(
            f"| {config['key']}: {config['title']} | {_tokens(summary['tokens_prefilled'])} of {summary['prompt_tokens']:,} | "
            f"{_seconds(summary['warm_ttft_median_s'])} | {_seconds(summary['cold_ttft_median_s'])} | {_seconds(summary.get('fan_out_wall_s'))} | "
            f"{_ratio(summary['reuse_efficiency'])} | {_times(summary.get('warm_ttft_over_incontext_prefill_median'))} | "
            f"{_growth(summary['warm_ttft_growth_ms_per_1k_tokens'])} | "
            f"{_times(summary.get('warm_ttft_over_cold_prefill_of_new_tokens_median'))} | {overhead} |"
        )
        if summary.get("reuse_unknown_requests"):
            notes.append(
                f"{config['key']}: reuse unknown for {summary['reuse_unknown_requests']} requests "
                f"({summary['reuse_unknown_prompt_tokens']:,} prompt tokens), left out of tokens prefilled and reuse efficiency."
            )
        if summary.get("ttft_fell_back_to_total"):
            notes.append(f"{config['key']}: {summary['ttft_fell_back_to_total']} requests had no output event; their TTFT is the total time (an upper bound).")
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    lines += [
        "",
        "Tokens prefilled and reuse efficiency count every request, fan-out included; TTFT medians leave out the fan-out "
        "group's requests (concurrent: their TTFT includes waiting for each other), which are measured by the group's wall time.",
    ]
    beyond = [
        f"{config['key'].split('-', 1)[0]}: {_seconds(config['summary'].get('warm_ttft_minus_incontext_prefill_median_s'))}"
        for config in result["configurations"]
        if config["summary"].get("warm_ttft_minus_incontext_prefill_median_s") is not None
    ]
    if beyond:
        lines += ["", "Warm TTFT minus the in-context prefill of its new tokens (median; the server's per-request cost beyond the model's compute): " + ", ".join(beyond) + "."]
    lanes = _timed_lanes(result)
    lines += ["", "Warm TTFT median per lane (cold in parentheses):", "", "| configuration | " + " | ".join(lanes) + " |", "|---" * (len(lanes) + 1) + "|"]
    for config in result["configurations"]:
        cells = []
        for lane in lanes:
            lane_summary = config["summary"]["lanes"].get(lane)
            if lane_summary is None:
                cells.append("-")
                continue
            cells.append(f"{_seconds(lane_summary['warm_ttft_median_s'])} ({_seconds(lane_summary['cold_ttft_median_s'])})")
        lines.append(f"| {config['key']} | " + " | ".join(cells) + " |")
    lines += targets_table(result) + contributions(result) + notable_table(result)
    overhead = result.get("proxy_overhead")
    if overhead:
        lines += proxy_overhead_table(overhead)
    return "\n".join(lines) + "\n"


def _timed_lanes(result: dict[str, Any]) -> list[str]:
    """Lanes with a TTFT median in some configuration: a fan-out instance's lane has none (its group has a wall time)."""
    return sorted({
        lane
        for config in result["configurations"]
        for lane, summary in config["summary"]["lanes"].items()
        if summary["warm_ttft_median_s"] is not None or summary["cold_ttft_median_s"] is not None
    })


def _interval_times(values: list[float] | None) -> str:
    return "" if not values else f" [{values[0]:.2f}, {values[1]:.2f}]"


def _met(value: float | None, limit: float) -> str:
    return "unknown" if value is None else ("met" if value <= limit else "not met")


def targets_table(result: dict[str, Any]) -> list[str]:
    """The product against the batched anchor behind the addon, in this run (both must be in it)."""
    summaries = {config["key"].split("-", 1)[0]: config["summary"] for config in result["configurations"]}
    product, anchor = summaries.get(PRODUCT_NUMBER), summaries.get(ANCHOR_NUMBER)
    if product is None or anchor is None:
        return []

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    comparison = result.get("comparison") or {}
    paired, paired_cold = comparison.get("paired_ttft_ratio") or {}, comparison.get("paired_cold_ttft_ratio") or {}
    rows = [("warm TTFT median, all lanes", product["warm_ttft_median_s"], anchor["warm_ttft_median_s"], paired.get("all"))]
    for lane in _timed_lanes(result):
        mine, theirs = product["lanes"].get(lane), anchor["lanes"].get(lane) or {}
        if mine is None:
            continue
        if mine["warm_ttft_median_s"] is None:  # a lane with cold requests only (title)
            rows.append((f"cold TTFT median, {lane}", mine["cold_ttft_median_s"], theirs.get("cold_ttft_median_s"), (paired_cold.get("lanes") or {}).get(lane)))
        else:
            rows.append((f"warm TTFT median, {lane}", mine["warm_ttft_median_s"], theirs.get("warm_ttft_median_s"), (paired.get("lanes") or {}).get(lane)))
    rows.append(("cold TTFT median, all lanes", product["cold_ttft_median_s"], anchor["cold_ttft_median_s"], paired_cold.get("all")))
    rows.append(("fan-out wall time", product.get("fan_out_wall_s"), anchor.get("fan_out_wall_s"), None))
    lines = [
        "",
        f"Targets, in this run: the product ({PRODUCT_NUMBER}) against vllm-mlx --continuous-batching behind the addon ({ANCHOR_NUMBER}); "
        "ratio = product / anchor, met when <= 1. Paired: the median over the warm requests of each one's TTFT ratio "
        "(same request, same turn of the run) with its 95% confidence interval; \"within noise\" when it includes 1.",
        "",
        "| figure | product | anchor | ratio | paired ratio [95% CI] | |",
        "|---|---|---|---|---|---|",
    ]
    for what, mine, theirs, pairs in rows:
        verdict = _met(ratio(mine, theirs), 1.0)
        paired_cell = ""
        if pairs and pairs.get("median") is not None:
            paired_cell = f"{_times(pairs['median'])}{_interval_times(pairs.get('ci95'))}"
            if pairs.get("within_noise"):
                verdict += " (within noise)"
        lines.append(f"| {what} | {_seconds(mine)} | {_seconds(theirs)} | {_times(ratio(mine, theirs))} | {paired_cell} | {verdict} |")
    prefilled = ratio(product["tokens_prefilled"], anchor["tokens_prefilled"])
    lines.append(f"| tokens prefilled | {_tokens(product['tokens_prefilled'])} | {_tokens(anchor['tokens_prefilled'])} | {_times(prefilled)} | | {_met(prefilled, 1.0)} |")
    new_content = product.get("warm_main_prefill_over_new_content") or {}
    anchor_new_content = anchor.get("warm_main_prefill_over_new_content") or {}
    lines.append(
        f"| warm main-lane tokens prefilled / its new content (previous reply + new messages; median, largest), target <= 1.1x | "
        f"{_times(new_content.get('median'))}, {_times(new_content.get('max'))} | "
        f"{_times(anchor_new_content.get('median'))}, {_times(anchor_new_content.get('max'))} | | | "
        f"median {_met(new_content.get('median'), 1.1)}, largest {_met(new_content.get('max'), 1.1)} |"
    )
    incontext = product.get("warm_ttft_over_incontext_prefill_median")
    lines.append(
        f"| warm TTFT / in-context prefill of its new tokens (median), target <= 1.3x | {_times(incontext)} | "
        f"{_times(anchor.get('warm_ttft_over_incontext_prefill_median'))} | | | {_met(incontext, 1.3)} |"
    )
    return lines


def proxy_overhead_table(overhead: dict[str, Any]) -> list[str]:
    first = next(iter(value for key, value in overhead.items() if key in OVERHEAD_VARIANTS))
    lines = [
        "",
        f"Proxy overhead for a {overhead['body_bytes'] / 1000:.0f} KB request against a loopback stub upstream "
        f"({first['added_ttft_ms']['samples']} rounds, every proxy and the direct path once per round in a shuffled order; "
        "proxied minus direct of the same round: p50 [bootstrap 95% CI of the median] / p95). "
        f"Added time to first token: the stub sends its headers at once and its first content event "
        f"{overhead['first_token_delay_ms']:.0f} ms later, as an engine that prefills. "
        "Added total time: the stub answers everything at once. \"within noise\": the interval includes zero.",
        "",
        "| proxy | added time to first token | added total time, instant upstream |",
        "|---|---|---|",
    ]
    variants = {**OVERHEAD_VARIANTS, "addon_own_share": "the addon's own share (strip_billing.py minus mitmdump with no script)"}
    for key, what in variants.items():
        if key in overhead:
            cells = []
            for figure in ("added_ttft_ms", "added_total_instant_upstream_ms"):
                stats = overhead[key][figure]
                noise = " (within noise)" if stats.get("within_noise") else ""
                cells.append(f"{_ms(stats['p50'])}{_interval(stats.get('p50_ci95'))} / {_ms(stats['p95'])}{noise}")
            lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return lines


def contributions(result: dict[str, Any]) -> list[str]:
    """What each fix buys: configuration 1 -> 2 -> 4 and 3 -> 4."""
    summaries = {config["key"].split("-", 1)[0]: config["summary"] for config in result["configurations"]}
    steps = [
        ("1", "2", "the addon alone, on vllm-mlx as shipped"),
        ("2", "4", "the engine patch, behind the addon"),
        ("3", "4", "the addon, in front of the patched engine"),
        ("6", "7", "the addon, in front of vllm-mlx --continuous-batching"),
        ("7", "4", "the patched engine instead of --continuous-batching, behind the addon"),
    ]
    lines = []
    for before, after, what in steps:
        if before not in summaries or after not in summaries:
            continue
        a, b = summaries[before], summaries[after]
        main_a, main_b = a["lanes"].get("main", {}), b["lanes"].get("main", {})
        lines.append(
            f"- {before} -> {after}, {what}: reuse efficiency {_ratio(a['reuse_efficiency'])} -> {_ratio(b['reuse_efficiency'])}; "
            f"tokens prefilled {_tokens(a['tokens_prefilled'])} -> {_tokens(b['tokens_prefilled'])}; "
            f"warm main-lane TTFT {_seconds(main_a.get('warm_ttft_median_s'))} -> {_seconds(main_b.get('warm_ttft_median_s'))}; "
            f"warm TTFT growth {_growth(a['warm_ttft_growth_ms_per_1k_tokens'])} -> {_growth(b['warm_ttft_growth_ms_per_1k_tokens'])} per 1K tokens."
        )
    return ["", "What each fix contributes:", "", *lines] if lines else []


def notable_table(result: dict[str, Any]) -> list[str]:
    notable = result["session"].get("notable_requests") or []
    if not notable:
        return []
    keys = [config["key"] for config in result["configurations"]]
    rows = {(row["configuration"], row["index"]): row for row in result["rows"]}
    lines = ["", "Notable requests: TTFT (tokens reused / prompt tokens):", "", "| request | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for note in notable:
        cells = []
        for key in keys:
            row = rows.get((key, note["index"]))
            if row is None:
                cells.append("-")
                continue
            reused = "?" if row["reused_tokens"] is None else f"{row['reused_tokens']:,}"
            cells.append(f"{_seconds(row['ttft_s'])} ({reused} / {row['prompt_tokens']:,})")
        lines.append(f"| #{note['index']} {note['what']} | " + " | ".join(cells) + " |")
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(12, 5.5))
    for config in result["configurations"]:
        rows = [row for row in result["rows"] if row["configuration"] == config["key"] and row["ttft_s"] is not None]
        (line,) = axes.plot([row["index"] for row in rows], [row["ttft_s"] for row in rows], linewidth=1.2, label=config["key"])
        for lane, marker in LANE_MARKERS.items():
            lane_rows = [row for row in rows if row["lane"] == lane]
            axes.scatter([row["index"] for row in lane_rows], [row["ttft_s"] for row in lane_rows], marker=marker, color=line.get_color(), s=28, zorder=3)
    for lane, marker in LANE_MARKERS.items():
        axes.scatter([], [], marker=marker, color="gray", label=f"lane {lane}")
    fan_out = [row["index"] for row in result["rows"] if row.get("fan_out")]
    if fan_out:
        axes.axvspan(min(fan_out) - 0.5, max(fan_out) + 0.5, color="gray", alpha=0.12)
        axes.annotate("fan-out (concurrent)", (min(fan_out) - 0.4, 0.92), xycoords=("data", "axes fraction"), va="top", color="gray")
    clear = next((row["index"] for row in result["rows"] if row["conversation"] == 1), None)
    if clear is not None:
        axes.axvline(clear - 0.5, color="gray", linestyle=":", linewidth=1)
        axes.annotate("/clear", (clear - 0.4, 0.98), xycoords=("data", "axes fraction"), va="top", color="gray")
    axes.set_yscale("log")
    axes.set_xlabel("request (in session order)")
    axes.set_ylabel("time to first token (s, log scale)")
    session = result["session"]
    axes.set_title(f"TTFT per request, {session['requests']} requests, scale {session['scale']}, {result['model']['description']}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write(result: dict[str, Any], out_dir: Path, name: str = "latest") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md", out_dir / f"{name}.png"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(markdown(result))
    plot(result, paths[2])
    return paths
