"""Which model a KV snapshot belongs to: a content hash, not a path.

A snapshot may only ever be restored into the model that computed it. The
identity is a SHA-256 over:
- the content of every file mlx-lm reads from the model directory (the
  patterns it downloads: weights, config, tokenizer, chat template, custom
  code), each hashed in full;
- the model's arguments as loaded (config overrides included), the kinds of
  its cache layers and the dtypes of its parameters (the KV dtype follows
  them);
- the mlx and mlx-lm versions and the snapshot file format version.

Hashing every weight byte costs seconds per 10 GB, so a file's digest is
remembered in `file-digests.json` beside the snapshots, keyed by its real path,
device, inode, size, mtime and ctime; a file is hashed again whenever any of
those changes. What this does not catch: a file rewritten in place with the
same size and both timestamps restored (ctime cannot be set without changing
the system clock), and weights changed after loading (adapters applied in
process). Strictly, a KV state depends only on the weights, the config and
the token ids; the tokenizer and chat template are in the hash as well, so a
change there costs a cold start, never a wrong answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from .snapshot_file import FORMAT_VERSION

# mlx-lm's download patterns (mlx_lm.utils._download): the files it reads.
MODEL_FILE_PATTERNS = ("*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "tiktoken.model", "*.txt", "*.jsonl", "*.jinja")
HASH_CHUNK_BYTES = 8 * 2**20
HASH_THREADS = min(4, os.cpu_count() or 1)


@dataclass(frozen=True)
class ModelIdentity:
    key: str  # hex SHA-256 of `description`
    description: dict[str, Any]

    @property
    def short(self) -> str:
        return self.key[:16]


def model_files(model_dir: Path) -> list[Path]:
    found = {path for pattern in MODEL_FILE_PATTERNS for path in model_dir.glob(pattern) if path.is_file()}
    return sorted(found)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as file:
        while chunk := file.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class DigestMemo:
    """File digests remembered across restarts, valid while a file's stat is unchanged."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        try:
            loaded = json.loads(path.read_text())
            self._digests: dict[str, dict[str, Any]] = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            self._digests = {}
        self.hashed_files = 0

    @staticmethod
    def _fingerprint(path: Path) -> list[int]:
        status = os.stat(path)
        return [status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns]

    def digest(self, path: Path) -> str:
        real = str(path.resolve())
        fingerprint = self._fingerprint(path)
        with self._lock:
            known = self._digests.get(real)
        if isinstance(known, dict) and known.get("stat") == fingerprint and isinstance(known.get("sha256"), str):
            return known["sha256"]
        digest = file_sha256(path)
        with self._lock:
            self._digests[real] = {"stat": fingerprint, "sha256": digest}
            self.hashed_files += 1
        return digest

    def save(self) -> None:
        """Write the memo atomically (0600); a failure only costs a re-hash next time."""
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}-{uuid.uuid4().hex}")
        with self._lock:
            text = json.dumps(self._digests, indent=0)
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(text)
            os.replace(temporary, self.path)
        except OSError:
            temporary.unlink(missing_ok=True)
            raise


def loaded_model_description(model: Any) -> dict[str, Any]:
    """What the loaded model object adds to its files: arguments, cache layer kinds, dtypes.

    Cheap; call it on the thread that loaded the model (it reads the model's
    parameters' dtypes and builds an empty cache).
    """
    arguments = getattr(model, "args", None)
    return {
        "model_args": json.loads(json.dumps(dataclasses.asdict(arguments), default=str, sort_keys=True))
        if dataclasses.is_dataclass(arguments) else None,
        "cache_layers": [type(layer).__name__ for layer in make_prompt_cache(model)],
        "parameter_dtypes": sorted({str(array.dtype) for _, array in tree_flatten(model.parameters())}),
    }


def identity_of(model_dir: Path, memo: DigestMemo, loaded: dict[str, Any]) -> ModelIdentity:
    """The identity of the model `loaded` describes, read from `model_dir` (hashes what the memo does not know)."""
    files = model_files(model_dir)
    if not any(path.suffix == ".safetensors" for path in files):
        raise FileNotFoundError(f"{model_dir}: no model*.safetensors to identify the weights by")
    digests = dict(zip((path.name for path in files), _in_daemon_threads(memo.digest, files)))
    description = {
        "files": digests,
        **loaded,
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "snapshot_format": FORMAT_VERSION,
    }
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()
    return ModelIdentity(key, description)


def _in_daemon_threads(function: Callable[[Path], str], paths: list[Path]) -> list[str]:
    """`function` over `paths`, HASH_THREADS at a time (hashlib releases the GIL), in daemon
    threads: an interpreter that exits mid-hash does not wait for them."""
    results: list[str | None] = [None] * len(paths)
    failures: list[BaseException] = []
    work = iter(enumerate(paths))
    lock = threading.Lock()

    def worker() -> None:
        while not failures:
            with lock:
                item = next(work, None)
            if item is None:
                return
            try:
                results[item[0]] = function(item[1])
            except BaseException as error:
                failures.append(error)

    threads = [threading.Thread(target=worker, name="model-hash", daemon=True) for _ in range(min(HASH_THREADS, len(paths)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return results
