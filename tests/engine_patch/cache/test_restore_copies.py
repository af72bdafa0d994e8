"""A restore from RAM (`cache_layers.restore_from_blocks`): the live cache it returns already holds the blocks'
bytes, copied once into one buffer per layer with room for the rest of the prompt, equal to the blocks back to
back, in every dtype a model keeps its cache in; the first prefilled token is written into that buffer."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache

from stable_prefix.engine_patch.cache import cache_layers

HEADS, HEAD_DIM, BLOCK = 2, 8, 16


def blocks_of(tokens: int, dtype, layers: int = 2) -> list[tuple[list, int]]:
    """(block arrays, tokens used) pieces over `tokens` tokens, as `copy_block` leaves them."""
    pieces, start = [], 0
    while start < tokens:
        used = min(BLOCK, tokens - start)
        arrays = [tuple(mx.random.normal((1, HEADS, BLOCK, HEAD_DIM)).astype(dtype) for _ in range(2)) for _ in range(layers)]
        mx.eval([part for pair in arrays for part in pair])
        pieces.append((arrays, used))
        start += used
    return pieces


def back_to_back(pieces: list[tuple[list, int]], layer: int, part: int) -> np.ndarray:
    joined = mx.concatenate([arrays[layer][part][..., :used, :] for arrays, used in pieces], axis=2)
    return np.asarray(joined.astype(mx.float32))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_a_restore_holds_the_blocks_back_to_back_in_their_dtype_with_room_behind(dtype):
    pieces = blocks_of(40, dtype)  # the last block used in part
    live = cache_layers.restore_from_blocks([KVCache(), KVCache()], pieces, 40, 300, [None, None])
    for index, layer in enumerate(live):
        assert layer.offset == 40 and layer.keys.dtype == dtype
        assert layer.keys.shape[2] == 512  # room up to the prompt's end, in KVCache's 256-token steps
        for part, array in enumerate((layer.keys, layer.values)):
            assert np.array_equal(np.asarray(array[..., :40, :].astype(mx.float32)), back_to_back(pieces, index, part))


def test_a_restore_is_done_when_it_returns_a_block_changed_later_does_not_reach_the_live_cache():
    """The copy happens inside the restore (its time is the restore's), not in the first prefill's evaluation."""
    pieces = blocks_of(32, mx.float16, layers=1)
    expected = back_to_back(pieces, 0, 0)
    live = cache_layers.restore_from_blocks([KVCache()], pieces, 32, 33, [None])
    np.asarray(pieces[0][0][0][0])[...] = 0  # the block's memory, written behind MLX's back
    assert np.array_equal(np.asarray(live[0].keys[..., :32, :].astype(mx.float32)), expected)


def test_the_first_prefilled_token_is_written_into_the_restored_buffer():
    pieces = blocks_of(32, mx.float16, layers=1)
    live = cache_layers.restore_from_blocks([KVCache()], pieces, 32, 40, [None])
    size = live[0].keys.shape[2]
    live[0].update_and_fetch(mx.ones((1, HEADS, 1, HEAD_DIM), mx.float16), mx.ones((1, HEADS, 1, HEAD_DIM), mx.float16))
    assert live[0].keys.shape[2] == size and live[0].offset == 33
    assert np.array_equal(np.asarray(live[0].keys[..., :32, :].astype(mx.float32)), back_to_back(pieces, 0, 0))


def test_a_restore_leaves_positional_layers_to_their_snapshot():
    recurrent = ArraysCache(size=1)
    recurrent[0] = mx.ones((1, 3, 4))
    frozen, _ = cache_layers.snapshot([recurrent])
    pieces = [([None, tuple(mx.ones((1, HEADS, BLOCK, HEAD_DIM)) for _ in range(2))], BLOCK)]
    live = cache_layers.restore_from_blocks([ArraysCache(size=1), KVCache()], pieces, BLOCK, BLOCK + 1, [frozen[0], None])
    assert np.array_equal(np.asarray(live[0].cache[0]), np.ones((1, 3, 4))) and live[1].offset == BLOCK
