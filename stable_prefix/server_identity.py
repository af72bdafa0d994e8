"""Which model server answers at a URL: what `stable-prefix up --upstream URL` asks before it starts the proxy.

Each server says who it is somewhere of its own, and nowhere else answers the same way:
- vllm-mlx with our patch: `GET /v1/cache/stats` names `vllm_mlx_version` (engine_patch/install.py `stats`);
- llama.cpp's llama-server: `GET /props` has `build_info` (and `total_slots`, its `-np`);
- LM Studio: `GET /api/v0/models`, its REST API, lists models with their `compatibility_type` (gguf, mlx);
- Ollama: `GET /api/version` is `{"version": ...}`;
- SGLang: `GET /server_info` (`/get_server_info` before 0.4.5) holds its server arguments (`tp_size`, `model_path`);
- vLLM: `GET /metrics` has `vllm:` series (its `/version` gives the release);
- vllm-mlx as shipped: `GET /health` names its `engine_type`.
The probes go out at once, each bounded by a short timeout, and the first server in that order that recognised itself
wins (llama.cpp before Ollama: some servers imitate another's paths, never its own). Nothing that answers any other way
is guessed at: it is "unknown", and the proxy runs before it as before (nothing server-specific switched on). Probes are
plain GETs without credentials: a server that wants a key for them is unknown too.

What the proxy switches on before a server found here is what can be known from outside it: before llama.cpp, its
slot lanes (addons/llama_slots.py) pinned to the slots it reports. A server `up --server` starts is set up by its
record instead (`model_servers/`), from the flags it was started with.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib import error, request

from stable_prefix.addons.llama_slots import FILES_OPTION as LLAMA_SLOT_FILES
from stable_prefix.addons.llama_slots import OPTION as LLAMA_SLOTS

if TYPE_CHECKING:  # the launcher's options, read here, never the other way round
    from stable_prefix.stack import StackOptions

# A probe's answer must come quickly: `up` waits for the slowest before it starts the proxy.
PROBE_TIMEOUT_S = 2.0
# /props carries the chat template, /metrics every series: enough for either, bounded.
MAX_PROBE_BYTES = 4 * 2**20


@dataclass(frozen=True)
class ServerIdentity:
    name: str  # the server's name as `up --server` spells it where it has one: llama.cpp, vllm, vllm-mlx; else lm-studio, ollama, sglang, unknown
    version: str | None = None
    evidence: str = ""  # what said so, e.g. "GET /props: build_info"
    patched: bool = False  # vllm-mlx with our prefix cache
    slots: int | None = None  # llama.cpp's slot count (`-np`)

    @property
    def known(self) -> bool:
        return self.name != "unknown"

    def describe(self) -> str:
        """One line for `up`: the server, its release, what said so."""
        if not self.known:
            return "an unknown server (none of the known ones answered its own way); the proxy runs with no server-specific addon"
        what = {"vllm-mlx": "vllm-mlx with the prefix-cache patch" if self.patched else "vllm-mlx as shipped (no prefix-cache patch)",
                "llama.cpp": "llama.cpp's llama-server", "vllm": "vLLM", "lm-studio": "LM Studio", "ollama": "Ollama", "sglang": "SGLang"}[self.name]
        details = [f"version {self.version}" if self.version else "", f"{self.slots} slots" if self.slots else "", self.evidence]
        return f"{what} ({', '.join(detail for detail in details if detail)})"


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any | None:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def fetch(url: str, timeout: float = PROBE_TIMEOUT_S) -> Answer | None:
    """A GET's status and body, or None when nothing answered in time (refused, timed out, not HTTP)."""
    try:
        with request.urlopen(request.Request(url, headers={"accept": "application/json"}), timeout=timeout) as response:
            return Answer(response.status, response.read(MAX_PROBE_BYTES))
    except error.HTTPError as refused:
        return Answer(refused.code, b"")
    except (OSError, ValueError):  # URLError, timeouts, a connection reset, a malformed answer
        return None


def _ok_json(answer: Answer | None) -> Any | None:
    return answer.json() if answer is not None and answer.status == 200 else None


