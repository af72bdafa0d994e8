"""`make soak`: a day of use in one command, with figures, and nothing lost.

Soak: `--requests` requests (1,000) through `stable-prefix up`, one client, the
bench session's lanes rotating session after session (`soak_requests.py`);
the engine is killed with SIGKILL every `--restart-every` requests and `up`
started again on the same KV directory. Every `--sample-every` requests the
engine's and the proxy's memory, threads and open files, MLX's memory and the
cache's bytes in RAM and on disk are sampled (`resources.py`); every
`--check-every`-th answer is compared with what its forwarded body gets alone
from an uncached engine (`reference_answers.py`). Reported: growth per 1,000
requests once full, the budgets at every sample, the first request after each
restart, errors. Then the load scenario (`load.py`): `--load-clients`
concurrent clients for `--load-seconds`, with clients giving up on purpose.

    python -m stable_prefix.bench.soak                 # full: 1,000 requests, 16 clients x 5 min (tens of minutes here)
    python -m stable_prefix.bench.soak --small         # what `make test` runs: a minute or two

Writes OUT/soak.json and OUT/soak.md, and (full runs) the figures section of docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path

from stable_prefix.addons.lanes import AGENT_ID_HEADER
from stable_prefix.bench.clients.load import LoadSettings, run_load
from stable_prefix.bench.clients.load import summary as load_summary
from stable_prefix.bench.clients.reference_answers import CaptureIndex, ReferenceAnswers, reference_engine, same_answer
from stable_prefix.bench.clients.stack import cpu_description
from stable_prefix.bench.clients.stream_client import post_messages
from stable_prefix.bench.clients.up_stack import SERVED_NAME, StackSettings, start_life
from stable_prefix.bench.measure.resources import Sample, sample, slope_per_1000, slopes_once_full
from stable_prefix.bench.measure.soak_report import markdown
from stable_prefix.bench.workload.soak_requests import session_requests
from stable_prefix.engine_patch.install import DEFAULT_ENGINE, ENGINES
from stable_prefix.servers import REPO_ROOT
from stable_prefix.usage import prompt_tokens_in_usage

DOCS_PAGE = REPO_ROOT / "docs" / "reliability.md"
DOCS_BEGIN, DOCS_END = "<!-- soak figures: begin (written by make soak) -->", "<!-- soak figures: end -->"


@dataclass
class SoakSettings:
    requests: int = 1000
    restart_every: int = 300
    sample_every: int = 25
    check_every: int = 10
    scale: float = 0.05


# What `make test` runs (tests/bench/test_soak.py): every part of the full run, in a minute or two.
SMALL = SoakSettings(requests=24, restart_every=12, sample_every=3, check_every=3, scale=0.02)
SMALL_LOAD = LoadSettings(clients=4, duration_s=20.0, scales=(0.02, 0.04), seeds=range(100, 101))


@dataclass
class Outcome:
    user_id: str
    lane: str
    life: int
    complete: bool
    error: str | None
    prompt_tokens: int | None
    reused_tokens: int | None
    first_after_restart: bool


@dataclass
class SoakResult:
    outcomes: list[Outcome] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    checked: int = 0
    mismatched: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    subagent_instances: set[str] = field(default_factory=set)  # each a new lane to the proxy


def run_soak(stack: StackSettings, settings: SoakSettings, reference: ReferenceAnswers) -> SoakResult:
    result = SoakResult()
    started = time.monotonic()
    life = start_life(stack, number=1)
    captures = CaptureIndex(life.capture_dir)
    first_after_restart = False
    try:
        for count, request in enumerate(islice(session_requests(settings.scale), settings.requests)):
            if count and count % settings.restart_every == 0:
                life.kill_engine()
                life = start_life(stack, number=life.number + 1)
                captures, first_after_restart = CaptureIndex(life.capture_dir), True
            answer = post_messages(life.proxy_url, request.body, request.headers)
            if request.headers.get(AGENT_ID_HEADER):
                result.subagent_instances.add(request.headers[AGENT_ID_HEADER])
            usage = answer.usage
            prompt = prompt_tokens_in_usage(usage) if usage else None
            result.outcomes.append(Outcome(request.user_id, request.lane, life.number, answer.complete, answer.error, prompt,
                                           usage.get("cache_read_input_tokens"), first_after_restart))
            first_after_restart = False
            if count % settings.check_every == 0 and answer.complete:
                forwarded = captures.forwarded(request.user_id)
                result.checked += 1
                if len(forwarded) != 1 or not same_answer(answer, reference.answer(forwarded[0])):
                    result.mismatched.append(request.user_id)
            if count % settings.sample_every == 0 or count == settings.requests - 1:
                result.samples.append(sample(count + 1, life.number, life.engine_pid, life.proxy_pid, life.engine_url))
    finally:
        life.stop()
    result.wall_s = time.monotonic() - started
    return result


def soak_summary(result: SoakResult, settings: SoakSettings, stack: StackSettings) -> dict:
    restarts = [o for o in result.outcomes if o.first_after_restart]
    slopes = slopes_once_full(result.samples)
    return {
        "requests": len(result.outcomes),
        "complete": sum(o.complete for o in result.outcomes),
        "errors": [f"{o.user_id}: {o.error}" for o in result.outcomes if not o.complete],
        "lanes": sorted({o.lane for o in result.outcomes}),
        "engine_lives": len({o.life for o in result.outcomes}),
        "wall_s": round(result.wall_s, 1),
        "budgets": {"ram": stack.ram_budget, "disk": stack.disk_budget},
        "samples": len(result.samples),
        "samples_within_budgets": sum(s.within_budgets() for s in result.samples),
        "ram_cache_mib_max": round(max(s.ram_cache_bytes for s in result.samples) / 2**20, 2),
        "disk_cache_mib_max": round(max(s.disk_cache_bytes or 0 for s in result.samples) / 2**20, 2),
        "slope_per_1000_requests": {name: None if value is None else round(value, 1) for name, value in slopes.items()},
        "first_request_after_each_restart": [{"reused": o.reused_tokens, "prompt": o.prompt_tokens, "lane": o.lane} for o in restarts],
        "subagent_lanes": len(result.subagent_instances),
        "proxy_rss_per_life": proxy_rss_per_life(result.samples),
        "compared_with_uncached": result.checked,
        "mismatched": result.mismatched,
    }


def proxy_rss_per_life(samples: list[Sample]) -> list[dict]:
    """The proxy's resident memory in each engine life (`up` starts the proxy again with the engine): its first
    and last sample and its growth per 1,000 requests over the whole life. Each session of the workload starts
    new subagent instances, each a new lane to the proxy: a proxy that kept state per lane grew with them."""
    lives = []
    for life in sorted({s.life for s in samples}):
        points = [(s.requests, s.proxy.rss_bytes) for s in samples if s.life == life and s.proxy.rss_bytes]
        if points:
            slope = slope_per_1000(points)
            lives.append({"life": life, "requests": [points[0][0], points[-1][0]], "first_mib": round(points[0][1] / 2**20, 1),
                          "last_mib": round(points[-1][1] / 2**20, 1),
                          "per_1000_requests_mib": None if slope is None else round(slope / 2**20, 2)})
    return lives


def update_docs(text: str, page: Path = DOCS_PAGE) -> None:
    content = page.read_text()
    begin, end = content.index(DOCS_BEGIN) + len(DOCS_BEGIN), content.index(DOCS_END)
    page.write_text(content[:begin] + "\n" + text + content[end:])


def targets_met(run: dict) -> list[str]:
    """What the run must show (empty: all of it)."""
    soak, load, failed = run["soak"], run.get("load"), []
    if soak["errors"] or soak["complete"] != soak["requests"]:
        failed.append(f"soak: {len(soak['errors'])} requests failed: {soak['errors'][:3]}")
    if soak["samples_within_budgets"] != soak["samples"]:
        failed.append("soak: a cache exceeded its budget")
    if soak["mismatched"]:
        failed.append(f"soak: answers differ from the uncached engine's: {soak['mismatched'][:5]}")
    if load and (load["lost"] or load["forwarded_twice"] or load["mismatched"]):
        failed.append(f"load: lost {load['lost'][:3]}, forwarded twice {load['forwarded_twice'][:3]}, mismatched {load['mismatched'][:3]}")
    return failed


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="the small version `make test` runs (a minute or two)")
    # float32: the batched engine decodes a request beside others with other rounding than alone, and a
    # float16 random-weight model has exact ties among its logits (docs/reliability.md); float32 has none.
    parser.add_argument("--model", type=Path, default=REPO_ROOT / "build" / "tiny-model-bench")
    parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE, help=f"the engine mode `up` runs (default {DEFAULT_ENGINE})")
    parser.add_argument("--requests", type=int)
    parser.add_argument("--restart-every", type=int)
    parser.add_argument("--sample-every", type=int)
    parser.add_argument("--check-every", type=int)
    parser.add_argument("--scale", type=float, help="the session's size (1.0 = Claude Code's real size)")
    parser.add_argument("--ram-budget", default="8MiB", help="the RAM cache's budget (small, so the soak fills it)")
    parser.add_argument("--disk-budget", default="16MiB", help="the disk cache's budget (small, so the soak fills it)")
    parser.add_argument("--load-clients", type=int)
    parser.add_argument("--load-seconds", type=float)
    parser.add_argument("--no-load", action="store_true", help="the soak only")
    parser.add_argument("--out", type=Path, help="where results go (default bench/results/soak; --small: build/soak-small)")
    parser.add_argument("--docs", action=argparse.BooleanOptionalAction, default=None,
                        help="write the figures into docs/reliability.md (default: on for full runs)")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> tuple[SoakSettings, LoadSettings]:
    soak = SoakSettings(**asdict(SMALL)) if args.small else SoakSettings()
    load = LoadSettings(**{**asdict(SMALL_LOAD), "seeds": SMALL_LOAD.seeds}) if args.small else LoadSettings()
    for name in ("requests", "restart_every", "sample_every", "check_every", "scale"):
        if getattr(args, name) is not None:
            setattr(soak, name, getattr(args, name))
    if args.load_clients is not None:
        load.clients = args.load_clients
    if args.load_seconds is not None:
        load.duration_s = args.load_seconds
    return soak, load


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    soak_settings, load_settings = settings_from(args)
    out = args.out or (REPO_ROOT / "build" / "soak-small" if args.small else REPO_ROOT / "bench" / "results" / "soak")
    # The stacks' logs, captures and disk caches: scratch, never results (only soak.json and soak.md are kept).
    work = out / "work" if args.out or args.small else REPO_ROOT / "build" / "soak-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    soak_stack = StackSettings(args.model, work / "soak", args.ram_budget, args.disk_budget, args.engine)
    load_stack = StackSettings(args.model, work / "load", args.ram_budget, args.disk_budget, args.engine)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT).stdout.strip()
    run: dict = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit or "unknown",
        "command": "python -m stable_prefix.bench.soak " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": str(args.model.relative_to(REPO_ROOT) if args.model.is_relative_to(REPO_ROOT) else args.model),
        "engine": args.engine, "machine": f"{cpu_description()}, {platform.system()}",
        "settings": {"soak": asdict(soak_settings), "load": {**asdict(load_settings), "seeds": list(load_settings.seeds)}},
    }
    with reference_engine(args.model, SERVED_NAME, work / "reference", args.engine) as reference_url:
        reference = ReferenceAnswers(reference_url)
        soak = run_soak(soak_stack, soak_settings, reference)
        run["soak"] = soak_summary(soak, soak_settings, soak_stack)
        run["samples"] = [s.as_dict() for s in soak.samples]
        if not args.no_load:
            run["load"] = load_summary(run_load(load_stack, load_settings, reference), load_settings)
    text = markdown(run)
    failed = targets_met(run)
    run["targets_failed"] = failed
    (out / "soak.json").write_text(json.dumps(run, indent=1) + "\n")
    (out / "soak.md").write_text(text)
    if args.docs if args.docs is not None else not args.small:
        update_docs(text)
    print(text)
    print(f"results: {out / 'soak.json'}, {out / 'soak.md'}")
    for line in failed:
        print(f"TARGET NOT MET: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
