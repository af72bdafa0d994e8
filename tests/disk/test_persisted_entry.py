"""A prefix-cache entry as a file's arrays and description: whole entries come back
with their checkpoints and the layers they share, and a description that does not
fit its layers is refused."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from stable_prefix.engine_patch.cache.cache_layers import snapshot
from stable_prefix.engine_patch.cache.prefix_cache import CachedPrefix, Checkpoint, own_nbytes
from stable_prefix.engine_patch.disk.persisted_entry import (
    ENTRY,
    EntryDescriptionError,
    checkpoint_positions,
    entry_from_arrays,
    entry_to_arrays,
)

TOKENS = 40


def live_cache(tokens: int) -> list:
    """A recurrent layer, a sliding window and an attention layer after `tokens` tokens."""
    recurrent = ArraysCache(size=2)
    recurrent[0], recurrent[1] = mx.full((1, 3, 4), float(tokens)), mx.full((1, 2, 4, 4), -float(tokens))
    window, attention = RotatingKVCache(max_size=16), KVCache()
    keys = mx.random.normal((1, 1, tokens, 8))
    window.update_and_fetch(keys, keys)
    attention.update_and_fetch(keys, keys)
    return [recurrent, window, attention]


def checkpoint_at(position: int, pinned: bool = False) -> Checkpoint:
    layers, nbytes = snapshot(live_cache(position), [0, 1])
    return Checkpoint(position, layers, nbytes, pinned=pinned)


def entry_ending_at_its_last_checkpoint() -> CachedPrefix:
    """As PrefixCache.store makes it when the end state is its last checkpoint's."""
    head, end_checkpoint = checkpoint_at(10, pinned=True), checkpoint_at(TOKENS)
    attention, _ = snapshot(live_cache(TOKENS), [2])
    layers = [end_checkpoint.layers[0], end_checkpoint.layers[1], attention[2]]
    checkpoints = [head, end_checkpoint]
    return CachedPrefix(np.arange(TOKENS), layers, own_nbytes(layers, checkpoints), 30, checkpoints)


def round_trip(entry: CachedPrefix, edit=None) -> CachedPrefix:
    arrays, metadata = entry_to_arrays(entry)
    if edit is not None:
        described = json.loads(metadata[ENTRY])
        edit(described)
        metadata = {**metadata, ENTRY: json.dumps(described)}
    return entry_from_arrays(entry.tokens, entry.prompt_length, arrays, metadata)


def test_an_entry_comes_back_with_its_checkpoints_and_its_bytes():
    entry = entry_ending_at_its_last_checkpoint()
    back = round_trip(entry)
    assert [(c.position, c.key, c.pinned, c.nbytes) for c in back.checkpoints] == [
        (c.position, c.key, c.pinned, c.nbytes) for c in entry.checkpoints
    ]
    assert back.nbytes == entry.nbytes and back.prompt_length == 30
    for original, loaded in zip(entry.layers, back.layers):
        assert type(loaded) is type(original)
        assert all(mx.array_equal(a, b).item() for a, b in zip(original.state, loaded.state) if isinstance(a, mx.array))


def test_the_end_state_shares_its_last_checkpoint_s_layers_and_stores_them_once():
    entry = entry_ending_at_its_last_checkpoint()
    arrays, _ = entry_to_arrays(entry)
    # recurrent x2 (head, end), window x2, attention: 2 + 2 + 2 + 2 + 2 arrays, not 2 more for the end state
    assert len(arrays) == 10
    back = round_trip(entry)
    assert back.layers[0] is back.checkpoints[-1].layers[0] and back.layers[1] is back.checkpoints[-1].layers[1]
    assert back.checkpoints[0].layers[2] is None


def test_checkpoint_positions_come_from_the_description_alone():
    _, metadata = entry_to_arrays(entry_ending_at_its_last_checkpoint())
    assert checkpoint_positions(metadata, TOKENS) == [10, TOKENS]


def moved_checkpoint(described):
    described["checkpoints"][0]["position"] = 11


def checkpoint_past_the_tokens(described):
    described["checkpoints"][-1]["position"] = TOKENS + 1


def checkpoints_out_of_order(described):
    described["checkpoints"].reverse()


def missing_layer(described):
    described["end"][2] = 99


def attention_in_a_checkpoint(described):
    described["checkpoints"][0]["layers"][2] = described["end"][2]


def no_description(described):
    described.clear()


EDITS = [moved_checkpoint, checkpoint_past_the_tokens, checkpoints_out_of_order, missing_layer, attention_in_a_checkpoint, no_description]


@pytest.mark.parametrize("edit", EDITS, ids=[edit.__name__ for edit in EDITS])
def test_a_description_that_does_not_fit_its_layers_is_refused(edit):
    with pytest.raises(EntryDescriptionError):
        round_trip(entry_ending_at_its_last_checkpoint(), edit)
