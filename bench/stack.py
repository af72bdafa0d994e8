"""The four configurations the benchmark compares, and starting one of them.

The configuration table is here and nowhere else: the demo runs the product
(`4-patched+addon`), the benchmark runs all of them, one after the other, each
on freshly started servers so no cache carries over.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.bench.replay import Measured, replay
from stable_prefix.bench.session import Request
from stable_prefix.tools.servers import REPO_ROOT, VENV_BIN, Server, free_port, http_ok, mitmdump_command, running

SERVED_MODEL_NAME = "tiny-model"
TOOL_CALL_PARSER = "hermes"  # Qwen's tool-call format
# How a Claude Code user serves a model with vllm-mlx: tool calls parsed.
SERVE_FLAGS = ["--served-model-name", SERVED_MODEL_NAME, "--enable-auto-tool-choice", "--tool-call-parser", TOOL_CALL_PARSER]
ADDON_SCRIPTS = ["addons/strip_billing.py"]
CAPTURE_SCRIPT = "addons/capture.py"
CAPTURE_ROOT = REPO_ROOT / "captures" / "sessions"  # capture.py's default capture_dir
UNBUFFERED = {"PYTHONUNBUFFERED": "1"}  # log lines must reach the log file as they happen


@dataclass(frozen=True)
class Configuration:
    key: str
    engine: str  # "shipped" (vllm-mlx 0.6.0 as released), "patched" (engine_patch) or "mlx-lm" (mlx_lm.server)
    addon: bool  # client -> mitmdump with our addon -> engine, or client -> engine
    title: str
    protocol: str = "anthropic"  # "openai": the requests go to /v1/chat/completions (bench.openai_form)


CONFIGURATIONS = (
    Configuration("1-shipped", "shipped", False, "vllm-mlx 0.6.0 as shipped, direct"),
    Configuration("2-shipped+addon", "shipped", True, "vllm-mlx 0.6.0 as shipped, behind the addon"),
    Configuration("3-patched", "patched", False, "patched engine, direct"),
    Configuration("4-patched+addon", "patched", True, "patched engine behind the addon (the product)"),
    # An outside anchor: mlx-lm's own server and its LRU prompt cache, OpenAI path only.
    Configuration("5-mlx-lm", "mlx-lm", False, "mlx_lm.server 0.31.3 (OpenAI path, LRU prompt cache), outside anchor", "openai"),
)
PRODUCT = CONFIGURATIONS[3]


def configuration(key: str) -> Configuration:
    for candidate in CONFIGURATIONS:
        if candidate.key == key or candidate.key.split("-", 1)[0] == key:
            return candidate
    raise ValueError(f"configuration {key!r}: unknown; choose from {', '.join(c.key for c in CONFIGURATIONS)}")


def engine_command(engine: str, model_dir: Path, port: int, engine_flags: Sequence[str] = ()) -> list[str]:
    if engine == "mlx-lm":
        return [str(VENV_BIN / "python"), "-m", "mlx_lm.server", "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    serve = ["serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *SERVE_FLAGS, *engine_flags]
    if engine == "shipped":
        return [str(VENV_BIN / "vllm-mlx"), *serve]
    # Snapshots stay in RAM unless a run asks for a disk directory: nothing carries over between runs.
    disk = [] if "--prefix-cache-dir" in engine_flags else ["--no-disk-cache"]
    return [str(VENV_BIN / "python"), "-m", "stable_prefix.engine_patch", *serve, *disk]


def proxy_options(served_model: str = SERVED_MODEL_NAME) -> dict[str, object]:
    return {"upstream_model": served_model, "max_tokens_cap": 8192}


@dataclass
class Endpoints:
    client_url: str  # where the client sends its requests
    server_url: str  # the engine itself
    server_log: Path
    proxy_log: Path | None
    capture_dir: Path | None  # where capture.py writes this session's records
    engine: Server | None = None  # the engine's process (the restart scenario kills it)

    def replay(self, requests: list[Request], **options) -> list[Measured]:
        """Replay `requests` through this stack, reading reuse from its engine and logs."""
        return replay(
            requests,
            self.client_url,
            server_url=self.server_url,
            server_log=self.server_log,
            proxy_log=self.proxy_log,
            **options,
        )


@contextlib.contextmanager
def started(
    config: Configuration, model_dir: Path, log_dir: Path, *, capture_session: str | None = None,
    engine_flags: Sequence[str] = (), engine_env: dict[str, str] | None = None,
) -> Iterator[Endpoints]:
    """Start `config`'s engine (and proxy, with capture.py when `capture_session` is
    given); both stop on exit, also on error or Ctrl-C."""
    engine_port = free_port()
    models_url = f"http://127.0.0.1:{engine_port}/v1/models"
    command = engine_command(config.engine, model_dir, engine_port, engine_flags)
    env = {**UNBUFFERED, **(engine_env or {})}
    with running(f"{config.key}-engine", command, port=engine_port, log_dir=log_dir, ready=lambda: http_ok(models_url), env=env) as engine:
        if not config.addon:
            yield Endpoints(engine.url, engine.url, engine.log_path, None, None, engine)
            return
        proxy_port = free_port()
        scripts, options, capture_dir = list(ADDON_SCRIPTS), proxy_options(), None
        if capture_session is not None:
            scripts.append(CAPTURE_SCRIPT)
            options["capture_session"] = capture_session
            capture_dir = CAPTURE_ROOT / capture_session
        proxy = mitmdump_command(scripts, engine.url, proxy_port, options)
        with running(f"{config.key}-mitmdump", proxy, port=proxy_port, log_dir=log_dir, env=UNBUFFERED) as mitmdump:
            yield Endpoints(mitmdump.url, engine.url, engine.log_path, mitmdump.log_path, capture_dir, engine)


def cpu_description() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPU cores{', ' + model if model else ''}"
