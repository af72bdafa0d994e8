"""Through a real patched server with the tiny test model (context 32,768 tokens), in both engine modes: a
prompt beyond the context is refused at once in its protocol's own error, streamed or not, before any of it
is prefilled; a client that gives up during a long prefill stops it (SimpleEngine: at the next chunk, ours;
the batched engine: vllm-mlx's own abort), nothing of it is stored, and the next request is served."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support.engines import engine
from tests.support.llm_client import cache_stats, send

pytestmark = pytest.mark.server

CONTEXT = 32768


def words(count: int, salt: str) -> str:
    return " ".join(f"{salt}{index}" for index in range(count))


# 5,000 such words are ~24K tokens: a prefill of several seconds here, inside the context.
LONG_PROMPT_WORDS = 5000
BEYOND_CONTEXT = words(9000, "w")  # ~43K tokens
BATCH_ABORT = "removed_from_batch=True"  # vllm-mlx's scheduler log line for a request taken out mid-flight


@pytest.fixture(scope="module", params=["simple", "batched"])
def server(tmp_path_factory, request):
    with engine(tmp_path_factory.mktemp(request.param), request.param, "--engine", request.param, "--no-disk-cache") as running_server:
        yield running_server


def request_body(path: str, content: str, stream: bool, max_tokens: int = 5) -> dict:
    return {"model": "tiny", "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": content}]}


def refusal(server, path: str, content: str, stream: bool) -> dict:
    """The error a refused request gets: a 400 body, streamed or not (a stream's start waits for the engine's verdict)."""
    response = requests.post(server.url + path, json=request_body(path, content, stream), timeout=300)
    assert response.status_code == 400 and response.headers["content-type"].startswith("application/json")
    return response.json()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_anthropic_prompt_beyond_the_context_is_refused_with_invalid_request_error(server, stream):
    before = cache_stats(server.url)
    error = refusal(server, "/v1/messages", BEYOND_CONTEXT, stream)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith("prompt is too long: ")
    assert error["error"]["message"].endswith(f" tokens > {CONTEXT} maximum")
    after = cache_stats(server.url)
    assert after["prompts_refused"] == before["prompts_refused"] + 1
    assert after["tokens_prefilled"] == before["tokens_prefilled"] and after["misses"] == before["misses"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_openai_prompt_beyond_the_context_is_refused_with_context_length_exceeded(server, stream):
    error = refusal(server, "/v1/chat/completions", BEYOND_CONTEXT, stream)
    assert error["error"]["code"] == "context_length_exceeded"
    assert f"maximum context length is {CONTEXT} tokens" in error["error"]["message"]


def test_a_paste_of_megabytes_is_refused_like_any_prompt_beyond_the_context(server):
    paste = "".join(f"line {line:06d}: a pasted log entry with a value of {line % 991:03d}\n" for line in range(60_000))  # 3.7 MB
    before = cache_stats(server.url)
    error = refusal(server, "/v1/messages", paste, stream=True)
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].endswith(f" tokens > {CONTEXT} maximum")
    assert cache_stats(server.url)["tokens_prefilled"] == before["tokens_prefilled"]


def test_a_prompt_inside_the_context_still_streams_as_before(server):
    answer = send(server.url, "/v1/messages", request_body("/v1/messages", "Say hello.", stream=True))
    assert answer.events[0]["type"] == "message_start" and answer.events[-1]["type"] == "message_stop"
    assert answer.usage["output_tokens"] > 0


def give_up_during_the_prefill(url: str, stream: bool, salt: str) -> None:
    with pytest.raises(requests.exceptions.RequestException):
        # a client timeout: the connection is closed while the engine prefills
        response = requests.post(url + "/v1/messages", json=request_body("/v1/messages", words(LONG_PROMPT_WORDS, salt), stream),
                                 timeout=2, stream=False)
        response.raise_for_status()
        raise AssertionError(f"answered before the client gave up: {response.status_code}")


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.2)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_that_gives_up_during_the_prefill_stops_it_and_the_next_request_is_served(server, stream):
    before, aborted_before = cache_stats(server.url), server.log_text().count(BATCH_ABORT)
    give_up_during_the_prefill(server.url, stream, salt="s" if stream else "n")
    if server.name == "batched":
        # vllm-mlx's batched engine takes an abandoned request out of the batch itself, mid-prefill
        wait_for(lambda: server.log_text().count(BATCH_ABORT) == aborted_before + 1)
    else:
        wait_for(lambda: cache_stats(server.url)["prefills_stopped"] == before["prefills_stopped"] + 1)
        after = cache_stats(server.url)
        # stopped between chunks: most of the prompt was never prefilled
        assert after["prefill_tokens_skipped"] - before["prefill_tokens_skipped"] > 2048
        assert "prefill stopped: the client disconnected after" in server.log_text()
    assert cache_stats(server.url)["stores"] == before["stores"]  # nothing of it was stored
    answer = send(server.url, "/v1/messages", request_body("/v1/messages", "Say hello.", stream=False))
    assert answer.usage["output_tokens"] > 0


def test_every_request_s_wait_in_the_queue_is_counted_and_logged(server):
    before, logged = cache_stats(server.url), server.log_text().count("in the queue")
    with ThreadPoolExecutor(max_workers=3) as pool:  # three at once: in SimpleEngine two of them queue
        list(pool.map(lambda n: send(server.url, "/v1/messages", request_body("/v1/messages", words(300, f"q{n}"), stream=False)),
                      range(3)))
    after = cache_stats(server.url)
    assert after["requests_admitted"] == before["requests_admitted"] + 3
    assert after["queue_wait_seconds_total"] > before["queue_wait_seconds_total"]
    assert after["queue_wait_seconds_max"] >= (after["queue_wait_seconds_total"] - before["queue_wait_seconds_total"]) / 3
    assert server.log_text().count("in the queue") == logged + 3
