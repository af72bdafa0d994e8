"""Each benchmark configuration starts from nothing: vllm-mlx --continuous-batching keeps its
prefix cache on disk between runs, so every engine gets its own empty home, removed when it stops."""

import json
from pathlib import Path

import pytest

from stable_prefix.bench.clients.replay import MESSAGES_PATH, post_streamed
from stable_prefix.bench.clients.stack import SERVED_MODEL_NAME, configuration, started
from tests.support.models import require_model

pytestmark = pytest.mark.server


def test_the_batched_engines_on_disk_cache_starts_empty_and_is_removed(tmp_path):
    long_prompt = " ".join(f"word{n % 97} alpha beta" for n in range(400))  # long enough for its cache to keep
    body = {"model": SERVED_MODEL_NAME, "max_tokens": 2, "stream": True, "messages": [{"role": "user", "content": long_prompt}]}
    with started(configuration("6"), require_model(), tmp_path) as endpoints:
        home = endpoints.engine_home
        assert home.is_dir() and home != Path.home()
        assert post_streamed(endpoints.client_url, MESSAGES_PATH, json.dumps(body).encode()).status == 200
    log = endpoints.server_log.read_text()
    assert "No prefix cache entries found on disk" in log
    assert f"Saved prefix cache to {home}/.cache/vllm-mlx/prefix_cache" in log  # it wrote there on shutdown ...
    assert not home.exists()  # ... and nothing of it is left for the next run
