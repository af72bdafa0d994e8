"""The routers a team puts in front of several engines: how each is installed, configured and started.

A router is the ecosystem's, never ours (docs/scale-out.md): what the project adds is the key on each
request (`addons/lanes.py: routing_key`, under the header names of `lane_routing_header`), the
configuration below for the router the user picked, and `stable-prefix router KIND` to start or print it.

  smg          SGLang's model gateway (PyPI `smg`, Rust), in its own venv `build/smg-venv` (`make routers`):
               `--policy consistent_hashing` on `--routing-key-headers`; it retries a request whose worker
               failed before answering on another worker (`--retry-max-retries`), and takes an unhealthy
               worker out after `--health-failure-threshold` failed checks.
  haproxy      HAProxy (Debian's package, Homebrew on a Mac), a config file we write: `balance hdr(NAME)` with
               `hash-type consistent`; `option http-no-delay`, or it holds each SSE chunk ~0.2 s; health checks
               on `/health`; L7 retries (`retry-on conn-failure empty-response`, `option redispatch 1`) that
               send a request whose server refused or dropped the connection before answering to the next
               server on the ring, instead of answering 502. A retry needs the whole request in one buffer
               (`option http-buffer-request`, `tune.bufsize`): Claude Code's bodies are 100-300 KB.
  vllm-router  vLLM's router (PyPI `vllm-router`, Rust, Linux wheels only), `build/vllm-router-venv`:
               `--policy consistent_hash` reads `x-session-id` (then `x-user-id`; no option names another); a
               worker whose requests failed `--cb-failure-threshold` times in a row leaves the ring at once (its
               circuit breaker), so a retry goes to the next replica.

Policies (`POLICIES`): `key` hashes our key header onto a ring, so a lane stays on one replica and moves only
when its replica leaves; `round_robin` spreads requests regardless of their cache; `prefix` is the router's
own prompt-text / cache-aware policy (smg's and vllm-router's `cache_aware`; HAProxy has none).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from stable_prefix import pins
from stable_prefix.servers import LOOPBACK, REPO_ROOT, Server, free_port, http_ok, running

ROUTER_KINDS = ("smg", "haproxy", "vllm-router")
POLICIES = ("key", "round_robin", "prefix")
INSTALL_TARGET = "make routers"
SMG_VERSION = pins.SMG.version
VLLM_ROUTER_VERSION = pins.VLLM_ROUTER.version
SMG_VENV = REPO_ROOT / "build" / "smg-venv"
VLLM_ROUTER_VENV = REPO_ROOT / "build" / "vllm-router-venv"
# The header each router reads its key from unless told otherwise (vllm-router cannot be told).
DEFAULT_KEY_HEADER = {"smg": "x-smg-routing-key", "haproxy": "x-smg-routing-key", "vllm-router": "x-session-id"}
VLLM_ROUTER_KEY_HEADERS = ("x-session-id", "x-user-id")
# Where HAProxy is when it is not on PATH (Debian's sbin for a non-root user, Homebrew on Apple Silicon and Intel).
HAPROXY_PLACES = (Path("/usr/sbin/haproxy"), Path("/opt/homebrew/sbin/haproxy"), Path("/usr/local/sbin/haproxy"),
                  Path("/opt/homebrew/bin/haproxy"), Path("/usr/local/bin/haproxy"))
HAPROXY_CONFIG_NAME = "haproxy.cfg"
# One buffer holds a whole request for HAProxy's L7 retries: 1 MiB is 3x Claude Code's largest bodies seen.
HAPROXY_BUFFER_BYTES = 1 << 20
# Retries of a request whose connection failed before any answer; each goes to the next server on the ring.
RETRIES = 3
# Failed health checks before a replica is taken out, and passed ones before it is back.
HEALTH_FALL = 2
HEALTH_RISE = 1
STARTUP_TIMEOUT_S = 120.0


class RouterNotInstalled(RuntimeError):
    """The router's pinned install is missing: the message names the make target that installs it."""


