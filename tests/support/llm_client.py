"""A small client for the three protocols (Anthropic messages, OpenAI chat
completions, the Responses API): send a request, streamed or not, and return
the answer text, the usage object and the time to the first token
(`sse_events.carries_output`, as everywhere in the project)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import requests

from stable_prefix.addons.sse_events import EventStream

RESPONSES_PATH = "/v1/responses"


@dataclass
class Answer:
    text: str
    usage: dict
    ttft_s: float | None = None
    events: list[dict] = field(default_factory=list)
    response: dict | None = None  # the Responses API's response object (streamed: the final event's)


def send(base_url: str, path: str, body: dict, timeout: float = 300.0) -> Answer:
    if body.get("stream"):
        return _send_streamed(base_url, path, body, timeout)
    response = requests.post(base_url + path, json=body, timeout=timeout)
    response.raise_for_status()
    payload = response.json()
    return Answer(text=_json_text(path, payload), usage=payload["usage"], response=payload if path == RESPONSES_PATH else None)


def _json_text(path: str, payload: dict) -> str:
    if path == "/v1/messages":
        return "".join(block.get("text", "") for block in payload["content"] if block["type"] == "text")
    if path == RESPONSES_PATH:
        return output_text(payload)
    return payload["choices"][0]["message"].get("content") or ""


def output_text(response: dict) -> str:
    """The assistant text of a Responses API response object."""
    return "".join(part.get("text", "") for item in response.get("output") or [] if item.get("type") == "message"
                   for part in item.get("content") or [] if part.get("type") == "output_text")


def _send_streamed(base_url: str, path: str, body: dict, timeout: float) -> Answer:
    started = time.perf_counter()
    stream = EventStream(clock=time.perf_counter)
    text, events = "", []
    with requests.post(base_url + path, json=body, timeout=timeout, stream=True) as response:
        response.raise_for_status()
        for chunk in response.iter_content(chunk_size=None):
            for event in stream.feed(chunk):
                payload = event.json()
                if isinstance(payload, dict):
                    events.append(payload)
                    text += _text_delta(path, payload)
    ttft = None if stream.first_output_at is None else stream.first_output_at - started
    return Answer(text=text, usage=stream.usage, ttft_s=ttft, events=events, response=stream.response)


def text_of(path: str, body: str) -> str:
    """The answer text of a response body as recorded (SSE events or one JSON object)."""
    stream = EventStream()
    events = [event.json() for event in stream.feed(body.encode())]
    if events:
        return "".join(_text_delta(path, event) for event in events if isinstance(event, dict))
    return _json_text(path, json.loads(body))


def _text_delta(path: str, event: dict) -> str:
    if path == "/v1/messages":
        if event.get("type") == "content_block_delta" and event["delta"].get("type") == "text_delta":
            return event["delta"]["text"]
        return ""
    if path == RESPONSES_PATH:
        return (event.get("delta") or "") if event.get("type") == "response.output_text.delta" else ""
    choices = event.get("choices") or []
    return "".join((choice.get("delta") or {}).get("content") or "" for choice in choices)


def reused_tokens(path: str, usage: dict) -> int | None:
    if path == "/v1/messages":
        return usage.get("cache_read_input_tokens")
    if path == RESPONSES_PATH:
        return (usage.get("input_tokens_details") or {}).get("cached_tokens")
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def prompt_tokens(path: str, usage: dict) -> int:
    if path == "/v1/messages":
        return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    return usage["prompt_tokens"]


def clear_cache(base_url: str) -> dict:
    response = requests.delete(base_url + "/v1/cache", timeout=30)
    response.raise_for_status()
    return response.json()


def cache_stats(base_url: str) -> dict:
    response = requests.get(base_url + "/v1/cache/stats", timeout=30)
    response.raise_for_status()
    return response.json()
