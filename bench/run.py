"""`make bench`: the same session against each configuration, side by side, in one run.

    python -m stable_prefix.bench.run                 # every configuration -> bench/results/latest.{json,md,png}
    python -m stable_prefix.bench.run --quick         # reduced session -> build/bench-quick/
    python -m stable_prefix.bench.run --full          # real Claude Code size, fewer requests -> bench/results/full.*
    python -m stable_prefix.bench.run --configs 1,4 --limit 12 --out /tmp/b
    python -m stable_prefix.bench.run --configs 4 --engine-tree /work/wt/baseline   # this checkout's engine against another's, paired

Each configuration gets freshly started servers (no cache carries over), the
same requests in the same order, greedy decoding, and the same model (by
default build/tiny-model-bench, `make tiny-model-bench`: replies of about the
session's length). See `bench/README.md` for what is measured and the schema
of `latest.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import math
import platform
import shlex
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

from stable_prefix.addons.lanes import AGENT_ID_HEADER
from stable_prefix.addons.normalize import Rules, normalize
from stable_prefix.addons.request_shape import api_for
from stable_prefix.bench.clients.replay import GREEDY, PROXY_MAX_TOKENS_CAP, Measured, max_tokens_policy, steps
from stable_prefix.bench.clients.stack import (
    PRODUCT,
    PRODUCT_WITHOUT_DRAFTS,
    SERVED_MODEL_NAME,
    STRONGEST_ANCHORS,
    TOOL_CALL_PARSER,
    Configuration,
    configuration,
    cpu_description,
    is_ours,
    product_of,
    started,
    stop_servers_on_sigterm,
)
from stable_prefix.bench.measure import report
from stable_prefix.bench.measure.metrics import Row, mark_cold_and_warm, output_agreement, paired_fan_out_ratio, paired_ratio, summarize
from stable_prefix.bench.probes import prefill_reference, proxy_overhead
from stable_prefix.bench.probes.incontext_prefill import InContextPrefill
from stable_prefix.bench.workload.openai_form import openai_body
from stable_prefix.bench.workload.prompt_tokens import MlxLmPromptRenderer, PromptRenderer, ideal_reusable_tokens
from stable_prefix.bench.workload.session import FAN_OUTS, FREE_FAN_OUT, MAIN_LANE, SHAPES, TODAYS_SHAPE, Request, generate_session
from stable_prefix.servers import REPO_ROOT

DEFAULT_MODEL = REPO_ROOT / "build" / "tiny-model-bench"
DEFAULT_SCALE, QUICK_SCALE, FULL_SCALE = 0.2, 0.04, 1.0
# The product in both engine modes (4: the default, 10: --engine simple), against every anchor; and with drafting
# off (12), so every run shows what the default --draft auto costs where drafting cannot pay (issue 32).
DEFAULT_CONFIGS, QUICK_CONFIGS = "1,2,3,4,5,6,7,8,9,10,12", "1,4,7,9,10"
# Full size: the product, the two strongest anchors (the batched engine and Rapid-MLX, behind the addon) and the
# product with drafting off; the session is cut to its first FULL_LIMIT requests (never its prompt sizes): the
# fan-out group, the ToolSearch load and the first request of the new conversation after the commit are among them.
FULL_CONFIGS, FULL_LIMIT = "4,7,9,12", 25
# The in-context prefill yardstick, by default for the patched and batched engines: not vllm-mlx's
# SimpleEngine as shipped (1, 2: they re-prefill most of each prompt, which takes minutes longer),
# mlx_lm.server (5, its own rendering: prompts no other configuration shares) or Rapid-MLX (8, 9:
# its prompts are not rendered, see stack.RAPID_MLX).
DEFAULT_INCONTEXT_CONFIGS = "3,4,6,7,10"


def as_received(body: dict, behind_addon: bool) -> dict:
    """The body the engine gets: the client's, or the addon's normalized version of it."""
    if not behind_addon:
        return body
    normalized = copy.deepcopy(body)
    normalize(normalized, api_for("POST", "/v1/messages"), Rules())
    return normalized


def view_of(config: Configuration) -> tuple[str, bool] | None:
    """Which prompts a configuration's engine receives: its protocol, and whether the addon normalized
    them; None for an engine whose rendering bench.workload.prompt_tokens does not reproduce."""
    return (config.protocol, config.addon) if config.engine.rendered else None


ADDON_VIEW = ("anthropic", True)


class PromptViews:
    """Token ids of every request as each kind of configuration's engine receives them,
    and the ideal reuse over them: vllm-mlx's rendering of the client's bytes (direct)
    or of the addon's normalized bytes, and mlx_lm.server's rendering of the
    chat-completions form. Each configuration is measured against its own view;
    the addon's view is also kept, as what the session's content shares."""

    def __init__(self, requests: list[Request], renderer: PromptRenderer, views: set[tuple[str, bool] | None], model_dir: Path):
        self.tokens: dict[tuple[str, bool], list[list[int]]] = {}
        for view in (views - {None}) | {ADDON_VIEW}:
            protocol, addon = view
            if protocol == "openai":
                openai_renderer = MlxLmPromptRenderer(model_dir)
                self.tokens[view] = [openai_renderer.token_ids(openai_body(r.body, max_tokens=1)) for r in requests]
            else:
                self.tokens[view] = [renderer.token_ids(as_received(r.body, addon)) for r in requests]
        self.ideal = {view: ideal_reusable_tokens(ids) for view, ids in self.tokens.items()}

    def of(self, config: Configuration, request: Request) -> list[int] | None:
        """The token ids `config`'s engine prefills for `request`; None where they are not rendered."""
        view = view_of(config)
        return None if view is None else self.tokens[view][request.index]

    def ideal_of(self, config: Configuration, request: Request) -> int | None:
        view = view_of(config)
        return None if view is None else self.ideal[view][request.index]

    def prompt_tokens(self, config: Configuration, request: Request) -> int | None:
        ids = self.of(config, request)
        return None if ids is None else len(ids)


