"""What a request gets alone from an uncached engine: the greedy answer every cached answer must equal.

The reference is the same engine mode as vllm-mlx ships it, with no prefix
cache (`UNCACHED_FLAGS`), sent the body the
proxy forwarded to the stack's engine (from the capture record, found by the
request's `metadata.user_id`, which every soak request carries and the proxy
passes on), alone, streamed like the original. Identical bodies are asked once.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

from stable_prefix.bench.clients.stream_client import StreamedAnswer, post_messages
from stable_prefix.servers import VENV_BIN, free_port, http_ok, running

CAPTURE_WAIT_S = 30.0
# Per engine mode, that engine as vllm-mlx ships it with no prefix cache of ours and none of its own: the two
# modes format an answer differently (the batched one keeps a first token's leading space, counts the
# tokens of a whole answer one lower), so each cached mode is compared with its own uncached engine.
UNCACHED_FLAGS = {
    "simple": ("--engine", "simple", "--no-prefix-cache"),
    "batched": ("--engine", "batched", "--no-prefix-cache", "--disable-prefix-cache"),
}


@contextlib.contextmanager
def reference_engine(model: Path, served_name: str, log_dir: Path, mode: str) -> Iterator[str]:
    port = free_port()
    command = [str(VENV_BIN / "python"), "-m", "stable_prefix.engine_patch", "serve", str(model), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", served_name, *UNCACHED_FLAGS[mode]]
    with running("reference", command, port=port, log_dir=log_dir, ready=lambda: http_ok(f"http://127.0.0.1:{port}/v1/models")) as server:
        yield server.url


class CaptureIndex:
    """The forwarded bodies in one capture folder, by `metadata.user_id`."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.bodies: dict[str, list[dict]] = {}
        self._read: set[Path] = set()

    def refresh(self) -> None:
        for path in sorted(self.folder.rglob("*.json")):
            if path in self._read:
                continue
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # still being written: read it next time
            self._read.add(path)
            body = record.get("forwarded_body")
            user_id = ((body or {}).get("metadata") or {}).get("user_id") if isinstance(body, dict) else None
            if user_id:
                self.bodies.setdefault(user_id, []).append(body)

    def forwarded(self, user_id: str, wait_s: float = CAPTURE_WAIT_S) -> list[dict]:
        """Every body forwarded for `user_id` (one, unless a request was sent upstream twice)."""
        deadline = time.monotonic() + wait_s
        while True:
            self.refresh()
            if user_id in self.bodies or time.monotonic() > deadline:
                return self.bodies.get(user_id, [])
            time.sleep(0.2)


class ReferenceAnswers:
    def __init__(self, url: str):
        self.url = url
        self.answers: dict[str, StreamedAnswer] = {}

    def answer(self, forwarded_body: dict) -> StreamedAnswer:
        request = {key: value for key, value in forwarded_body.items() if key != "metadata"}
        key = json.dumps(request, sort_keys=True)
        if key not in self.answers:
            self.answers[key] = post_messages(self.url, request)
        return self.answers[key]


def same_answer(answer: StreamedAnswer, reference: StreamedAnswer) -> bool:
    return answer.complete and reference.complete and answer.text == reference.text and answer.output_tokens == reference.output_tokens