@dataclass(frozen=True)
class RouterConfig:
    """How to run one router: its command line and, for HAProxy, the config file it reads.

    `argv` names the config file by `HAPROXY_CONFIG_NAME`; `command(directory)` writes the file there and
    returns the command line that reads it."""

    kind: str
    argv: tuple[str, ...]
    port: int
    key_header: str | None  # None: the policy reads no key
    config_text: str | None = None

    def command(self, directory: Path) -> list[str]:
        if self.config_text is None:
            return list(self.argv)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / HAPROXY_CONFIG_NAME
        path.write_text(self.config_text)
        return [str(path) if part == HAPROXY_CONFIG_NAME else part for part in self.argv]

    def printed(self) -> str:
        """What `stable-prefix router KIND --print` shows: the config file (if any), then the command line."""
        command = " ".join(self.argv)
        if self.config_text is None:
            return command + "\n"
        return f"# {HAPROXY_CONFIG_NAME}\n{self.config_text}\n# run it:\n{command}\n"


def expected_binary(kind: str) -> Path:
    """Where the pinned install of `kind` is (or would be), without checking."""
    check_kind(kind)
    if kind == "smg":
        return SMG_VENV / "bin" / "smg"
    if kind == "vllm-router":
        return VLLM_ROUTER_VENV / "bin" / "vllm-router"
    found = shutil.which("haproxy")
    return Path(found) if found else next((place for place in HAPROXY_PLACES if place.exists()), Path("haproxy"))


def router_binary(kind: str) -> Path:
    """The pinned install of `kind`; RouterNotInstalled names what installs it."""
    if kind == "vllm-router" and not sys.platform.startswith("linux"):
        raise RouterNotInstalled(f"vllm-router {VLLM_ROUTER_VERSION} ships Linux wheels only (this is {sys.platform}): use smg or haproxy")
    binary = expected_binary(kind)
    if not binary.is_file():
        how = {"smg": f"{INSTALL_TARGET} (smg {SMG_VERSION} into {SMG_VENV})",
               "vllm-router": f"{INSTALL_TARGET} (vllm-router {VLLM_ROUTER_VERSION} into {VLLM_ROUTER_VENV})",
               "haproxy": f"{INSTALL_TARGET} (apt-get install haproxy), or brew install haproxy on a Mac"}[kind]
        raise RouterNotInstalled(f"{kind} is not installed at {binary}: run {how}")
    return binary


def check_kind(kind: str) -> None:
    if kind not in ROUTER_KINDS:
        raise ValueError(f"router {kind!r}: not one of {', '.join(ROUTER_KINDS)}")


def check_replicas(replica_urls: Sequence[str]) -> list[tuple[str, int]]:
    """(host, port) of each replica URL; a URL without both, or with a path, is refused."""
    if not replica_urls:
        raise ValueError("no replica URLs: give each engine's base URL, e.g. http://10.0.0.2:8000")
    places = []
    for url in replica_urls:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
            raise ValueError(f"replica {url!r}: expected http://HOST:PORT (the engine's base URL, no path)")
        places.append((parts.hostname, parts.port))
    return places