def rows_for(
    config: Configuration, measured: list[Measured], views: PromptViews, reference: list[tuple[int, float]] | None = None
) -> list[Row]:
    """One row per replayed request (`bench/README.md` names every field), marked cold or warm."""
    rows = []
    for result in measured:
        index = result.request.index
        rendered = views.prompt_tokens(config, result.request)
        prompt = result.prompt_tokens if result.prompt_tokens is not None else rendered
        reused = result.reused_tokens
        rows.append({
            "configuration": config.key,
            "index": index,
            "lane": result.request.lane,
            "conversation": result.request.conversation,
            "fan_out": result.request.fan_out,
            "beside": result.request.beside,  # sent at the same time as that request (a title beside its main turn)
            "agent_id": result.request.headers.get(AGENT_ID_HEADER),  # the subagent instance, where the client names it
            "body_bytes": len(result.request.body_bytes()),
            "status": result.reply.status,
            "error": result.reply.error,
            "prompt_tokens": prompt,
            "rendered_prompt_tokens": rendered,
            "reused_tokens": reused,
            "prefilled_tokens": None if reused is None or prompt is None else prompt - reused,
            "reuse_source": result.reuse_source,
            # The yardstick: what an ideal cache could have reused of the prompts this engine received.
            "ideal_reusable_tokens": views.ideal_of(config, result.request),
            "ideal_reusable_tokens_behind_addon": views.ideal[ADDON_VIEW][index],
            "started_s": result.started_s,
            "ttft_s": result.reply.ttft_s,
            "ttft_is_total": result.reply.ttft_is_total,
            "total_s": result.reply.total_s,  # the turn time: until the stream ended
            "max_tokens": result.max_tokens,
            "output_tokens": result.reply.output_tokens,  # as the server counted them
            "stop_reason": result.reply.stop_reason,
            "reply_tokens": result.request.reply_tokens,  # about how long the session's own reply is
            "diagnosis": result.diagnosis,
            # Yardstick 1: the same number of tokens prefilled from nothing on this server.
            "cold_prefill_of_new_tokens_s": None if reused is None or prompt is None or not reference else prefill_reference.prefill_seconds(reference, prompt - reused),
            # Yardstick 2 (bench.probes.incontext_prefill): set after the replays where measured.
            "incontext_prefill_s": None,
        })
    return mark_cold_and_warm(rows)


