"""`make bench-kv`: what the engine's cache writes and holds, per session, at real models' KV shapes.

    python -m stable_prefix.bench.kv_bytes                       # in process: 3 sessions x 3 real shapes -> bench/results/kv/today.{json,md}
    python -m stable_prefix.bench.kv_bytes --servers             # demo and long sessions through the proxy into real servers, tiny model -> bench/results/kv/servers.*
    python -m stable_prefix.bench.kv_bytes --engine-tree /work/wt/baseline --name blocks   # that checkout's engine and this one's, paired

In process (`bench/probes/kv_drive.py`), the engine's own cache object serves each
session's real token sequences (`bench/workload/kv_sessions.py`) with mlx-lm cache
objects of a real model's shape filled with random data instead of a forward
pass, so every store, restore, disk write and eviction moves real bytes. Each
run gives the RAM tier 16 GiB (a quarter of a 64 GB Mac: the engine's default
share of RAM) and the disk tier its default 20 GiB, both at the real shape. A
run that would not fit this machine at full size (a 120K-token lane at 256 KiB
a token is 30 GiB) runs with 1/k of the layers and 1/k of both budgets: every
byte the cache holds or writes is per layer, so it makes the same decisions and
moves 1/k of the bytes; the report multiplies them back (`layers run`).

Through servers (`bench/clients/kv_servers.py`, `--servers`), `make demo`'s stack serves
the sessions at the size this CPU prefills (the tiny model's 512 B a token; the
long session at scale 0.05), with the engines' timings paired request by request.

Every figure comes from the engine's own `stats()` (its `/v1/cache/stats`), or
is counted from the token sequences (`bench/measure/token_states.py`); a figure the
engine does not report is `unknown`, never 0. Definitions and the schema:
docs/benchmark.md, "The bytes bench".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stable_prefix.bench.clients.engine_tree import EngineTree, this_checkout
from stable_prefix.bench.clients.kv_servers import paired_timings, through_servers
from stable_prefix.bench.clients.stack import Configuration, cpu_description, product_of
from stable_prefix.bench.measure import kv_report
from stable_prefix.bench.measure.kv_figures import figures
from stable_prefix.bench.probes.kv_session_file import SessionFile
from stable_prefix.bench.run import turn_order
from stable_prefix.bench.workload.kv_sessions import SESSIONS, rendered
from stable_prefix.bench.workload.kv_shapes import DISK_BUDGET_BYTES, RAM_BUDGET_BYTES, REAL_SHAPES, SHAPES, GiB, KvShape, model_bytes
from stable_prefix.servers import REPO_ROOT

# What one in-process run may take of this shared machine, at most: the RAM tier's budget and three
# lanes alive (the live cache, its exact-size copy, a load), and bytes written to its disk.
MEMORY_LIMIT_BYTES = 3 * GiB
WRITE_LIMIT_BYTES = 8 * GiB
DRIVER = Path(__file__).resolve().parent / "probes" / "kv_drive.py"
OUT = REPO_ROOT / "bench" / "results" / "kv"


def configuration_of(engine: EngineTree) -> Configuration:
    """The product's stack with this engine (`make demo`'s, through servers)."""
    return product_of(engine.tree)


def layers_to_run(shape: KvShape, session: SessionFile, bytes_per_token: int, checkpoint_bytes: int) -> int:
    """The most layers whose run fits MEMORY_LIMIT_BYTES and WRITE_LIMIT_BYTES, judged by what today's
    cache could hold and write at most (every lane whole, every request's state written)."""
    lanes: dict[str, int] = {}
    for index in range(len(session)):
        lanes[session.lane(index)] = len(session.sequence(index))
    lane_bytes = max(lanes.values()) * bytes_per_token + checkpoint_bytes
    held = min(RAM_BUDGET_BYTES, sum(lanes.values()) * bytes_per_token + checkpoint_bytes * len(lanes))
    written = sum(len(session.sequence(index)) * bytes_per_token + 6 * checkpoint_bytes for index in range(len(session)))
    for count in shape.layer_counts():
        share = count / shape.layers
        if (held + 3 * lane_bytes) * share <= MEMORY_LIMIT_BYTES and written * share <= WRITE_LIMIT_BYTES:
            return count
    return shape.layer_counts()[-1]


def run_in_process(engine: EngineTree, session: SessionFile, tokens_file: Path, shape: KvShape, layers: int, logs: Path) -> dict[str, Any]:
    """One in-process run of `engine`'s cache (its own interpreter), budgets scaled to the layers run."""
    share = layers / shape.layers
    with tempfile.TemporaryDirectory(prefix="kv-bytes-", dir=REPO_ROOT / "build") as directory:
        out = Path(directory) / "run.json"
        command = [str(engine.python), str(DRIVER), "--tokens", str(tokens_file), "--model", str(shape.model), "--layers", str(layers),
                   "--ram-bytes", str(int(RAM_BUDGET_BYTES * share)), "--disk-bytes", str(int(DISK_BUDGET_BYTES * share)),
                   "--disk-dir", str(Path(directory) / "kv"), "--out", str(out)]
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{session.description['session']}-{shape.key}-{engine.name}.log"
        print(f"  {engine.label}: {layers} of {shape.layers} layers, log {log}", flush=True)
        with log.open("w") as output:
            finished = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **engine.env}, cwd=engine.cwd)
        if finished.returncode:
            raise SystemExit(f"the in-process run failed ({finished.returncode}); see {log}:\n{log.read_text()[-3000:]}")
        return json.loads(out.read_text())


