"""`bench/servers_vllm.py`'s Markdown: tokens prefilled per configuration, each against one replica through the proxy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DESCRIPTIONS = {
    "straight": "one replica, no proxy",
    "one": "one replica, through the proxy",
    "key": "two replicas, vllm-router on our key",
    "round_robin": "two replicas, vllm-router round robin",
    "prefix": "two replicas, vllm-router cache-aware",
}


def configurations_table(result: dict[str, Any]) -> list[str]:
    configurations = result["configurations"]
    alone = configurations.get("one", {}).get("prefilled")
    lines = ["| configuration | tokens prefilled | of prompt tokens | / one replica through the proxy | lanes on one replica | "
             "requests per replica | failed |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for name, figures in configurations.items():
        against = f"{figures['prefilled'] / alone:.2f}x" if alone else "n/a"
        share = f"{figures['prefilled'] / figures['prompt_tokens']:.1%}" if figures["prompt_tokens"] else "n/a"
        per_replica = " / ".join(map(str, figures["requests_per_replica"])) if name not in ("straight", "one") else str(figures["requests"])
        lines.append(f"| {name}: {DESCRIPTIONS.get(name, name)} | {figures['prefilled']:,} | {share} of {figures['prompt_tokens']:,} | {against} | "
                     f"{figures['lanes_on_one_replica']} of {figures['lanes']} | {per_replica} | {figures['failed']} |")
    return lines


def write_report(result: dict[str, Any], path: Path) -> None:
    lines = [
        "# vLLM for a team: tokens prefilled (vLLM's own counters)",
        "",
        f"`python -m stable_prefix.bench.servers_vllm --scale {result['scale']}`: {result['vllm']}, vllm-router {result['vllm_router']}, "
        f"{result['model']}; the Claude Code-shaped session's first conversation ({result['requests']} requests: main turns, a title, three "
        f"Explore instances at once, a general-purpose subagent), request by request, all configurations in one run ({result['seconds']} s). "
        "Tokens prefilled: per replica `vllm:prompt_tokens_total` less `vllm:prefix_cache_hits_total` (vLLM's block size on a CPU, 128 "
        "tokens: a prompt's last partial block is always prefilled); each replica's prefix cache emptied between configurations.",
        "",
        *configurations_table(result),
        "",
        "Failed: answered 400 by vLLM. Straight, the requests after Claude Code's ToolSearch result (a `tool_reference` block) fail: the "
        "model's chat template takes text only; through the proxy the same requests are answered. Our key keeps each lane on one replica, a "
        "subagent type's instances (which share their head) together; lanes whose prompts share nothing may sit on different replicas at "
        "no cost. Round robin alternates a lane's requests between the replicas: each prefills what the other holds.",
        "",
    ]
    path.write_text("\n".join(lines))
