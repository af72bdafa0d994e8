"""A chat completion stream the engine broke off is completed by the proxy, in the client's open stream.

Through a real mitmdump with our addons, before a relay (`bench/clients/cut_relay.py`) that breaks off the first
streamed answers of a real patched engine (the long-reply tiny model) as a killed replica does, after a
chosen number of output events; the proxy's recovery requests go through the same relay to the same engine.
Greedy answers: the spliced answer must be the engine's uncut answer, text for text and token for token, with
drafting on (a drafted step sends its confirmed run in one event, so the replay groups tokens unlike the uncut answer).
"""

from __future__ import annotations

import contextlib
import http.client
import json

import openai
import pytest
import requests
from mitmproxy.http import Headers
from mitmproxy.test import tflow, tutils

from stable_prefix.addons.sse_events import format_event
from stable_prefix.addons.stream_recovery import MAX_ATTEMPTS, RECOVERED_NOTE, follow
from stable_prefix.bench.clients.cut_relay import Cut, cut_relay
from tests.support.engines import engine
from tests.support.llm_client import send
from tests.support.models import FAILOVER_MODEL
from tests.support.processes import free_port, mitmdump_command, running

CHAT = "/v1/chat/completions"
MID_REPLY = 30
SYSTEM = "You are a coding agent. Answer at length. " * 8
TOOLS = [{"type": "function", "function": {"name": "read", "description": "Read a file.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def body(prompt: str, **changes) -> dict:
    # With tools the engine streams through vllm-mlx's auto tool parser, which withheld the text after a "<" and a "["
    # until `http_api/tool_parser_stream.py`; the random model writes both early, so these texts test that seam too.
    return {"model": "tiny", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}], "tools": TOOLS,
            "temperature": 0, "max_tokens": 120, "stream": True, "stream_options": {"include_usage": True}, **changes}


def test_a_followed_stream_passes_whole_events_and_never_an_empty_chunk():
    """mitmproxy writes an empty chunk as one, and an empty chunk ends a chunked body."""
    request = tutils.treq(method=b"POST", path=b"/v1/chat/completions", headers=Headers(content_type="application/json"),
                          content=json.dumps(body("Hi")).encode())
    flow = tflow.tflow(req=request, resp=tutils.tresp(headers=Headers(content_type="text/event-stream")))
    flow.response.stream = True
    followed = follow(flow, "replay")
    event = format_event({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]})
    assert flow.response.stream(event[:10]) == []
    assert flow.response.stream(event[10:]) == [event]
    assert flow.response.stream(b"") == []
    assert followed.delivered.text() == "Hello"


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    # Drafting on, as on a Mac: greedy tokens are those without drafts, bit for bit (the margin rule; this float32 Qwen2
    # model's verify writes its cache as one-token steps do: docs/engine.md, "Greedy, bit for bit").
    with engine(tmp_path_factory.mktemp("engine"), "engine", "--draft", "on", model=FAILOVER_MODEL) as server:
        yield server


# Each test sends its prompt through the cut first and asks the replica for the uncut answer after: the replica
# drafts a prompt it answered before from that answer, a step's confirmed run in one event, and the cut falls after
# a count of events (its replays, which the proxy sends, are drafted so).
@contextlib.contextmanager
def proxy_before_cuts(replica, log_dir, cut: Cut, **options):
    with cut_relay(replica.url, cut) as relay:
        port = free_port()
        command = mitmdump_command(["addons/strip_billing.py"], relay.url, port, {"upstream_model": "tiny", **options})
        with running("proxy", command, port=port, log_dir=log_dir) as proxy:
            yield proxy, relay


def chunks_of(answer) -> list[dict]:
    return [event for event in answer.events if "choices" in event]


@pytest.mark.server
def test_a_greedy_request_repeated_to_the_drafting_replica_streams_the_whole_first_answer_again(replica):
    """The proxy's replay is such a repeat: the replica then drafts from the first answer, which its cache holds, and
    sends each drafted run in one event; the tokens, and so the text, must not change."""
    request = body("Describe the tokenizer.")  # its answer holds "<" and then "[" (see `body`)
    before = requests.get(f"{replica.url}/v1/cache/stats", timeout=30).json()
    first, *again = [send(replica.url, CHAT, request) for _ in range(3)]
    whole = send(replica.url, CHAT, {**request, "stream": False})
    after = requests.get(f"{replica.url}/v1/cache/stats", timeout=30).json()
    assert [answer.text for answer in again] == [first.text] * 2
    # Every token's text streamed, as the answer not streamed has it (which vllm-mlx strips of surrounding whitespace).
    assert first.text.strip() == whole.text.strip()
    assert after["draft_accepted"] > before["draft_accepted"]
    assert any(len(chunks_of(answer)) < answer.usage["completion_tokens"] for answer in again), "events carried drafted runs"


@pytest.mark.server
@pytest.mark.parametrize(("after", "inside_event_bytes"), [(MID_REPLY, 0), (0, 0), (MID_REPLY, 40)],
                         ids=["mid-reply", "before-the-first-output", "inside-an-event"])
