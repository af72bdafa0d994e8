"""The configurations the benchmark compares, and starting one of them.

The configuration table is here and nowhere else: the demo runs the product
(`4-patched+addon`), the benchmark runs all of them, one after the other, each
on freshly started servers so no cache carries over. Each engine also gets a
fresh, empty home directory, removed when it stops: vllm-mlx's batched engine
saves its prefix cache to `~/.cache/vllm-mlx/prefix_cache/` on a clean
shutdown and loads it at start, which would carry one run's cache into the next.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from stable_prefix.bench.replay import Measured, Replayer, replay
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
# vllm-mlx 0.6.0's SimpleEngine answers 503 to a request that arrives while another
# runs, unless told to queue it; a user whose subagents run concurrently must set
# this (the engine patch sets it by default). It changes nothing for sequential requests.
QUEUE_CONCURRENT_REQUESTS = {"VLLM_MLX_SIMPLE_ENGINE_LOCK_ADMISSION": "wait"}


@dataclass(frozen=True)
class Configuration:
    key: str
    # "shipped" (vllm-mlx 0.6.0 as released), "batched" (the same with --continuous-batching),
    # "patched" (engine_patch) or "mlx-lm" (mlx_lm.server)
    engine: str
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
    # vllm-mlx's strongest mode as shipped: its batched engine and memory-aware prefix cache.
    Configuration("6-batched", "batched", False, "vllm-mlx 0.6.0 --continuous-batching as shipped, direct"),
    Configuration("7-batched+addon", "batched", True, "vllm-mlx 0.6.0 --continuous-batching as shipped, behind the addon (the anchor)"),
)
PRODUCT = CONFIGURATIONS[3]
BATCHED_ANCHOR = CONFIGURATIONS[6]


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
    if engine == "batched":
        return [str(VENV_BIN / "vllm-mlx"), *serve, "--continuous-batching"]
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
    engine_home: Path | None = None  # the engine's own empty home directory, removed when it stops

    def replay(self, requests: list[Request], **options) -> list[Measured]:
        """Replay `requests` through this stack, reading reuse from its engine and logs."""
        return replay(requests, self.client_url, server_url=self.server_url, server_log=self.server_log, proxy_log=self.proxy_log, **options)

    def replayer(self, **options) -> Replayer:
        """A `Replayer` for this stack, for replays that take turns with other stacks."""
        return Replayer(self.client_url, server_url=self.server_url, server_log=self.server_log, proxy_log=self.proxy_log, **options)


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
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"stable-prefix-{config.key}-home-")))
        env = {**UNBUFFERED, **QUEUE_CONCURRENT_REQUESTS, "HOME": str(home), **(engine_env or {})}
        engine = stack.enter_context(running(f"{config.key}-engine", command, port=engine_port, log_dir=log_dir, ready=lambda: http_ok(models_url), env=env))
        if not config.addon:
            yield Endpoints(engine.url, engine.url, engine.log_path, None, None, engine, home)
            return
        proxy_port = free_port()
        scripts, options, capture_dir = list(ADDON_SCRIPTS), proxy_options(), None
        if capture_session is not None:
            scripts.append(CAPTURE_SCRIPT)
            options["capture_session"] = capture_session
            capture_dir = CAPTURE_ROOT / capture_session
        proxy = mitmdump_command(scripts, engine.url, proxy_port, options)
        mitmdump = stack.enter_context(running(f"{config.key}-mitmdump", proxy, port=proxy_port, log_dir=log_dir, env=UNBUFFERED))
        yield Endpoints(mitmdump.url, engine.url, engine.log_path, mitmdump.log_path, capture_dir, engine, home)


@contextlib.contextmanager
def stop_servers_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM unwinds like Ctrl-C, so a stopped benchmark or demo stops
    its servers too (a background job ignores SIGINT, and SIGTERM's default would orphan them)."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cpu_description() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPU cores{', ' + model if model else ''}"
