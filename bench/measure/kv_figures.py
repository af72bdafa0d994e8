"""The bytes bench's figures from one run: the engine's own stats, and the token states counted from the session.

A run (in process, `bench/probes/kv_drive.py`, or through servers, `bench/clients/kv_servers.py`) is a
dict: the KV bytes per token and per checkpoint at the size it ran, per request what it
reused (from disk or RAM, how long the restore took and how many bytes it restored,
where known) and the engine's stats after it, the stats at the end, the token sequences
each tier held, each lane's last request and whether it was warm, and what a new
engine on the same directory restored. Byte figures are multiplied by `scale_up`
(the share of the model's layers the run left out).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stable_prefix.bench.measure.token_states import new_token_states, unique_token_states
from stable_prefix.bench.probes.kv_session_file import SessionFile

GiB = 2**30


def figures(run: dict[str, Any], session: SessionFile, scale_up: float) -> dict[str, Any]:
    """The bench's figures at the real shape from one run (bytes x `scale_up`, the layers left out)."""
    end, restart = run["end_stats"], run["restart"]["stats"]
    per_token = run["bytes_per_token"] * scale_up
    checkpoint = run["checkpoint_bytes"] * scale_up
    sequences = [session.sequence(index) for index in range(len(session))]
    new = sum(new_token_states(sequences))
    written = _scaled(end.get("disk_bytes_written"), scale_up)
    ram_held = _scaled(end.get("bytes"), scale_up)
    ram_unique = unique_held(run["held"]["ram"])
    disk_unique = unique_held(run["held"]["disk"])
    ram_states = positional_states_held(run["held"]["ram"]) if checkpoint else 0
    # What holding and writing each state once takes: the unique tokens' KV, and for a hybrid its positional
    # states (one per checkpoint position and lane end held; one new one per request written, its end).
    ram_once = None if ram_unique is None or ram_states is None else ram_unique * per_token + ram_states * checkpoint
    written_once = new * per_token + len(session) * checkpoint
    ram_restores = [record for record in run["requests"] if record["reused"] and not record["from_disk"] and record.get("restore_s")]
    lanes = run["lanes"]
    return {
        "requests": len(session),
        "prompt_tokens": sum(len(session.prompt(index)) for index in range(len(session))),
        "reply_tokens": sum(len(session.reply(index)) for index in range(len(session))),
        "tokens_reused": sum(record["reused"] for record in run["requests"]),
        "new_token_states": new,
        "bytes_per_token": per_token,
        "checkpoint_bytes": checkpoint or None,
        "disk_bytes_written": written,
        "written_over_new": _ratio(written, written_once),
        "gib_written_per_100_requests": None if written is None else written / GiB * 100 / len(session),
        "ram_bytes_held": ram_held,
        "ram_peak_bytes": _scaled(max((record["stats"].get("bytes") or 0) for record in run["requests"]), scale_up),
        "ram_unique_token_states": ram_unique,
        "ram_block_tokens": end.get("block_tokens"),  # the engine's own count, where it keeps blocks
        "ram_positional_states": ram_states if checkpoint else None,
        "ram_over_unique": _ratio(ram_held, ram_once),
        "disk_bytes_held": _scaled(end.get("disk_bytes"), scale_up),
        "disk_unique_token_states": disk_unique,
        "disk_block_tokens": end.get("disk_block_tokens"),
        "disk_entries": end.get("disk_entries"),
        "disk_files": run["disk_files"],
        "restore_gb_per_s_ram": _ratio(sum(r["restored_bytes"] for r in ram_restores) / 1e9, sum(r["restore_s"] for r in ram_restores)) if ram_restores else None,
        "restore_gb_per_s_disk": _ratio((restart.get("disk_bytes_loaded") or 0) / 1e9, restart.get("disk_load_seconds")),
        **restore_rates(run["restart"]),
        "lanes": len(lanes),
        "lanes_warm_ram": _known_count(lane["warm_in_ram"] for lane in lanes.values()),
        "lanes_warm_disk": _known_count(run["restart"]["warm_on_disk"].values()),
        "evictions_ram": end.get("evictions"),
        "disk_evictions": end.get("disk_evictions"),
        "disk_writes": end.get("disk_writes"),
        "disk_writes_dropped": end.get("disk_writes_dropped"),
        "disk_writes_skipped": end.get("disk_writes_skipped"),
        "seconds": run["seconds"],
    }


def restore_rates(restart: dict[str, Any]) -> dict[str, float | None]:
    """After the restart: each lane's restore into a live cache (until its first prefilled token is written),
    GB/s from the disk (files out of the page cache), the page cache and RAM, and a memcpy of the largest
    lane's bytes into memory written before and into new memory, in the same run (unknown where not measured)."""
    restores, memcpy = restart.get("restores") or {}, restart.get("memcpy") or {}

    def rate(source: str) -> float | None:
        measured = restores.get(source) or {}
        return _ratio((measured.get("bytes") or 0) / 1e9, measured.get("seconds"))

    return {
        "restore_gb_per_s_from_disk": rate("disk") if (restores.get("disk") or {}).get("evicted_from_page_cache") else None,
        "restore_gb_per_s_from_page_cache": rate("page_cache"),
        "restore_gb_per_s_from_ram_after_restart": rate("ram"),
        "memcpy_gb_per_s": _ratio((memcpy.get("bytes") or 0) / 1e9, memcpy.get("warm_s")),
        "memcpy_gb_per_s_new_memory": _ratio((memcpy.get("bytes") or 0) / 1e9, memcpy.get("fresh_s")),
    }


def _known_count(flags) -> int | None:
    """How many are true; unknown if any is."""
    flags = list(flags)
    return None if any(flag is None for flag in flags) else sum(flags)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def unique_held(held: list[dict[str, Any]] | None) -> int | None:
    """Unique token states a tier holds, counted from the token ids of its entries (lanes); unknown where
    the run could not see them."""
    return None if held is None else unique_token_states([np.asarray(entry["tokens"]) for entry in held])


def positional_states_held(held: list[dict[str, Any]] | None) -> int | None:
    """Distinct positional states a hybrid's tier holds: one per token prefix it has a checkpoint or a lane's end at."""
    if held is None:
        return None
    return len({tuple(entry["tokens"][:position]) for entry in held for position in {*entry["checkpoints"], len(entry["tokens"])}})
