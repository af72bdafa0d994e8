"""Which vllm-mlx releases the patch installs on, and what it does on others."""

import inspect
import logging
import subprocess
import sys

import mlx_lm
import pytest
import vllm_mlx
from mlx_lm.models.cache import KVCache
from transformers import AutoTokenizer

from stable_prefix.engine_patch.__main__ import engine_mode, parse_size
from stable_prefix.engine_patch.cache.ram_tier import RamTier
from stable_prefix.engine_patch.cache.request_plan import PrefixPlanner
from stable_prefix.engine_patch.drafts.drafting import Drafting
from stable_prefix.engine_patch.install import DEFAULT_ENGINE, install, why_unsupported
from stable_prefix.engine_patch.vllm_mlx.seam_table import take_out
from stable_prefix.engine_patch.vllm_mlx.simple.seams import SimpleEngineSeams
from tests.support.llm_client import send
from tests.support.models import require_model
from tests.support.processes import REPO_ROOT, free_port, http_ok, running


def test_the_pinned_release_is_recognised():
    assert vllm_mlx.__version__ == "0.6.0"
    assert why_unsupported(vllm_mlx) is None


def test_an_unrecognised_release_is_left_unpatched_and_the_reason_logged(monkeypatch, caplog):
    monkeypatch.setattr(vllm_mlx, "__version__", "9.1.0")
    before = mlx_lm.stream_generate
    with caplog.at_level(logging.WARNING, logger="engine_patch"):
        assert install(budget_bytes=2**20) is None
    assert mlx_lm.stream_generate is before
    assert "vllm-mlx left unpatched: version 9.1.0 is not one the patch is tested with (0.3.0, 0.6.0)" in caplog.text


def test_install_and_serve_run_the_batched_engine_unless_told_otherwise():
    # One default, as docs/engine.md documents it: embedding install() gets the engine `serve` and `up` run.
    assert DEFAULT_ENGINE == "batched"
    assert inspect.signature(install).parameters["engine"].default == DEFAULT_ENGINE
    assert engine_mode(None, []) == DEFAULT_ENGINE


def test_a_release_between_the_tested_ones_is_left_unpatched_too(monkeypatch):
    monkeypatch.setattr(vllm_mlx, "__version__", "0.5.0")
    assert "0.5.0 is not one the patch is tested with" in why_unsupported(vllm_mlx)


def test_a_release_whose_text_path_no_longer_ends_in_mlx_lm_is_not_recognised(monkeypatch):
    from vllm_mlx.models.llm import MLXLanguageModel

    def stream_generate(self, prompt, **kwargs):
        yield from ()

    monkeypatch.setattr(MLXLanguageModel, "stream_generate", stream_generate)
    assert "no longer calls mlx_lm.stream_generate" in why_unsupported(vllm_mlx)


@pytest.mark.parametrize("text, size", [("8GiB", 8 * 2**30), ("512MB", 512 * 10**6), ("1000000", 10**6), ("1.5 GiB", 3 * 2**29)])
def test_cache_budgets_are_given_in_bytes_with_units(text, size):
    assert parse_size(text) == size


def test_a_malformed_budget_is_refused_with_the_flag_named():
    result = subprocess.run(
        [sys.executable, "-m", "stable_prefix.engine_patch", "serve", "model", "--prefix-cache-bytes", "lots"],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )
    assert result.returncode != 0
    assert "--prefix-cache-bytes: 'lots' is not a size" in result.stderr


@pytest.mark.server
@pytest.mark.slow
def test_an_older_release_without_a_cache_of_its_own_gets_one(tmp_path):
    """vllm-mlx 0.3.0 (no cache on the chat path), imported ahead of the pinned one."""
    target = REPO_ROOT / "build" / "vllm-mlx-0.3.0"
    if not (target / "vllm_mlx").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), "vllm-mlx==0.3.0"],
            check=True,
        )
    port = free_port()
    command = [sys.executable, "-m", "stable_prefix.engine_patch", "serve", str(require_model()), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", "tiny"]
    with running("vllm-mlx-0.3.0", command, port=port, log_dir=tmp_path, env={"PYTHONPATH": str(target)},
                 ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models")) as server:
        body = {"model": "tiny", "max_tokens": 4, "temperature": 0, "stream": True, "system": "Answer briefly.",
                "messages": [{"role": "user", "content": "Which files changed in the last commit?"}]}
        send(server.url, "/v1/messages", body)
        second = send(server.url, "/v1/messages", body)
        assert "prefix cache installed on vllm-mlx 0.3.0" in server.log_text()
    assert second.usage["cache_read_input_tokens"] > 0


class CustomKVCache(KVCache):
    """A model's own subclass of KVCache: vllm-mlx's system-prefix cache takes it, ours does not."""


class ModelWithCustomCache:
    layers = [None]

    def make_cache(self):
        return [CustomKVCache()]


class ModelWithPlainCache:
    layers = [None]

    def make_cache(self):
        return [KVCache()]


@pytest.fixture
def deferred():
    """SimpleEngine's seams installed (its system-prefix ones among them); every patched attribute put back afterwards."""
    from vllm_mlx.engine import simple

    seams = SimpleEngineSeams(PrefixPlanner(RamTier(budget_bytes=2**20)), Drafting("off"))
    seams.install()
    tokenizer = AutoTokenizer.from_pretrained(str(require_model()))
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Hello"}]
    template_kwargs = {"tokenize": False, "add_generation_prompt": True}

    def system_prefix():
        return simple.build_system_prompt_cache_prefix(tokenizer, messages, template_kwargs=template_kwargs)

    yield simple.SimpleEngine, system_prefix
    take_out(seams.patches)


def test_a_model_our_cache_cannot_serve_keeps_vllm_mlxs_own_system_prefix_cache(deferred):
    engine, system_prefix = deferred
    assert engine._probe_system_kv_cache_support(ModelWithCustomCache(), "llm") is True
    assert system_prefix().startswith("<|im_start|>system\nYou are a coding agent.")


def test_a_model_our_cache_serves_turns_vllm_mlxs_system_prefix_cache_off(deferred):
    engine, system_prefix = deferred
    engine._probe_system_kv_cache_support(ModelWithPlainCache(), "llm")
    assert system_prefix() is None
