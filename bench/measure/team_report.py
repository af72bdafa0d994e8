"""The team bench's outputs: `latest.json` (everything, with every request's row) and `latest.md`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stable_prefix.bench.clients.agent_clients import CLIENTS
from stable_prefix.bench.measure.report import _interval_times, _seconds, _times, _tokens, verdict


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _paired(pairs: dict[str, Any] | None) -> str:
    if not pairs or pairs.get("median") is None:
        return "n/a"
    return f"{_times(pairs['median'])}{_interval_times(pairs.get('ci95'))} ({pairs['requests']})"


def _met(met: bool | None) -> str:
    return "unknown" if met is None else "met" if met else "NOT met"


def _replicas(result: dict[str, Any]) -> str:
    return " / ".join(f"{name} {figures['requests']}" for name, figures in result["replicas"].items())


def configurations_table(result: dict[str, Any]) -> list[str]:
    lines = [
        "| configuration | tokens prefilled (of prompt tokens) | requests per replica (balance) | lanes on one replica | warm TTFT | warm turn | "
        "warm TTFT / alone, paired | lost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, config in result["configurations"].items():
        on_one = config["lanes_on_one_replica"]
        balance = f" ({_times(config['balance'])})" if config["balance"] else ""
        against = (config.get("paired_against_alone") or {}).get("warm_ttft")
        lines.append(
            f"| `{key}`: {config['title']} | {_tokens(config['tokens_prefilled'])} (of {_tokens(config['prompt_tokens'])}) | "
            f"{_replicas(config)}{balance} | {on_one['on_one_replica']} of {on_one['lanes']} | {_seconds(config['warm_ttft_median_s'])} | "
            f"{_seconds(config['warm_turn_median_s'])} | {_paired(against)} | {config['requests_lost']} |"
        )
    return lines


def lanes_table(result: dict[str, Any]) -> list[str]:
    configs = result["configurations"]
    lanes = sorted({lane for config in configs.values() for lane in config["lanes"]})
    lines = ["| lane | " + " | ".join(f"`{key}`" for key in configs) + " |", "|---|" + "---|" * len(configs)]
    for lane in lanes:
        cells = []
        for config in configs.values():
            figures = config["lanes"].get(lane)
            cells.append("-" if not figures else f"{_seconds(figures['warm_ttft_median_s'])} / {_seconds(figures['warm_turn_median_s'])}")
        lines.append(f"| {lane} | " + " | ".join(cells) + " |")
    return lines


def key_decision_lines(decision: dict[str, Any] | None) -> list[str]:
    if not decision:
        return ["Not measured in this run (it needs `key-smg` and `lane-key-smg`)."]
    prefilled, balance, ttft, fan_out = (decision[k] for k in ("tokens_prefilled", "balance", "warm_ttft_median_s", "fan_out_wall_s"))
    ttft_pairs, turn_pairs = decision["paired_warm_ttft_head_over_lane"], decision["paired_warm_turn_head_over_lane"]
    return [
        "| | head key (`key-smg`) | per-lane key (`lane-key-smg`) |",
        "|---|---|---|",
        f"| tokens prefilled | {_tokens(prefilled['head'])} | {_tokens(prefilled['lane'])} |",
        f"| balance (busier replica's requests / the other's) | {_times(balance['head'])} | {_times(balance['lane'])} |",
        f"| warm TTFT median | {_seconds(ttft['head'])} | {_seconds(ttft['lane'])} |",
        f"| fan-out groups' wall time, summed | {_seconds(fan_out['head'])} | {_seconds(fan_out['lane'])} |",
        "",
        f"Paired, request by request, head over per-lane: warm TTFT {_paired(ttft_pairs)} {verdict(ttft_pairs)}, "
        f"warm turn {_paired(turn_pairs)} {verdict(turn_pairs)} (below 1: the head key is faster).",
    ]


def failover_lines(result: dict[str, Any]) -> list[str]:
    config = result["configurations"].get("failover-haproxy")
    if not config:
        return ["Not run."]
    events, moved = config["events"], config["moved"]
    against = moved.get("against_undisturbed")
    lines = [
        f"Replica B was SIGKILLed at {events.get('killed_at_s', 0):.1f} s ({events.get('answered_at_kill')} requests answered) and started again at "
        f"{events.get('restart_began_s', 0):.1f} s (ready at {events.get('restarted_at_s', 0):.1f} s; {events.get('answered_at_restart')} answered); "
        f"the run took {events['wall_s']:.1f} s.",
        f"- requests whose lane moved to the other replica: {moved['requests']} ({moved['after_kill']} after the kill, the rest back after the restart); "
        f"they reused {_tokens(moved['reused_tokens'])} of their {_tokens(moved['prompt_tokens'])} prompt tokens ({_share(moved['reuse_of_prompt'])}; "
        f"the lowest {_share(moved['lowest_reuse_of_prompt'])})",
        "- disk restores logged: " + " / ".join(f"{name} {figures['disk_loads']}" for name, figures in config["replicas"].items()),
        f"- requests lost: {config['requests_lost']} ({json.dumps(config['lost_by_kind'])}; refused: no answer, error event: a stream cut and ended "
        "with the protocol's error event, cut: a stream cut silently)"
        + "".join(f"\n  - {lost['index']} {lost['lane']}: {lost['loss']}, status {lost['status']}, {lost['error']}" for lost in config["lost"]),
    ]
    if against:
        lines.append(f"- the same {against['requests']} requests in `{against['configuration']}` (no kill) reused {_tokens(against['reused_without'])} "
                     f"of their {_tokens(against['prompt_tokens_without'])} prompt tokens; with the failover {_tokens(against['reused_with_failover'])} "
                     f"({_share(against['share_of_undisturbed_reuse'])} of the undisturbed reuse)")
    return lines


def recovery_lines(result: dict[str, Any]) -> list[str]:
    """Per failover run: what the users, each behaving as one agent does, lost when replica B died."""
    runs = {key: config for key, config in result["configurations"].items() if config["failover"]}
    if not runs:
        return ["Not run."]
    lines = ["| configuration | users behave as | streams cut (how they ended for the client) | recovered by the agent | recovered by the proxy | lost "
             "| from the cut to the whole answer (median, max) |", "|---|---|---|---|---|---|---|"]
    for key, config in runs.items():
        recovery = config["recovery"]
        seconds = f"{_seconds(recovery['recovery_s_median'])}, {_seconds(recovery['recovery_s_max'])}" if recovery["recovery_s_median"] is not None else "n/a"
        lines.append(f"| `{key}` | {CLIENTS[config['client']].name} ({CLIENTS[config['client']].protocol}) | {recovery['cut']} "
                     f"({', '.join(f'{form} {count}' for form, count in recovery['cut_forms'].items()) or 'none'}) | "
                     f"{recovery['recovered_by_agent']} | {recovery['recovered_by_proxy']} | {recovery['lost']} | {seconds} |")
    lines += ["", "An agent that sends a cut request again does so at once here (its own back-off is not modelled): the agent's figure is "
              "its second request's time; the proxy's, the recovery it logged (`stream_recovery`). Where the kill found replica B "
              "decoding a reply (`killed while decoding`), a stream was cut mid-reply; the others in flight were cut where they were: "
              + ", ".join(f"`{key}` {config['events'].get('killed_while_decoding')}" for key, config in runs.items())]
    return lines


def balance_lines(result: dict[str, Any]) -> list[str]:
    """The key's placement with and without HAProxy's bounded load, and smg's, against one replica alone."""
    keys = [key for key in ("key-haproxy", "key-haproxy-bounded", "key-smg") if key in result["configurations"]]
    if not keys:
        return ["Not measured in this run."]
    alone = result["configurations"].get("alone")
    lines = ["| configuration | requests per replica (balance) | tokens prefilled | against one replica alone | lanes on one replica |",
             "|---|---|---|---|---|"]
    for key in keys:
        config = result["configurations"][key]
        ratio = _times(config["tokens_prefilled"] / alone["tokens_prefilled"]) if alone and alone["tokens_prefilled"] else "n/a"
        on_one = config["lanes_on_one_replica"]
        balance = f" ({_times(config['balance'])})" if config["balance"] else ""
        lines.append(f"| `{key}` | {_replicas(config)}{balance} | {_tokens(config['tokens_prefilled'])} | {ratio} | "
                     f"{on_one['on_one_replica']} of {on_one['lanes']} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    team = result["team"]
    sizes = ", ".join(f"{user} {count}" for user, count in team["requests_per_user"].items())
    lines = [
        "# The team bench (`make bench-team`)",
        "",
        f"{result['generated_at']}, commit {result['commit']}; {result['machine']['cpu']}; model `{result['model']['path']}` "
        f"({result['model']['model_type']}, {result['model']['dtype']}).",
        f"{team['users']} users at once (requests each: {sizes}; session scale {team['scale']}; max_tokens {team['max_tokens']}, greedy), each through "
        f"their own proxy into two patched replicas sharing one `--prefix-cache-dir`; key header `{team['key_header']}`; "
        f"{team['rounds']} round(s) in the order {', '.join(team['order'])}" + (" and back" if team["rounds"] > 1 else "") + ".",
        "Two replicas on one small CPU share its cores: they do not double the compute, so times are secondary here; tokens prefilled "
        "(each engine's own usage) and placement (each replica's own log) are the point.",
        "",
        "## Per configuration",
        "",
        *configurations_table(result),
        "",
        "Warm TTFT / warm turn per lane (all users):",
        "",
        *lanes_table(result),
        "",
        "## The routing key: head key against per-lane key",
        "",
        *key_decision_lines(result["key_decision"]),
        "",
        "## Failover",
        "",
        *failover_lines(result),
        "",
        "## What a user loses when a replica dies mid-reply, per agent",
        "",
        *recovery_lines(result),
        "",
        "## Balance: bounded-load consistent hashing",
        "",
        *balance_lines(result),
        "",
        "## Targets",
        "",
        "| target | value | result | detail |",
        "|---|---|---|---|",
        *(f"| {t['target']} | {'n/a' if t['value'] is None else round(t['value'], 3)} | {_met(t['met'])} | {t['detail']} |" for t in result["targets"]),
        "",
    ]
    return "\n".join(lines)


def write(result: dict[str, Any], out_dir: Path, name: str = "latest") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(markdown(result))
    return paths
