"""Each loaded model's identity (`model_identity.py`), found in the background: its lanes are looked up and
written once it is known, and a model whose identity cannot be found is served without the disk."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from stable_prefix.engine_patch.cache.per_model import PerModel

from .disk_faults import DiskFaults
from .model_identity import DigestMemo, ModelIdentity, identity_of, loaded_model_description
from .snapshot_directory import SnapshotDirectory

logger = logging.getLogger("engine_patch")


class LoadedModels:
    def __init__(self, files: SnapshotDirectory, faults: DiskFaults, found: Callable[[Path], None]):
        """`found(folder)`: a model's identity is known, its lanes are in `folder`."""
        self.files, self.faults, self.found = files, faults, found
        self._memo = DigestMemo(files.path / "file-digests.json")
        # Per model object, held weakly (an unloaded model must be freed: cache/per_model.py).
        self._identities: PerModel[Future] = PerModel()

    def loaded(self, model: Any, model_dir: Path) -> None:
        loaded = loaded_model_description(model)
        identity: Future = Future()
        self._identities.set(model, identity)
        # A daemon thread: a shutdown never waits for a model to finish hashing.
        threading.Thread(target=lambda: identity.set_result(self._identify(Path(model_dir), loaded)),
                         name="kv-disk-identity", daemon=True).start()

    def _identify(self, model_dir: Path, loaded: dict[str, Any]) -> ModelIdentity | None:
        started = time.perf_counter()
        try:
            identity = identity_of(model_dir, self._memo, loaded)
        except Exception as error:
            self.faults.count_error(f"identifying the model in {model_dir} (disk cache off for it)", error)
            return None
        if self._memo.hashed_files:
            with contextlib.suppress(OSError):
                self._memo.save()
        folder = self.files.folder(identity)
        self.found(folder)
        logger.info(
            "disk cache: model %s is %s (%d files, %d hashed, %.1f s); lanes in %s",
            model_dir, identity.short, len(identity.description["files"]), self._memo.hashed_files,
            time.perf_counter() - started, folder,
        )
        return identity

    def bind(self, model: Any, identity: ModelIdentity) -> None:
        known: Future = Future()
        known.set_result(identity)
        self._identities.set(model, known)

    def future(self, model: Any) -> Future | None:
        """The model's identity as it will be (None: the model was never loaded here)."""
        return self._identities.get(model)

    def identity_for(self, model: Any, wait: float | None = 0) -> ModelIdentity | None:
        future = self.future(model)
        if future is None:
            return None
        with contextlib.suppress(TimeoutError):
            return future.result(timeout=wait)
        return None

    def all(self) -> list[ModelIdentity | None]:
        """Every loaded model's identity, None for one not known yet (or never)."""
        return [future.result() if future.done() else None for future in list(self._identities.values())]

    def known(self) -> list[ModelIdentity]:
        return [identity for identity in self.all() if identity]
