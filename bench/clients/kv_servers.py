"""The bytes bench through real servers: the session through our addon into `engine_patch serve --prefix-cache-dir`.

`make demo`'s stack (mitmdump with the addon, the patched engine with a disk
directory), one per engine (`--engine-tree`: another checkout's engine from its
own venv), all started together and taking turns step by step on the same
requests, each waiting for its disk writer after every step (a disk that keeps
up with the turns, as in process). After the session each engine is stopped and
a new one started on its directory, which gets each lane's last request again
(one token of reply): the lanes it restores from disk, and its restore rate.

Figures come from the engine's `/v1/cache/stats` after every step. What the
stats do not list, the token ids a tier holds, is counted from this run's own
record where the engine gives no count (block fields): its `entry_tokens`
lengths matched to the requests that stored them (the latest request whose
sequence is at least that long), exact for a model without positional layers.
Reply token ids never reach the client: each request's reply counts as
`output_tokens` new token states (no replayed prompt holds a model's reply).
Timings are kept too: warm TTFT and turn time paired request by request between
the engines (`bench/metrics.py`).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from stable_prefix.bench.clients.replay import cache_stats, steps
from stable_prefix.bench.clients.stack import Configuration, started
from stable_prefix.bench.measure.metrics import mark_cold_and_warm, paired_ratio
from stable_prefix.bench.measure.token_states import common_prefix_length
from stable_prefix.bench.probes.kv_session_file import SessionFile
from stable_prefix.bench.restart import wait_for_disk_writes
from stable_prefix.bench.run import turn_order
from stable_prefix.bench.workload.kv_sessions import KvSession, rendered, reply_ids
from stable_prefix.bench.workload.kv_shapes import DISK_BUDGET_BYTES, RAM_BUDGET_BYTES, KvShape, model_bytes
from stable_prefix.bench.workload.session import Request
from stable_prefix.servers import REPO_ROOT

MAX_TOKENS_SESSION = "session"


# The disk tier whatever the environment says (a test run turns it off for every engine it starts).
DISK_TIER_ON = {"ENGINE_PATCH_NO_DISK_CACHE": "0"}


def engine_flags(directory: Path) -> list[str]:
    return ["--prefix-cache-dir", str(directory), "--prefix-cache-bytes", str(RAM_BUDGET_BYTES), "--prefix-cache-disk-bytes", str(DISK_BUDGET_BYTES)]


def _with_disk_tier(endpoints):
    """`endpoints`, once its engine says its disk tier is on (the bench measures nothing without it)."""
    if not (cache_stats(endpoints.server_url) or {}).get("disk_enabled"):
        raise RuntimeError(f"{endpoints.config.key}: the engine started without its disk tier; see {endpoints.server_log}")
    return endpoints


def through_servers(configs: list[Configuration], session: KvSession, shape: KvShape, logs: Path) -> dict[str, dict[str, Any]]:
    """Each configuration's run of `session` on `shape`'s preset (the run dicts `kv_figures.figures` reads)."""
    requests = session.requests(session.server_scale)
    tokens, _ = rendered(session, shape.model, scale=session.server_scale)
    max_tokens = session.reply_tokens or MAX_TOKENS_SESSION
    bytes_per_token, checkpoint_bytes = model_bytes(shape.model)
    records: dict[str, list[dict[str, Any]]] = {config.key: [] for config in configs}
    with tempfile.TemporaryDirectory(prefix="kv-servers-", dir=REPO_ROOT / "build") as root:
        directories = {config.key: Path(root) / f"kv-{number}" for number, config in enumerate(configs)}
        started_at = time.perf_counter()
        with contextlib.ExitStack() as stack:
            endpoints = {config.key: _with_disk_tier(stack.enter_context(
                started(config, shape.model, logs, engine_flags=engine_flags(directories[config.key]), engine_env=DISK_TIER_ON))) for config in configs}
            replayers = {config.key: endpoints[config.key].replayer(max_tokens=max_tokens, prompt_tokens_of=lambda r: len(tokens.prompt(r.index)))
                         for config in configs}
            for turn, step in enumerate(steps(requests)):
                for config in turn_order(configs, turn):
                    url = endpoints[config.key].server_url
                    before = cache_stats(url) or {}
                    for result in replayers[config.key].step(step):
                        records[config.key].append(_record(result))
                    stats = wait_for_disk_writes(url, timeout=1800)  # fsync can wait behind other writers of the disk
                    for record in records[config.key][-len(step):]:
                        record["stats"] = stats
                        record["from_disk"] = (stats.get("disk_loads") or 0) > (before.get("disk_loads") or 0)
                    _progress(config, step, stats)
            seconds = time.perf_counter() - started_at
            end_stats = {config.key: cache_stats(endpoints[config.key].server_url) or {} for config in configs}
        runs = {}
        for config in configs:
            outputs = {record["index"]: record["output_tokens"] for record in records[config.key]}
            sequences = _with_replies(tokens, requests, outputs)
            held = _held_by_length(end_stats[config.key].get("entry_tokens"), sequences)
            runs[config.key] = {
                "bytes_per_token": bytes_per_token,
                "checkpoint_bytes": checkpoint_bytes,
                "seconds": seconds,
                "requests": records[config.key],
                "end_stats": {key: value for key, value in end_stats[config.key].items() if not isinstance(value, list)},
                "held": {"ram": held, "disk": None},
                "disk_files": sum(1 for path in directories[config.key].rglob("*") if path.is_file()),
                "lanes": _lanes_warm(tokens, held),
                "restart": _restart(config, shape, logs, directories[config.key], tokens, requests),
                "sequences": sequences,
                "rows": _rows(records[config.key], requests),
            }
    return runs


def _record(result) -> dict[str, Any]:
    return {"index": result.request.index, "reused": result.reused_tokens, "output_tokens": result.reply.output_tokens,
            "ttft_s": result.reply.ttft_s, "total_s": result.reply.total_s, "started_s": result.started_s, "error": result.reply.error}


def _progress(config: Configuration, step: list[Request], stats: dict[str, Any]) -> None:
    print(f"  {config.key:<28} #{step[0].index:<4} {step[0].lane:<20} RAM {(stats.get('bytes') or 0) / 2**20:8.1f} MiB  "
          f"written {(stats.get('disk_bytes_written') or 0) / 2**20:9.1f} MiB", flush=True)


def _with_replies(tokens: SessionFile, requests: list[Request], outputs: dict[int, int | None]) -> SessionFile:
    """The session's sequences with each reply as long as the engine's (its ids unknown: seeded stand-ins)."""
    replies = [reply_ids(request, outputs.get(request.index) or 1) for request in requests]
    return SessionFile(tokens.lanes, tokens.head_texts, tokens.prompts, replies, tokens.description)


def _held_by_length(lengths: list[int] | None, session: SessionFile) -> list[dict[str, Any]] | None:
    """The sequences of held entries of these lengths. An entry is the state a request ended with (its
    whole sequence), a prefix of it that fit the budget or that concurrent requests shared: the latest
    request whose sequence is that long, else the latest whose sequence it cuts after the prompt, else
    the latest whose prompt it cuts; entries of one length go to as many different requests."""
    if lengths is None:
        return None
    latest_first = [(index, len(session.prompt(index)), len(session.sequence(index))) for index in reversed(range(len(session)))]
    rules = (lambda length, prompt, whole: whole == length, lambda length, prompt, whole: prompt <= length <= whole,
             lambda length, prompt, whole: prompt >= length)
    held, taken = [], set()
    for length in lengths:
        candidates = [index for rule in rules for index, prompt, whole in latest_first if rule(length, prompt, whole)]
        if not candidates:
            return None
        holder = next((index for index in candidates if index not in taken), candidates[0])
        taken.add(holder)
        held.append({"tokens": session.sequence(holder)[:length].tolist(), "checkpoints": []})
    return held


def _lanes_warm(tokens: SessionFile, held: list[list[int]] | None) -> dict[str, dict[str, Any]]:
    """Each lane's last request, and whether a held sequence restores all of its prompt but the last token
    (a rewindable model restores any prefix of what it holds)."""
    last = {tokens.lane(index): index for index in range(len(tokens))}
    lanes = {}
    for lane, index in last.items():
        prompt = tokens.prompt(index)
        point = len(prompt) - 1
        warm = None if held is None else any(common_prefix_length(np.asarray(entry["tokens"]), prompt) >= point for entry in held)
        lanes[lane] = {"last_request": index, "resume_point": point, "warm_in_ram": warm}
    return lanes


def _restart(config: Configuration, shape: KvShape, logs: Path, directory: Path, tokens: SessionFile, requests: list[Request]) -> dict[str, Any]:
    """A new engine on the directory: each lane's last request again, one token of reply; the lanes it restored whole."""
    last = {tokens.lane(index): index for index in range(len(tokens))}
    warm = {}
    with started(config, shape.model, logs, engine_flags=engine_flags(directory), engine_env=DISK_TIER_ON) as endpoints:
        replayer = endpoints.replayer(max_tokens=1, prompt_tokens_of=lambda r: len(tokens.prompt(r.index)))
        for lane, index in last.items():
            (result,) = replayer.step([requests[index]])
            warm[lane] = result.reused_tokens is not None and result.reused_tokens >= len(tokens.prompt(index)) - 1
        stats = cache_stats(endpoints.server_url) or {}
    return {"warm_on_disk": warm, "stats": {key: value for key, value in stats.items() if not isinstance(value, list)}}


def _rows(records: list[dict[str, Any]], requests: list[Request]) -> list[dict[str, Any]]:
    """Rows for bench/metrics.py: each request's times, lane and conversation, marked cold or warm."""
    by_index = {request.index: request for request in requests}
    rows = [{**record, "lane": by_index[record["index"]].lane, "conversation": by_index[record["index"]].conversation,
             "fan_out": by_index[record["index"]].fan_out, "beside": by_index[record["index"]].beside} for record in records]
    return mark_cold_and_warm(sorted(rows, key=lambda row: row["index"]))


def paired_timings(rows: list[dict[str, Any]], baseline_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Warm TTFT and turn time of one engine over another's, request by request, with 95% intervals."""
    return {"warm_ttft": paired_ratio(rows, baseline_rows, "ttft_s")["all"], "warm_turn": paired_ratio(rows, baseline_rows, "total_s")["all"]}

