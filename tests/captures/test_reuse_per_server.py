"""Reuse read from each server's own figures: a response in llama.cpp's, vLLM's and the Anthropic shape goes through
the capture addon, and the live line and `stable-prefix report` show what that server said it reused, or `?` when it
said nothing. The bodies are written by us in each server's shape (llama.cpp b11434's tools/server/server-task.cpp;
vLLM 0.32's usage with and without `--enable-prompt-tokens-details`, as it answered here)."""

import json

import pytest
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from stable_prefix.addons.capture import Capture
from stable_prefix.captures.cli import main as captures_main
from stable_prefix.live import live_line
from stable_prefix.usage import reuse_from_timings, reuse_in_record, reuse_reported, timings_in

LLAMA_TIMINGS = {"cache_n": 880, "prompt_n": 20, "prompt_ms": 41.2, "prompt_per_token_ms": 2.06, "prompt_per_second": 485.4,
                 "predicted_n": 2, "predicted_ms": 9.1, "predicted_per_token_ms": 4.55, "predicted_per_second": 219.8}
OPENAI_USAGE = {"completion_tokens": 2, "prompt_tokens": 900, "total_tokens": 902, "prompt_tokens_details": {"cached_tokens": 880}}
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True}


def sse(*payloads: dict | str, named: bool = False) -> list[bytes]:
    """One chunk per event; `named` gives each its `event:` line (Anthropic and Responses streams)."""
    events = []
    for payload in payloads:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        head = f"event: {payload['type']}\n" if named and isinstance(payload, dict) else ""
        events.append(f"{head}data: {data}\n\n".encode())
    return events


def chat_chunk(delta: dict, finish_reason=None, **extra) -> dict:
    return {"object": "chat.completion.chunk", "id": "chatcmpl-1", "model": "m", "system_fingerprint": "b11434-0a1b2c3",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}


# llama.cpp's chat completion streamed without `stream_options.include_usage`: its timings ride on the last chunk.
LLAMA_CHAT_STREAM = sse(chat_chunk({"role": "assistant", "content": None}), chat_chunk({"content": "Hi"}),
                        chat_chunk({}, "stop", timings=LLAMA_TIMINGS), "[DONE]")
# ... and with it: a usage chunk (`choices: []`), which then carries the timings.
LLAMA_CHAT_STREAM_WITH_USAGE = sse(chat_chunk({"content": "Hi"}), chat_chunk({}, "stop"),
                                   {**chat_chunk({}), "choices": [], "usage": OPENAI_USAGE, "timings": LLAMA_TIMINGS}, "[DONE]")
LLAMA_CHAT_JSON = {"object": "chat.completion", "id": "chatcmpl-1", "model": "m", "usage": OPENAI_USAGE, "timings": LLAMA_TIMINGS,
                   "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi"}}]}
# llama.cpp's /v1/messages: the usage in `message_start` (sent with the first token, after the prefill), no timings.
LLAMA_MESSAGES_STREAM = sse(
    {"type": "message_start", "message": {"id": "m1", "type": "message", "role": "assistant", "content": [], "model": "m",
                                          "usage": {"cache_read_input_tokens": 880, "input_tokens": 20, "output_tokens": 0}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"}, named=True)
# llama.cpp's Responses stream: the usage in `response.completed`'s response, the timings beside it in the event.
LLAMA_RESPONSES_STREAM = sse(
    {"type": "response.created", "response": {"id": "resp_1", "object": "response", "status": "in_progress"}},
    {"type": "response.output_text.delta", "delta": "Hi", "item_id": "msg_1"},
    {"type": "response.completed", "timings": LLAMA_TIMINGS,
     "response": {"id": "resp_1", "object": "response", "status": "completed", "output": [],
                  "usage": {"input_tokens": 900, "output_tokens": 2, "total_tokens": 902, "input_tokens_details": {"cached_tokens": 880}}}},
    named=True)
# vLLM without --enable-prompt-tokens-details: the details are null, so its reuse is unknown.
VLLM_CHAT_JSON_NO_DETAILS = {"object": "chat.completion", "id": "chatcmpl-2", "model": "m",
                             "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi"}}],
                             "usage": {"prompt_tokens": 900, "total_tokens": 902, "completion_tokens": 2, "prompt_tokens_details": None}}
VLLM_CHAT_JSON_DETAILS = {**VLLM_CHAT_JSON_NO_DETAILS, "usage": OPENAI_USAGE}
# vLLM 0.32's /v1/messages streamed (with the details flag): `message_start` counts the whole prompt as input, the
# `message_delta` at the end splits it into the part prefilled and the part read from its cache.
VLLM_MESSAGES_STREAM = sse(
    {"type": "message_start", "message": {"id": "m3", "type": "message", "role": "assistant", "content": [], "model": "m",
                                          "usage": {"input_tokens": 900, "output_tokens": 0}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
     "usage": {"input_tokens": 20, "output_tokens": 2, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 880}},
    {"type": "message_stop"}, named=True)
ANTHROPIC_JSON_NO_CACHE_FIELD = {"id": "m2", "type": "message", "role": "assistant", "model": "m", "content": [{"type": "text", "text": "Hi"}],
                                 "stop_reason": "end_turn", "usage": {"input_tokens": 900, "output_tokens": 2}}


@pytest.fixture
def capture(tmp_path):
    addon = Capture()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, capture_dir=str(tmp_path), capture_session="s1")
        yield addon


