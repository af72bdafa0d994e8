"""The bench compares turn times at equal output length because every engine it runs decodes
greedily when asked: temperature 0 gives the same reply every time, on each endpoint the bench
uses, cached or not, while temperature 1 samples (so it is the temperature that made them equal)."""

import json

import pytest

from stable_prefix.addons.chat_splice import pieces_of
from stable_prefix.addons.sse_events import carries_output
from stable_prefix.bench.clients.replay import CHAT_COMPLETIONS_PATH, MESSAGES_PATH
from stable_prefix.bench.clients.stack import SERVED_MODEL_NAME, configuration, started
from tests.support.llm_client import send
from tests.support.models import require_model

pytestmark = pytest.mark.server

PROMPT = "Read the cache module, then say which function trims a prompt cache and why."
# vllm-mlx's SimpleEngine and --continuous-batching, the patched engine, mlx_lm.server, Rapid-MLX.
ENGINES = ["1-shipped", "6-batched", "3-patched", "5-mlx-lm", "8-rapid-mlx"]


def body(temperature: float, model: str | None) -> dict:
    request = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12, "temperature": temperature, "stream": True}
    return request if model is None else {**request, "model": model}


def pieces(event: dict) -> list[tuple[str, str]]:
    """(kind, text) of one output event: an Anthropic delta's one text field, or a chat chunk's fields."""
    if "delta" in event:
        delta = event["delta"]
        return [(delta["type"], next((value for key, value in delta.items() if key != "type"), ""))]
    return [(f"{piece.kind}{piece.index}", piece.text) for choice in event["choices"] for piece in pieces_of(choice.get("delta") or {})]


def reply(base_url: str, path: str, temperature: float, model: str | None) -> str:
    """Everything the reply's output events carried (text, thinking, tool calls), in order, runs of one kind
    joined: how an engine groups tokens into events is not the reply (a drafted step sends its accepted run in one)."""
    answer = send(base_url, path, body(temperature, model))
    output: list[list[str]] = []
    for event in filter(carries_output, answer.events):
        for kind, text in pieces(event):
            if output and output[-1][0] == kind:
                output[-1][1] += text
            else:
                output.append([kind, text])
    return json.dumps(output)


@pytest.mark.parametrize("key", ENGINES)
def test_temperature_zero_decodes_the_same_reply_every_time_and_temperature_one_does_not(key, tmp_path):
    config = configuration(key)
    paths = [CHAT_COMPLETIONS_PATH] if config.protocol == "openai" else [MESSAGES_PATH, CHAT_COMPLETIONS_PATH]
    model = None if config.protocol == "openai" else SERVED_MODEL_NAME  # mlx_lm.server serves its --model by default
    with started(config, require_model(), tmp_path) as endpoints:
        for path in paths:
            greedy = [reply(endpoints.client_url, path, 0, model) for _ in range(3)]  # the second and third: cache hits
            assert greedy[0] != "[]" and greedy[0] == greedy[1] == greedy[2], (path, greedy)
            sampled = [reply(endpoints.client_url, path, 1.0, model) for _ in range(2)]
            assert sampled[0] != sampled[1], (path, sampled)
