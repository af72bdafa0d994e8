"""The drafts bench's Markdown (`bench/results/drafts/latest.md`), from its `latest.json`."""

from __future__ import annotations

from typing import Any

CONFIGURATIONS = {
    "ours-on": "ours, --draft on",
    "ours-off": "ours, --draft off (reference)",
    "ours-auto": "ours, --draft auto (the default)",
    "rapid-suffix": "Rapid-MLX --suffix-decoding",
}
KIND_NAMES = {"edit": "Edit after a Read", "write": "Write of a read function, one change", "tool_call": "tool-call JSON (a path from a grep)",
              "report": "report quoting a grep", "chat": "plain chat"}


def _cell(cell: dict[str, Any] | None) -> str:
    if not cell or cell.get("passes_per_token") is None:
        return "n/a"
    acceptance = f", {cell['acceptance']:.0%} of drafted accepted" if cell.get("acceptance") is not None else ""
    return f"{cell['passes_per_token']:.2f} ({cell['forward_passes']} / {cell['tokens']}{acceptance})"


def passes_table(result: dict[str, Any]) -> list[str]:
    columns = [key for key in ("ours-on/greedy", "ours-on/sampled", "ours-auto/greedy", "ours-off/greedy", "rapid-suffix/greedy", "rapid-suffix/sampled")
               if key in result["per_kind"]]
    header = " | ".join(f"{CONFIGURATIONS[key.split('/')[0]]}, {key.split('/')[1]}" for key in columns)
    lines = [f"| reply kind | {header} |", "|---|" + "---|" * len(columns)]
    for kind, name in KIND_NAMES.items():
        lines.append(f"| {name} | " + " | ".join(_cell(result["per_kind"][key].get(kind)) for key in columns) + " |")
    return lines


def curve_lines(curve: dict[str, Any]) -> list[str]:
    widths = sorted(curve["relative_cost_by_tokens"], key=int)
    return [
        "| drafted tokens k | " + " | ".join(str(int(width) - 1) for width in widths[1:]) + " |",
        "|---|" + "---|" * (len(widths) - 1),
        "| a verify of k+1 tokens costs (one-token steps) | " + " | ".join(f"{curve['relative_cost_by_tokens'][width]:.2f}" for width in widths[1:]) + " |",
        "| acceptance from which k drafted tokens pay (auto) | "
        + " | ".join("never" if (alpha := curve["break_even_acceptance"].get(str(int(width) - 1), curve["break_even_acceptance"].get(int(width) - 1))) is None
                     else f"{alpha:.2f}" for width in widths[1:]) + " |",
    ]


def markdown(result: dict[str, Any]) -> str:
    exact = result["exact_greedy"]
    auto = result.get("auto_decision") or {}
    curve = result["cost_curve"]
    lines = [
        "# Drafted decoding on real weights",
        "",
        f"{result['model']}, tasks built from {', '.join(result['functions'])} (Python's standard library as installed: each function "
        f"read, and a grep of its module), one of each reply kind per function; {result['max_tokens']} tokens at most per reply, greedy and "
        f"sampled (temperature {result['sampled']['temperature']}, top-p {result['sampled']['top_p']}); one request at a time, each "
        f"configuration a server of its own. Finished {result['finished']}.",
        "",
        "## Target forward passes per output token (hardware-independent; lower is better, 1.00 is plain decoding)",
        "",
        *passes_table(result),
        "",
        f"Greedy answers with drafts on equal the reference's (drafts off) text for text: {exact['identical']} of {exact['compared']}"
        + (f"; different: {', '.join(exact['different'])}" if exact["different"] else "") + ".",
        "",
        "## Targets",
        "",
        "| reply kind | target | ours (--draft on, greedy) | met |",
        "|---|---|---|---|",
    ]
    for kind, target in result["targets"].items():
        if kind == "better_than_rapid_mlx":
            continue
        met = "unknown" if target["met"] is None else "met" if target["met"] else "NOT met"
        value = "n/a" if target["ours"] is None else f"{target['ours']:.2f}"
        lines.append(f"| {KIND_NAMES[kind]} | <= {target['target']} | {value} | {met} |")
    lines += ["", "Against Rapid-MLX's suffix decoding (greedy, same prompts): " + "; ".join(
        f"{KIND_NAMES[kind]} {pair['ours']} vs {pair['rapid_mlx']}" for kind, pair in result["targets"]["better_than_rapid_mlx"].items()) + ".", ""]
    lines += [
        "## The verify-cost curve on this CPU",
        "",
        f"{curve['source']}; one one-token step {curve['one_token_step_s'] * 1000:.0f} ms.",
        "",
        *curve_lines(curve),
        "",
        f"The default (`--draft auto`) decided here: **{auto.get('drafting', 'n/a')}** ({auto.get('reason', 'n/a')}).",
        "",
        "## PROJECTION: where a k-token verify costs one step (an Apple GPU, decode bound by reading the weights)",
        "",
        "Not measured: the decode time per token ours-on's forward passes would take if every forward cost one step of this machine.",
        "",
        "| reply kind | plain, s per token | drafted, s per token (projected) | speed-up (projected) |",
        "|---|---|---|---|",
    ]
    for kind, figures in result["projection"].items():
        lines.append(f"| {KIND_NAMES[kind]} | {figures['plain_s_per_token']:.3f} | {figures['drafted_s_per_token']:.3f} | {figures['speed_up']:.2f}x |")
    return "\n".join(lines) + "\n"
