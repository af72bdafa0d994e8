"""The proxy's Responses path, driven through mitmproxy's own test harness:
strip_billing (rules, diagnosis, stored histories) and capture (the record)."""

import json
import logging
from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.test import taddons, tutils

from stable_prefix.addons.capture import Capture
from stable_prefix.addons.flow_notes import FLOW_NOTES
from stable_prefix.addons.sse_events import format_event
from tests.fixtures import codex
from tests.support.proxy_addons import NO_RULES, DiagnosedCapture, ProxyAddons
from tests.support.responses_flows import json_answer, response_object, responses_flow

SCRIPT = Path(__file__).resolve().parents[2] / "addons" / "strip_billing.py"


def answer_events(response_id, text="Hello."):
    """A streamed Responses answer as vllm-mlx sends it (shortened)."""
    opening = {"id": response_id, "object": "response", "status": "in_progress", "output": [], "usage": None}
    return [
        format_event({"type": "response.created", "sequence_number": 1, "response": opening}, "response.created"),
        format_event({"type": "response.output_text.delta", "sequence_number": 2, "item_id": "m", "output_index": 0,
                      "content_index": 0, "delta": text}, "response.output_text.delta"),
        format_event({"type": "response.completed", "sequence_number": 3, "response": response_object(response_id, text)}, "response.completed"),
    ]


def stream_answer(addons, flow, events, chunk=23):
    flow.response = tutils.tresp(headers=http.Headers(((b"content-type", b"text/event-stream"),)), content=b"")
    flow.response.timestamp_start, flow.response.timestamp_end = 100.2, 101.0
    for addon in addons:
        addon.responseheaders(flow)
    wire = b"".join(events)
    passed = [flow.response.stream(wire[i : i + chunk]) for i in range(0, len(wire), chunk)] + [flow.response.stream(b"")]
    for addon in addons:
        addon.response(flow)
    return b"".join(passed), wire


@pytest.fixture
def addon():
    addon = ProxyAddons()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, upstream_model="tiny", max_tokens_cap=64)
        yield addon


def test_a_codex_request_reaches_the_engine_with_the_served_model_name(addon):
    flow = responses_flow(codex.Conversation("Say hello.").request(model="gpt-5.4"))
    addon.request(flow)
    assert json.loads(flow.request.content)["model"] == "tiny"
    assert flow.metadata[FLOW_NOTES]["api"] == "responses"


def test_the_script_file_normalizes_a_responses_request():
    with taddons.context() as tctx:
        [script_addon] = [addon for addon in tctx.script(str(SCRIPT)).addons if type(addon).__name__ == "Normalizer"]
        tctx.options.update(upstream_model="tiny", max_tokens_cap=64)
        script_addon.configure({"upstream_model", "max_tokens_cap"})
        flow = responses_flow({"model": "gpt-5.4", "input": "hi", "max_output_tokens": 100000})
        script_addon.request(flow)
    assert json.loads(flow.request.content) == {"model": "tiny", "input": "hi", "max_output_tokens": 64}


def test_a_body_whose_input_is_not_a_string_or_a_list_passes_through_byte_for_byte_and_is_logged(addon, caplog):
    content = b'{"model":"gpt-5.4","input":{"role":"user"}}'
    flow = responses_flow(content)
    with caplog.at_level(logging.WARNING):
        addon.request(flow)
    assert flow.request.content == content
    assert "input is a JSON dict, not a string or a list of items; passed through unchanged" in caplog.text


def test_an_item_type_no_rule_reads_is_forwarded_and_named_once(addon, caplog):
    body = codex.Conversation("Look at this.").request()
    body["input"].append({"type": "computer_call_output", "call_id": "c1", "output": {"type": "input_image"}})
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            flow = responses_flow(body)
            addon.request(flow)
            assert json.loads(flow.request.content)["input"][-1] == body["input"][-1]
    assert caplog.text.count("'computer_call_output' are not read by any rule") == 1


def test_a_streamed_answer_passes_unchanged_and_a_request_continuing_it_is_diagnosed_with_its_history(addon):
    first = responses_flow({"model": "gpt-5.4", "instructions": "Be brief.", "input": "Say hello."})
    addon.request(first)
    passed, wire = stream_answer([addon], first, answer_events("resp_1"))
    assert passed == wire
    second = responses_flow({"model": "gpt-5.4", "instructions": "Be brief.", "previous_response_id": "resp_1", "input": "In French."})
    addon.request(second)
    json_answer([addon], second, response_object("resp_2"))
    diagnosis = second.metadata[FLOW_NOTES]["diagnosis"]
    assert diagnosis["prefix_kept"] and diagnosis["first_divergence"]["path"] == "input[1]"


def test_capture_loaded_first_still_sees_every_chunk_and_records_the_answer(tmp_path):
    capture, strip = Capture(), ProxyAddons()
    with taddons.context(strip, capture) as tctx:
        tctx.configure(capture, capture_dir=str(tmp_path), capture_session="s1")
        conversation = codex.Conversation("Say hello.")
        flow = responses_flow(conversation.request(), conversation.headers())
        capture.request(flow)
        strip.request(flow)
        passed, wire = stream_answer([capture, strip], flow, answer_events("resp_9"))
    assert passed == wire
    [record] = [json.loads(path.read_text()) for path in tmp_path.rglob("*.json")]
    assert record["response"]["usage"]["input_tokens_details"]["cached_tokens"] == 880
    assert record["response"]["response_id"] == "resp_9" and record["response"]["output"][0]["role"] == "assistant"
    assert record["request"]["api"] == "responses" and record["lane"] == "main"


def test_capture_alone_records_a_json_answer_and_diagnoses_a_continued_one(tmp_path):
    capture = DiagnosedCapture()  # the one diagnosis, its rules off
    with taddons.context(capture) as tctx:
        tctx.configure(capture, capture_dir=str(tmp_path), capture_session="s1", **NO_RULES)
        for number, body in enumerate([{"model": "m", "input": "Say hello."}, {"model": "m", "previous_response_id": "resp_1", "input": "More."}], 1):
            flow = responses_flow(body)
            capture.request(flow)
            json_answer([capture], flow, response_object(f"resp_{number}"))
    first, second = (json.loads(path.read_text()) for path in sorted(tmp_path.rglob("*.json")))
    assert first["response"]["response_id"] == "resp_1" and first["response"]["streamed"] is False
    assert second["diagnosis"]["prefix_kept"] is True
