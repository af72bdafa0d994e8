"""Values kept per loaded model object, never keeping the model alive.

vllm-mlx unloads a model (`--auto-unload-idle-seconds`, `--lazy-load-model`,
`--models-config` with a memory budget) by dropping its engine; the weights
are freed only if nothing else holds the model. So every table of ours about
a model holds it weakly: by `id` (an mlx model is a dict, unhashable), with a
finalizer that forgets the entry when the model is freed, so a later model
given the same address never inherits the freed one's values.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any


class PerModel[Value]:
    def __init__(self, on_forget: Callable[[Value], None] | None = None) -> None:
        self._values: dict[int, Value] = {}
        self._lock = threading.Lock()
        self._on_forget = on_forget  # told each value whose model was freed

    def get(self, model: Any, default: Value | None = None) -> Value | None:
        with self._lock:
            return self._values.get(id(model), default)

    def __contains__(self, model: Any) -> bool:
        with self._lock:
            return id(model) in self._values

    def set(self, model: Any, value: Value) -> None:
        key = id(model)
        with self._lock:
            known = key in self._values
            self._values[key] = value
        if not known:
            weakref.finalize(model, self._forget, key)

    def setdefault(self, model: Any, make: Callable[[], Value]) -> Value:
        with self._lock:
            if id(model) in self._values:
                return self._values[id(model)]
        value = make()
        self.set(model, value)
        return value

    def values(self) -> Iterator[Value]:
        with self._lock:
            return iter(list(self._values.values()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def _forget(self, key: int) -> None:
        with self._lock:
            value = self._values.pop(key, None)
        if value is not None and self._on_forget is not None:
            self._on_forget(value)
