"""When the engine is down or dies mid-stream, the client gets an error in its protocol's own shape.

Through a real mitmdump with our addons: before a port nobody listens on (the
engine is down), and before the recording upstream told to drop the
connection mid-stream (`x-test-break-after`), as a killed engine does. The
clients are the SDKs Claude Code and the OpenAI-protocol agents use, so "in
the protocol's shape" means: the SDK raises its own error with our message.
tests/e2e/test_engine_restart.py does the same with a real engine killed by SIGKILL.
"""

from __future__ import annotations

import http.client
import json

import anthropic
import openai
import pytest

from stable_prefix.addons.engine_errors import error_event, not_forwarded, protocol_of
from tests.support.processes import LOOPBACK, free_port, mitmdump_command, running
from tests.support.slow_sse_upstream import slow_sse_upstream

MESSAGES = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def raw_post(port: int, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=30)
    try:
        connection.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


# --- the shapes ------------------------------------------------------------------------------------


def test_each_api_path_answers_in_its_own_protocol():
    assert protocol_of("/v1/messages?beta=true") == protocol_of("/v1/messages/count_tokens") == "anthropic"
    assert protocol_of("/v1/chat/completions") == protocol_of("/v1/models") == "openai"
    assert protocol_of("/v1/responses") == "responses"
    assert protocol_of("/healthz") is None


def test_a_stream_the_engine_broke_off_ends_with_the_protocols_error_event():
    assert error_event("anthropic", "gone") == b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"gone"}}\n\n'
    assert error_event("openai", "gone") == (
        b'data: {"error":{"message":"gone","type":"server_error","param":null,"code":"engine_unavailable"}}\n\n')
    assert error_event("responses", "gone") == (
        b'event: error\ndata: {"type":"error","code":"engine_unavailable","message":"gone","param":null}\n\n')


def test_a_request_that_was_not_forwarded_gets_a_502_json_error_naming_the_engine():
    from mitmproxy.test import tutils

    request = tutils.treq(host="127.0.0.1", port=8000, method=b"POST", path=b"/v1/chat/completions")
    data, note = not_forwarded(request, "openai", 502, "connection refused")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway") and b"content-type: application/json" in head
    error = json.loads(body)["error"]
    assert error["type"] == "server_error" and "the engine at http://127.0.0.1:8000 did not answer (connection refused)" in error["message"]
    assert note.endswith("The client got a 502 JSON error.")


# --- through mitmdump --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def down(tmp_path_factory):
    """A proxy before an engine that is not running."""
    port, engine_port = free_port(), free_port()
    command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], f"http://{LOOPBACK}:{engine_port}", port,
                               {"capture_dir": tmp_path_factory.mktemp("captures")})
    with running("mitmdump", command, port=port, log_dir=tmp_path_factory.mktemp("logs"), startup_timeout=60) as proxy:
        yield proxy, f"http://{LOOPBACK}:{engine_port}"


@pytest.fixture(scope="module")
def breaking(tmp_path_factory):
    """A proxy before an engine that can be told to die mid-stream."""
    with slow_sse_upstream(event_delay=0.01) as upstream:
        port = free_port()
        command = mitmdump_command(["addons/strip_billing.py", "addons/capture.py"], upstream.url, port,
                                   {"capture_dir": tmp_path_factory.mktemp("captures")})
        with running("mitmdump", command, port=port, log_dir=tmp_path_factory.mktemp("logs"), startup_timeout=60) as proxy:
            yield proxy, upstream.url


@pytest.mark.server
def test_while_the_engine_is_down_an_anthropic_client_gets_a_502_api_error_naming_its_address(down):
    proxy, engine = down
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-test", max_retries=0)
    with pytest.raises(anthropic.InternalServerError) as raised:
        client.messages.create(**MESSAGES)
    assert raised.value.status_code == 502
    assert raised.value.body["type"] == "error" and raised.value.body["error"]["type"] == "api_error"
    assert f"the engine at {engine} did not answer" in raised.value.body["error"]["message"]