def router_config(kind: str, replica_urls: Sequence[str], *, port: int, policy: str = "key", key_header: str | None = None,
                  health_interval_s: float = 1.0, host: str = LOOPBACK, metrics_port: int | None = None,
                  balance_factor: int | None = None) -> RouterConfig:
    """The command line (and config file) that runs `kind` on `host:port` before `replica_urls`.

    `key_header`: the header holding our key (default: the one the router reads unless told,
    `DEFAULT_KEY_HEADER`); a comma-separated list is the proxy's option form, and the router reads
    the first name. `metrics_port`: the Rust routers' Prometheus port (default theirs, 29000: a second
    router on the machine needs another). `balance_factor`: HAProxy's bounded-load consistent hashing
    (`hash-balance-factor`, percent of the average load a replica may take; None: unbounded). Pure:
    nothing is checked on disk, nothing started."""
    check_kind(kind)
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: not one of {', '.join(POLICIES)}")
    places = check_replicas(replica_urls)
    header = first_header(key_header) or DEFAULT_KEY_HEADER[kind]
    if kind == "vllm-router" and policy == "key" and header not in VLLM_ROUTER_KEY_HEADERS:
        raise ValueError(f"vllm-router reads its key from {' or '.join(VLLM_ROUTER_KEY_HEADERS)} only, not {header!r}: "
                         "set the proxy's lane_routing_header to x-session-id")
    if kind == "haproxy" and policy == "prefix":
        raise ValueError("haproxy has no prompt-text policy: use policy key or round_robin, or smg / vllm-router for prefix")
    if balance_factor is not None and (kind != "haproxy" or policy != "key"):
        raise ValueError(f"a balance factor bounds HAProxy's consistent hashing (policy key) only, not {kind} with policy {policy}")
    if balance_factor is not None and balance_factor <= 100:
        raise ValueError(f"balance factor {balance_factor}: a percent of the average load above 100 (e.g. 150)")
    used_header = header if policy == "key" else None
    binary = str(expected_binary(kind))
    metrics = ["--prometheus-host", host, "--prometheus-port", str(metrics_port)] if metrics_port else []
    if kind == "smg":
        argv = smg_argv(binary, replica_urls, host, port, policy, header, health_interval_s)
        return RouterConfig(kind, (*argv, *metrics), port, used_header)
    if kind == "vllm-router":
        argv = vllm_router_argv(binary, replica_urls, host, port, policy, health_interval_s)
        return RouterConfig(kind, (*argv, *metrics), port, used_header)
    text = haproxy_config(places, host, port, policy, header, health_interval_s, balance_factor)
    return RouterConfig(kind, (binary, "-db", "-f", HAPROXY_CONFIG_NAME), port, used_header, text)


def first_header(key_header: str | None) -> str | None:
    names = [name.strip() for name in (key_header or "").split(",") if name.strip()]
    return names[0] if names else None


def _whole_seconds(seconds: float) -> str:
    """Both Rust routers take whole seconds, at least 1."""
    return str(max(1, round(seconds)))


def smg_argv(binary: str, replica_urls: Sequence[str], host: str, port: int, policy: str, header: str, health_interval_s: float) -> list[str]:
    smg_policy = {"key": "consistent_hashing", "round_robin": "round_robin", "prefix": "cache_aware"}[policy]
    argv = [binary, "launch", "--host", host, "--port", str(port), "--worker-urls", *replica_urls, "--policy", smg_policy,
            "--health-check-endpoint", "/health", "--health-check-interval-secs", _whole_seconds(health_interval_s),
            "--health-failure-threshold", str(HEALTH_FALL), "--health-success-threshold", str(HEALTH_RISE),
            "--retry-max-retries", str(RETRIES + 1)]
    if policy == "key":
        argv += ["--routing-key-headers", header]
    return argv


def vllm_router_argv(binary: str, replica_urls: Sequence[str], host: str, port: int, policy: str, health_interval_s: float) -> list[str]:
    router_policy = {"key": "consistent_hash", "round_robin": "round_robin", "prefix": "cache_aware"}[policy]
    return [binary, "--host", host, "--port", str(port), "--worker-urls", *replica_urls, "--policy", router_policy,
            "--health-check-endpoint", "/health", "--health-check-interval-secs", _whole_seconds(health_interval_s),
            "--health-failure-threshold", str(HEALTH_FALL), "--health-success-threshold", str(HEALTH_RISE),
            "--retry-max-retries", str(RETRIES + 1),
            # Its key ring skips only a worker whose circuit is open: without this its retries (~0.3 s) all go to a replica
            # that died, before a health check has noticed, and a broken-off stream's replay gets a 500.
            "--cb-failure-threshold", str(HEALTH_FALL)]


