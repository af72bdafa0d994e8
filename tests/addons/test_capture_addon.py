"""The capture addon: what a record holds, alone and next to strip_billing."""

import json
from pathlib import Path

import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons.capture import REDACTED, Capture, UsageObserver
from tests.fixtures import claude_code
from tests.support.messages_flows import api_flow, json_response
from tests.support.proxy_addons import NO_RULES, DiagnosedCapture, ProxyAddons

SCRIPT = Path(__file__).resolve().parents[2] / "addons" / "capture.py"

ANTHROPIC_SSE = [
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","usage":{"input_tokens":12,"cache_read_input_tokens":2000,"output_tokens":1}}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\n\n',
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}\n\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


def sse_response(flow):
    flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"text/event-stream"),)), content=b"")
    flow.response.timestamp_start, flow.response.timestamp_end = 100.2, 103.1


def records(directory):
    return [json.loads(path.read_text()) for path in sorted(directory.rglob("*.json"))]


@pytest.fixture
def capture(tmp_path):
    addon = DiagnosedCapture()  # capture with the one diagnosis before it, its rules off
    with taddons.context(addon) as tctx:
        tctx.configure(addon, capture_dir=str(tmp_path), capture_session="s1", **NO_RULES)
        yield addon


def test_a_request_is_recorded_with_secrets_redacted(capture, tmp_path):
    flow = api_flow(claude_code.main_request())
    capture.request(flow)
    json_response(flow, {"type": "message", "usage": {"input_tokens": 30, "cache_read_input_tokens": 2000, "output_tokens": 5}})
    capture.response(flow)
    [record] = records(tmp_path)
    assert sorted(p.name for p in (tmp_path / "s1").iterdir()) == ["0001-main.json"]
    headers = record["request"]["headers"]
    assert headers["x-api-key"] == headers["authorization"] == headers["cookie"] == REDACTED
    assert headers["anthropic-version"] == "2023-06-01"
    assert "sk-secret" not in json.dumps(record)
    assert record["client_body"] == record["forwarded_body"] == claude_code.main_request()
    assert record["response"]["usage"]["cache_read_input_tokens"] == 2000
    assert record["response"]["status"] == 200 and record["response"]["total_s"] == pytest.approx(0.9)
    assert record["response"]["ttfb_s"] == pytest.approx(0.5)


def test_alone_it_diagnoses_with_no_rules_applied(capture, tmp_path):
    for turns, cch in ((2, "a"), (3, "b")):
        flow = api_flow(claude_code.main_request(turns, cch=cch))
        capture.request(flow)
        json_response(flow, {})
        capture.response(flow)
    second = records(tmp_path)[1]
    assert second["diagnosis"]["explained_by"] == "billing_header"
    assert "(billing header; strip_billing_header off)" in second["diagnosis"]["line"]


@pytest.mark.parametrize("order", ["strip_billing first", "capture first"])
def test_with_strip_billing_in_either_order_it_records_both_bodies(tmp_path, order):
    capture, strip = Capture(), ProxyAddons()
    with taddons.context(strip, capture) as tctx:
        tctx.configure(capture, capture_dir=str(tmp_path), capture_session="s1")
        tctx.configure(strip, upstream_model="served")
        flow = api_flow(claude_code.main_request(cch="9f2c1"))
        for addon in ([strip, capture] if order == "strip_billing first" else [capture, strip]):
            addon.request(flow)
        json_response(flow, {})
        strip.responseheaders(flow)  # the answer's headers: the diagnosis is made
        capture.response(flow)
    [record] = records(tmp_path)
    assert record["client_body"] == claude_code.main_request(cch="9f2c1")
    assert record["forwarded_body"]["model"] == "served"
    assert "x-anthropic-billing-header" not in json.dumps(record["forwarded_body"])
    assert record["changes"][0].startswith("billing_header system[0]")
    assert record["lane"] == "main" and record["diagnosis"]["lane"] == "main"


def test_streamed_usage_is_read_from_the_events_as_they_pass(capture, tmp_path):
    flow = api_flow(claude_code.main_request())
    capture.request(flow)
    sse_response(flow)
    capture.responseheaders(flow)
    stream = flow.response.stream
    wire = b"".join(ANTHROPIC_SSE)
    passed = [stream(wire[i : i + 37]) for i in range(0, len(wire), 37)] + [stream(b"")]
    assert b"".join(passed) == wire  # unchanged, chunk by chunk
    capture.response(flow)
    [record] = records(tmp_path)
    assert record["response"]["streamed"] is True
    assert record["response"]["usage"] == {"input_tokens": 12, "cache_read_input_tokens": 2000, "output_tokens": 7}
    assert record["response"]["ttft_s"] is not None


