"""cache_layers' rollback of a draft cut short, on every family's tiny model: after a forward of the next
token and a draft, dropping the rejected tokens (attention layers) or putting the recurrent state back
leaves a cache that continues like one fed only the accepted tokens, for one sequence and per row of
mlx-lm's batched caches, sliding windows past their size included."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import _merge_caches
from mlx_lm.models.cache import make_prompt_cache

from stable_prefix.engine_patch.cache.cache_layers import (
    drop_last_tokens,
    drop_last_tokens_per_row,
    has_recurrent_state,
    recurrent_state,
    restore_recurrent_state,
    why_not_draftable,
)
from tests.support.family_models import FAMILIES, shared_family_model

# Longer than the tiny sliding windows (64 tokens): the windows have wrapped before the draft.
PROMPT_LENGTH = 90


def tokens(count: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(100, 20_000, count).tolist()


def feed(model, cache, ids: list[list[int]]) -> mx.array:
    logits = model(mx.array(ids), cache=cache)
    mx.eval(logits, [layer.state for layer in cache])
    return logits


def tolerance(model) -> float:
    """Float16 weights (the Qwen2 test model) round a k-token forward differently from k one-token ones."""
    return 2e-2 if any(value.dtype == mx.float16 for _, value in _parameters(model)) else 1e-4


def _parameters(model):
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())


def rolled_back(model, prompt: list[int], fed: list[int], accepted: int) -> list:
    """A cache that was fed `fed` after the prompt, then kept only its first `accepted` tokens, as drafting does."""
    cache = make_prompt_cache(model)
    feed(model, cache, [prompt])
    saved = recurrent_state(cache)
    feed(model, cache, [fed])
    if has_recurrent_state(cache) and accepted < len(fed):
        restore_recurrent_state(cache, saved)
        drop_last_tokens(cache, len(fed))
        feed(model, cache, [fed[:accepted]])  # a recurrent layer's accepted tokens are fed again
    else:
        drop_last_tokens(cache, len(fed) - accepted)
    return cache


@pytest.mark.parametrize("family", FAMILIES)
def test_a_cache_rolled_back_to_the_accepted_tokens_continues_like_one_fed_only_those(family):
    model, _ = shared_family_model(family)
    prompt, fed = tokens(PROMPT_LENGTH, 1), tokens(6, 2)
    for accepted in (1, 3, 6):
        ours = rolled_back(model, prompt, fed, accepted)
        reference = make_prompt_cache(model)
        feed(model, reference, [prompt])
        feed(model, reference, [fed[:accepted]])
        # Several steps on: one token at a time, then another multi-token forward.
        for step in ([7_001], [7_002], [7_003, 7_004, 7_005]):
            got, expected = feed(model, ours, [step]), feed(model, reference, [step])
            assert np.allclose(np.array(got), np.array(expected), atol=tolerance(model)), (family, accepted, step)


@pytest.mark.parametrize("family", ("qwen2", "gpt_oss", "gemma3_text"))
def test_each_row_of_a_batched_cache_drops_its_own_rejected_tokens(family):
    model, _ = shared_family_model(family)
    prompts = [tokens(PROMPT_LENGTH, 3), tokens(PROMPT_LENGTH - 17, 4), tokens(PROMPT_LENGTH + 9, 5)]
    width = 5
    fed = [tokens(width, 10 + row) for row in range(len(prompts))]
    kept = [5, 1, 3]  # tokens of each row's forward that stay (the rest rejected or padding)
    singles = []
    for prompt in prompts:
        single = make_prompt_cache(model)
        feed(model, single, [prompt])
        singles.append(single)
    batch = _merge_caches(singles)
    feed(model, batch, fed)
    drop_last_tokens_per_row(batch, [width - count for count in kept])
    for single, row_fed, count in zip(singles, fed, kept):
        feed(model, single, [row_fed[:count]])
    for step in ([[7_001]] * 3, [[7_002, 7_003]] * 3):
        got = np.array(feed(model, batch, step))
        for row, single in enumerate(singles):
            expected = np.array(feed(model, single, step[:1]))[0]
            assert np.allclose(got[row], expected, atol=tolerance(model)), (family, row, step)


@pytest.mark.parametrize("family", ("qwen3_5", "nemotron_h"))
def test_recurrent_rows_put_back_are_as_before_the_step_and_the_others_as_after(family):
    model, _ = shared_family_model(family)
    prompts = [tokens(PROMPT_LENGTH, 6), tokens(PROMPT_LENGTH, 7)]
    singles = []
    for prompt in prompts:
        single = make_prompt_cache(model)
        feed(model, single, [prompt])
        singles.append(single)
    batch = _merge_caches(singles)
    before = recurrent_state(batch)
    feed(model, batch, [tokens(4, 8), tokens(4, 9)])
    after = recurrent_state(batch)
    restore_recurrent_state(batch, before, rows=[1])
    for layer, old, new in zip(batch, before, after):
        if old is None:
            continue
        for current, was, became in zip(layer.cache, old[0], new[0]):
            assert np.array_equal(np.array(current[1]), np.array(was[1])) and np.array_equal(np.array(current[0]), np.array(became[0]))


def test_a_quantized_cache_is_named_as_one_drafts_cannot_roll_back():
    from mlx_lm.models.cache import QuantizedKVCache

    assert "QuantizedKVCache" in why_not_draftable([QuantizedKVCache()])
    model, _ = shared_family_model("qwen3_5")
    assert why_not_draftable(make_prompt_cache(model)) is None
