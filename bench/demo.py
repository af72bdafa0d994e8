"""`make demo`: a Claude Code-shaped session through the whole stack, on this machine.

Starts the patched vllm-mlx server and mitmdump with our addons on free
loopback ports, replays the generated session through the proxy, prints one
row per request and a summary, and stops both servers (also on Ctrl-C or
error).

    python -m stable_prefix.bench.demo            # small prompts: a few minutes on a 2-core CPU
    python -m stable_prefix.bench.demo --full     # full-size prompts (~23K-token main prefix)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from stable_prefix.bench.clients.replay import Measured
from stable_prefix.bench.clients.stack import PRODUCT, SERVED_MODEL_NAME, TOOL_CALL_PARSER, started, stop_servers_on_sigterm
from stable_prefix.bench.measure.metrics import Row, fan_out_wall_s, mark_cold_and_warm, reuse_efficiency, summarize
from stable_prefix.bench.run import PromptViews, model_description, rows_for, view_of
from stable_prefix.bench.workload.prompt_tokens import PromptRenderer
from stable_prefix.bench.workload.session import generate_session
from stable_prefix.captures.cli import write_page
from stable_prefix.servers import REPO_ROOT

DEMO_SCALE = 0.2
DEFAULT_MODEL = REPO_ROOT / "build" / "tiny-model"
# The demo shows what the cache reuses and the first token; `make bench` measures whole turns.
DEMO_MAX_TOKENS = 8
HEADER = f"{'#':>3}  {'lane':<20} {'prompt':>7} {'reused':>7} {'prefilled':>9} {'TTFT':>8}  diagnosis (addon)"


def request_line(result: Measured) -> str:
    def count(value: int | None) -> str:
        return "?" if value is None else f"{value:,}"

    prefilled = None if result.reused_tokens is None or result.prompt_tokens is None else result.prompt_tokens - result.reused_tokens
    failed = f"  ERROR {result.reply.error}" if result.reply.error else ""
    # The addon's lines of concurrent requests cannot be told apart (see replay.Replayer.step).
    diagnosis = result.diagnosis or (
        f"(fan-out group {result.request.fan_out}: its lines are in the proxy log)" if result.request.fan_out
        else f"(sent beside #{result.request.beside}: the lines of both are in the proxy log)" if result.request.beside is not None
        else ""
    )
    return (
        f"{result.request.index:>3}  {result.request.lane:<20} {count(result.prompt_tokens):>7} {count(result.reused_tokens):>7} "
        f"{count(prefilled):>9} {result.reply.ttft_s or 0:>7.2f}s  {diagnosis}{failed}"
    )


def summary_lines(rows: list[Row]) -> list[str]:
    summary = summarize(rows)
    lines = ["", "Summary (TTFT median; cold = first request of a lane or conversation, warm = the rest):"]
    for lane, lane_summary in sorted(summary["lanes"].items()):
        cold, warm = lane_summary["cold_ttft_median_s"], lane_summary["warm_ttft_median_s"]
        if cold is None and warm is None:
            continue  # a fan-out instance: its group is timed as a whole, below
        speedup = f"  ({cold / warm:.1f}x faster warm)" if cold and warm and cold > warm else ""
        lines.append(
            f"  {lane:<20} {lane_summary['requests']:>2} requests   cold {'-' if cold is None else f'{cold:.2f} s':>8}"
            f"   warm {'-' if warm is None else f'{warm:.2f} s':>8}{speedup}"
        )
    for group, wall_s in fan_out_wall_s(rows).items():
        members = [row for row in rows if row.get("fan_out") == group]
        instances = len({row["lane"] for row in members})
        lines.append(f"  fan-out {group}: {instances} concurrent instances, {len(members)} requests, {wall_s:.2f} s from the first sent to the last answered")
    efficiency = reuse_efficiency(rows)
    reused, prompt = summary["tokens_reused"] or 0, summary["prompt_tokens"]
    if summary["reuse_unknown_requests"]:
        lines.append(f"  reuse unknown for {summary['reuse_unknown_requests']} requests, left out below")
    lines.append(
        f"  reuse: {reused:,} of {prompt:,} prompt tokens came from the cache ({reused / prompt:.0%}); "
        f"that is {'n/a' if efficiency is None else f'{efficiency:.1%}'} of what an ideal cache could have reused"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="full-size prompts (~23K-token main prefix; slow on a CPU)")
    parser.add_argument("--scale", type=float, help=f"session scale (default {DEMO_SCALE}; --full = 1.0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / "build" / "demo-logs")
    parser.add_argument("--page", type=Path, default=REPO_ROOT / "build" / "demo-session.html", help="where the session's page goes")
    args = parser.parse_args(argv)
    scale = args.scale or (1.0 if args.full else DEMO_SCALE)
    logging.getLogger("vllm_mlx").setLevel(logging.WARNING)

    requests = generate_session(args.seed, scale)
    print(f"Session: {len(requests)} requests shaped like Claude Code (scale {scale}); model: {model_description(args.model)['description']}")
    views = PromptViews(requests, PromptRenderer(args.model, SERVED_MODEL_NAME, TOOL_CALL_PARSER), {view_of(PRODUCT)}, args.model)
    capture_session = time.strftime("demo-%Y%m%d-%H%M%S")
    try:
        with stop_servers_on_sigterm(), started(PRODUCT, args.model, args.logs, capture_session=capture_session) as endpoints:
            print(f"Started: patched vllm-mlx on {endpoints.server_url}, mitmdump with our addons on {endpoints.client_url}", flush=True)
            endpoints.warm_up()
            print()
            print(HEADER)
            measured = endpoints.replay(
                requests,
                max_tokens=DEMO_MAX_TOKENS,
                on_result=lambda result: print(request_line(result), flush=True),
            )
    except KeyboardInterrupt:
        print("\ninterrupted: both servers stopped", file=sys.stderr)
        return 130
    rows = mark_cold_and_warm(rows_for(PRODUCT, measured, views))
    print("\n".join(summary_lines(rows)))
    print(f"\nServers stopped. Logs: {args.logs.relative_to(REPO_ROOT) if args.logs.is_relative_to(REPO_ROOT) else args.logs}/")
    captures = endpoints.capture_dir.relative_to(REPO_ROOT)
    print(f"Captures: {captures}/ ({len(list(endpoints.capture_dir.glob('*.json')))} requests; per-lane report: .venv/bin/python -m stable_prefix.captures report {captures})")
    session = write_page(endpoints.capture_dir, args.page)
    print(f"Session page: {args.page.relative_to(REPO_ROOT) if args.page.is_relative_to(REPO_ROOT) else args.page} ({len(session.lanes)} lanes, "
          f"{len(session.breaks)} prefix breaks: per lane what the cache reused, what was prefilled, and why; open it in a browser)")
    return 0 if all(result.reply.status == 200 and not result.reply.error for result in measured) else 1


if __name__ == "__main__":
    sys.exit(main())
