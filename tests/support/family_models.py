"""The tiny model of each family (FAMILY_MODELS, built by `make tiny-families`), loaded for in-process engine tests.

A test that only runs a model takes the shared one: loaded once per test process, so a worker that runs the
drafted, batched and rollback tests loads each family once, not once per file. A test that changes a model (its
dtype, say) or must own it (a disk tier that identifies it) takes a fresh one.
"""

from __future__ import annotations

import functools

import mlx_lm

from .family_chat import FAMILY_MODELS
from .models import require_model

FAMILIES = tuple(FAMILY_MODELS)


def fresh_family_model(family: str, dtype=None) -> tuple:
    """(model, tokenizer) of `family`'s tiny model, loaded now and owned by the caller; cast to `dtype` if given."""
    model, tokenizer = mlx_lm.load(str(require_model(FAMILY_MODELS[family])))
    if dtype is not None:
        model.set_dtype(dtype)
    return model, tokenizer


@functools.cache
def shared_family_model(family: str) -> tuple:
    """(model, tokenizer) of `family`'s tiny model, shared by every test in this process: read it, never change it."""
    return fresh_family_model(family)
