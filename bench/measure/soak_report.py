"""The soak's Markdown (`make soak`: bench/results/soak/latest.md and docs/reliability.md's figures): the soak's growth per
1,000 requests, its budgets and restarts, and the load scenario's clients."""

from __future__ import annotations


def markdown(run: dict) -> str:
    soak, load = run["soak"], run.get("load")
    mib = 2**20
    slopes = soak["slope_per_1000_requests"]

    def per_1000(name: str, unit: float = mib, suffix: str = " MiB") -> str:
        value = slopes.get(name)
        return "n/a" if value is None else f"{value / unit:+.2f}{suffix}"

    lines = [
        f"Run: {run['when']}, commit `{run['commit']}`, `{run['command']}`, model `{run['model']}`, engine `{run['engine']}`, "
        f"on {run['machine']}.",
        "",
        f"**Soak**: {soak['requests']} requests ({', '.join(soak['lanes'])}) through `stable-prefix up` in {soak['wall_s']:.0f} s, "
        f"{soak['engine_lives']} engine lives (SIGKILL between them); {soak['complete']} complete, {len(soak['errors'])} errors. "
        f"One answer in {run['settings']['soak']['check_every']} compared with an uncached engine's: "
        f"{soak['compared_with_uncached'] - len(soak['mismatched'])} of {soak['compared_with_uncached']} identical.",
        "",
        "| figure | growth per 1,000 requests (steepest engine life, its second half) |",
        "|---|---|",
        *[f"| {name.replace('_', ' ')} | {per_1000(name, *( (1, '') if 'threads' in name or 'files' in name else (mib, ' MiB')))} |"
          for name in slopes],
        "",
        f"Budgets (RAM {soak['budgets']['ram']}, disk {soak['budgets']['disk']}) held at {soak['samples_within_budgets']} of "
        f"{soak['samples']} samples; the most held: {soak['ram_cache_mib_max']} MiB in RAM, {soak['disk_cache_mib_max']} MiB on disk.",
        "First request after each restart (tokens reused / prompt): "
        + (", ".join(f"{r['reused']} / {r['prompt']} ({r['lane']})" for r in soak["first_request_after_each_restart"]) or "none"),
    ]
    if soak.get("proxy_rss_per_life"):
        lanes = soak.get("subagent_lanes") or 0
        lines.append(
            f"Proxy RSS per engine life (MiB, first → last, growth per 1,000 requests) with {lanes} new subagent lanes"
            + (f" (one every {soak['requests'] / lanes:.0f} requests)" if lanes else "") + ": "
            + ", ".join(f"requests {r['requests'][0]}-{r['requests'][1]}: {r['first_mib']} → {r['last_mib']} "
                        f"({'n/a' if r['per_1000_requests_mib'] is None else format(r['per_1000_requests_mib'], '+.2f')})"
                        for r in soak["proxy_rss_per_life"]) + ".")
    if load:
        lines += [
            "",
            f"**Load**: {load['clients']} clients for {load['duration_s']:.0f} s through the proxy: {load['requests']} requests "
            f"({', '.join(load['lanes'])}), {load['completed']} completed, {load['gave_up_before_first_token']} abandoned before "
            f"the first token and {load['gave_up_mid_stream']} mid-stream on purpose; lost {len(load['lost'])}, forwarded twice "
            f"{len(load['forwarded_twice'])}; {load['compared_with_uncached'] - len(load['mismatched'])} of "
            f"{load['compared_with_uncached']} completed answers identical to the request's answer alone (uncached). "
            f"Time to first token median {load['ttft_s_median']} s, p95 {load['ttft_s_p95']} s; the engine's queue wait "
            f"mean {load['engine_queue_wait_s_mean']} s, max {load['engine_queue_wait_s_max']} s; {load['engine_prefills_stopped']} "
            f"prefills stopped for a client gone. RSS (MiB, first / last / max): proxy {load['proxy_rss_mib_first_last_max']}, "
            f"engine {load['engine_rss_mib_first_last_max']}.",
        ]
    return "\n".join(lines) + "\n"