def haproxy_config(places: Sequence[tuple[str, int]], host: str, port: int, policy: str, header: str, health_interval_s: float,
                   balance_factor: int | None = None) -> str:
    balance = f"balance hdr({header})\n    hash-type consistent" if policy == "key" else "balance roundrobin"
    if balance_factor is not None:
        # Bounded-load consistent hashing: a key whose replica holds more than this percent of the average
        # active requests goes to the next replica on the ring (that request only).
        balance += f"\n    hash-balance-factor {balance_factor}"
    interval_ms = max(100, round(health_interval_s * 1000))
    servers = "\n".join(f"    server replica{index} {server_host}:{server_port} check"
                        for index, (server_host, server_port) in enumerate(places, start=1))
    return f"""\
# Generated by stable-prefix (stable_prefix/routers.py): {len(places)} replicas, policy {policy}.
global
    # L7 retries need the whole request in one buffer; Claude Code's bodies are 100-300 KB.
    tune.bufsize {HAPROXY_BUFFER_BYTES}
    maxconn 256

defaults
    mode http
    # A prefill of a long prompt can take minutes before the first byte.
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout http-request 60s
    # Without it each SSE chunk is held ~0.2 s.
    option http-no-delay
    # Read the body before choosing a server, so a retry can send it again.
    option http-buffer-request
    # A connection refused, or closed before any answer, goes to the next server on the ring: no 502.
    retries {RETRIES}
    option redispatch 1
    retry-on conn-failure empty-response
    default-server inter {interval_ms}ms fall {HEALTH_FALL} rise {HEALTH_RISE}

frontend stable_prefix_router
    bind {host}:{port}
    default_backend replicas

backend replicas
    {balance}
    option httpchk GET /health
    http-check expect status 200
{servers}
"""


@contextlib.contextmanager
def running_router(kind: str, replica_urls: Sequence[str], *, policy: str = "key", key_header: str | None = None, log_dir: Path,
                   health_interval_s: float = 1.0, port: int | None = None, host: str = LOOPBACK,
                   startup_timeout: float = STARTUP_TIMEOUT_S, metrics_port: int | None = None,
                   balance_factor: int | None = None) -> Iterator[Server]:
    """`kind` on `host:port` (default: a free loopback port) before `replica_urls` for the duration of the
    block (stopped on exit, also on failure); ready when a `/health` through it is answered. Its metrics
    port: `metrics_port`, else a free one (two routers on one machine would both take 29000)."""
    binary = router_binary(kind)
    port = port or free_port()
    config = router_config(kind, replica_urls, port=port, policy=policy, key_header=key_header, health_interval_s=health_interval_s,
                           host=host, metrics_port=metrics_port or (None if kind == "haproxy" else free_port()), balance_factor=balance_factor)
    command = [str(binary), *config.command(log_dir / f"{kind}-{port}")[1:]]
    url = f"http://{LOOPBACK if host in ('0.0.0.0', '::') else host}:{port}"
    with running(kind, command, port=port, log_dir=log_dir, ready=lambda: router_ready(kind, url, replica_urls),
                 startup_timeout=startup_timeout) as server:
        yield server


def router_ready(kind: str, url: str, replica_urls: Sequence[str]) -> bool:
    """The router answers, and (smg) every replica is registered and healthy: smg answers `/health` before
    its background registration has added any worker, and a lane whose first request meets a ring of one
    replica moves when the second joins (vllm-router waits for its workers before it listens)."""
    if not http_ok(f"{url}/health"):
        return False
    if kind != "smg":
        return True
    try:
        with urllib.request.urlopen(f"{url}/workers", timeout=2) as response:
            workers = json.loads(response.read()).get("workers") or []
    except (OSError, ValueError):
        return False
    healthy = {worker.get("url") for worker in workers if isinstance(worker, dict) and worker.get("is_healthy")}
    return {replica.rstrip("/") for replica in replica_urls} <= healthy