@pytest.mark.server
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_while_the_engine_is_down_an_openai_client_gets_a_502_server_error_naming_its_address(down, path):
    proxy, engine = down
    status, headers, body = raw_post(proxy.port, path, CHAT)
    assert (status, headers["content-type"]) == (502, "application/json")
    error = json.loads(body)["error"]
    assert error["type"] == "server_error" and error["code"] == "engine_unavailable" and engine in error["message"]


@pytest.mark.server
def test_the_openai_sdk_reads_the_502_as_its_own_error(down):
    proxy, engine = down
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0)
    with pytest.raises(openai.InternalServerError, match="did not answer"):
        client.chat.completions.create(**CHAT)


@pytest.mark.server
def test_the_proxy_keeps_answering_while_the_engine_is_down(down):
    proxy, _ = down
    for _ in range(3):
        assert raw_post(proxy.port, "/v1/messages", MESSAGES)[0] == 502
    assert proxy.process.poll() is None
    assert "Addon error" not in proxy.log_text()


@pytest.mark.server
def test_a_stream_cut_by_the_engine_ends_with_an_anthropic_error_event_and_a_clean_end(breaking):
    proxy, engine = breaking
    status, headers, body = raw_post(proxy.port, "/v1/messages", {**MESSAGES, "stream": True}, {"x-test-break-after": "3"})
    assert status == 200  # http.client read the chunked body to its last chunk: the stream ended cleanly
    events = [event for event in body.decode().split("\n\n") if event]
    assert [event.split("\n")[0] for event in events] == ["event: message_start", "event: content_block_start",
                                                         "event: content_block_delta", "event: error"]
    error = json.loads(events[-1].split("data: ", 1)[1])
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert f"the engine at {engine} broke off its answer" in error["error"]["message"]


@pytest.mark.server
def test_the_anthropic_sdk_raises_its_error_for_the_cut_stream(breaking):
    proxy, engine = breaking
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-test", max_retries=0, default_headers={"x-test-break-after": "3"})
    text = []
    with pytest.raises(anthropic.APIStatusError, match="broke off its answer"):
        with client.messages.stream(**MESSAGES) as stream:
            for piece in stream.text_stream:
                text.append(piece)
    assert text == ["Hello"]  # what came before the engine died


@pytest.mark.server
def test_a_chat_stream_cut_by_the_engine_ends_with_an_error_object_the_openai_sdk_raises(breaking):
    proxy, engine = breaking
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0, default_headers={"x-test-break-after": "1"})
    chunks = []
    with pytest.raises(openai.APIError, match="broke off its answer"):
        for chunk in client.chat.completions.create(**CHAT, stream=True):
            chunks.append(chunk)
    assert [chunk.choices[0].delta.content for chunk in chunks] == ["Hello"]


@pytest.mark.server
def test_after_a_cut_stream_the_next_request_is_served_as_usual(breaking):
    proxy, _ = breaking
    raw_post(proxy.port, "/v1/messages", {**MESSAGES, "stream": True}, {"x-test-break-after": "2"})
    status, _, body = raw_post(proxy.port, "/v1/messages", {**MESSAGES, "stream": True})
    assert status == 200 and body.rstrip().endswith(b'data: {"type":"message_stop"}')
    assert "Addon error" not in proxy.log_text()


@pytest.mark.server
def test_turned_off_mitmproxy_answers_as_it_always_did(tmp_path):
    port = free_port()
    command = mitmdump_command(["addons/strip_billing.py"], f"http://{LOOPBACK}:{free_port()}", port,
                               {"answer_engine_failures": "false", "connection_strategy": "lazy"})
    with running("mitmdump", command, port=port, log_dir=tmp_path, startup_timeout=60):
        status, headers, body = raw_post(port, "/v1/messages", MESSAGES)
    assert (status, headers["content-type"]) == (502, "text/html") and b"<html" in body
