"""The proxy's memory over a day of subagents, without an engine: how `mitmdump -s addons/strip_billing.py` grows.

`make soak` samples the proxy too, but `up` starts it again with every engine life (300 requests), and a
life's 40-odd new subagent lanes stay below the diagnosis's bound on lanes (`MAX_LANES`, 128), so a
life shows the proxy filling, never its plateau. Here one proxy lives for the whole run, before a
stand-in engine that answers every request at once with a short Anthropic stream, so thousands of
requests take minutes: the soak's own workload (`bench/workload/soak_requests.py`: the bench session's
lanes session after session, a new subagent instance every ~7 requests), the proxy's RSS sampled
every `--sample-every` requests, its growth per 1,000 requests over the second half of the run (the
lanes bound reached) and over the whole run.

    python -m stable_prefix.bench.soak_proxy [--requests 4000] [--scale 0.05] [--out build/soak-proxy]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import psutil
import requests

from stable_prefix.addons.lanes import AGENT_ID_HEADER
from stable_prefix.bench.measure.resources import slope_per_1000
from stable_prefix.bench.workload.soak_requests import session_requests
from stable_prefix.servers import REPO_ROOT, free_port, mitmdump_command, running, serving

EVENTS = [
    ("message_start", {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                                             "model": "tiny", "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}),
    ("message_stop", {"type": "message_stop"}),
]
ANSWER = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in EVENTS).encode()


class StandInEngine(BaseHTTPRequestHandler):
    """Answers every POST with the same short stream (what the proxy keeps per lane comes from the requests)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *_) -> None:
        pass


def rss_bytes(pid: int) -> int:
    process = psutil.Process(pid)
    return process.memory_info().rss + sum(child.memory_info().rss for child in process.children(recursive=True))


def per_1000_mib(points: list[tuple[int, int]]) -> float | None:
    slope = slope_per_1000(points)
    return None if slope is None else round(slope / 2**20, 2)


def run(requests_total: int, scale: float, sample_every: int, out: Path) -> dict:
    engine_port, proxy_port = free_port(), free_port()
    samples: list[tuple[int, int]] = []
    instances: set[str] = set()  # subagent instances: each a new lane to the proxy
    started = time.monotonic()
    with serving(StandInEngine, engine_port, "stand-in engine"):
        command = mitmdump_command(["addons/strip_billing.py"], f"http://127.0.0.1:{engine_port}", proxy_port,
                                   {"upstream_model": "tiny", "capture_dir": str(out / "captures")})
        with running("proxy", command, port=proxy_port, log_dir=out) as proxy, requests.Session() as session:
            for sent, request in enumerate(session_requests(scale), start=1):
                if sent > requests_total:
                    break
                if request.headers.get(AGENT_ID_HEADER):
                    instances.add(request.headers[AGENT_ID_HEADER])
                response = session.post(f"{proxy.url}/v1/messages", json=request.body, headers=request.headers, timeout=60)
                response.raise_for_status()
                if sent % sample_every == 0:
                    samples.append((sent, rss_bytes(proxy.process.pid)))
    half = [point for point in samples if point[0] > requests_total // 2]
    mib = 2**20
    result = {
        "command": "python -m stable_prefix.bench.soak_proxy " + " ".join(sys.argv[1:]),
        "requests": requests_total, "scale": scale, "seconds": round(time.monotonic() - started, 1),
        "subagent_lanes": len(instances),
        "first_mib": round(samples[0][1] / mib, 1), "last_mib": round(samples[-1][1] / mib, 1),
        "max_mib": round(max(rss for _, rss in samples) / mib, 1),
        "per_1000_requests_mib_whole_run": per_1000_mib(samples),
        "per_1000_requests_mib_second_half": per_1000_mib(half),
        "samples": [(sent, round(rss / mib, 2)) for sent, rss in samples],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak_proxy.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stable_prefix.bench.soak_proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--scale", type=float, default=0.05, help="the session's size (1.0 = Claude Code's real size)")
    parser.add_argument("--sample-every", type=int, default=100)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "soak-proxy")
    args = parser.parse_args(argv)
    result = run(args.requests, args.scale, args.sample_every, args.out)
    print(f"proxy RSS over {result['requests']} requests ({result['subagent_lanes']} new subagent lanes, "
          f"{result['seconds']} s): {result['first_mib']} -> {result['last_mib']} MiB (max {result['max_mib']}); per 1,000 requests "
          f"{result['per_1000_requests_mib_whole_run']} MiB over the run, {result['per_1000_requests_mib_second_half']} MiB "
          f"over its second half")
    return 0


if __name__ == "__main__":
    sys.exit(main())
