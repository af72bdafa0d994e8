"""Snapshot/restore exactness of the prefix cache core, with whichever mlx-lm is importable.

    python -m tests.support.cache_core_check            # the venv's mlx-lm (0.31)
    PYTHONPATH=build/mlx-lm-0.32 python -m tests.support.cache_core_check

For each cache kind (a tiny model of each family, built in memory from
tools/tiny_families.py): prefill a prompt with a checkpoint, store it, fetch
the same prompt back and continue from the restored state; its last-token
log-probs must equal, bit for bit, those of a live cache split at the same
position. A second restore after the first one was extended must give the
same again (no aliasing). The entry also goes to a disk tier and comes back
through a new one on the same directory (a restart), and must continue the
same way. Layer kinds no tiny model has (ChunkedKVCache, CacheList) go through
the disk tier's layer serialization on their own. Prints one JSON object.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx_lm.models.cache import CacheList, ChunkedKVCache, KVCache, RotatingKVCache

from stable_prefix.engine_patch.cache import cache_layers
from stable_prefix.engine_patch.cache.ram_tier import Checkpoint, RamTier
from stable_prefix.engine_patch.disk.disk_tier import DiskTier
from stable_prefix.engine_patch.disk.model_identity import ModelIdentity
from stable_prefix.engine_patch.disk.tiered_cache import TieredCache
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


def restarted_cache(model, directory: Path) -> tuple[TieredCache, DiskTier]:
    """A RAM cache over a new disk tier on `directory`, as a server started afresh has."""
    tier = DiskTier(directory, budget_bytes=2**30)
    tier.bind(model, ModelIdentity("c" * 64, {"synthetic": "cache core check"}))
    return TieredCache(RamTier(budget_bytes=2**30), tier), tier


def check(family: str, directory: Path) -> dict:
    mx.random.seed(3)
    model = tiny_model(family)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, VOCAB, PROMPT_LENGTH).tolist()
    # A later prompt that shares exactly the first CHECKPOINT_AT tokens.
    later = tokens[:CHECKPOINT_AT] + rng.integers(0, VOCAB, PROMPT_LENGTH - CHECKPOINT_AT).tolist()

    def prefilled_to_checkpoint(live):
        model(mx.array(tokens[:CHECKPOINT_AT])[None], cache=live)
        cache_layers.eval_state(live)
        return live

    expected = last_log_probs(model, prefilled_to_checkpoint(mlx_lm.models.cache.make_prompt_cache(model)), later[CHECKPOINT_AT:])

    cache, tier = restarted_cache(model, directory)
    live = prefilled_to_checkpoint(cache.fetch(model, tokens).prompt_cache)
    positional = cache_layers.positional_indices(live)
    layers, nbytes = cache_layers.snapshot(live, positional)
    checkpoints = [Checkpoint(CHECKPOINT_AT, layers, nbytes)] if positional else []
    model(mx.array(tokens[CHECKPOINT_AT:])[None], cache=live)
    cache_layers.eval_state(live)
    cache.store(tokens, live, PROMPT_LENGTH, checkpoints, model=model)

    first = cache.fetch(model, later)
    restored = last_log_probs(model, first.prompt_cache, later[first.reused :])
    last_log_probs(model, first.prompt_cache, tokens[:7])  # extend the first restore further
    second = cache.fetch(model, later)
    again = last_log_probs(model, second.prompt_cache, later[second.reused :])
    tier.close()

    after_restart, restarted_tier = restarted_cache(model, directory)
    # The whole lane comes back (a load reads the prefix the prompt restores), then the later prompt restores from it.
    whole = after_restart.fetch(model, tokens + [7])
    from_disk = after_restart.fetch(model, later)
    loaded = last_log_probs(model, from_disk.prompt_cache, later[from_disk.reused :])
    restarted_tier.close()
    return {
        "kinds": sorted({type(layer).__name__ for layer in live}),
        "reused": first.reused,
        "restored_equals_split": bool(np.array_equal(restored, expected)),
        "second_restore_equals_first": bool(np.array_equal(again, restored)),
        "bytes": cache.ram.stats()["bytes"],
        "reused_after_restart": from_disk.reused,
        "whole_lane_after_restart": whole.reused == PROMPT_LENGTH,
        "disk_loads": restarted_tier.stats()["disk_loads"],
        "disk_errors": tier.stats()["disk_errors"] + restarted_tier.stats()["disk_errors"],
        "from_disk_equals_split": bool(np.array_equal(loaded, expected)),
        "bytes_after_restart": after_restart.ram.stats()["bytes"],
    }


def filled(layer, tokens: int):
    keys = mx.random.normal((1, 2, tokens, 8))
    layer.update_and_fetch(keys, keys * 0.5)
    return layer


LAYER_KINDS = {
    "ChunkedKVCache": lambda: filled(ChunkedKVCache(chunk_size=64), 40),
    "CacheList": lambda: CacheList(filled(KVCache(), 40), filled(RotatingKVCache(max_size=16), 40)),
}


def serialized_layer_continues_like_the_original(make_layer) -> bool:
    """Snapshot a layer, through layers_to_arrays/layers_from_arrays, restore: one more step
    gives the same keys and values as the snapshot restored directly."""
    layers, _ = cache_layers.snapshot([make_layer()])
    arrays, metadata = cache_layers.layers_to_arrays(layers)
    from_arrays = cache_layers.layers_from_arrays({name: mx.array(array) for name, array in arrays.items()}, metadata)
    step = mx.random.normal((1, 2, 3, 8))
    outputs = []
    for frozen in (layers, from_arrays):
        (live,) = cache_layers.restore(frozen)
        parts = live.caches if isinstance(live, CacheList) else [live]
        outputs.append([(part.offset, part.update_and_fetch(step, step)) for part in parts])
    return all(a[0] == b[0] and all(mx.array_equal(x, y).item() for x, y in zip(a[1], b[1])) for a, b in zip(*outputs))


def main() -> None:
    families = ["qwen2", *FAMILIES]
    with tempfile.TemporaryDirectory() as directory:
        checked = {family: check(family, Path(directory) / family) for family in families}
    print(json.dumps({
        "mlx_lm": mlx_lm.__version__,
        "meta_state_api": cache_layers.HAS_META_STATE,
        "families": checked,
        "layer_kinds": {kind: serialized_layer_continues_like_the_original(make) for kind, make in LAYER_KINDS.items()},
    }))


if __name__ == "__main__":
    main()
