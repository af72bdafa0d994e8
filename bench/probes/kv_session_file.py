"""A session's token sequences in one file: what the bytes bench's in-process driver replays.

Each request: its lane, its prompt's token ids (as the engine receives them,
rendered by `bench.prompt_tokens`), the reply token ids the driver feeds back
after it, and the stable head's text (vllm-mlx's system-prefix probe, where the
engine checkpoints a hybrid). A plain module (numpy and json only): the driver
reads it under any checkout's interpreter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class SessionFile:
    lanes: list[str]
    head_texts: list[str | None]
    prompts: list[np.ndarray]
    replies: list[np.ndarray]
    description: dict

    def __len__(self) -> int:
        return len(self.prompts)

    def prompt(self, index: int) -> np.ndarray:
        return self.prompts[index]

    def reply(self, index: int) -> np.ndarray:
        return self.replies[index]

    def lane(self, index: int) -> str:
        return self.lanes[index]

    def head_text(self, index: int) -> str | None:
        return self.head_texts[index]

    def sequence(self, index: int) -> np.ndarray:
        """What the engine holds after the request: the prompt and every reply token (the batched engine's
        cache holds the last one too: a 2,129-token prompt answered with 8 tokens leaves a 2,137-token entry)."""
        return np.concatenate([self.prompts[index], self.replies[index]])

    def save(self, path: Path) -> None:
        meta = {"lanes": self.lanes, "head_texts": self.head_texts, "description": self.description}
        with open(path, "wb") as file:
            np.savez(file, meta=np.array(json.dumps(meta)), prompts=_joined(self.prompts), prompt_ends=_ends(self.prompts),
                     replies=_joined(self.replies), reply_ends=_ends(self.replies))

    @classmethod
    def load(cls, path: Path) -> SessionFile:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            return cls(meta["lanes"], meta["head_texts"], _split(data["prompts"], data["prompt_ends"]),
                       _split(data["replies"], data["reply_ends"]), meta["description"])


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays).astype(np.int32) if arrays else np.zeros(0, np.int32)


def _ends(arrays: list[np.ndarray]) -> np.ndarray:
    return np.cumsum([len(array) for array in arrays], dtype=np.int64)


def _split(joined: np.ndarray, ends: np.ndarray) -> list[np.ndarray]:
    return [part.astype(np.int64) for part in np.split(joined, ends[:-1])] if len(ends) else []