def test_time_to_first_token_is_taken_at_the_first_output_event_not_the_opening():
    observer = UsageObserver(None)
    observer(ANTHROPIC_SSE[0])  # message_start: no output yet
    assert observer.first_chunk_at is not None and observer.first_output_at is None
    observer(ANTHROPIC_SSE[1])
    assert observer.first_output_at is not None
    openai = UsageObserver(None)
    openai(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')
    assert openai.first_output_at is None
    openai(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n')
    assert openai.first_output_at is not None


def test_openai_streamed_usage_with_cached_tokens(capture, tmp_path):
    flow = api_flow(claude_code.openai_request(), path="/v1/chat/completions")
    capture.request(flow)
    sse_response(flow)
    capture.responseheaders(flow)
    usage = {"prompt_tokens": 900, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 880}}
    flow.response.stream(b'data: {"choices":[{"delta":{"content":"Hi"}}],"usage":null}\n\n')
    flow.response.stream(f'data: {{"choices":[],"usage":{json.dumps(usage)}}}\n\ndata: [DONE]\n\n'.encode())
    flow.response.stream(b"")
    capture.response(flow)
    assert records(tmp_path)[0]["response"]["usage"] == usage


def test_an_existing_stream_transform_still_runs():
    observer = UsageObserver(lambda chunk: chunk.upper())
    assert observer(b"data: {}\n\n") == b"DATA: {}\n\n"


def test_failed_requests_are_recorded_with_the_error(capture, tmp_path):
    flow = api_flow(claude_code.main_request())
    capture.request(flow)
    flow.error = tflow.terr()
    capture.error(flow)
    [record] = records(tmp_path)
    assert record["response"]["status"] is None and record["response"]["error"]


def test_other_flows_are_not_recorded(capture, tmp_path):
    for path in ("/v1/models", "/v1/messages/count_tokens"):
        flow = api_flow({}, path=path)
        capture.request(flow)
        json_response(flow, {})
        capture.response(flow)
    assert records(tmp_path) == []


def test_files_are_numbered_in_request_order_and_named_by_lane(capture, tmp_path):
    flows = [api_flow(body) for body in (claude_code.main_request(2), claude_code.subagent_request(), claude_code.title_request())]
    for flow in flows:
        capture.request(flow)
    for flow in reversed(flows):  # answers may come back in any order
        json_response(flow, {})
        capture.response(flow)
    names = sorted(p.name for p in (tmp_path / "s1").iterdir())
    assert names[0] == "0001-main.json" and names[1].startswith("0002-sub-") and names[2].startswith("0003-side-")


def test_a_body_that_is_not_json_is_recorded_as_text(capture, tmp_path):
    flow = api_flow({})
    flow.request.content = b"not json"
    capture.request(flow)
    json_response(flow, {})
    capture.response(flow)
    [record] = records(tmp_path)
    assert record["client_body_text"] == "not json" and record["lane"] == "unknown"


def test_capture_dir_that_is_a_file_is_rejected(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    addon = Capture()
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match="capture_dir="):
        tctx.configure(addon, capture_dir=str(not_a_dir))


def test_capture_session_must_be_a_plain_name(tmp_path):
    addon = Capture()
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match="capture_session='../x'"):
        tctx.configure(addon, capture_dir=str(tmp_path), capture_session="../x")


def test_the_script_file_loads_as_mitmdump_loads_it():
    with taddons.context() as tctx:
        script = tctx.script(str(SCRIPT))
        assert [type(addon).__name__ for addon in script.addons] == ["Capture"]


def test_a_record_keeps_the_clients_own_headers_and_the_routing_key_that_replaced_them_beside(tmp_path):
    """opencode names its sessions in x-session-id, the header vllm-router reads a lane's key from."""
    capture, strip = Capture(), ProxyAddons()
    with taddons.context(strip, capture) as tctx:
        tctx.configure(capture, capture_dir=str(tmp_path), capture_session="s1")
        tctx.configure(strip, lane_routing_header="x-session-id,x-smg-routing-key")
        flow = api_flow(claude_code.main_request())
        flow.request.headers["x-session-id"] = "ses_client_own"
        strip.request(flow)
        capture.request(flow)
        json_response(flow, {})
        capture.response(flow)
    [record] = records(tmp_path)
    headers, key = record["request"]["headers"], flow.request.headers["x-smg-routing-key"]
    assert headers["x-session-id"] == "ses_client_own" and "x-smg-routing-key" not in headers
    assert record["request"]["routing_key_headers"] == {"x-session-id": key, "x-smg-routing-key": key}


def test_without_a_routing_key_a_record_has_no_routing_key_headers(capture, tmp_path):
    flow = api_flow(claude_code.main_request())
    capture.request(flow)
    json_response(flow, {})
    capture.response(flow)
    assert "routing_key_headers" not in records(tmp_path)[0]["request"]
