"""Snapshot/restore exactness of the prefix cache core, with whichever mlx-lm is importable.

    python -m tests.support.cache_core_check            # the venv's mlx-lm (0.31)
    PYTHONPATH=build/mlx-lm-0.32 python -m tests.support.cache_core_check

For each cache kind (a tiny model of each family, built in memory from
tools/tiny_families.py): prefill a prompt with a checkpoint, store it, fetch
the same prompt back and continue from the restored state; its last-token
log-probs must equal, bit for bit, those of a live cache split at the same
position. A second restore after the first one was extended must give the
same again (no aliasing). Prints one JSON object.
"""

from __future__ import annotations

import json

import mlx.core as mx
import mlx_lm
import numpy as np

from stable_prefix.engine_patch import cache_layers
from stable_prefix.engine_patch.prefix_cache import Checkpoint, PrefixCache
from stable_prefix.tools.tiny_families import FAMILIES

PROMPT_LENGTH, CHECKPOINT_AT = 150, 100  # past the 64-token windows
VOCAB = 4096  # token ids drawn from here; the embedding stays full size


def tiny_model(family: str):
    import importlib

    if family == "qwen2":
        from mlx_lm.models import qwen2

        args = qwen2.ModelArgs(model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                               num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6, vocab_size=VOCAB,
                               tie_word_embeddings=True)
        return qwen2.Model(args)
    config = FAMILIES[family].config(FAMILIES[family].default_shape)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    return module.Model(module.ModelArgs.from_dict(config))


def last_log_probs(model, prompt_cache, tokens: list[int]) -> np.ndarray:
    if len(tokens) > 1:
        model(mx.array(tokens[:-1])[None], cache=prompt_cache)
        cache_layers.eval_state(prompt_cache)
    logits = model(mx.array(tokens[-1:])[None], cache=prompt_cache)[0, -1]
    return np.array(logits - mx.logsumexp(logits))


def check(family: str) -> dict:
    mx.random.seed(3)
    model = tiny_model(family)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, VOCAB, PROMPT_LENGTH).tolist()
    # A later prompt that shares exactly the first CHECKPOINT_AT tokens.
    later = tokens[:CHECKPOINT_AT] + rng.integers(0, VOCAB, PROMPT_LENGTH - CHECKPOINT_AT).tolist()

    def prefilled_to_checkpoint():
        live = mlx_lm.models.cache.make_prompt_cache(model)
        model(mx.array(tokens[:CHECKPOINT_AT])[None], cache=live)
        cache_layers.eval_state(live)
        return live

    expected = last_log_probs(model, prefilled_to_checkpoint(), later[CHECKPOINT_AT:])

    live = prefilled_to_checkpoint()
    positional = cache_layers.positional_indices(live)
    layers, nbytes = cache_layers.snapshot(live, positional)
    checkpoints = [Checkpoint(CHECKPOINT_AT, layers, nbytes)] if positional else []
    model(mx.array(tokens[CHECKPOINT_AT:])[None], cache=live)
    cache_layers.eval_state(live)
    cache = PrefixCache(budget_bytes=2**30)
    cache.store(tokens, live, PROMPT_LENGTH, checkpoints)

    first = cache.fetch(model, later)
    restored = last_log_probs(model, first.prompt_cache, later[first.reused :])
    last_log_probs(model, first.prompt_cache, tokens[:7])  # extend the first restore further
    second = cache.fetch(model, later)
    again = last_log_probs(model, second.prompt_cache, later[second.reused :])
    return {
        "kinds": sorted({type(layer).__name__ for layer in live}),
        "reused": first.reused,
        "restored_equals_split": bool(np.array_equal(restored, expected)),
        "second_restore_equals_first": bool(np.array_equal(again, restored)),
        "bytes": cache.stats()["bytes"],
    }


def main() -> None:
    families = ["qwen2", *FAMILIES]
    print(json.dumps({
        "mlx_lm": mlx_lm.__version__,
        "meta_state_api": cache_layers.HAS_META_STATE,
        "families": {family: check(family) for family in families},
    }))


if __name__ == "__main__":
    main()
