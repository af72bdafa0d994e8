"""The bench compares turn times at equal output length because every engine it runs decodes
greedily when asked: temperature 0 gives the same reply every time, on each endpoint the bench
uses, cached or not, while temperature 1 samples (so it is the temperature that made them equal)."""

import pytest

from stable_prefix.bench.replay import CHAT_COMPLETIONS_PATH, MESSAGES_PATH
from stable_prefix.bench.stack import SERVED_MODEL_NAME, configuration, started
from tests.support.llm_client import send
from tests.support.models import require_model

pytestmark = pytest.mark.server

PROMPT = "Read the cache module, then say which function trims a prompt cache and why."
# vllm-mlx's SimpleEngine and --continuous-batching, the patched engine, mlx_lm.server, Rapid-MLX.
ENGINES = ["1-shipped", "6-batched", "3-patched", "5-mlx-lm", "8-rapid-mlx"]


def body(path: str, temperature: float) -> dict:
    request = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12, "temperature": temperature, "stream": True}
    return request if path == CHAT_COMPLETIONS_PATH else {**request, "model": SERVED_MODEL_NAME}


@pytest.mark.parametrize("key", ENGINES)
def test_temperature_zero_decodes_the_same_reply_every_time_and_temperature_one_does_not(key, tmp_path):
    config = configuration(key)
    paths = [CHAT_COMPLETIONS_PATH] if config.protocol == "openai" else [MESSAGES_PATH, CHAT_COMPLETIONS_PATH]
    with started(config, require_model(), tmp_path) as endpoints:
        for path in paths:
            greedy = [send(endpoints.client_url, path, body(path, 0)) for _ in range(3)]  # the second and third: cache hits
            assert greedy[0].text and greedy[0].text == greedy[1].text == greedy[2].text, (path, [answer.text for answer in greedy])
            sampled = [send(endpoints.client_url, path, body(path, 1.0)).text for _ in range(2)]
            assert sampled[0] != sampled[1], (path, sampled)