def measure_incontext_prefill(config_rows: list[Row], views: PromptViews, configs: dict[str, Configuration], model_dir: Path, repeats: int = 3) -> None:
    """Set `incontext_prefill_s` on the warm rows of `configs` whose reuse is known:
    the model's time to prefill the request's new tokens on top of its reused prefix."""
    wanted = {
        (row["configuration"], row["index"]): (views.tokens[view_of(configs[row["configuration"]])][row["index"]], row["reused_tokens"])
        for row in config_rows
        if row["configuration"] in configs and view_of(configs[row["configuration"]]) is not None
        and row["warm"] and not row["fan_out"] and row["reused_tokens"] is not None
        and row["rendered_prompt_tokens"] == row["prompt_tokens"]  # the split is only right on the server's own token ids
        and row["reused_tokens"] < row["prompt_tokens"]
    }
    if not wanted:
        return
    print(f"in-context prefill: {len(wanted)} warm requests of {', '.join(configs)}, new tokens on top of their reused prefix ...", flush=True)
    seconds = InContextPrefill(model_dir, repeats=repeats).measure_all(wanted)
    for row in config_rows:
        row["incontext_prefill_s"] = seconds.get((row["configuration"], row["index"]), row["incontext_prefill_s"])


def progress_line(config: Configuration, result: Measured) -> str:
    reply = result.reply
    reused = "?" if result.reused_tokens is None else f"{result.reused_tokens:,}"
    prompt = "?" if result.prompt_tokens is None else f"{result.prompt_tokens:,}"
    output = "?" if reply.output_tokens is None else f"{reply.output_tokens:,}"
    status = "" if reply.status == 200 and not reply.error else f"  ERROR {reply.error}"
    fallback = " (no output event: total time)" if reply.ttft_is_total else ""
    together = f"  [{result.request.fan_out}]" if result.request.fan_out else f"  [beside #{result.request.beside}]" if result.request.beside is not None else ""
    return (
        f"  {config.key:<16} #{result.request.index:<3} {result.request.lane:<20} prompt {prompt:>7} reused {reused:>7}"
        f"  TTFT {reply.ttft_s or 0:7.2f} s  turn {reply.total_s:7.2f} s  out {output:>5}{fallback}{together}{status}"
    )


def replay_options(config: Configuration, views: PromptViews, max_tokens: int | str) -> dict[str, Any]:
    return {
        "max_tokens": max_tokens,
        # A direct client must name the served model; behind the addon, the addon maps it.
        "model": None if config.addon else SERVED_MODEL_NAME,
        "protocol": config.protocol,
        "prompt_tokens_of": lambda request: views.prompt_tokens(config, request),
    }


def measure_reference(config: Configuration, endpoints, renderer: PromptRenderer) -> list[tuple[int, float]]:
    reference = prefill_reference.measure(endpoints.server_url, renderer, SERVED_MODEL_NAME, endpoints.clear_cache, protocol=config.protocol)
    print(f"  {config.key} cold prefill reference (tokens, TTFT s): {[(tokens, round(ttft, 2)) for tokens, ttft in reference]}", flush=True)
    return reference


def run_configuration(
    config: Configuration, requests: list[Request], model_dir: Path, log_dir: Path, max_tokens: int | str, renderer: PromptRenderer, views: PromptViews
) -> tuple[list[Measured], list[tuple[int, float]]]:
    """The replay's measurements, and the server's cold-prefill reference measured after it."""
    print(f"{config.key}: {config.title}", flush=True)
    with started(config, model_dir, log_dir) as endpoints:
        endpoints.warm_up()
        measured = endpoints.replay(
            requests, on_result=lambda result: print(progress_line(config, result), flush=True), **replay_options(config, views, max_tokens)
        )
        return measured, measure_reference(config, endpoints, renderer)


