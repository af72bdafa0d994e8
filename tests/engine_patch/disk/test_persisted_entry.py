"""A prefix-cache entry as files: a manifest naming its blocks and states, blocks and states of their own.
What is written comes back with its checkpoints and the layers they share, and a description that does
not fit its tokens or its layers is refused."""

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from stable_prefix.engine_patch.cache.cache_layers import copy_block, snapshot
from stable_prefix.engine_patch.cache.kv_blocks import Block, BlockRef, block_keys
from stable_prefix.engine_patch.cache.ram_tier import CachedPrefix, Checkpoint, own_nbytes
from stable_prefix.engine_patch.disk.persisted_entry import (
    BlockPiece,
    EntryDescriptionError,
    block_arrays,
    block_from_arrays,
    cut,
    lane_metadata,
    lane_record,
    record_of,
    state_arrays,
    state_from_arrays,
    state_keys,
    with_tokens,
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


def blocks_of(tokens: np.ndarray, segments: list[tuple[int, int]]) -> list[BlockRef]:
    live = live_cache(len(tokens))
    refs = []
    for (start, end), key in zip(segments, block_keys(tokens, segments)):
        arrays, nbytes = copy_block(live, start, end)
        refs.append(BlockRef(Block(key, start, end, tokens[start:end].astype(np.int32), arrays, nbytes), end - start))
    return refs


def entry_ending_at_its_last_checkpoint() -> CachedPrefix:
    """As RamTier.store makes it when the end state is its last checkpoint's."""
    head, end_checkpoint = checkpoint_at(10, pinned=True), checkpoint_at(TOKENS)
    layers = [end_checkpoint.layers[0], end_checkpoint.layers[1], None]
    checkpoints = [head, end_checkpoint]
    tokens = np.arange(TOKENS)
    return CachedPrefix(tokens, blocks_of(tokens, [(0, 32), (32, TOKENS)]), layers, own_nbytes(layers, checkpoints), 30, checkpoints, turns=3)


def round_trip(entry: CachedPrefix, edit=None):
    record, _ = record_of(entry)
    if edit is not None:
        record = edit(record)
    return with_tokens(lane_record("name", lane_metadata(record), 0), token_ids_of(entry))


def token_ids_of(entry: CachedPrefix) -> dict:
    return {ref.block.key: ref.block.token_ids for ref in entry.blocks}


def test_a_manifest_names_its_blocks_checkpoints_end_state_and_turns():
    entry = entry_ending_at_its_last_checkpoint()
    back = round_trip(entry)
    assert [(piece.key, piece.start, piece.end, piece.used) for piece in back.blocks] == [
        (ref.block.key, ref.start, ref.block.end, ref.used) for ref in entry.blocks
    ]
    assert [(c.key, c.position, c.pinned) for c in back.checkpoints] == [(c.key, c.position, c.pinned) for c in entry.checkpoints]
    assert back.prompt_length == 30 and back.turns == 3 and back.positional == [0, 1] and back.layer_count == 3
    assert back.tokens.tolist() == list(range(TOKENS)) and back.token_count == TOKENS


def test_an_end_state_that_is_its_last_checkpoint_needs_no_state_of_its_own():
    entry = entry_ending_at_its_last_checkpoint()
    record, own_end_state = record_of(entry)
    assert record.end_state == entry.checkpoints[-1].key and not own_end_state
    assert state_keys(record) == [c.key for c in entry.checkpoints]


def test_an_end_state_of_its_own_gets_a_state_key():
    entry = entry_ending_at_its_last_checkpoint()
    entry.layers = list(snapshot(live_cache(TOKENS), [0, 1])[0])
    record, own_end_state = record_of(entry)
    assert own_end_state and record.end_state not in {c.key for c in entry.checkpoints}


def test_a_lane_cut_at_a_checkpoint_ends_in_that_checkpoint_s_state_and_uses_part_of_a_block():
    record, _ = record_of(entry_ending_at_its_last_checkpoint())
    head = cut(record, 10)
    assert len(head.tokens) == 10 and head.end_state == record.checkpoints[0].key
    assert [(piece.start, piece.used) for piece in head.blocks] == [(0, 10)]
    assert head.prompt_length == 10 and [c.position for c in head.checkpoints] == [10]


def test_a_block_comes_back_from_its_arrays():
    entry = entry_ending_at_its_last_checkpoint()
    record, _ = record_of(entry)
    block = entry.blocks[1].block
    arrays, metadata = block_arrays(block)
    back = block_from_arrays(record.blocks[1], np.array(arrays.pop("tokens")), arrays, metadata, record)
    assert back.token_ids.tolist() == list(range(32, TOKENS))
    assert (back.key, back.start, back.end, back.nbytes) == (block.key, block.start, block.end, block.nbytes)
    assert back.arrays[0] is None and back.arrays[1] is None
    assert all(mx.array_equal(a, b).item() for a, b in zip(block.arrays[2], back.arrays[2]))


def test_a_block_file_holding_another_block_or_shape_is_refused():
    entry = entry_ending_at_its_last_checkpoint()
    record, _ = record_of(entry)
    arrays, metadata = block_arrays(entry.blocks[1].block)
    token_ids = np.array(arrays.pop("tokens"))
    with pytest.raises(EntryDescriptionError, match="holds another block"):
        block_from_arrays(record.blocks[0], token_ids, arrays, metadata, record)
    short = {name: array[..., :3, :] for name, array in arrays.items()}
    with pytest.raises(EntryDescriptionError, match="lacks layer 2"):
        block_from_arrays(record.blocks[1], token_ids, short, metadata, record)
    with pytest.raises(EntryDescriptionError, match="lacks its token ids"):
        block_from_arrays(record.blocks[1], token_ids[:3], arrays, metadata, record)


def test_a_lane_s_token_ids_come_from_its_blocks_and_stop_where_one_is_missing_or_not_what_its_key_says():
    entry = entry_ending_at_its_last_checkpoint()
    record, _ = record_of(entry)
    described = lane_record("name", lane_metadata(record), 0)
    assert described.tokens is None and described.token_count == TOKENS
    assert with_tokens(described, token_ids_of(entry)).tokens.tolist() == list(range(TOKENS))
    first, second = entry.blocks[0].block, entry.blocks[1].block
    # The second block gone, or a file of other tokens under its name: the lane restores up to its head checkpoint.
    for token_ids in ({first.key: first.token_ids}, {first.key: first.token_ids, second.key: second.token_ids + 1}):
        cut_back = with_tokens(described, token_ids)
        assert cut_back.tokens.tolist() == list(range(10)) and cut_back.end_state == entry.checkpoints[0].key
    assert with_tokens(described, {}).tokens is None


def test_a_state_comes_back_at_its_indices_and_position():
    entry = entry_ending_at_its_last_checkpoint()
    record, _ = record_of(entry)
    head = entry.checkpoints[0]
    layers = state_from_arrays(head.key, 10, *state_arrays(head.layers, head.key, 10), record)
    assert layers[2] is None and type(layers[0]) is ArraysCache and type(layers[1]) is RotatingKVCache
    assert mx.array_equal(layers[0].cache[0], head.layers[0].cache[0]).item()


def test_a_state_at_another_position_is_refused():
    entry = entry_ending_at_its_last_checkpoint()
    record, _ = record_of(entry)
    head = entry.checkpoints[0]
    arrays, metadata = state_arrays(head.layers, head.key, 10)
    with pytest.raises(EntryDescriptionError, match="holds another state"):
        state_from_arrays(head.key, 11, arrays, metadata, record)
    with pytest.raises(EntryDescriptionError, match="at 11 holds a layer at 10"):
        state_from_arrays(head.key, 11, arrays, {**metadata, "position": "11"}, record)


def blocks_with_a_gap(record):
    first, second = record.blocks
    return replace(record, blocks=[first, BlockPiece(second.key, second.start + 1, second.end, second.used - 1)])


def blocks_short_of_the_tokens(record):
    return replace(record, blocks=record.blocks[:1])


def checkpoints_out_of_order(record):
    return replace(record, checkpoints=list(reversed(record.checkpoints)))


def checkpoint_past_the_tokens(record):
    last = record.checkpoints[-1]
    return replace(record, checkpoints=[*record.checkpoints[:-1], replace(last, position=TOKENS + 1)])


def no_end_state_for_positional_layers(record):
    return replace(record, end_state=None)


def prompt_longer_than_the_tokens(record):
    return replace(record, prompt_length=TOKENS + 1)


EDITS = [blocks_with_a_gap, blocks_short_of_the_tokens, checkpoints_out_of_order, checkpoint_past_the_tokens,
         no_end_state_for_positional_layers, prompt_longer_than_the_tokens]


@pytest.mark.parametrize("edit", EDITS, ids=[edit.__name__ for edit in EDITS])
def test_a_description_that_does_not_fit_its_tokens_is_refused(edit):
    with pytest.raises(EntryDescriptionError):
        round_trip(entry_ending_at_its_last_checkpoint(), edit)


def test_a_malformed_description_is_refused():
    record, _ = record_of(entry_ending_at_its_last_checkpoint())
    with pytest.raises(EntryDescriptionError, match="malformed"):
        lane_record("name", {"lane": '{"blocks": 3}'}, 0)