def in_process(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for turn, (session_key, shape_key) in enumerate((session, shape) for session in args.sessions for shape in args.shapes):
        shape = SHAPES[shape_key]
        if not (shape.model / "config.json").exists():
            raise SystemExit(f"{shape.model}: missing; run `make tiny-kv-models`")
        session, tokens_file = rendered(SESSIONS[session_key], shape.model)
        bytes_per_token, checkpoint_bytes = model_bytes(shape.model)
        layers = args.layers or layers_to_run(shape, session, bytes_per_token, checkpoint_bytes)
        print(f"{session_key} session x {shape.title}", flush=True)
        for engine in turn_order(args.engines, turn):
            run = run_in_process(engine, session, tokens_file, shape, layers, args.logs)
            runs.append({"session": session_key, "shape": shape_key, "engine": engine.label, "layers_run": layers, "layers": shape.layers,
                         "figures": figures(run, session, shape.layers / layers)})
    return runs


def servers(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for turn, (session_key, shape_key) in enumerate((session, shape) for session in args.sessions for shape in args.shapes):
        shape, session = SHAPES[shape_key], SESSIONS[session_key]
        print(f"{session_key} session (scale {session.server_scale}) x {shape.title}, through servers", flush=True)
        by_key = through_servers([configuration_of(engine) for engine in turn_order(args.engines, turn)], session, shape, args.logs)
        first = by_key[configuration_of(args.engines[0]).key]
        for engine in args.engines:
            run = by_key[configuration_of(engine).key]
            runs.append({"session": session_key, "shape": shape_key, "engine": engine.label, "layers_run": shape.layers, "layers": shape.layers,
                         "scale": session.server_scale, "figures": figures(run, run["sequences"], 1.0),
                         "paired_with_first_engine": None if run is first else paired_timings(run["rows"], first["rows"])})
    return runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.kv_bytes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", action="store_true", help="through the proxy into real servers (default: in process)")
    parser.add_argument("--sessions", help=f"comma-separated, of {', '.join(SESSIONS)} (default all; demo,long with --servers)")
    parser.add_argument("--shapes", help=f"comma-separated, of {', '.join(SHAPES)} (default the three real shapes; tiny with --servers)")
    parser.add_argument("--layers", type=int, help="layers every in-process run takes (default: the most that fit this machine, per run)")
    parser.add_argument("--engine-tree", type=Path, action="append", default=[],
                        help="also run the engine of this checkout (its own .venv, else this one's), on the same requests, before this "
                        "checkout's (the first engine is the one the others are compared with; name this checkout to put it first)")
    parser.add_argument("--name", help="output file stem (default today; servers with --servers)")
    parser.add_argument("--out", type=Path, default=OUT, help="output directory (default bench/results/kv)")
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / "build" / "kv-bench-logs")
    parser.add_argument("--report", type=Path, metavar="RESULT.json", help="only write the Markdown report of a result again (beside it)")
    args = parser.parse_args(argv)
    args.name = args.name or ("servers" if args.servers else "today")
    args.sessions = [key.strip() for key in (args.sessions or ("demo,long" if args.servers else ",".join(SESSIONS))).split(",") if key.strip()]
    args.shapes = [key.strip() for key in (args.shapes or ("tiny" if args.servers else ",".join(REAL_SHAPES))).split(",") if key.strip()]
    for key, table in [*((key, SESSIONS) for key in args.sessions), *((key, SHAPES) for key in args.shapes)]:
        if key not in table:
            parser.error(f"{key!r}: unknown; choose from {', '.join(table)}")
    try:
        engines = [EngineTree.of(tree) for tree in args.engine_tree]
        # This checkout's engine runs too, last, unless it is named among them (then where it is named).
        args.engines = engines if any(engine.is_this_checkout for engine in engines) else [*engines, this_checkout()]
    except FileNotFoundError as error:
        parser.error(f"--engine-tree: {error}")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("vllm_mlx").setLevel(logging.WARNING)  # its renderer logs every message merge
    args = parse_args(argv)
    if args.report:
        result = json.loads(args.report.read_text())
        args.report.with_suffix(".md").write_text(kv_report.markdown(result))
        print(kv_report.markdown(result))
        return 0
    started, load_at_start = time.time(), os.getloadavg()[0]
    runs = servers(args) if args.servers else in_process(args)
    result = {
        "schema": 1,
        "generated_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "command": shlex.join(["python", "-m", "stable_prefix.bench.kv_bytes", *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{cpu_description()}, {platform.system()}",
        # The machine's load (1-minute average) as the run began and ended: timings on a shared box are loaded and noisy.
        "load_average": {"start": round(load_at_start, 2), "end": round(os.getloadavg()[0], 2)},
        "mode": "through servers (mitmdump with the addon into engine_patch serve --prefix-cache-dir)" if args.servers else "in process",
        "budgets": {"ram_bytes": RAM_BUDGET_BYTES, "disk_bytes": DISK_BUDGET_BYTES},
        "engines": [{"label": engine.label, "tree": str(engine.tree)} for engine in args.engines],
        "sessions": {key: SESSIONS[key].title + (f"; scale {SESSIONS[key].server_scale} here" if args.servers and SESSIONS[key].server_scale != SESSIONS[key].scale else "")
                     for key in args.sessions},
        "shapes": {key: SHAPES[key].title for key in args.shapes},
        "runs": runs,
    }
    for path in kv_report.write(result, args.out, args.name):
        print(f"wrote {path}")
    print(kv_report.markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