def turn_order(configs: list[Configuration], turn: int) -> list[Configuration]:
    """Who sends first rotates from turn to turn, so none always goes first (or last)."""
    first = turn % len(configs)
    return configs[first:] + configs[:first]


def run_interleaved(
    configs: list[Configuration], requests: list[Request], model_dir: Path, log_dir: Path, max_tokens: int | str, renderer: PromptRenderer, views: PromptViews
) -> dict[str, tuple[list[Measured], list[tuple[int, float]]]]:
    """Every configuration's stack running at once, taking turns request by request
    (step by step: a fan-out group is one turn), the first of each turn rotating,
    so a change in the machine's load falls on all of them alike. Only one stack
    works at a time; the others idle (measured: ~0.5% of a core each)."""
    print(f"interleaved: {', '.join(config.key for config in configs)} started together, taking turns", flush=True)
    with contextlib.ExitStack() as stack:
        endpoints = {config.key: stack.enter_context(started(config, model_dir, log_dir)) for config in configs}
        for config in configs:
            endpoints[config.key].warm_up()
        replayers = {config.key: endpoints[config.key].replayer(**replay_options(config, views, max_tokens)) for config in configs}
        measured: dict[str, list[Measured]] = {config.key: [] for config in configs}
        for turn, step in enumerate(steps(requests)):
            for config in turn_order(configs, turn):
                for result in replayers[config.key].step(step):
                    measured[config.key].append(result)
                    print(progress_line(config, result), flush=True)
        return {config.key: (measured[config.key], measure_reference(config, endpoints[config.key], renderer)) for config in configs}


def model_description(model_dir: Path) -> dict[str, Any]:
    """What the model is, from its config.json and its weight files' headers (any architecture).

    Models under build/ are the project's random-weight builds (tools/build_tiny_model.py).
    """
    config = json.loads((model_dir / "config.json").read_text())
    text_config = config.get("text_config", config)
    layers, hidden = text_config["num_hidden_layers"], text_config["hidden_size"]
    parameters = stored_parameters(model_dir)
    dtype = text_config.get("torch_dtype") or config.get("torch_dtype") or "unknown dtype"
    random_weight = "random-weight " if model_dir.resolve().is_relative_to(REPO_ROOT / "build") else ""
    caches = cache_kinds(model_dir)
    return {
        "path": str(model_dir.relative_to(REPO_ROOT) if model_dir.is_relative_to(REPO_ROOT) else model_dir),
        "model_type": config["model_type"],
        "dtype": dtype,
        "layers": layers,
        "hidden_size": hidden,
        "attention_heads": text_config.get("num_attention_heads"),
        "kv_heads": text_config.get("num_key_value_heads"),
        "parameters_approx": parameters,
        "cache_kinds": caches,
        # Plain attention: every layer's cache is a KV cache any prefix cache can trim; otherwise
        # hybrid (recurrent or sliding-window layers: only checkpoints restore them).
        "attention": "plain" if caches == ["KVCache"] else "hybrid",
        "description": f"{random_weight}{config['model_type']}, {layers} layers, hidden {hidden}, {dtype}, ~{parameters / 1e6:.1f}M parameters",
    }


def cache_kinds(model_dir: Path) -> list[str]:
    """The model's per-layer cache classes, as mlx-lm makes them (the model loaded lazily: no weights read)."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    model, _ = load_model(model_dir, lazy=True)
    return sorted({type(cache).__name__ for cache in make_prompt_cache(model)})


def stored_parameters(model_dir: Path) -> int:
    """Values in the model's safetensors files, from their headers (quantized weights count as packed)."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as file:
            (header_length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(header_length))
        total += sum(math.prod(tensor["shape"]) for name, tensor in header.items() if name != "__metadata__")
    return total


