"""Which component retries a request whose connection failed before any answer: the router (HAProxy's L7
retries, `stable_prefix/routers.py`), never the proxy, which forwards once. Two stand-in replicas on 127.0.0.1: one
answers its health checks but drops every request unanswered (as an engine killed mid-prefill does), the
other records what arrives."""

import contextlib
import json
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from stable_prefix.routers import HAPROXY_BUFFER_BYTES, running_router
from tests.support.processes import free_port, serving
from tests.support.recording_anthropic_stub import RecordingHandler

pytestmark = pytest.mark.server
CLAUDE_CODE_SIZED = 300_000  # bytes: the largest Claude Code bodies seen


class DropsEveryRequest(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        pass

    def handle(self):
        with contextlib.suppress(ConnectionResetError):  # HAProxy closes its side of a dropped request too
            super().handle()

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.close_connection = True  # closed with no answer: HAProxy's `empty-response`


def body_of(size: int, key: int) -> dict:
    return {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * size}], "metadata": {"n": key}}


@pytest.fixture
def dropping_and_recording(tmp_path):
    record = tmp_path / "arrived.jsonl"
    recorder = type("Recorder", (RecordingHandler,), {"record_path": record})
    ports = free_port(), free_port()
    with serving(DropsEveryRequest, ports[0], "dropping"), serving(recorder, ports[1], "recording"):
        yield [f"http://127.0.0.1:{port}" for port in ports], record


def arrived_posts(record) -> list[dict]:
    return [entry for entry in map(json.loads, record.read_text().splitlines()) if entry["method"] == "POST"]


def test_haproxy_sends_a_claude_code_sized_request_dropped_unanswered_to_the_other_replica(dropping_and_recording, tmp_path):
    replicas, record = dropping_and_recording
    with running_router("haproxy", replicas, log_dir=tmp_path) as router:
        statuses = [requests.post(router.url + "/v1/messages", json=body_of(CLAUDE_CODE_SIZED, key), timeout=60,
                                  headers={"x-smg-routing-key": f"lane-{key}"}).status_code for key in range(16)]
    assert statuses == [200] * 16  # some keys hash to the dropping replica: each was retried, none became a 502
    assert sorted(entry["body"]["metadata"]["n"] for entry in arrived_posts(record)) == list(range(16))
    assert all(entry["body_bytes"] > CLAUDE_CODE_SIZED for entry in arrived_posts(record))


def test_a_body_beyond_haproxys_buffer_is_not_retried(dropping_and_recording, tmp_path):
    """The limit, shown: a request larger than one buffer is streamed on, so a dropped one is a 502."""
    replicas, record = dropping_and_recording
    with running_router("haproxy", replicas, log_dir=tmp_path) as router:
        statuses = {requests.post(router.url + "/v1/messages", json=body_of(HAPROXY_BUFFER_BYTES * 2, key), timeout=60,
                                  headers={"x-smg-routing-key": f"lane-{key}"}).status_code for key in range(16)}
    assert 502 in statuses
