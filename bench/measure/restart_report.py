"""The restart scenario's Markdown (`restart.md`): cold against restored per configuration, every request after a
restart, and the restore throughput with its projection."""

from __future__ import annotations

from typing import Any

from stable_prefix.bench.measure.report import _seconds, _tokens


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Restart scenario (`{result['command']}`, {result['generated_at']}, {result['duration_s']:.0f} s, {result['machine']}); "
             f"model {result['model']} ({result['model_description']}); session scale {result['scale']}: {result['requests_before']} requests of the first "
             "conversation, a restart, then either the interrupted conversation's next requests (resume) or a new "
             "conversation's first requests; no warm-up request after a start.", ""]
    lines += ["| configuration | shutdown | after the restart | first main request: prompt tokens | reusable at best | cold TTFT | restored TTFT | restored / cold | tokens reused (restored) | from disk |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for config in result["configurations"]:
        for name in result["scenarios"]:
            head = config["headline"].get(name) or {}
            ratio = head.get("restored_over_cold")
            lines.append(f"| {config['title']} | {config['shutdown']} | {name.replace('_', ' ')} | {_tokens(head.get('prompt_tokens'))} | "
                         f"{_tokens(head.get('reusable_at_best'))} | {_seconds(head.get('cold_ttft_s'))} | {_seconds(head.get('restored_ttft_s'))} | "
                         f"{'n/a' if ratio is None else f'{ratio:.2f}x'} | {_tokens(head.get('restored_reused_tokens'))} | {_tokens(head.get('tokens_from_disk'))} |")
    lines += ["", "Every request after a restart (reuse `unknown`: the server reports none):", "",
              "| configuration | after the restart | request | lane | prompt | reusable at best | cold TTFT | restored TTFT | reused cold / restored | from disk |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for config in result["configurations"]:
        for name in result["scenarios"]:
            for restored, cold in zip(config[name]["restored"], config[name]["cold"]):
                lines.append(f"| {config['key']} | {name.replace('_', ' ')} | #{restored['index']} | {restored['lane']} | {_tokens(restored['prompt_tokens'])} | "
                             f"{_tokens(restored.get('reusable_at_best'))} | {_seconds(cold['ttft_s'])} | {_seconds(restored['ttft_s'])} | "
                             f"{_tokens(cold['reused_tokens'])} / {_tokens(restored['reused_tokens'])} | {_tokens(restored['tokens_from_disk'])} |")
    throughput = result.get("throughput")
    if throughput:
        rate = throughput["load_gb_per_s"]
        projection = throughput["projection"]
        lines += ["", f"Restore throughput, {throughput['file_bytes'] / 2**30:.2f} GiB state in Qwen3-Coder-30B-A3B's layout "
                  f"({throughput['tokens']:,} tokens x {throughput['layout']['bytes_per_token'] // 1024} KiB), through the disk tier's code "
                  f"(best of {len(throughput['load_s']['page_cache'])}):", "",
                  "| | seconds | GB/s |", "|---|---|---|",
                  f"| write (writer thread: CRC, write, fsync, rename) | {throughput['write_s']:.2f} | {throughput['write_gb_per_s']:.2f} |",
                  f"| load from the page cache (manifest, each block: header, mx.load, CRC per tensor) | {throughput['load_s_best']['page_cache']:.2f} | {rate['page_cache']:.2f} |"]
        if rate["device"] is not None:
            lines.append(f"| load from the device (page cache dropped for the files) | {throughput['load_s_best']['device']:.2f} | {rate['device']:.2f} |")
        lines += ["", f"Time on the request path to queue the write: {throughput['submit_s'] * 1000:.1f} ms. Loaded state equal to the written one: "
                  f"{throughput['loaded_state_equals_written']}.",
                  f"Projection: a {projection['tokens']:,}-token Qwen3-Coder-30B-A3B prefix is {projection['bytes'] / 2**30:.2f} GiB; "
                  f"reading it at {projection['assumed_ssd_gb_per_s']:.0f} GB/s (assumed for a Mac SSD) and then running the whole pipeline "
                  f"at the {projection['pipeline_gb_per_s_measured_here']:.2f} GB/s measured here from the page cache, one after the other, "
                  f"takes at most {projection['seconds']:.1f} s."]
    return "\n".join(lines) + "\n"
