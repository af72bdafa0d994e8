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


def markdown(result: dict[str, Any]) -> str:
    session, model = result["session"], result["model"]
    lines = [
        f"Session: {session['requests']} requests (seed {session['seed']}, scale {session['scale']}: "
        f"main prefix {session['main_prefix_tokens']:,} tokens, largest prompt {session['largest_prompt_tokens']:,} tokens); "
        f"model: {model['description']}; machine: {result['machine']}.",
        f"Command: `{result['command']}`",
        "",
        "| configuration | cold TTFT (median) | warm TTFT (median) | reuse efficiency | warm TTFT growth per 1K prompt tokens | warm TTFT / prefill of its new tokens on top of its reused prefix (median) | warm TTFT / cold prefill of as many tokens from nothing (median) | tokens prefilled | proxy added TTFT p50 / p95 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for config in result["configurations"]:
        summary = config["summary"]
        overhead = "-"
        if config["addon"]:
            overhead = f"{_ms(summary.get('proxy_overhead_ms_p50'))} / {_ms(summary.get('proxy_overhead_ms_p95'))}"
        prefilled = summary["tokens_prefilled"]
        lines.append(
            f"| {config['key']}: {config['title']} | {_seconds(summary['cold_ttft_median_s'])} | "
            f"{_seconds(summary['warm_ttft_median_s'])} | {_ratio(summary['reuse_efficiency'])} | "
            f"{_growth(summary['warm_ttft_growth_ms_per_1k_tokens'])} | "
            f"{_times(summary.get('warm_ttft_over_incontext_prefill_median'))} | "
            f"{_times(summary.get('warm_ttft_over_cold_prefill_of_new_tokens_median'))} | "
            f"{'n/a' if prefilled is None else f'{prefilled:,}'} of {summary['prompt_tokens']:,} | {overhead} |"
        )
    beyond = [
        f"{config['key'].split('-', 1)[0]}: {_seconds(config['summary'].get('warm_ttft_minus_incontext_prefill_median_s'))}"
        for config in result["configurations"]
        if config["summary"].get("warm_ttft_minus_incontext_prefill_median_s") is not None
    ]
    if beyond:
        lines += ["", "Warm TTFT minus the in-context prefill of its new tokens (median; the server's per-request cost beyond the model's compute): " + ", ".join(beyond) + "."]
    lanes = sorted({lane for config in result["configurations"] for lane in config["summary"]["lanes"]})
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
    lines += contributions(result) + notable_table(result)
    overhead = result.get("proxy_overhead")
    if overhead:
        lines += [
            "",
            f"Proxy overhead for a {overhead['body_bytes'] / 1000:.0f} KB request against a loopback stub upstream "
            f"({overhead['addon']['added_ttft_ms']['samples']} request pairs each; proxied minus direct, p50 / p95). "
            f"Added time to first token: the stub sends its headers at once and its first content event "
            f"{overhead['first_token_delay_ms']:.0f} ms later, as an engine that prefills. "
            "Added total time: the stub answers everything at once.",
            "",
            "| proxy | added time to first token | added total time, instant upstream |",
            "|---|---|---|",
        ]
        for key, what in OVERHEAD_VARIANTS.items():
            if key in overhead:
                ttft, total = overhead[key]["added_ttft_ms"], overhead[key]["added_total_instant_upstream_ms"]
                lines.append(f"| {what} | {_ms(ttft['p50'])} / {_ms(ttft['p95'])} | {_ms(total['p50'])} / {_ms(total['p95'])} |")
    return "\n".join(lines) + "\n"


def contributions(result: dict[str, Any]) -> list[str]:
    """What each fix buys: configuration 1 -> 2 -> 4 and 3 -> 4."""
    summaries = {config["key"].split("-", 1)[0]: config["summary"] for config in result["configurations"]}
    steps = [
        ("1", "2", "the addon alone, on vllm-mlx as shipped"),
        ("2", "4", "the engine patch, behind the addon"),
        ("3", "4", "the addon, in front of the patched engine"),
    ]
    lines = []
    for before, after, what in steps:
        if before not in summaries or after not in summaries:
            continue
        a, b = summaries[before], summaries[after]
        main_a, main_b = a["lanes"].get("main", {}), b["lanes"].get("main", {})
        lines.append(
            f"- {before} -> {after}, {what}: reuse efficiency {_ratio(a['reuse_efficiency'])} -> {_ratio(b['reuse_efficiency'])}; "
            f"tokens prefilled {a['tokens_prefilled'] or 0:,} -> {b['tokens_prefilled'] or 0:,}; "
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


def write(result: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "latest.json", out_dir / "latest.md", out_dir / "latest.png"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(markdown(result))
    plot(result, paths[2])
    return paths