def notable_requests(requests: list[Request]) -> list[dict[str, Any]]:
    """The requests where the causes of slow warm turns show, for the report's table."""
    notable: list[dict[str, Any]] = []

    def note(index: int | None, what: str) -> None:
        if index is not None and all(n["index"] != index for n in notable):
            notable.append({"index": index, "what": what})

    main = [r for r in requests if r.lane == MAIN_LANE]
    first_conversation = [r for r in main if r.conversation == 0]
    note(main[0].index if main else None, "first request (cold)")
    note(next((r.index for r in main[1:] if r.body["messages"][-1]["role"] == "system"), None), "main turn with a role:system message appended at the tail")
    calls_seen: dict[str, str] = {}
    for r in requests:
        if r.lane.startswith("sub:"):
            suffix = r.body["system"][0]["text"]
            if r.lane in calls_seen and calls_seen[r.lane] != suffix:
                note(r.index, f"{r.lane} called again (new billing suffix)")
                break
            calls_seen.setdefault(r.lane, suffix)
    note(first_conversation[-1].index if first_conversation else None, "main turn with the longest history")
    note(next((r.index for r in main if r.conversation == 1), None), "first turn after /clear (new git status)")
    note(main[-1].index if main else None, "last main turn")
    return sorted(notable, key=lambda n: n["index"])