def test_a_greedy_answer_cut_by_the_engine_reaches_the_client_whole_and_equal_to_the_uncut_one(replica, tmp_path, after, inside_event_bytes):
    request = body(f"Tell the story of parser number {after}, part {inside_event_bytes}.")
    with proxy_before_cuts(replica, tmp_path, Cut(after, inside_event_bytes=inside_event_bytes)) as (proxy, relay):
        spliced = send(proxy.url, CHAT, request)
        log = proxy.log_text()
    uncut = send(replica.url, CHAT, request)
    assert [r.cut for r in relay.api_requests()] == [True, False], "the first answer was cut, the replay was not"
    assert relay.api_requests()[0].content_events == after
    # Text for text, and token for token as the engine counts them (how it groups tokens into chunks may differ).
    assert spliced.text == uncut.text
    assert len({chunk["id"] for chunk in chunks_of(spliced)}) == 1
    assert sum("role" in (c["choices"] or [{}])[0].get("delta", {}) for c in chunks_of(spliced)) == 1
    assert spliced.events[-1]["choices"] == [] and spliced.usage["completion_tokens"] == uncut.usage["completion_tokens"]
    assert spliced.usage["prompt_tokens"] == uncut.usage["prompt_tokens"]
    assert RECOVERED_NOTE in log and "(replay)" in log and "Traceback" not in log
    assert ("40 bytes of an unfinished event dropped" in log) == bool(inside_event_bytes)


@pytest.mark.server
def test_the_openai_sdk_reads_the_completed_stream_as_one_completion(replica, tmp_path):
    request = body("Describe the parser.")
    with proxy_before_cuts(replica, tmp_path, Cut(MID_REPLY)) as (proxy, _):
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0)
        chunks = list(client.chat.completions.create(**{k: v for k, v in request.items() if k != "stream"}, stream=True))
    uncut = send(replica.url, CHAT, request)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == uncut.text and len({chunk.id for chunk in chunks}) == 1
    assert chunks[-1].usage.total_tokens == uncut.usage["total_tokens"]


@pytest.mark.server
def test_a_replay_cut_too_is_asked_again_from_what_the_client_has_by_then(replica, tmp_path):
    request = body("Explain the cache in detail.")
    with proxy_before_cuts(replica, tmp_path, Cut(MID_REPLY, streams=2)) as (proxy, relay):
        spliced = send(proxy.url, CHAT, request)
    uncut = send(replica.url, CHAT, request)
    assert [r.cut for r in relay.api_requests()] == [True, True, False]
    assert spliced.text == uncut.text


@pytest.mark.server
def test_a_stream_that_cannot_be_completed_ends_with_the_error_event(replica, tmp_path):
    with proxy_before_cuts(replica, tmp_path, Cut(MID_REPLY, streams=MAX_ATTEMPTS + 1)) as (proxy, relay):
        answer = send(proxy.url, CHAT, body("Explain the router."))
        log = proxy.log_text()
    assert len(relay.api_requests()) == MAX_ATTEMPTS + 1
    assert answer.events[-1]["error"]["code"] == "engine_unavailable" and "broke off its answer" in answer.events[-1]["error"]["message"]
    assert "could not complete the stream" in log


@pytest.mark.server
def test_a_stream_that_cannot_be_completed_ends_silently_for_qwen_code_which_sends_again_only_then(replica, tmp_path):
    """Qwen Code (and Pi) lose the turn to the error event, and send the request again after a silent cut (bench/probes/agent_cuts.py)."""
    with proxy_before_cuts(replica, tmp_path, Cut(MID_REPLY, streams=MAX_ATTEMPTS + 1)) as (proxy, _):
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=120)
        connection.request("POST", CHAT, body=json.dumps(body("Explain the proxy.")),
                           headers={"content-type": "application/json", "user-agent": "QwenCode/0.24.4 (linux; x64)"})
        response, received = connection.getresponse(), b""
        with pytest.raises(http.client.IncompleteRead):
            while chunk := response.read1(65536):
                received += chunk
        log = proxy.log_text()
    assert b'"error"' not in received and b"[DONE]" not in received
    assert "it ends with a silent cut, after which Qwen Code sends it again" in log


@pytest.mark.server
def test_continue_mode_has_the_engine_continue_the_delivered_text(replica, tmp_path):
    request = body("Write about the disk tier.")
    with proxy_before_cuts(replica, tmp_path, Cut(MID_REPLY), stream_recovery="continue") as (proxy, relay):
        spliced = send(proxy.url, CHAT, request)
        log = proxy.log_text()
    uncut = send(replica.url, CHAT, request)
    cut, *counts, continuation = relay.api_requests()
    assert cut.cut and not continuation.cut and continuation.last_role == "assistant"
    assert [count.stream for count in counts] == [False, False], "the prompt's tokens counted, then with the delivered text"
    assert "(continuation)" in log and spliced.events[-1]["choices"] == []
    # The usage of the whole answer: the prompt as the engine counts it, everything after it generated.
    assert spliced.usage["prompt_tokens"] == uncut.usage["prompt_tokens"]
    assert spliced.usage["prompt_tokens"] + spliced.usage["completion_tokens"] == spliced.usage["total_tokens"]
    assert len({chunk["id"] for chunk in chunks_of(spliced)}) == 1


@pytest.mark.server
def test_turned_off_the_cut_stream_ends_with_the_error_event_as_before(replica, tmp_path):
    with proxy_before_cuts(replica, tmp_path, Cut(MID_REPLY), stream_recovery="off") as (proxy, relay):
        answer = send(proxy.url, CHAT, body("Explain the lanes."))
    assert len(relay.api_requests()) == 1 and "error" in answer.events[-1]
