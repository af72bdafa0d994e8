"""The engine killed with SIGKILL mid-stream, a request while it is down, and its restart, through the proxy.

A real patched engine (the test tiny model, its disk cache on) behind a real
mitmdump with our addons. The first turn is answered and written to disk; the
next turn's stream is cut by `kill -9` while the engine prefills it; a request
while it is down; then the engine starts again on the same port and the same
cache folder, and the next turn is sent again. The proxy is never restarted.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import signal
import sys
import time
from dataclasses import dataclass

import pytest

from tests.support.llm_client import Answer, cache_stats, send
from tests.support.models import TEST_MODEL, require_model
from tests.support.processes import LOOPBACK, free_port, http_ok, mitmdump_command, running

pytestmark = pytest.mark.server

SYSTEM = "You are the main coding agent. Work step by step and call tools when you need facts."
TOOLS = [{"name": "read_file", "description": "Read a file.", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
FIRST_TURN = [{"role": "user", "content": "What does src/app.py do? Read it first."}]
# A long tool result: the engine prefills it for a second or more, and is killed meanwhile.
LISTING = "".join(f"def handler_{n}(request):\n    return service_{n}(request, retries={n % 7})\n\n" for n in range(250))
NEXT_TURN = FIRST_TURN + [
    {"role": "assistant", "content": [{"type": "text", "text": "Let me read it."},
                                      {"type": "tool_use", "id": "toolu_01", "name": "read_file", "input": {"path": "src/app.py"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": LISTING}]},
]


def body(messages: list[dict], stream: bool = False) -> dict:
    return {"model": "claude-opus-4-8", "max_tokens": 24, "temperature": 0, "stream": stream,
            "system": [{"type": "text", "text": SYSTEM}], "tools": TOOLS, "messages": copy.deepcopy(messages)}


def engine(port: int, cache_dir, log_dir, name: str):
    command = [sys.executable, "-m", "stable_prefix.engine_patch", "serve", str(require_model(TEST_MODEL)), "--host", LOOPBACK,
               "--port", str(port), "--served-model-name", "tiny", "--prefix-cache-dir", str(cache_dir)]
    return running(name, command, port=port, log_dir=log_dir, env={"ENGINE_PATCH_NO_DISK_CACHE": "0"},
                   ready=lambda: http_ok(f"http://{LOOPBACK}:{port}/v1/models"))


def stream_killed_after_it_opens(port: int, payload: dict, kill) -> str:
    """Stream `payload` through the proxy, `kill` the engine as soon as `message_start` arrives, read to the end."""
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=120)
    try:
        connection.request("POST", "/v1/messages", body=json.dumps(payload), headers={"content-type": "application/json"})
        response = connection.getresponse()
        received, killed = b"", False
        while chunk := response.read1(65536):
            received += chunk
            if not killed and b"message_start" in received:
                kill()
                killed = True
        assert killed, f"no message_start before the stream ended: {received[:500]!r}"
        return received.decode()
    finally:
        connection.close()


def wait_for_disk_writes(url: str, writes: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (stats := cache_stats(url))["disk_writes"] < writes or stats["disk_writes_pending"]:
        assert time.monotonic() < deadline, f"nothing on disk after {timeout:.0f}s: {stats}"
        time.sleep(0.2)


@dataclass
class Scenario:
    engine_url: str
    first_turn: Answer
    cut_stream: str
    while_down: tuple[int, str, bytes]
    after_restart: Answer
    stats_after_restart: dict
    proxy_alive: bool
    proxy_log: str


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> Scenario:
    logs, cache_dir, captures = (tmp_path_factory.mktemp(name) for name in ("logs", "kv", "captures"))
    engine_port, proxy_port = free_port(), free_port()
    engine_url = f"http://{LOOPBACK}:{engine_port}"
    proxy_command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], engine_url, proxy_port,
                                     {"upstream_model": "tiny", "capture_dir": captures, "capture_session": "s"})
    with running("proxy", proxy_command, port=proxy_port, log_dir=logs, startup_timeout=60) as proxy:
        with engine(engine_port, cache_dir, logs, "first-life") as first:
            first_turn = send(proxy.url, "/v1/messages", body(FIRST_TURN))
            wait_for_disk_writes(first.url, 1)

            def kill_9() -> None:
                os.killpg(first.process.pid, signal.SIGKILL)
                first.process.wait(timeout=30)

            cut = stream_killed_after_it_opens(proxy_port, body(NEXT_TURN, stream=True), kill_9)
        connection = http.client.HTTPConnection(LOOPBACK, proxy_port, timeout=30)
        connection.request("POST", "/v1/messages", body=json.dumps(body(NEXT_TURN)), headers={"content-type": "application/json"})
        response = connection.getresponse()
        while_down = (response.status, response.getheader("content-type"), response.read())
        connection.close()
        with engine(engine_port, cache_dir, logs, "second-life") as second:
            after = send(proxy.url, "/v1/messages", body(NEXT_TURN, stream=True))
            stats = cache_stats(second.url)
        return Scenario(engine_url, first_turn, cut, while_down, after, stats, proxy.process.poll() is None, proxy.log_text())


def test_an_engine_killed_mid_stream_ends_the_clients_stream_with_an_api_error_event(scenario):
    events = [event for event in scenario.cut_stream.split("\n\n") if event.strip()]
    assert events[0].startswith("event: message_start")
    assert events[-1].startswith("event: error\n")
    error = json.loads(events[-1].split("data: ", 1)[1])
    assert error["error"]["type"] == "api_error" and f"the engine at {scenario.engine_url} broke off its answer" in error["error"]["message"]
    assert "message_stop" not in scenario.cut_stream


def test_a_request_while_the_engine_is_down_gets_a_502_json_error_naming_its_address(scenario):
    status, content_type, data = scenario.while_down
    assert (status, content_type) == (502, "application/json")
    error = json.loads(data)["error"]
    assert error["type"] == "api_error" and f"the engine at {scenario.engine_url} did not answer" in error["message"]


def test_the_first_request_after_the_restart_is_warm_from_the_disk_cache(scenario):
    usage = scenario.after_restart.usage
    assert scenario.after_restart.events[-1]["type"] == "message_stop"
    # The whole first turn's prompt, restored from the file the killed engine left.
    assert usage["cache_read_input_tokens"] >= scenario.first_turn.usage["input_tokens"]
    assert scenario.stats_after_restart["disk_hits"] >= 1 and scenario.stats_after_restart["disk_errors"] == 0


def test_the_proxy_kept_serving_through_the_kill_and_the_restart_without_an_addon_error(scenario):
    assert scenario.proxy_alive
    assert "Addon error" not in scenario.proxy_log and "Traceback" not in scenario.proxy_log
    assert "broke off its answer" in scenario.proxy_log and "did not answer" in scenario.proxy_log