def request_flow(path: str):
    request = tutils.treq(host="127.0.0.1", port=8000, method=b"POST", path=path.encode(),
                          headers=http.Headers([(b"content-type", b"application/json")]), content=json.dumps(CHAT_BODY).encode())
    request.timestamp_start, request.timestamp_end = 100.0, 100.1
    return tflow.tflow(req=request)


def recorded(capture, tmp_path, path: str, *, streamed: list[bytes] | None = None, body: dict | None = None) -> dict:
    """The capture record of one request answered with `streamed` events or a JSON `body`."""
    flow = request_flow(path)
    capture.request(flow)
    content_type = b"text/event-stream" if streamed is not None else b"application/json"
    flow.response = tutils.tresp(headers=http.Headers([(b"content-type", content_type)]), content=b"" if streamed is not None else json.dumps(body).encode())
    flow.response.timestamp_start, flow.response.timestamp_end = 100.2, 100.9
    capture.responseheaders(flow)
    for chunk in streamed or []:
        flow.response.stream(chunk)
    capture.response(flow)
    [path_written] = sorted(tmp_path.rglob("*.json"))[-1:]
    return json.loads(path_written.read_text())


def figures_of(line: str) -> str:
    return " · ".join(part for part in line.split(" · ") if part.endswith(("prompt tok", "reused")))


@pytest.mark.parametrize(("path", "answer"), [
    ("/v1/chat/completions", {"streamed": LLAMA_CHAT_STREAM}),
    ("/v1/chat/completions", {"streamed": LLAMA_CHAT_STREAM_WITH_USAGE}),
    ("/v1/chat/completions", {"body": LLAMA_CHAT_JSON}),
    ("/v1/messages", {"streamed": LLAMA_MESSAGES_STREAM}),
    ("/v1/responses", {"streamed": LLAMA_RESPONSES_STREAM}),
    ("/v1/chat/completions", {"body": VLLM_CHAT_JSON_DETAILS}),
    ("/v1/messages", {"streamed": VLLM_MESSAGES_STREAM}),
], ids=["llama.cpp chat streamed, timings only", "llama.cpp chat streamed with its usage chunk", "llama.cpp chat", "llama.cpp messages streamed",
        "llama.cpp responses streamed", "vLLM with prompt-token details", "vLLM messages streamed, split at the end"])
def test_the_live_line_shows_what_the_server_said_it_reused(capture, tmp_path, path, answer):
    record = recorded(capture, tmp_path, path, **answer)
    assert figures_of(live_line(record)) == "900 prompt tok · 880 reused"


@pytest.mark.parametrize("answer", [{"streamed": LLAMA_CHAT_STREAM}, {"body": LLAMA_CHAT_JSON}], ids=["streamed", "whole"])
def test_a_record_keeps_llama_cpps_timings(capture, tmp_path, answer):
    assert recorded(capture, tmp_path, "/v1/chat/completions", **answer)["response"]["timings"] == LLAMA_TIMINGS


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", VLLM_CHAT_JSON_NO_DETAILS), ("/v1/messages", ANTHROPIC_JSON_NO_CACHE_FIELD)],
                         ids=["vLLM without prompt-token details", "an Anthropic usage without its cache field"])
def test_a_server_that_reports_no_reuse_is_shown_as_unknown_never_as_zero(capture, tmp_path, path, body):
    record = recorded(capture, tmp_path, path, body=body)
    assert "timings" not in record["response"]
    assert figures_of(live_line(record)) == "? prompt tok · ? reused"


def test_the_report_shows_the_servers_reuse_and_unknown_as_a_question_mark(capture, tmp_path, capsys):
    recorded(capture, tmp_path, "/v1/chat/completions", body=VLLM_CHAT_JSON_NO_DETAILS)
    recorded(capture, tmp_path, "/v1/chat/completions", streamed=LLAMA_CHAT_STREAM)
    recorded(capture, tmp_path, "/v1/chat/completions", body=VLLM_CHAT_JSON_NO_DETAILS)
    assert captures_main(["report", str(tmp_path / "s1")]) in (0, None)
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(("0002", "0003"))]
    # the cached column, after the cause: the second request's own figure, the third's unknown
    assert [row[-2] for row in rows] == ["880", "?"]


def test_the_usage_is_read_before_the_timings_and_each_alone_suffices():
    assert reuse_reported(OPENAI_USAGE, {"cache_n": 1, "prompt_n": 1}) == (900, 880)
    assert reuse_reported({"prompt_tokens": 900}, LLAMA_TIMINGS) == (900, 880)
    assert reuse_reported(None, None) is None
    assert reuse_in_record({"usage": {"input_tokens": 20, "cache_read_input_tokens": 880}}) == (900, 880)


def test_timings_without_both_counts_are_no_figure():
    assert reuse_from_timings({"cache_n": 880}) is None
    assert reuse_from_timings({"prompt_n": 20, "cache_n": None}) is None
    assert timings_in({"timings": "soon"}) is None and timings_in(["timings"]) is None
