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
    session, model, replay = result["session"], result["model"], result.get("replay") or {}
    fan_out = session.get("fan_out") or {}
    replies = session.get("reply_tokens") or {}
    lines = [
        f"Session: {session['requests']} requests (seed {session['seed']}, scale {session['scale']}: "
        f"main prefix {session['main_prefix_tokens']:,} tokens, largest prompt {session['largest_prompt_tokens']:,} tokens"
        + (f"; first {session['limit']} requests of the session" if session.get("limit") else "")
        + (f"; {_fan_out_description(fan_out)}" if fan_out.get("requests") else "")
        + (f"; {session['beside']} title requests sent beside a main turn" if session.get("beside") else "")
        + f"); model: {model['description']}; machine: {result['machine']}.",
        f"Replies: {_replies(replay)}"
        + (f"; the session's own replies are {replies['total']:,} tokens (median {replies['median']:,}, largest {replies['max']:,})" if replies else "")
        + ".",
        f"Command: `{result['command']}`",
        "",
        "| configuration | tokens prefilled | warm TTFT | warm turn time | cold TTFT | cold turn time | output tokens | decode tokens/s "
        "| fan-out wall time | title beside a main turn: TTFT / turn time | session wall time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for config in result["configurations"]:
        summary = config["summary"]
        beside = summary.get("beside") or {}
        lines.append(
            f"| {config['key']}: {config['title']} | {_tokens(summary['tokens_prefilled'])} of {summary['prompt_tokens']:,} | "
            f"{_seconds(summary['warm_ttft_median_s'])} | {_seconds(summary.get('warm_turn_median_s'))} | "
            f"{_seconds(summary['cold_ttft_median_s'])} | {_seconds(summary.get('cold_turn_median_s'))} | "
            f"{_tokens(summary.get('output_tokens'))} | {_rate(summary.get('decode_tokens_per_s'))} | {_fan_out(summary)} | "
            f"{_seconds(beside.get('ttft_median_s'))} / {_seconds(beside.get('turn_median_s'))} | {_seconds(summary.get('session_wall_s'))} |"
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
        "Medians; turn time: from sending a request to the end of its reply's stream. Tokens prefilled count every request, fan-out included; "
        "TTFT and turn-time medians leave out the fan-out group's requests (concurrent: their times include waiting for each other), "
        "which are measured by the group's wall time. Decode tokens/s: output tokens after the first over the time after the first token, "
        "requests outside the fan-out group. Session wall time: every step of the replay from its first request sent to its last "
        "answer ended, summed (what a user of the session waits for; a fan-out group or a title beside its turn counted once).",
    ]
    lanes = _timed_lanes(result)
    lines += [
        "", "Warm TTFT / warm turn time per lane, medians (cold in parentheses):", "",
        "| configuration | " + " | ".join(lanes) + " |", "|---" * (len(lanes) + 1) + "|",
    ]
    for config in result["configurations"]:
        cells = []
        for lane in lanes:
            lane_summary = config["summary"]["lanes"].get(lane)
            if lane_summary is None:
                cells.append("-")
                continue
            cells.append(
                f"{_seconds(lane_summary['warm_ttft_median_s'])} / {_seconds(lane_summary.get('warm_turn_median_s'))} "
                f"({_seconds(lane_summary['cold_ttft_median_s'])} / {_seconds(lane_summary.get('cold_turn_median_s'))})"
            )
        lines.append(f"| {config['key']} | " + " | ".join(cells) + " |")
    lines += paired_table(result) + targets_table(result) + secondary_table(result) + contributions(result) + notable_table(result)
    overhead = result.get("proxy_overhead")
    if overhead:
        lines += proxy_overhead_table(overhead)
    return "\n".join(lines) + "\n"


def _fan_out_description(fan_out: dict[str, Any]) -> str:
    if fan_out.get("mode") == "rounds":
        return (f"a fan-out of {fan_out['instances']} concurrent subagent instances (two Explore, one general-purpose) "
                f"sent in {fan_out['groups']} rounds, {fan_out['requests']} requests")
    return f"a fan-out group of {fan_out['instances']} concurrent subagent instances, {fan_out['requests']} requests"


def _replies(replay: dict[str, Any]) -> str:
    greedy = "greedy (temperature 0)" if replay.get("temperature") == 0 else f"temperature {replay.get('temperature', 'as the client sent it')}"
    policy = replay.get("max_tokens")
    limit = {
        "proxy": "max_tokens as the addon caps it (the client's, at most 8,192), the same for every configuration",
        "session": "max_tokens the session's own reply length",
    }.get(policy, f"max_tokens {policy}")
    return f"{greedy}, {limit}"


def _fan_out(summary: dict[str, Any]) -> str:
    if summary.get("fan_out_wall_s") is None:
        return "n/a"
    return f"{_seconds(summary['fan_out_wall_s'])} ({_tokens(summary.get('fan_out_output_tokens'))} output tokens)"


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


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


def _summaries(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {config["key"]: config["summary"] for config in result["configurations"]}


PAIRED_ROWS = (  # (label, the comparison's key, cold lanes' key)
    ("TTFT", "paired_ttft_ratio", "paired_cold_ttft_ratio"),
    ("turn time", "paired_turn_ratio", "paired_cold_turn_ratio"),
)


def _lane_pairs(result: dict[str, Any], anchor: dict[str, Any], figure: tuple[str, str, str]) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(what, lane, paired ratio) of one figure (a PAIRED_ROWS entry) for all lanes, then every lane the
    targets cover: its warm requests, or the cold ones of a lane that has no warm requests (title)."""
    label, warm_key, cold_key = figure
    product = _summaries(result)[result["comparison"]["product"]]
    pairs = [(f"warm {label}, all lanes", "", (anchor.get(warm_key) or {}).get("all"))]
    for lane in _timed_lanes(result):
        mine = product["lanes"].get(lane)
        if mine is None:
            continue
        cold_only = mine["warm_ttft_median_s"] is None
        key = cold_key if cold_only else warm_key
        pairs.append((f"{'cold' if cold_only else 'warm'} {label}, {lane}", lane, ((anchor.get(key) or {}).get("lanes") or {}).get(lane)))
    return pairs


# Too few pairs for an interval (a lane with one warm request): a ratio this close to 1 is
# called level, the spread of paired ratios between two configurations in one interleaved run
# on this machine (timings move +-20% between runs, much less within one).
SINGLE_PAIR_NOISE = 0.10


def verdict(pairs: dict[str, Any] | None) -> str:
    """"ahead", "level" (within noise), "behind" or "unknown", from a paired ratio's median and confidence interval."""
    if not pairs or pairs.get("median") is None:
        return "unknown"
    interval = pairs.get("ci95")
    if interval is None:
        interval = (pairs["median"] * (1 - SINGLE_PAIR_NOISE), pairs["median"] * (1 + SINGLE_PAIR_NOISE))
    return "ahead" if interval[1] < 1 else "behind" if interval[0] > 1 else "level"


def _paired_cell(pairs: dict[str, Any] | None) -> str:
    if not pairs or pairs.get("median") is None:
        return "n/a"
    rescaled = f", {pairs['rescaled']} rescaled" if pairs.get("rescaled") else ""
    return f"{_times(pairs['median'])}{_interval_times(pairs.get('ci95'))} {verdict(pairs)} ({pairs['requests']}{rescaled})"


def paired_table(result: dict[str, Any]) -> list[str]:
    """The product against each strongest anchor in the run, request by request."""
    anchors = (result.get("comparison") or {}).get("anchors") or {}
    if not anchors:
        return []
    keys = list(anchors)
    product = result["comparison"]["product"]
    lines = [
        "",
        f"The product ({product}) against the strongest anchors in this run, request by request: the median over the requests "
        "of product / anchor for the same request, sent in the same turn of the interleaved run, with its bootstrap 95% confidence "
        "interval; ahead (the interval below 1), level (it includes 1) or behind (a single pair has no interval: within +-10% it is "
        "level); in parentheses the requests paired. Turn times compare "
        "at equal output length: where the two decoded different numbers of tokens, the product's turn time is rescaled to the anchor's "
        "length by its own time per decoded token (\"rescaled\").",
        "",
        "| figure | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    for figure in PAIRED_ROWS:
        rows = [_lane_pairs(result, anchors[key], figure) for key in keys]
        for position, (what, _, _) in enumerate(rows[0]):
            lines.append(f"| {what} | " + " | ".join(_paired_cell(pairs[position][2]) for pairs in rows) + " |")
    for label, _, cold_key in PAIRED_ROWS:
        lines.append(f"| cold {label}, all lanes | " + " | ".join(_paired_cell((anchors[key].get(cold_key) or {}).get("all")) for key in keys) + " |")
    agreement_cells = []
    for key in keys:
        agreement = anchors[key].get("output_agreement") or {}
        differing = agreement.get("differing") or []
        listed = f"; differing: {', '.join(f'#{index}' for index in differing[:12])}{' ...' if len(differing) > 12 else ''}" if differing else ""
        agreement_cells.append(f"{agreement.get('equal', 0)} of {agreement.get('requests', 0)}{listed}")
    lines.append("| requests that decoded the same number of tokens (greedy) | " + " | ".join(agreement_cells) + " |")
    if any((anchors[key].get("paired_fan_out_ratio") or {}).get("groups") for key in keys):
        lines.append("| fan-out wall time, per group (round) | " + " | ".join(_fan_out_cell(anchors[key].get("paired_fan_out_ratio")) for key in keys) + " |")
    lines.append("| session wall time (one sample) | " + " | ".join(_paired_cell(session_wall_ratio(result, key)) for key in keys) + " |")
    return lines


def _fan_out_cell(pairs: dict[str, Any] | None) -> str:
    if not pairs or pairs.get("median") is None:
        return "n/a"
    return f"{_times(pairs['median'])}{_interval_times(pairs.get('ci95'))} {verdict(pairs)} ({pairs['groups']}; {pairs['equal_output']} at equal output)"


def session_wall_ratio(result: dict[str, Any], anchor: str) -> dict[str, Any] | None:
    """The product's session wall time over `anchor`'s: one sample per run (a paired ratio without an interval)."""
    summaries = _summaries(result)
    mine = summaries[result["comparison"]["product"]].get("session_wall_s")
    theirs = (summaries.get(anchor) or {}).get("session_wall_s")
    if mine is None or not theirs:
        return None
    return {"requests": 1, "median": mine / theirs, "ci95": None, "rescaled": 0}


FAN_OUT_TARGETS = {"plain": 0.95, "hybrid": 0.6}
# Issue 23's session: the product's session wall time at most this times Rapid-MLX's (9) and the batched anchor's (7).
SESSION_TARGETS = {"plain": {"9": 1.0, "7": 0.9}, "hybrid": {"9": 0.95, "7": 0.6}}


def targets_table(result: dict[str, Any]) -> list[str]:
    """Issue 16's targets for the product in this run."""
    comparison = result.get("comparison") or {}
    summaries = _summaries(result)
    product_key = comparison.get("product")
    if product_key not in summaries:
        return []
    product = summaries[product_key]
    anchors = {config["key"]: config["summary"] for config in result["configurations"] if not config.get("ours")}
    paired = comparison.get("anchors") or {}
    lines = [
        "",
        f"Targets (issue 16), the product ({product_key}) in this run:",
        "",
        "| target | in this run | |",
        "|---|---|---|",
    ]
    for figure in PAIRED_ROWS:
        label = figure[0]
        behind, unknown = [], []
        for key, anchor in paired.items():
            for _, lane, pairs in _lane_pairs(result, anchor, figure):
                if not lane:
                    continue  # all lanes together: the lanes are the target
                outcome = verdict(pairs)
                if outcome == "behind":
                    behind.append(f"{lane} against {key} ({_times(pairs['median'])}{_interval_times(pairs.get('ci95'))})")
                elif outcome == "unknown":
                    unknown.append(f"{lane} against {key}")
        found = "behind: " + "; ".join(behind) if behind else "ahead or level everywhere"
        found += f" (unknown: {', '.join(unknown)})" if unknown else ""
        status = "unknown" if not paired else "not met" if behind else "unknown" if unknown else "met"
        lines.append(f"| {label} on every lane (warm; cold where a lane has only cold requests): ahead of {', '.join(paired) or 'the strongest anchors'} or level within noise | {found} | {status} |")
    known = {key: summary["tokens_prefilled"] for key, summary in anchors.items() if summary.get("tokens_prefilled") is not None}
    if product.get("tokens_prefilled") is None or not known:
        lines.append(f"| tokens prefilled <= every anchor's | {_tokens(product.get('tokens_prefilled'))} | unknown |")
    else:
        fewest = min(known, key=known.get)
        unknown_anchors = [key for key in anchors if key not in known]
        found = f"{_tokens(product['tokens_prefilled'])}; the fewest of the anchors: {fewest} {_tokens(known[fewest])} ({_times(product['tokens_prefilled'] / known[fewest])})"
        found += f"; unknown for {', '.join(unknown_anchors)}" if unknown_anchors else ""
        lines.append(f"| tokens prefilled <= every anchor's | {found} | {_met(product['tokens_prefilled'] / known[fewest], 1.0) if not unknown_anchors else 'unknown'} |")
    lines.append(fan_out_target(result, product, anchors))
    lines += session_targets(result, product, anchors)
    return lines


def session_targets(result: dict[str, Any], product: dict[str, Any], anchors: dict[str, dict[str, Any]]) -> list[str]:
    """Issue 23: the whole session's wall time against Rapid-MLX and the batched anchor, where they ran."""
    attention = result["model"].get("attention", "plain")
    lines = []
    for number, limit in SESSION_TARGETS[attention].items():
        reference = next((key for key in anchors if key.split("-", 1)[0] == number), None)
        if reference is None:
            continue
        ratio = session_wall_ratio(result, reference)
        value = None if ratio is None else ratio["median"]
        found = f"{_seconds(product.get('session_wall_s'))}; {reference}: {_seconds(anchors[reference].get('session_wall_s'))} ({_times(value)}, one sample)"
        lines.append(f"| session wall time <= {limit}x {reference}'s (issue 23, {attention}) | {found} | {_met(value, limit)} |")
    return lines


def fan_out_target(result: dict[str, Any], product: dict[str, Any], anchors: dict[str, dict[str, Any]]) -> str:
    """<= 0.95x the best anchor's fan-out wall time on a plain-attention model, <= 0.6x the batched anchor's (7) on a hybrid."""
    attention = result["model"].get("attention", "plain")
    limit = FAN_OUT_TARGETS[attention]
    if attention == "plain":
        walls = {key: summary["fan_out_wall_s"] for key, summary in anchors.items() if summary.get("fan_out_wall_s") is not None}
        reference = min(walls, key=walls.get) if walls else None
        what = f"fan-out wall time <= {limit}x the best anchor's (plain attention)"
    else:
        reference = next((key for key in anchors if key.split("-", 1)[0] == ANCHOR_NUMBER), None)
        what = f"fan-out wall time <= {limit}x the batched anchor's ({ANCHOR_NUMBER}; hybrid: {', '.join(result['model'].get('cache_kinds', []))})"
    mine = product.get("fan_out_wall_s")
    theirs = anchors[reference]["fan_out_wall_s"] if reference else None
    ratio = None if mine is None or not theirs else mine / theirs
    found = f"{_seconds(mine)}; {reference}: {_seconds(theirs)} ({_times(ratio)})" if reference else f"{_seconds(mine)}; no anchor measured one"
    outputs = (product.get("fan_out_output_tokens"), anchors[reference].get("fan_out_output_tokens") if reference else None)
    if reference and outputs[0] != outputs[1]:
        found += f"; the group decoded {_tokens(outputs[0])} tokens, {reference} {_tokens(outputs[1])}: not equal work"
    return f"| {what} | {found} | {_met(ratio, limit)} |"


def secondary_table(result: dict[str, Any]) -> list[str]:
    """The earlier targets (issue 11) and yardsticks, for the product and the batched anchor behind the addon."""
    summaries = {key.split("-", 1)[0]: summary for key, summary in _summaries(result).items()}
    product, anchor = summaries.get(PRODUCT_NUMBER), summaries.get(ANCHOR_NUMBER)
    if product is None:
        return []
    anchor = anchor or {}
    new_content = product.get("warm_main_prefill_over_new_content") or {}
    anchor_new_content = anchor.get("warm_main_prefill_over_new_content") or {}
    incontext = product.get("warm_ttft_over_incontext_prefill_median")
    lines = [
        "",
        f"Earlier targets (issue 11) and yardsticks, the product ({PRODUCT_NUMBER}) and the batched anchor behind the addon ({ANCHOR_NUMBER}):",
        "",
        "| figure | product | anchor | |",
        "|---|---|---|---|",
        f"| warm main-lane tokens prefilled / its new content (previous reply + new messages; median, largest), target <= 1.1x | "
        f"{_times(new_content.get('median'))}, {_times(new_content.get('max'))} | "
        f"{_times(anchor_new_content.get('median'))}, {_times(anchor_new_content.get('max'))} | "
        f"median {_met(new_content.get('median'), 1.1)}, largest {_met(new_content.get('max'), 1.1)} |",
        f"| warm TTFT / in-context prefill of its new tokens (median), target <= 1.3x | {_times(incontext)} | "
        f"{_times(anchor.get('warm_ttft_over_incontext_prefill_median'))} | {_met(incontext, 1.3)} |",
        f"| reuse efficiency (of its own prompts) | {_ratio(product['reuse_efficiency'])} | {_ratio(anchor.get('reuse_efficiency'))} | |",
        f"| warm TTFT growth per 1K prompt tokens | {_growth(product['warm_ttft_growth_ms_per_1k_tokens'])} | {_growth(anchor.get('warm_ttft_growth_ms_per_1k_tokens'))} | |",
        f"| warm TTFT / cold prefill of as many tokens from nothing (median) | {_times(product.get('warm_ttft_over_cold_prefill_of_new_tokens_median'))} | "
        f"{_times(anchor.get('warm_ttft_over_cold_prefill_of_new_tokens_median'))} | |",
        f"| proxy added TTFT p50 [95% CI] / p95 | {_ms(product.get('proxy_overhead_ms_p50'))}{_interval(product.get('proxy_overhead_ms_p50_ci95'))} / "
        f"{_ms(product.get('proxy_overhead_ms_p95'))} | | |",
    ]
    beyond = [
        f"{config['key'].split('-', 1)[0]}: {_seconds(config['summary'].get('warm_ttft_minus_incontext_prefill_median_s'))}"
        for config in result["configurations"]
        if config["summary"].get("warm_ttft_minus_incontext_prefill_median_s") is not None
    ]
    if beyond:
        lines += ["", "Warm TTFT minus the in-context prefill of its new tokens (median; the server's per-request cost beyond the model's compute): " + ", ".join(beyond) + "."]
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
    """What each fix buys: configuration 1 -> 2 -> 4 and 3 -> 4, and the addon in front of each anchor."""
    summaries = {config["key"].split("-", 1)[0]: config["summary"] for config in result["configurations"]}
    steps = [
        ("1", "2", "the addon alone, on vllm-mlx as shipped"),
        ("2", "4", "the engine patch, behind the addon"),
        ("3", "4", "the addon, in front of the patched engine"),
        ("6", "7", "the addon, in front of vllm-mlx --continuous-batching"),
        ("7", "4", "the patched engine instead of --continuous-batching, behind the addon"),
        ("8", "9", "the addon, in front of Rapid-MLX"),
        ("9", "4", "the patched engine instead of Rapid-MLX, behind the addon"),
        ("10", "4", "the patched engine's default mode instead of --engine simple, behind the addon"),
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
            f"warm main-lane TTFT {_seconds(main_a.get('warm_ttft_median_s'))} -> {_seconds(main_b.get('warm_ttft_median_s'))}, "
            f"turn time {_seconds(main_a.get('warm_turn_median_s'))} -> {_seconds(main_b.get('warm_turn_median_s'))}; "
            f"warm TTFT growth {_growth(a['warm_ttft_growth_ms_per_1k_tokens'])} -> {_growth(b['warm_ttft_growth_ms_per_1k_tokens'])} per 1K tokens."
        )
    return ["", "What each fix contributes:", "", *lines] if lines else []


def notable_table(result: dict[str, Any]) -> list[str]:
    notable = result["session"].get("notable_requests") or []
    if not notable:
        return []
    keys = [config["key"] for config in result["configurations"]]
    rows = {(row["configuration"], row["index"]): row for row in result["rows"]}
    lines = [
        "", "Notable requests: TTFT / turn time (tokens reused / prompt tokens; output tokens):", "",
        "| request | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|",
    ]
    for note in notable:
        cells = []
        for key in keys:
            row = rows.get((key, note["index"]))
            if row is None:
                cells.append("-")
                continue
            if row.get("error") or row.get("status") != 200:
                # A refused or failed request has no figures to show: its status says what happened.
                cells.append(f"HTTP {row.get('status')}" if row.get("status") not in (None, 200) else "error")
                continue
            reused = "?" if row["reused_tokens"] is None else f"{row['reused_tokens']:,}"
            cells.append(f"{_seconds(row['ttft_s'])} / {_seconds(row['total_s'])} ({reused} / {_tokens(row['prompt_tokens'])}; {_tokens(row.get('output_tokens'))})")
        lines.append(f"| #{note['index']} {note['what']} | " + " | ".join(cells) + " |")
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    """TTFT and turn time per request, one line per configuration, a marker per lane."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(2, 1, figsize=(12, 9), sharex=True)
    for axes, field, what in ((panels[0], "ttft_s", "time to first token"), (panels[1], "total_s", "turn time")):
        for config in result["configurations"]:
            rows = [row for row in result["rows"] if row["configuration"] == config["key"] and row.get(field) is not None]
            (line,) = axes.plot([row["index"] for row in rows], [row[field] for row in rows], linewidth=1.2, label=config["key"])
            for lane, marker in LANE_MARKERS.items():
                lane_rows = [row for row in rows if row["lane"] == lane]
                axes.scatter([row["index"] for row in lane_rows], [row[field] for row in lane_rows], marker=marker, color=line.get_color(), s=28, zorder=3)
        fan_out = [row["index"] for row in result["rows"] if row.get("fan_out")]
        if fan_out:
            axes.axvspan(min(fan_out) - 0.5, max(fan_out) + 0.5, color="gray", alpha=0.12)
            axes.annotate("fan-out (concurrent)", (min(fan_out) - 0.4, 0.92), xycoords=("data", "axes fraction"), va="top", color="gray")
        clear = next((row["index"] for row in result["rows"] if row["conversation"] == 1), None)
        if clear is not None:
            axes.axvline(clear - 0.5, color="gray", linestyle=":", linewidth=1)
            axes.annotate("/clear", (clear - 0.4, 0.98), xycoords=("data", "axes fraction"), va="top", color="gray")
        axes.set_yscale("log")
        axes.set_ylabel(f"{what} (s, log scale)")
        axes.grid(True, which="both", alpha=0.3)
    for lane, marker in LANE_MARKERS.items():
        panels[0].scatter([], [], marker=marker, color="gray", label=f"lane {lane}")
    panels[0].legend(fontsize=8, ncol=3)
    panels[1].set_xlabel("request (in session order)")
    session = result["session"]
    panels[0].set_title(f"TTFT and turn time per request, {session['requests']} requests, scale {session['scale']}, {result['model']['description']}")
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
