"""The configurations the benchmark compares, the engines they run, and starting one of them.

The configuration table is here and nowhere else: the demo runs the product
(`4-patched+addon`), the benchmark runs all of them, each on freshly started
servers so no cache carries over. A configuration is an engine (a server
program, `ENGINES`), the flags it is started with, and whether our addon sits in
front of it. Each engine also gets a fresh, empty home directory, removed when it
stops: vllm-mlx's batched engine saves its prefix cache to
`~/.cache/vllm-mlx/prefix_cache/` on a clean shutdown and loads it at start, and
Rapid-MLX does the same under `~/.cache/rapid-mlx/`, which would carry one run's
cache into the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stable_prefix.bench.clients.engine_tree import EngineTree
from stable_prefix.bench.clients.replay import PROXY_MAX_TOKENS_CAP, Measured, Replayer, replay, warm_up
from stable_prefix.bench.workload.session import Request
from stable_prefix.servers import REPO_ROOT, VENV_BIN, Server, free_port, http_ok, mitmdump_command, running

SERVED_MODEL_NAME = "tiny-model"
TOOL_CALL_PARSER = "hermes"  # Qwen's tool-call format
# How a Claude Code user serves a model with vllm-mlx (and Rapid-MLX, which keeps its flags): tool calls parsed.
SERVE_FLAGS = ["--served-model-name", SERVED_MODEL_NAME, "--enable-auto-tool-choice", "--tool-call-parser", TOOL_CALL_PARSER]
ADDON_SCRIPTS = ["addons/strip_billing.py"]
CAPTURE_SCRIPT = "addons/capture.py"
CAPTURE_ROOT = REPO_ROOT / "captures" / "sessions"  # capture.py's default capture_dir
UNBUFFERED = {"PYTHONUNBUFFERED": "1"}  # log lines must reach the log file as they happen
# vllm-mlx 0.6.0's SimpleEngine answers 503 to a request that arrives while another
# runs, unless told to queue it; a user whose subagents run concurrently must set
# this (the engine patch sets it by default). It changes nothing for sequential requests.
QUEUE_CONCURRENT_REQUESTS = {"VLLM_MLX_SIMPLE_ENGINE_LOCK_ADMISSION": "wait"}

# Rapid-MLX pins other versions of mlx-lm's neighbours than ours (transformers, tokenizers,
# fastapi, ...), so it lives in a venv of its own (`make rapid-mlx`); its server is that
# venv's `vllm-mlx` script.
RAPID_MLX_VERSION = "0.16.10"
RAPID_MLX_VENV = REPO_ROOT / "build" / "rapid-mlx-venv"
# Nothing of a bench run may leave the machine: no usage telemetry, no update check,
# no model download (it serves the local model directory).
RAPID_MLX_OFFLINE = {
    "RAPID_MLX_TELEMETRY": "0",
    "RAPID_MLX_DISABLE_VERSION_CHECK": "1",
    "RAPID_MLX_DISABLE_MODEL_DOWNLOADS": "1",
    "RAPID_MLX_NO_BANNER": "1",
    "HF_HUB_OFFLINE": "1",
}


@dataclass(frozen=True)
class Engine:
    """A server program: how to start it, how to empty its prefix cache, and where it reports
    what it reused (`bench.clients.replay.reuse_figures`, in this order of preference)."""

    name: str
    description: str
    command: Callable[[Path, int, Sequence[str]], list[str]] = field(repr=False)
    clear_cache: tuple[str, str] | None  # (method, path) of the request that empties its prefix cache; None: it has none
    reuse_sources: tuple[str, ...] = ("usage", "stats", "server-log")
    env: dict[str, str] = field(default_factory=dict)
    # Whether bench.workload.prompt_tokens renders its prompts token for token (vllm-mlx's conversion
    # on the Anthropic path, mlx_lm.server's on the OpenAI path); where not, the ideal-reuse
    # baseline and the in-context yardstick are unknown for it, never approximated.
    rendered: bool = True
    # Where it runs: the checkout whose code it imports (another checkout's engine runs from its own tree).
    cwd: Path = REPO_ROOT


def _vllm_mlx_serve(program: list[str]) -> Callable[[Path, int, Sequence[str]], list[str]]:
    """`PROGRAM serve MODEL` with vllm-mlx's flags (the patched engine and Rapid-MLX take them too)."""
    return lambda model_dir, port, flags: [*program, "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *SERVE_FLAGS, *flags]


def _patched_serve(python: Path) -> Callable[[Path, int, Sequence[str]], list[str]]:
    def command(model_dir: Path, port: int, flags: Sequence[str]) -> list[str]:
        # Snapshots stay in RAM unless a run asks for a disk directory: nothing carries over between runs.
        disk = [] if "--prefix-cache-dir" in flags else ["--no-disk-cache"]
        return [*_vllm_mlx_serve([str(python), "-m", "stable_prefix.engine_patch"])(model_dir, port, flags), *disk]

    return command


def _mlx_lm_server(model_dir: Path, port: int, flags: Sequence[str]) -> list[str]:
    return [str(VENV_BIN / "python"), "-m", "mlx_lm.server", "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *flags]


def _rapid_mlx_serve(model_dir: Path, port: int, flags: Sequence[str]) -> list[str]:
    program = RAPID_MLX_VENV / "bin" / "vllm-mlx"
    if not program.exists():
        raise FileNotFoundError(f"{program} is missing: run `make rapid-mlx` (Rapid-MLX {RAPID_MLX_VERSION} in its own venv; make bench does)")
    return _vllm_mlx_serve([str(program)])(model_dir, port, flags)


VLLM_MLX = Engine("vllm-mlx", "vllm-mlx 0.6.0 as released", _vllm_mlx_serve([str(VENV_BIN / "vllm-mlx")]), ("DELETE", "/v1/cache"))
PATCHED = Engine("patched", "vllm-mlx with engine_patch (our cache)", _patched_serve(VENV_BIN / "python"), ("DELETE", "/v1/cache"))
MLX_LM = Engine("mlx-lm", "mlx-lm's mlx_lm.server 0.31.3", _mlx_lm_server, None)
# Rapid-MLX reports reuse in its usage (cache_read_input_tokens, left out when nothing was
# cached) and in its scheduler's `[schedule] ... tokens_to_prefill=M` line. They agree except
# on an exact repeat, which its usage counts as all cached while the scheduler prefills the
# last token again: the log says what it prefilled. Its DELETE /v1/cache clears only vision
# caches. Its own Anthropic conversion renders the addon's requests a few tokens longer than
# vllm-mlx 0.6.0's, so they are not rendered here.
RAPID_MLX = Engine(
    "rapid-mlx", f"Rapid-MLX {RAPID_MLX_VERSION} (continuous batching always on)", _rapid_mlx_serve, ("POST", "/v1/cache/clear"),
    reuse_sources=("server-log", "usage"), env=RAPID_MLX_OFFLINE, rendered=False,
)
ENGINES = (VLLM_MLX, PATCHED, MLX_LM, RAPID_MLX)

CONTINUOUS_BATCHING = ("--continuous-batching",)


@dataclass(frozen=True)
class Configuration:
    key: str
    engine: Engine
    addon: bool  # client -> mitmdump with our addon -> engine, or client -> engine
    title: str
    engine_flags: tuple[str, ...] = ()  # what the engine is started with beyond SERVE_FLAGS
    protocol: str = "anthropic"  # "openai": the requests go to /v1/chat/completions (bench.workload.openai_form)

    @property
    def number(self) -> str:
        return self.key.split("-", 1)[0]


CONFIGURATIONS = (
    Configuration("1-shipped", VLLM_MLX, False, "vllm-mlx 0.6.0 as shipped, direct"),
    Configuration("2-shipped+addon", VLLM_MLX, True, "vllm-mlx 0.6.0 as shipped, behind the addon"),
    # The product in its default engine mode.
    Configuration("3-patched", PATCHED, False, "patched engine (its default engine mode), direct"),
    Configuration("4-patched+addon", PATCHED, True, "patched engine (its default engine mode) behind the addon (the product)"),
    # An outside anchor: mlx-lm's own server and its LRU prompt cache, OpenAI path only.
    Configuration("5-mlx-lm", MLX_LM, False, "mlx_lm.server 0.31.3 (OpenAI path, LRU prompt cache), outside anchor", protocol="openai"),
    # vllm-mlx's strongest mode as shipped: its batched engine and memory-aware prefix cache.
    Configuration("6-batched", VLLM_MLX, False, "vllm-mlx 0.6.0 --continuous-batching as shipped, direct", CONTINUOUS_BATCHING),
    Configuration("7-batched+addon", VLLM_MLX, True, "vllm-mlx 0.6.0 --continuous-batching as shipped, behind the addon (the anchor)", CONTINUOUS_BATCHING),
    # An outside anchor a Claude Code user may pick instead: Rapid-MLX, with its defaults
    # (prefix cache on, memory-aware, radix index) and the tool-call parser.
    Configuration("8-rapid-mlx", RAPID_MLX, False, f"Rapid-MLX {RAPID_MLX_VERSION} (continuous batching), direct"),
    Configuration("9-rapid-mlx+addon", RAPID_MLX, True, f"Rapid-MLX {RAPID_MLX_VERSION} (continuous batching), behind the addon"),
    # The product in its other engine mode (the patched engine's `--engine simple`).
    Configuration("10-patched-simple+addon", PATCHED, True, "patched engine, --engine simple, behind the addon", ("--engine", "simple")),
    # The product with one prompt per prefill batch: how its batched engine prefilled hybrid prompts
    # before recurrent_padding_fix (the before of issue 23, in the same run).
    Configuration("11-patched-one-prefill+addon", PATCHED, True, "patched engine, --prefill-batch-size 1 (one prompt per prefill), behind the addon",
                  ("--prefill-batch-size", "1")),
    # The product with drafted decoding off: what its default (`--draft auto`) costs or gains (issue 32).
    Configuration("12-patched-no-drafts+addon", PATCHED, True, "patched engine, --draft off, behind the addon", ("--draft", "off")),
)
PRODUCT = CONFIGURATIONS[3]
BATCHED_ANCHOR = CONFIGURATIONS[6]
RAPID_MLX_ANCHOR = CONFIGURATIONS[8]
MLX_LM_ANCHOR = CONFIGURATIONS[4]
# The anchors the product is compared with pair by pair, strongest first.
STRONGEST_ANCHORS = (BATCHED_ANCHOR, RAPID_MLX_ANCHOR, MLX_LM_ANCHOR)
# The product with one of its own features off, compared with it request by request like an anchor.
PRODUCT_WITHOUT_DRAFTS = CONFIGURATIONS[11]


def is_ours(config: Configuration) -> bool:
    """Our engine patch runs in it: the product (in either engine mode) or its parts; every other configuration is an anchor."""
    return config.engine.name.split("@")[0] == PATCHED.name


def product_of(tree: Path) -> Configuration:
    """The product with another checkout's engine (`engine_tree.py`): the engine before (or after) a change,
    in the same run as this checkout's (`--engine-tree`). This checkout's own is the product."""
    other = EngineTree.of(tree)
    if other.is_this_checkout:
        return PRODUCT
    engine = dataclasses.replace(PATCHED, name=f"patched@{other.name}", description=f"vllm-mlx with {other.tree}'s engine_patch",
                                 command=_patched_serve(other.python), env={**PATCHED.env, **other.env}, cwd=other.cwd)
    return dataclasses.replace(PRODUCT, key=f"{PRODUCT.key}@{other.name}", engine=engine, title=f"{PRODUCT.title}, {other.tree}'s engine")


def configuration(key: str) -> Configuration:
    for candidate in CONFIGURATIONS:
        if candidate.key == key or candidate.number == key:
            return candidate
    raise ValueError(f"configuration {key!r}: unknown; choose from {', '.join(c.key for c in CONFIGURATIONS)}")


def engine_command(config: Configuration, model_dir: Path, port: int, extra_flags: Sequence[str] = ()) -> list[str]:
    return config.engine.command(model_dir, port, [*config.engine_flags, *extra_flags])


def proxy_options(served_model: str = SERVED_MODEL_NAME) -> dict[str, object]:
    return {"upstream_model": served_model, "max_tokens_cap": PROXY_MAX_TOKENS_CAP}


def clear_cache(engine: Engine, server_url: str) -> bool:
    """Empty the engine's prefix cache; False where it has no way to (mlx_lm.server)."""
    if engine.clear_cache is None:
        return False
    method, path = engine.clear_cache
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{server_url}{path}", method=method), timeout=30):
            return True
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"{engine.name}: {method} {path} answered HTTP {error.code}; its prefix cache was not cleared") from error


@dataclass
class Endpoints:
    client_url: str  # where the client sends its requests
    server_url: str  # the engine itself
    server_log: Path
    proxy_log: Path | None
    capture_dir: Path | None  # where capture.py writes this session's records
    engine: Server | None = None  # the engine's process (the restart scenario kills it)
    engine_home: Path | None = None  # the engine's own empty home directory, removed when it stops
    config: Configuration | None = None

    def clear_cache(self) -> bool:
        return clear_cache(self.config.engine, self.server_url)

    def warm_up(self, model: str = SERVED_MODEL_NAME) -> None:
        """One small request, then an emptied cache (`bench.clients.replay.warm_up`)."""
        warm_up(self.server_url, model, self.config.protocol)
        self.clear_cache()

    def replay(self, requests: list[Request], **options) -> list[Measured]:
        """Replay `requests` through this stack, reading reuse from its engine and logs."""
        return replay(requests, self.client_url, **self._sources(), **options)

    def replayer(self, **options) -> Replayer:
        """A `Replayer` for this stack, for replays that take turns with other stacks."""
        return Replayer(self.client_url, **self._sources(), **options)

    def _sources(self) -> dict[str, object]:
        return {"server_url": self.server_url, "server_log": self.server_log, "proxy_log": self.proxy_log, "reuse_sources": self.config.engine.reuse_sources}


@contextlib.contextmanager
def started(
    config: Configuration, model_dir: Path, log_dir: Path, *, capture_session: str | None = None,
    engine_flags: Sequence[str] = (), engine_env: dict[str, str] | None = None,
) -> Iterator[Endpoints]:
    """Start `config`'s engine (with `engine_flags` beyond its own) and proxy (with capture.py
    when `capture_session` is given); both stop on exit, also on error or Ctrl-C."""
    engine_port = free_port()
    models_url = f"http://127.0.0.1:{engine_port}/v1/models"
    command = engine_command(config, model_dir, engine_port, engine_flags)
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"stable-prefix-{config.key}-home-")))
        env = {**UNBUFFERED, **QUEUE_CONCURRENT_REQUESTS, **config.engine.env, "HOME": str(home), **(engine_env or {})}
        engine = stack.enter_context(running(f"{config.key}-engine", command, port=engine_port, log_dir=log_dir, ready=lambda: http_ok(models_url),
                                             env=env, cwd=config.engine.cwd))
        if not config.addon:
            yield Endpoints(engine.url, engine.url, engine.log_path, None, None, engine, home, config)
            return
        proxy_port = free_port()
        scripts, options, capture_dir = list(ADDON_SCRIPTS), proxy_options(), None
        if capture_session is not None:
            scripts.append(CAPTURE_SCRIPT)
            options["capture_session"] = capture_session
            capture_dir = CAPTURE_ROOT / capture_session
        proxy = mitmdump_command(scripts, engine.url, proxy_port, options)
        mitmdump = stack.enter_context(running(f"{config.key}-mitmdump", proxy, port=proxy_port, log_dir=log_dir, env=UNBUFFERED))
        yield Endpoints(mitmdump.url, engine.url, engine.log_path, mitmdump.log_path, capture_dir, engine, home, config)


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
