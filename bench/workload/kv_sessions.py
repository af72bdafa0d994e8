"""The three sessions of the bytes bench, as token sequences an engine receives.

- `demo`: `make demo`'s session (2.1.332-shaped, scale 0.2, 36 requests);
- `full`: `make bench FULL=1`'s (full size, its first 25 requests, ~492K prompt tokens);
- `long`: one conversation of 100+ turns growing to a 128K context (`bench/workload/long_session.py`).

Each request is rendered as the engine receives it behind the addon
(`bench.run.as_received`, `bench.prompt_tokens.PromptRenderer`: vllm-mlx's own
conversion and the model's chat template), with the stable head's text where a
hybrid is checkpointed. Its reply is a run of seeded token ids as long as the
session's own reply (`Request.reply_tokens`) or a fixed length: no earlier
request's sequence holds them, as no replayed prompt holds a model's reply
(the session's next prompts carry its own assistant text). Rendering a long
session takes minutes, so each rendering is kept in build/kv-bench-tokens/,
keyed by everything it depends on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stable_prefix.addons.lanes import AGENT_ID_HEADER
from stable_prefix.bench.clients.stack import SERVED_MODEL_NAME, TOOL_CALL_PARSER
from stable_prefix.bench.demo import DEMO_MAX_TOKENS, DEMO_SCALE
from stable_prefix.bench.probes.kv_session_file import SessionFile
from stable_prefix.bench.run import FULL_LIMIT, as_received
from stable_prefix.bench.workload.long_session import generate_long_session
from stable_prefix.bench.workload.prompt_tokens import PromptRenderer
from stable_prefix.bench.workload.session import Request, generate_session
from stable_prefix.servers import REPO_ROOT

TOKENS_CACHE = REPO_ROOT / "build" / "kv-bench-tokens"
# Qwen's BPE ranks: seeded reply ids are drawn below its added tokens.
ORDINARY_TOKENS = 151_643


@dataclass(frozen=True)
class KvSession:
    key: str
    title: str
    generate: Callable[[float], list[Request]]
    scale: float  # in process: the session's own size
    server_scale: float  # through servers on this CPU
    # Reply tokens per request: the session's own lengths (None), or what its command asks for.
    reply_tokens: int | None = None

    def requests(self, scale: float | None = None) -> list[Request]:
        return self.generate(self.scale if scale is None else scale)


SESSIONS = {
    session.key: session
    for session in (
        KvSession("demo", f"make demo's session (2.1.332-shaped, scale {DEMO_SCALE}, 36 requests, replies of {DEMO_MAX_TOKENS} tokens as it asks)",
                  lambda scale: generate_session(0, scale), DEMO_SCALE, DEMO_SCALE, DEMO_MAX_TOKENS),
        KvSession(
            "full", f"the full-size session (make bench FULL=1: its first {FULL_LIMIT} requests)",
            lambda scale: generate_session(0, scale)[:FULL_LIMIT], 1.0, 1.0,
        ),
        KvSession("long", "one conversation of 100+ turns growing to a 128K context", lambda scale: generate_long_session(0, scale), 1.0, 0.05),
    )
}


def lane_of(request: Request) -> str:
    """A lane: one conversation of the main agent, one subagent instance, one title request's conversation."""
    agent = request.headers.get(AGENT_ID_HEADER)
    return f"{request.lane}/conversation {request.conversation}" + (f"/{agent}" if agent else "")


def reply_ids(request: Request, reply_tokens: int | None) -> np.ndarray:
    """Seeded token ids for the request's reply: the session's length, or `reply_tokens`."""
    length = max(1, request.reply_tokens if reply_tokens is None else reply_tokens)
    return np.random.default_rng([request.index, length]).integers(0, ORDINARY_TOKENS, length, dtype=np.int64)


def rendered(session: KvSession, model_dir: Path, *, scale: float | None = None) -> tuple[SessionFile, Path]:
    """The session's token sequences as `model_dir`'s engine receives them behind the addon, and the file
    that keeps them (rendered once)."""
    scale, reply_tokens = session.scale if scale is None else scale, session.reply_tokens
    path = _cache_path(session, model_dir, scale, reply_tokens)
    if path.exists():
        return SessionFile.load(path), path
    requests = session.requests(scale)
    renderer = PromptRenderer(model_dir, SERVED_MODEL_NAME, TOOL_CALL_PARSER)
    bodies = [as_received(request.body, True) for request in requests]
    print(f"rendering the {session.key} session ({len(requests)} requests, scale {scale}) with {model_dir.name}'s chat template ...", flush=True)
    tokens = SessionFile(
        lanes=[lane_of(request) for request in requests],
        head_texts=[renderer.head_text(body) for body in bodies],
        prompts=[np.asarray(renderer.token_ids(body), dtype=np.int64) for body in bodies],
        replies=[reply_ids(request, reply_tokens) for request in requests],
        description={"session": session.key, "scale": scale, "requests": len(requests),
                     "replies": "the session's reply lengths" if reply_tokens is None else f"{reply_tokens} tokens each"},
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    tokens.save(partial)
    partial.rename(path)
    return tokens, path


def _cache_path(session: KvSession, model_dir: Path, scale: float, reply_tokens: int | None) -> Path:
    """Keyed by the session, its size, the replies, the tokenizer and chat template, and the generators' code."""
    digest = hashlib.sha256()
    for path in (model_dir / "tokenizer_config.json", model_dir / "tokenizer.json",
                 *(REPO_ROOT / "bench" / "workload" / name for name in ("session.py", "long_session.py", "kv_sessions.py", "prompt_tokens.py"))):
        digest.update(path.read_bytes())
    digest.update(json.dumps([session.key, scale, reply_tokens]).encode())
    return TOKENS_CACHE / f"{session.key}-{scale:g}-{digest.hexdigest()[:16]}.npz"
