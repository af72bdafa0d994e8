"""A lane extended past its last, partly used block holds each token once (#37).

A turn's sequence is its prompt and its reply; the next turn repeats the prompt
and renders the reply back in its own way (a template drops the thinking, a
tool call is re-serialized), so only the reply's first tokens are shared. The
reply's KV is kept in blocks of its own, so the part the next turn does not
share is freed with the turn it belonged to instead of staying alive, unused,
inside a block the next turn still refers to.
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import qwen2
from mlx_lm.models.cache import make_prompt_cache

from stable_prefix.engine_patch.cache.ram_tier import RamTier

VOCAB = 512


@pytest.fixture(scope="module")
def model():
    mx.random.seed(7)
    args = qwen2.ModelArgs(model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=2,
                           num_key_value_heads=1, rms_norm_eps=1e-6, vocab_size=VOCAB, tie_word_embeddings=True)
    model = qwen2.Model(args)
    mx.eval(model.parameters())
    return model


def tokens(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, length).tolist()


def turn(cache: RamTier, model, prompt: list[int], reply: list[int]) -> int:
    """One request as the engine runs it: restore, prefill the rest, generate `reply`, store. Returns the tokens reused."""
    fetched = cache.fetch(model, prompt)
    sequence = prompt + reply
    model(mx.array(sequence[fetched.reused : -1])[None], cache=fetched.prompt_cache)  # the last generated token is never fed
    cache.store(sequence, fetched.prompt_cache, prompt_length=len(prompt))
    return fetched.reused


def unique_tokens_held(cache: RamTier) -> int:
    (entry,) = cache.entries.values()
    return len(entry.tokens)


def test_a_lane_extended_past_its_partial_block_holds_each_token_once(model):
    cache = RamTier(budget_bytes=10**9)
    prompt, reply = tokens(1, 600), tokens(2, 40)
    turn(cache, model, prompt, reply)
    # The next turn shares the reply's first 3 tokens only (its thinking dropped).
    turn(cache, model, prompt + reply[:3] + tokens(3, 50), tokens(4, 20))
    assert cache.blocks.tokens == unique_tokens_held(cache)


def test_a_conversation_of_many_short_turns_holds_each_token_once(model):
    cache = RamTier(budget_bytes=10**9)
    prompt, shared = tokens(1, 300), 0
    for index in range(12):
        reply = tokens(100 + index, 30)
        assert turn(cache, model, prompt, reply) == shared
        shared = len(prompt) + 2
        prompt = prompt + reply[:2] + tokens(200 + index, 60)  # the reply rendered back differently after 2 tokens
    assert cache.blocks.tokens == unique_tokens_held(cache)


def test_a_restore_across_the_prompt_s_block_boundary_computes_what_a_full_prefill_does(model):
    cache = RamTier(budget_bytes=10**9)
    prompt, reply = tokens(1, 600), tokens(2, 40)
    turn(cache, model, prompt, reply)
    next_turn = prompt + reply[:3] + tokens(3, 50)
    fetched = cache.fetch(model, next_turn)
    assert fetched.reused == 603
    restored = model(mx.array(next_turn[603:])[None], cache=fetched.prompt_cache)
    cold = make_prompt_cache(model)
    expected = model(mx.array(next_turn)[None], cache=cold)
    assert np.allclose(np.array(restored[0, -1].astype(mx.float32)), np.array(expected[0, -1].astype(mx.float32)), atol=1e-4)