def session_description(requests: list[Request], views: PromptViews, seed: int, scale: float, limit: int | None, fan_out_mode: str = FREE_FAN_OUT) -> dict[str, Any]:
    first_main = next(i for i, r in enumerate(requests) if r.lane == MAIN_LANE)
    fan_out = [r for r in requests if r.fan_out]
    replies = sorted(r.reply_tokens for r in requests)
    return {
        "seed": seed,
        "scale": scale,
        "requests": len(requests),
        "limit": limit,
        "lanes": sorted({r.lane for r in requests}),
        # The first main request is its prefix plus a short first message.
        "main_prefix_tokens": len(views.tokens[ADDON_VIEW][first_main]),
        "largest_prompt_tokens": max(len(ids) for ids in views.tokens[ADDON_VIEW]),
        "ideal_reusable_tokens_behind_addon": sum(views.ideal[ADDON_VIEW]),
        "fan_out": {
            "groups": len({r.fan_out for r in fan_out}),
            "instances": len({r.headers.get(AGENT_ID_HEADER) for r in fan_out}),
            "mode": fan_out_mode,
            "requests": len(fan_out),
        },
        "beside": len([r for r in requests if r.beside is not None]),
        # How long the session's own replies are (about: chars / CHARS_PER_TOKEN).
        "reply_tokens": {"total": sum(replies), "median": statistics.median(replies), "max": replies[-1]},
        "notable_requests": notable_requests(requests),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.run", description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"reduced session (scale {QUICK_SCALE}, configurations {QUICK_CONFIGS}) for CI-sized checks")
    size.add_argument(
        "--full", action="store_true",
        help=f"real Claude Code size (scale {FULL_SCALE}, configurations {FULL_CONFIGS}, first {FULL_LIMIT} requests) -> full.*",
    )
    parser.add_argument("--scale", type=float, help=f"session scale; default {DEFAULT_SCALE} ({QUICK_SCALE} with --quick, {FULL_SCALE} with --full); 1.0 = full size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", help=f"comma-separated configuration numbers or keys (default {DEFAULT_CONFIGS}; {QUICK_CONFIGS} with --quick)")
    parser.add_argument("--limit", type=int, help="replay only the first N requests of the session")
    parser.add_argument("--shape", choices=SHAPES, default=TODAYS_SHAPE,
                        help=f"which Claude Code the session models (default {TODAYS_SHAPE}; only it has a fan-out group of concurrent subagents)")
    parser.add_argument(
        "--fan-out", choices=FAN_OUTS, default=FREE_FAN_OUT,
        help="how the fan-out group runs: free (three Explore instances, each at its own pace; the default) or rounds "
        "(two Explore instances and a general-purpose one, round by round: issue 23's session)",
    )
    parser.add_argument(
        "--engine-tree", type=Path, action="append", default=[],
        help="also run the product with this checkout's engine (its own .venv), compared with this checkout's request by request",
    )
    parser.add_argument("--name", help="output file name stem (default latest; full with --full)")
    parser.add_argument(
        "--sequential", dest="interleave", action="store_false",
        help="one configuration after the other, each alone on the machine (default: all started together, taking turns request by request)",
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument(
        "--max-tokens", type=_max_tokens_option, default="proxy",
        help=f"max_tokens sent with each request: proxy (the client's, as the addon caps it: at most {PROXY_MAX_TOKENS_CAP:,}; the default), "
        "session (the session's reply length: for a model whose replies never end), or a number",
    )
    parser.add_argument("--overhead-samples", type=int, help="request pairs for the proxy overhead (0: skip)")
    parser.add_argument(
        "--incontext-configs", default=DEFAULT_INCONTEXT_CONFIGS,
        help=f"comma-separated configuration numbers or keys whose warm requests get the in-context prefill yardstick, where they run (default {DEFAULT_INCONTEXT_CONFIGS}; '' for none)",
    )
    parser.add_argument(
        "--incontext-repeats", type=int,
        help="timings per request of the in-context prefill yardstick, median kept (default 3; 1 with --full, where one takes up to a minute)",
    )
    parser.add_argument("--out", type=Path, help="output directory (default bench/results, or build/bench-quick with --quick)")
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / "build" / "bench-logs", help="server and proxy logs (default build/bench-logs)")
    args = parser.parse_args(argv)
    args.scale = args.scale or (QUICK_SCALE if args.quick else FULL_SCALE if args.full else DEFAULT_SCALE)
    args.out = args.out or REPO_ROOT / ("build/bench-quick" if args.quick else "bench/results")
    args.name = args.name or ("full" if args.full else "latest")
    if args.full and args.limit is None:
        args.limit = FULL_LIMIT
    if args.incontext_repeats is None:
        args.incontext_repeats = 1 if args.full else 3
    if args.overhead_samples is None:
        args.overhead_samples = 20 if args.quick else 60
    args.configs = args.configs or (QUICK_CONFIGS if args.quick else FULL_CONFIGS if args.full else DEFAULT_CONFIGS)
    try:
        args.configurations = [configuration(key.strip()) for key in args.configs.split(",")]
    except ValueError as error:
        parser.error(f"--configs {args.configs}: {error}")
    try:
        args.other_engines = [product_of(tree) for tree in args.engine_tree]
    except FileNotFoundError as error:
        parser.error(f"--engine-tree: {error}")
    args.configurations += args.other_engines
    try:
        args.incontext_configurations = [configuration(key.strip()) for key in args.incontext_configs.split(",") if key.strip()]
    except ValueError as error:
        parser.error(f"--incontext-configs {args.incontext_configs}: {error}")
    return args


def _max_tokens_option(text: str) -> int | str:
    try:
        return max_tokens_policy(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def run(args: argparse.Namespace, command: str) -> dict[str, Any]:
    if not (args.model / "config.json").exists():
        raise SystemExit(f"model {args.model}: no config.json; run `make tiny-model` first")
    started_at = time.time()
    requests = generate_session(args.seed, args.scale, shape=args.shape, fan_out=args.fan_out)[: args.limit]
    print(f"rendering {len(requests)} requests with {args.model}'s chat template for the ideal-reuse baseline ...", flush=True)
    renderer = PromptRenderer(args.model, SERVED_MODEL_NAME, TOOL_CALL_PARSER)
    views = PromptViews(requests, renderer, {view_of(config) for config in args.configurations}, args.model)
    log_dir = args.logs
    configurations = []
    rows: list[Row] = []
    if args.interleave:
        replays = run_interleaved(args.configurations, requests, args.model, log_dir, args.max_tokens, renderer, views)
    else:
        replays = {config.key: run_configuration(config, requests, args.model, log_dir, args.max_tokens, renderer, views) for config in args.configurations}
    for config in args.configurations:
        measured, reference = replays[config.key]
        config_rows = rows_for(config, measured, views, reference)
        rows += config_rows
        configurations.append({
            "key": config.key,
            "title": config.title,
            "engine": config.engine.name,
            "engine_flags": list(config.engine_flags),
            "ours": is_ours(config),
            "addon": config.addon,
            "cold_prefill_reference": [{"prompt_tokens": tokens, "ttft_s": ttft} for tokens, ttft in reference],
            "summary": summarize(config_rows),
        })
    incontext = {config.key: config for config in args.configurations if config in args.incontext_configurations and view_of(config) is not None}
    measure_incontext_prefill(rows, views, incontext, args.model, args.incontext_repeats)
    for config in configurations:
        config["summary"] = summarize([row for row in rows if row["configuration"] == config["key"]])
    overhead = None
    if args.overhead_samples > 0:
        print(f"proxy overhead: {args.overhead_samples} request pairs per variant against a loopback stub ...", flush=True)
        overhead = proxy_overhead.measure_all(log_dir, args.overhead_samples)
    for config in configurations:
        applies = overhead is not None and config["addon"]
        added_ttft = overhead["addon"]["added_ttft_ms"] if applies else {}
        added_total = overhead["addon"]["added_total_instant_upstream_ms"] if applies else {}
        # The headline is the time to first token a user loses (engine-like stub upstream).
        config["summary"]["proxy_overhead_ms_p50"] = added_ttft.get("p50")
        config["summary"]["proxy_overhead_ms_p95"] = added_ttft.get("p95")
        config["summary"]["proxy_overhead_ms_p50_ci95"] = added_ttft.get("p50_ci95")
        config["summary"]["proxy_overhead_total_instant_upstream_ms_p50"] = added_total.get("p50")
        config["summary"]["proxy_overhead_total_instant_upstream_ms_p95"] = added_total.get("p95")
    return {
        "schema": 3,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        "duration_s": round(time.time() - started_at, 1),
        "command": command,
        "machine": f"{cpu_description()}, {platform.system()} {platform.machine()}",
        "model": model_description(args.model),
        "session": session_description(requests, views, args.seed, args.scale, args.limit, args.fan_out),
        "replay": {
            "max_tokens": args.max_tokens, "temperature": GREEDY, "served_model_name": SERVED_MODEL_NAME,
            "order": "interleaved" if args.interleave else "sequential",
        },
        "configurations": configurations,
        "proxy_overhead": overhead,
        "comparison": comparison(rows, [config.key for config in args.configurations], args.other_engines),
        "rows": rows,
    }


def comparison(rows: list[Row], keys: list[str], other_engines: list[Configuration] = ()) -> dict[str, Any] | None:
    """The product against each of the strongest anchors in the run, the product without drafted decoding
    (12) and the product with each other checkout's engine (`--engine-tree`), request by request."""
    if PRODUCT.key not in keys:
        return None
    of = {key: [row for row in rows if row["configuration"] == key] for key in keys}
    anchors = {}
    for anchor in [*STRONGEST_ANCHORS, PRODUCT_WITHOUT_DRAFTS, *other_engines]:
        if anchor.key in keys:
            mine, theirs = of[PRODUCT.key], of[anchor.key]
            anchors[anchor.key] = {
                "paired_ttft_ratio": paired_ratio(mine, theirs),
                "paired_cold_ttft_ratio": paired_ratio(mine, theirs, warm=False),
                "paired_turn_ratio": paired_ratio(mine, theirs, "total_s"),
                "paired_cold_turn_ratio": paired_ratio(mine, theirs, "total_s", warm=False),
                "output_agreement": output_agreement(mine, theirs),
                "paired_fan_out_ratio": paired_fan_out_ratio(mine, theirs),
            }
    return {"product": PRODUCT.key, "anchors": anchors}


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("vllm_mlx").setLevel(logging.WARNING)  # its renderer logs every message merge
    args = parse_args(argv)
    command = "python -m stable_prefix.bench.run " + shlex.join(argv if argv is not None else sys.argv[1:])
    try:
        with stop_servers_on_sigterm():
            result = run(args, command.strip())
    except KeyboardInterrupt:
        print("\ninterrupted: servers stopped, nothing written", file=sys.stderr)
        return 130
    for path in report.write(result, args.out, args.name):
        print(f"wrote {path}")
    print()
    print(report.markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
