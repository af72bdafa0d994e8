"""End to end: a real mitmdump with strip_billing + capture in reverse mode, in
front of a real (slow, recording) upstream on 127.0.0.1.

One session is replayed through the proxy; each test checks one aspect of
what came out: what the upstream received, that SSE streamed, the capture
files, and the diagnosis lines in mitmdump's own output.
"""

from __future__ import annotations

import gzip
import http.client
import json
import subprocess
import time
from dataclasses import dataclass, field

import pytest

from tests.fixtures import claude_code
from tests.support.processes import LOOPBACK, free_port, mitmdump_command, running
from tests.support.slow_sse_upstream import CACHED_TOKENS, slow_sse_upstream

pytestmark = pytest.mark.server

EVENT_DELAY = 0.1
SERVED_MODEL = "served-model"
NOT_JSON = b'{"model": "claude-opus-4-8", "system": "x-anthropic-billing-header: cc_version=1;", "messa'


@dataclass
class Reply:
    status: int
    body: bytes
    first_chunk_at: float | None
    chunks: list[bytes] = field(default_factory=list)


def send(port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> Reply:
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
    try:
        connection.request(method, path, body=body, headers={"content-type": "application/json", "x-api-key": "sk-test-secret", **(headers or {})})
        response = connection.getresponse()
        chunks, first_chunk_at = [], None
        while chunk := response.read1(65536):
            first_chunk_at = first_chunk_at or time.time()
            chunks.append(chunk)
        return Reply(response.status, b"".join(chunks), first_chunk_at, chunks)
    finally:
        connection.close()


def post_json(port: int, body: dict, path: str = "/v1/messages?beta=true") -> Reply:
    return send(port, "POST", path, json.dumps(body).encode())


@dataclass
class Session:
    replies: dict[str, Reply]
    received: dict[str, object]  # name -> what the upstream received
    event_times: list[list[float]]
    streamed_names: list[str]
    log: str
    captures: list[dict]
    capture_names: list[str]


STEPS = [
    ("title", lambda: claude_code.title_request()),
    ("main-1", lambda: claude_code.main_request(2, cch="aaaa1")),
    ("explore", lambda: claude_code.subagent_request("explore", 1)),
    ("main-2", lambda: claude_code.main_request(3, cch="aaaa2")),
    ("main-cleared", lambda: claude_code.main_request(1, git_status="?? notes.txt", topic="other work", cch="aaaa3")),
]


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Session:
    logs = tmp_path_factory.mktemp("logs")
    capture_dir = tmp_path_factory.mktemp("captures")
    replies, received, streamed_names = {}, {}, []
    with slow_sse_upstream(EVENT_DELAY) as upstream:
        port = free_port()
        command = mitmdump_command(
            ["addons/strip_billing.py", "addons/capture.py"],
            upstream.url,
            port,
            {"upstream_model": SERVED_MODEL, "max_tokens_cap": 8192, "capture_dir": capture_dir, "capture_session": "e2e"},
        )
        with running("mitmdump", command, port=port, log_dir=logs, startup_timeout=60) as proxy:

            def remember(name):
                received[name] = upstream.received[-1]

            for name, build in STEPS:
                replies[name] = post_json(port, build())
                streamed_names.append(name)
                remember(name)
            replies["openai"] = post_json(port, claude_code.openai_request(), "/v1/chat/completions")
            streamed_names.append("openai")
            remember("openai")
            gzipped = gzip.compress(json.dumps(claude_code.main_request(2, git_status="?? notes.txt", topic="other work", cch="aaaa4")).encode())
            replies["main-gzip"] = send(port, "POST", "/v1/messages?beta=true", gzipped, {"content-encoding": "gzip"})
            streamed_names.append("main-gzip")
            remember("main-gzip")
            replies["not-json"] = send(port, "POST", "/v1/messages", NOT_JSON)
            remember("not-json")
            counted = json.dumps(claude_code.main_request()).encode()
            replies["count-tokens"] = send(port, "POST", "/v1/messages/count_tokens", counted)
            remember("count-tokens")
            replies["models"] = send(port, "GET", "/v1/models")
        log = proxy.log_text()  # after mitmdump stopped: includes the shutdown totals
        event_times = upstream.event_times
    session_dir = capture_dir / "e2e"
    files = sorted(session_dir.glob("*.json"))
    return Session(replies, received, event_times, streamed_names, log, [json.loads(p.read_text()) for p in files], [p.name for p in files])


# --- what the upstream received -----------------------------------------------


def test_no_request_reached_the_upstream_with_the_billing_header(session):
    for name in [step for step, _ in STEPS] + ["openai", "main-gzip"]:
        assert b"x-anthropic-billing-header" not in session.received[name].body(), name


def test_system_messages_reached_the_upstream_as_user_reminders(session):
    messages = session.received["main-2"].json()["messages"]
    assert all(message["role"] != "system" for message in messages)
    assert messages[0]["content"].startswith("<system-reminder>\n")  # initial context: before the first user message


def test_model_was_mapped_and_max_tokens_capped(session):
    main, title = session.received["main-1"].json(), session.received["title"].json()
    assert (main["model"], main["max_tokens"]) == (SERVED_MODEL, 8192)
    assert (title["model"], title["max_tokens"]) == (SERVED_MODEL, 512)


def test_changed_body_has_a_correct_content_length(session):
    received = session.received["main-1"]
    assert int(received.headers["content-length"]) == len(received.raw_body)


def test_gzip_body_arrived_gzipped_and_normalized(session):
    received = session.received["main-gzip"]
    assert received.headers["content-encoding"] == "gzip"
    assert received.json()["model"] == SERVED_MODEL


def test_invalid_json_and_other_paths_arrived_byte_for_byte(session):
    assert session.received["not-json"].raw_body == NOT_JSON
    assert session.received["count-tokens"].raw_body == json.dumps(claude_code.main_request()).encode()
    assert session.replies["models"].status == 200


# --- streaming ----------------------------------------------------------------


def test_events_reached_the_client_before_the_upstream_sent_the_last(session):
    for index, name in enumerate(session.streamed_names):
        sent = session.event_times[index]
        reply = session.replies[name]
        assert len(sent) >= 4, name
        assert reply.first_chunk_at < sent[-1] - EVENT_DELAY, name  # at least one event interval early
        assert len(reply.chunks) > 1, name


def test_the_client_got_every_event_unchanged(session):
    reply = session.replies["main-1"]
    events = [block for block in reply.body.decode().split("\n\n") if block]
    assert events[0].startswith("event: message_start") and events[-1].startswith("event: message_stop")
    assert "".join(json.loads(e.split("data: ", 1)[1])["delta"].get("text", "") for e in events if "text_delta" in e) == "Hello from the upstream."


# --- capture files ------------------------------------------------------------


def test_every_api_request_was_captured_in_order_with_its_lane(session):
    names = session.capture_names
    assert len(names) == 8  # five steps, openai, gzip, not-json; not count_tokens, not GET
    assert names[0] == "0001-side-title.json" and names[1] == "0002-main.json"
    assert names[2].startswith("0003-sub-") and names[3] == "0004-main.json"


def test_captures_hold_both_bodies_redacted_headers_usage_and_timings(session):
    record = session.captures[1]
    assert record["request"]["headers"]["x-api-key"] == "[redacted]"
    assert "sk-test-secret" not in json.dumps(session.captures)
    assert "x-anthropic-billing-header" in json.dumps(record["client_body"]["system"])
    assert "x-anthropic-billing-header" not in json.dumps(record["forwarded_body"])
    response = record["response"]
    assert response["status"] == 200 and response["streamed"] is True
    assert response["usage"]["cache_read_input_tokens"] == CACHED_TOKENS and response["usage"]["output_tokens"] == 4
    assert 0 < response["ttfb_s"] < response["ttft_s"] < response["total_s"]  # message_start comes an event before the text
    assert response["total_s"] >= 5 * EVENT_DELAY


def test_openai_capture_has_cached_tokens(session):
    record = next(r for r in session.captures if r["request"]["api"] == "openai")
    assert record["response"]["usage"]["prompt_tokens_details"]["cached_tokens"] == CACHED_TOKENS


# --- diagnosis in mitmdump's output -------------------------------------------


def test_diagnosis_lines_are_in_the_mitmdump_log(session):
    log = session.log
    assert "lane side:title · first request · " in log
    assert "lane main · first request · " in log
    assert "lane main · prefix stable " in log and "raw broke at system[0].text byte " in log and "(billing header; stripped)" in log
    assert "lane main · prefix broke at messages[1].content[0].text byte " in log and "(new conversation)" in log  # the /clear


def test_unreadable_body_is_reported_as_passed_through(session):
    assert "/v1/messages: body is not valid JSON" in session.log and "passed through unchanged" in session.log


def test_session_totals_are_logged_at_shutdown(session):
    assert "lane main · 4 requests · prefix kept 2/3 · " in session.log
    assert "capture: 8 request(s) written to " in session.log


def test_mitmdump_refuses_to_start_with_a_bad_option_naming_it():
    command = mitmdump_command(["addons/strip_billing.py"], "http://127.0.0.1:9", free_port(), {"model_map": "claude-*"})
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "OptionsError: model_map='claude-*': entry 'claude-*' is not of the form pattern=served-model-name" in result.stdout + result.stderr
