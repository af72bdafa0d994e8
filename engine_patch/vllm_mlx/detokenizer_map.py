"""One streaming detokenizer per tokenizer, copied for each generation.

mlx-lm 0.31's `TokenizerWrapper.detokenizer` builds a new detokenizer for every
generation, and the BPE and SPM detokenizers build an id -> token list of the
whole vocabulary in `__init__` (151,665 entries for Qwen), reading
`tokenizer.vocab` twice; transformers 5 rebuilds that dict on every access.
Measured on this CPU: ~0.4-0.7 s of every request, before its first token.

The list depends only on the vocabulary, so each tokenizer's detokenizer is
built once and every generation gets a shallow copy of it, `reset()`: the
`StreamingDetokenizer` interface puts all per-generation state in `reset()`,
and the token list is only read. A tokenizer whose vocabulary size changed
(tokens added at run time) gets a new one. The naive detokenizer (mlx-lm's
choice when a tokenizer's decoder is neither BPE nor SPM, Nemotron-H's here)
builds no token map and cannot be copied, so it is built per generation, as
mlx-lm does.
"""

from __future__ import annotations

import copy
import threading
import weakref
from typing import Any

_built: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _vocabulary_size(wrapper: Any) -> int:
    # `len()` of a transformers tokenizer asks the Rust tokenizer for its size; it
    # does not build the vocabulary dict.
    return len(wrapper._tokenizer)


def _holds_a_token_map(detokenizer: Any) -> bool:
    return hasattr(detokenizer, "tokenmap")


def shared_map_detokenizer(build):
    """A `detokenizer` getter that calls `build(wrapper)` once per tokenizer
    whose detokenizer holds a token map, and per generation otherwise."""

    def detokenizer(wrapper):
        size = _vocabulary_size(wrapper)
        with _lock:
            built = _built.get(wrapper)
            if built is None or built[0] != size:
                made = build(wrapper)
                if not _holds_a_token_map(made):
                    return made  # nothing to share; not remembered, so nothing to copy
                built = _built[wrapper] = (size, made)
        fresh = copy.copy(built[1])
        fresh.reset()
        return fresh

    detokenizer.shares_token_map = True
    detokenizer.__wrapped__ = build  # mlx-lm's own getter, for whoever must put it back (the tests)
    return detokenizer


def install() -> list[str]:
    """Patch mlx-lm's `TokenizerWrapper.detokenizer`; the names of what was patched."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    getter = TokenizerWrapper.__dict__.get("detokenizer")
    if not isinstance(getter, property) or getter.fget is None:
        return []  # another mlx-lm layout: left as it is
    if getattr(getter.fget, "shares_token_map", False):
        return []  # already installed
    TokenizerWrapper.detokenizer = property(shared_map_detokenizer(getter.fget), doc=getter.__doc__)
    return ["mlx-lm detokenizer (token map built once per tokenizer)"]