def _text(answer: Answer | None) -> str:
    return answer.body.decode("utf-8", "replace") if answer is not None and answer.status == 200 else ""


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _version(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def patched_vllm_mlx(answers: dict[str, Answer | None]) -> ServerIdentity | None:
    stats = _dict(_ok_json(answers["/v1/cache/stats"]))
    if "vllm_mlx_version" in stats:
        return ServerIdentity("vllm-mlx", _version(stats["vllm_mlx_version"]), "GET /v1/cache/stats: vllm_mlx_version", patched=True)
    return None


def llama_cpp(answers: dict[str, Answer | None]) -> ServerIdentity | None:
    props = _dict(_ok_json(answers["/props"]))
    if "build_info" not in props:
        return None
    slots = props.get("total_slots")
    return ServerIdentity("llama.cpp", _version(props["build_info"]), "GET /props: build_info", slots=slots if isinstance(slots, int) else None)


def lm_studio(answers: dict[str, Answer | None]) -> ServerIdentity | None:
    models = _dict(_ok_json(answers["/api/v0/models"])).get("data")
    if isinstance(models, list) and models and all(isinstance(model, dict) and "compatibility_type" in model for model in models):
        return ServerIdentity("lm-studio", None, "GET /api/v0/models: compatibility_type")
    return None


def ollama(answers: dict[str, Answer | None]) -> ServerIdentity | None:
    version = _dict(_ok_json(answers["/api/version"]))
    if set(version) == {"version"} and _version(version["version"]):
        return ServerIdentity("ollama", version["version"], "GET /api/version")
    return None


SGLANG_KEYS = ("tp_size", "model_path")


def sglang(answers: dict[str, Answer | None]) -> ServerIdentity | None:
    for path in ("/server_info", "/get_server_info"):
        info = _dict(_ok_json(answers[path]))
        if all(key in info for key in SGLANG_KEYS):
            return ServerIdentity("sglang", _version(info.get("version")), f"GET {path}: {', '.join(SGLANG_KEYS)}")
    return None


# A Prometheus sample line of a vLLM series: `vllm:prefix_cache_hits_total{...} 12.0`, or its HELP/TYPE comment.
_VLLM_SERIES = re.compile(r"^(?:# (?:HELP|TYPE) )?vllm:[a-z_]+", re.MULTILINE)


def vllm(answers: dict[str, Answer | None]) -> ServerIdentity | None:
    if not _VLLM_SERIES.search(_text(answers["/metrics"])):
        return None
    return ServerIdentity("vllm", _version(_dict(_ok_json(answers["/version"])).get("version")), "GET /metrics: vllm: series")


def shipped_vllm_mlx(answers: dict[str, Answer | None]) -> ServerIdentity | None:
    health = _dict(_ok_json(answers["/health"]))
    if "engine_type" in health and "model_loaded" in health:
        return ServerIdentity("vllm-mlx", None, "GET /health: engine_type")
    return None


# Most specific first: each recogniser reads only the answers of its own paths.
RECOGNISERS: tuple[Callable[[dict[str, Answer | None]], ServerIdentity | None], ...] = (
    patched_vllm_mlx, llama_cpp, lm_studio, ollama, sglang, vllm, shipped_vllm_mlx)
PROBED_PATHS = ("/v1/cache/stats", "/props", "/api/v0/models", "/api/version", "/server_info", "/get_server_info", "/metrics", "/version",
                "/health")
UNKNOWN = ServerIdentity("unknown")


def identify(base_url: str, timeout: float = PROBE_TIMEOUT_S) -> ServerIdentity:
    """The server at `base_url` (http://HOST:PORT, no trailing slash), or UNKNOWN; never raises for what the server does."""
    base = base_url.rstrip("/")
    with ThreadPoolExecutor(max_workers=len(PROBED_PATHS), thread_name_prefix="server-identity") as pool:
        answers = dict(zip(PROBED_PATHS, pool.map(lambda path: fetch(base + path, timeout), PROBED_PATHS)))
    for recognise in RECOGNISERS:
        found = recognise(answers)
        if found is not None:
            return found
    return UNKNOWN



def proxy_settings_before(identity: ServerIdentity) -> dict[str, object]:
    """The proxy options for the server found. llama.cpp: a lane per slot it reports, pinned with `id_slot`; lanes
    are not moved through slot files (`/props` does not say whether it has a --slot-save-path, and a save without
    one fails), so its own RAM cache moves them: `--set llama_slot_files=true` where it has one."""
    if identity.name == "llama.cpp" and identity.slots:
        return {LLAMA_SLOTS: identity.slots, LLAMA_SLOT_FILES: False}
    return {}


def with_proxy_settings_for(identity: ServerIdentity, options: StackOptions) -> StackOptions:
    """`options` with `proxy_settings_before(identity)` ahead of the team options and the user's `--set`, which come
    later and win."""
    settings = proxy_settings_before(identity)
    ours = tuple(f"{name}={str(value).lower() if isinstance(value, bool) else value}" for name, value in settings.items())
    return replace(options, proxy_options=(*ours, *options.proxy_options))
