"""RamTier without a server: hits, misses, longest common prefix, trimming,
eviction order, the byte budget, and that a restored cache computes exactly what
a full prefill computes."""

import gc

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import qwen2, qwen3_5
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache

from stable_prefix.engine_patch.cache import cache_layers
from stable_prefix.engine_patch.cache.cache_layers import UnsupportedCache, check_snapshot_support, snapshot
from stable_prefix.engine_patch.cache.kv_blocks import block_keys
from stable_prefix.engine_patch.cache.ram_tier import Checkpoint, RamTier
from stable_prefix.tools.tiny_families import FAMILIES

VOCAB = 512


@pytest.fixture(scope="module")
def model():
    mx.random.seed(7)
    args = qwen2.ModelArgs(
        model_type="qwen2",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB,
        tie_word_embeddings=True,
    )
    model = qwen2.Model(args)
    mx.eval(model.parameters())
    return model


def tokens(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, length).tolist()


def prefilled(model, prompt: list[int]):
    """A live cache holding `prompt`, as a finished request leaves it."""
    cache = make_prompt_cache(model)
    model(mx.array(prompt)[None], cache=cache)
    return cache


def last_logits(model, cache, suffix: list[int]) -> np.ndarray:
    logits = model(mx.array(suffix)[None], cache=cache)
    return np.array(logits[0, -1].astype(mx.float32))


def bytes_per_token(model) -> int:
    cache = prefilled(model, [1])
    return sum(array.nbytes for layer in cache for array in layer.state)


def test_an_empty_cache_misses_and_counts_the_whole_prompt_as_prefilled(model):
    cache = RamTier(budget_bytes=10**9)
    fetched = cache.fetch(model, tokens(1, 20))
    assert fetched.reused == 0
    assert cache.stats()["misses"] == 1
    assert cache.stats()["tokens_prefilled"] == 20


def next_turn_fetched(model, stored_length: int, seed: int, new_length: int):
    """A cache holding one prefilled turn of `stored_length` tokens, and the next turn (`new_length` more) fetched
    from it: (the cache, the next turn, what the fetch returned)."""
    cache = RamTier(budget_bytes=10**9)
    turn1 = tokens(1, stored_length)
    cache.store(turn1, prefilled(model, turn1))
    turn2 = turn1 + tokens(seed, new_length)
    return cache, turn2, cache.fetch(model, turn2)


def test_a_prompt_that_extends_a_stored_one_reuses_all_of_it(model):
    cache, _, fetched = next_turn_fetched(model, 30, seed=2, new_length=10)
    assert fetched.reused == 30
    assert fetched.prompt_cache[0].offset == 30
    assert cache.stats()["tokens_prefilled"] == 10


def test_restored_state_gives_the_same_logits_as_a_full_prefill(model):
    _, turn2, fetched = next_turn_fetched(model, 40, seed=3, new_length=12)
    cached = last_logits(model, fetched.prompt_cache, turn2[fetched.reused :])
    full = last_logits(model, make_prompt_cache(model), turn2)
    np.testing.assert_allclose(cached, full, atol=1e-2)
    assert cached.argmax() == full.argmax()


def test_a_prompt_that_diverges_midway_reuses_the_common_prefix_by_trimming(model):
    cache = RamTier(budget_bytes=10**9)
    stored = tokens(1, 40)
    cache.store(stored, prefilled(model, stored))
    edited = stored[:25] + tokens(4, 10)
    fetched = cache.fetch(model, edited)
    assert fetched.reused == 25
    assert fetched.prompt_cache[0].offset == 25
    cached = last_logits(model, fetched.prompt_cache, edited[25:])
    full = last_logits(model, make_prompt_cache(model), edited)
    assert cached.argmax() == full.argmax()
    np.testing.assert_allclose(cached, full, atol=1e-2)


def test_an_identical_prompt_leaves_its_last_token_to_prefill(model):
    cache = RamTier(budget_bytes=10**9)
    prompt = tokens(1, 30)
    cache.store(prompt, prefilled(model, prompt))
    assert cache.fetch(model, prompt).reused == 29


def test_the_longest_match_wins_among_lanes(model):
    cache = RamTier(budget_bytes=10**9)
    main_lane, subagent_lane = tokens(1, 30), tokens(2, 30)
    cache.store(main_lane, prefilled(model, main_lane))
    cache.store(subagent_lane, prefilled(model, subagent_lane))
    assert cache.fetch(model, main_lane + [5]).reused == 30
    assert cache.fetch(model, subagent_lane + [5]).reused == 30
    assert cache.stats()["entries"] == 2


def test_a_state_that_extends_an_entry_replaces_it(model):
    cache = RamTier(budget_bytes=10**9)
    turn1 = tokens(1, 20)
    turn2 = turn1 + tokens(2, 20)
    cache.store(turn1, prefilled(model, turn1))
    cache.store(turn2, prefilled(model, turn2))
    assert cache.stats()["entries"] == 1
    assert cache.stats()["entry_tokens"] == [40]


def test_an_older_turn_is_dropped_once_a_newer_state_repeats_its_whole_prompt(model):
    cache = RamTier(budget_bytes=10**9)
    turn1, generated = tokens(1, 20), tokens(2, 4)
    cache.store(turn1 + generated, prefilled(model, turn1 + generated), prompt_length=20)
    # The next turn renders the reply differently, so it diverges after turn1.
    turn2 = turn1 + tokens(3, 10)
    cache.store(turn2, prefilled(model, turn2), prompt_length=30)
    assert cache.stats()["entry_tokens"] == [30]


def test_an_entry_whose_prompt_was_not_repeated_is_kept(model):
    cache = RamTier(budget_bytes=10**9)
    first = tokens(1, 20)
    cache.store(first, prefilled(model, first), prompt_length=20)
    sibling = first[:15] + tokens(4, 10)
    cache.store(sibling, prefilled(model, sibling), prompt_length=25)
    assert sorted(cache.stats()["entry_tokens"]) == [20, 25]


def test_a_state_already_held_as_a_prefix_is_not_stored_twice(model):
    cache = RamTier(budget_bytes=10**9)
    long = tokens(1, 40)
    cache.store(long, prefilled(model, long))
    cache.store(long[:20], prefilled(model, long[:20]))
    assert cache.stats()["entry_tokens"] == [40]
    assert cache.stats()["stores"] == 1


def test_the_cache_may_hold_fewer_tokens_than_reported_and_keeps_only_those(model):
    cache = RamTier(budget_bytes=10**9)
    prompt, generated = tokens(1, 20), tokens(2, 3)
    # The last generated token is never fed back into the model.
    cache.store(prompt + generated, prefilled(model, prompt + generated[:-1]))
    assert cache.stats()["entry_tokens"] == [22]


def test_least_recently_used_lane_is_evicted_first(model):
    per_entry = 20 * bytes_per_token(model)
    cache = RamTier(budget_bytes=2 * per_entry)
    lane_a, lane_b, lane_c = tokens(1, 20), tokens(2, 20), tokens(3, 20)
    cache.store(lane_a, prefilled(model, lane_a))
    cache.store(lane_b, prefilled(model, lane_b))
    assert cache.fetch(model, lane_a + [1]).reused == 20  # lane a is now the most recent
    cache.store(lane_c, prefilled(model, lane_c))
    assert cache.stats()["evictions"] == 1
    assert cache.fetch(model, lane_b + [1]).reused == 0
    assert cache.fetch(model, lane_a + [1]).reused == 20
    assert cache.fetch(model, lane_c + [1]).reused == 20


def test_entry_count_bound_evicts_too(model):
    cache = RamTier(budget_bytes=10**9, max_entries=2)
    for seed in (1, 2, 3):
        lane = tokens(seed, 10)
        cache.store(lane, prefilled(model, lane))
    assert cache.stats()["entries"] == 2
    assert cache.stats()["evictions"] == 1


def test_bytes_held_are_counted_exactly_and_never_exceed_the_budget(model):
    per_token = bytes_per_token(model)
    budget = 70 * per_token
    cache = RamTier(budget_bytes=budget)
    rng = np.random.default_rng(0)
    for seed in range(12):
        lane = tokens(seed, int(rng.integers(5, 40)))
        cache.store(lane, prefilled(model, lane))
        stats = cache.stats()
        assert stats["bytes"] <= budget
        assert stats["bytes"] == sum(stats["entry_tokens"]) * per_token


def test_a_state_larger_than_the_budget_is_trimmed_to_fit(model):
    per_token = bytes_per_token(model)
    cache = RamTier(budget_bytes=25 * per_token)
    prompt = tokens(1, 40)
    cache.store(prompt, prefilled(model, prompt))
    assert cache.stats()["entry_tokens"] == [25]
    assert cache.stats()["trimmed_to_fit"] == 1
    assert cache.fetch(model, prompt + [1]).reused == 25


def test_an_admitted_entry_follows_the_store_rules_and_replaces_the_turn_it_repeats(model):
    """An entry made elsewhere (loaded from disk) replaces a RAM entry whose whole prompt it holds."""
    turn1 = tokens(1, 30)
    ram = RamTier(budget_bytes=10**9)
    ram.store(turn1, prefilled(model, turn1))
    elsewhere = RamTier(budget_bytes=10**9)
    turn2 = turn1 + tokens(2, 20)
    elsewhere.store(turn2, prefilled(model, turn2))
    ram.admit(elsewhere.newest_entry())
    assert ram.stats()["entry_tokens"] == [50]
    assert ram.fetch(model, turn2 + [1]).reused == 50


def test_an_admitted_entry_larger_than_the_budget_keeps_the_longest_prefix_that_fits(model):
    per_token = bytes_per_token(model)
    elsewhere = RamTier(budget_bytes=10**9)
    prompt = tokens(1, 40)
    elsewhere.store(prompt, prefilled(model, prompt))
    ram = RamTier(budget_bytes=25 * per_token)
    ram.admit(elsewhere.newest_entry())
    assert ram.stats()["entry_tokens"] == [25] and ram.stats()["bytes"] <= 25 * per_token
    assert ram.fetch(model, prompt + [1]).reused == 25


def held_arrays(cache: RamTier) -> list[np.ndarray]:
    """Every array the cache's blocks and positional states hold, copied out."""
    arrays = []
    for entry in cache.entries.values():
        arrays += [np.array(part) for ref in entry.blocks for pair in ref.block.arrays if pair is not None for part in pair]
        arrays += [np.array(array) for layer in entry.layers if layer is not None for array in layer.state]
    return arrays


@pytest.mark.parametrize("length", [40, 1000], ids=["one-block", "several-blocks"])
def test_a_restored_cache_never_writes_into_the_snapshot(model, length):
    cache = RamTier(budget_bytes=10**9)
    stored = tokens(1, length)
    cache.store(stored, prefilled(model, stored))
    held = held_arrays(cache)

    # Trimmed, then extended: the cache writes new keys into its existing buffer.
    first = cache.fetch(model, stored[: length - 10] + tokens(5, 8))
    last_logits(model, first.prompt_cache, tokens(5, 8))
    last_logits(model, first.prompt_cache, tokens(6, 3))

    after = held_arrays(cache)
    for before_array, after_array in zip(held, after):
        np.testing.assert_array_equal(before_array, after_array)
    second = cache.fetch(model, stored + [9])
    full = last_logits(model, make_prompt_cache(model), stored + [9])
    assert last_logits(model, second.prompt_cache, [9]).argmax() == full.argmax()


def test_clear_drops_every_entry(model):
    cache = RamTier(budget_bytes=10**9)
    prompt = tokens(1, 10)
    cache.store(prompt, prefilled(model, prompt))
    assert cache.clear() == 1
    assert cache.stats()["entries"] == 0
    assert cache.stats()["bytes"] == 0


def test_a_short_state_is_copied_down_to_its_tokens(model):
    live = prefilled(model, tokens(1, 10))  # KVCache allocates 256-token steps
    layers, nbytes = snapshot(live)
    assert all(array.shape[2] == 10 for layer in layers for array in layer.state)
    assert nbytes == 10 * bytes_per_token(model)


def test_a_long_state_is_kept_as_blocks_of_its_tokens(model):
    cache = RamTier(budget_bytes=10**9)
    cache.store(tokens(1, 1000), prefilled(model, tokens(1, 1000)))  # held in a 1,024-token buffer
    (entry,) = cache.entries.values()
    assert [(ref.start, ref.end) for ref in entry.blocks] == [(0, 256), (256, 512), (512, 768), (768, 1000)]
    assert cache.stats()["bytes"] == 1000 * bytes_per_token(model)  # the tokens, not the buffer behind them


def test_a_stored_state_is_copied_out_of_the_live_buffer_and_never_keeps_it_alive(model):
    prompt = tokens(1, 1000)
    live = prefilled(model, prompt)  # a 1,024-token buffer per layer
    mx.eval([layer.state for layer in live])
    gc.collect()
    with_live = mx.get_active_memory()
    cache = RamTier(budget_bytes=10**9)
    cache.store(prompt[:300], live)
    del live
    gc.collect()
    # A slice of the live buffer would keep all 1,024 tokens' arrays alive (the slack: a page per array).
    assert mx.get_active_memory() <= with_live - (1024 - 300) * bytes_per_token(model) + 4 * 4096


def test_a_quantized_cache_is_refused_and_a_sliding_window_accepted():
    with pytest.raises(UnsupportedCache, match="QuantizedKVCache"):
        check_snapshot_support([KVCache(), QuantizedKVCache(group_size=64, bits=8)])
    check_snapshot_support([KVCache(), RotatingKVCache(max_size=64, keep=4)])


# --- models with positional layers: checkpoints --------------------------------


@pytest.fixture(scope="module")
def hybrid():
    """A tiny Qwen3.5-shaped model: gated-DeltaNet (ArraysCache) layers and one attention layer."""
    mx.random.seed(7)
    config = FAMILIES["qwen3_5"].config(FAMILIES["qwen3_5"].default_shape) | {"vocab_size": VOCAB}
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(config))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def prefilled_with_checkpoints(model, prompt: list[int], positions: list[int]):
    """A live cache holding `prompt`, and checkpoints of its positional layers at `positions`."""
    cache, checkpoints, done = make_prompt_cache(model), [], 0
    positional = cache_layers.positional_indices(cache)
    for position in [*positions, len(prompt)]:
        model(mx.array(prompt[done:position])[None], cache=cache)
        done = position
        if position < len(prompt):
            layers, nbytes = cache_layers.snapshot(cache, positional)
            checkpoints.append(Checkpoint(position, layers, nbytes))
    return cache, checkpoints


def test_a_positional_model_restores_the_longest_checkpoint_inside_the_common_prefix(hybrid):
    cache = RamTier(budget_bytes=10**9)
    stored = tokens(1, 40)
    live, checkpoints = prefilled_with_checkpoints(hybrid, stored, [10, 20])
    cache.store(stored, live, 40, checkpoints)
    fetched = cache.fetch(hybrid, stored[:30] + tokens(2, 5))
    assert fetched.reused == 20 and fetched.common_prefix == 30
    assert [c.position for c in fetched.inherited] == [10, 20]
    cached = last_logits(hybrid, fetched.prompt_cache, stored[20:30] + tokens(2, 5))
    full = last_logits(hybrid, make_prompt_cache(hybrid), stored[:30] + tokens(2, 5))
    np.testing.assert_allclose(cached, full, atol=1e-4)


def test_a_positional_model_restores_the_whole_entry_when_the_prompt_extends_it(hybrid):
    cache = RamTier(budget_bytes=10**9)
    stored = tokens(1, 40)
    live, checkpoints = prefilled_with_checkpoints(hybrid, stored, [10])
    cache.store(stored, live, 40, checkpoints)
    assert cache.fetch(hybrid, stored + tokens(2, 5)).reused == 40


def test_a_checkpoint_shared_by_two_lanes_is_counted_once(hybrid):
    cache = RamTier(budget_bytes=10**9)
    first = tokens(1, 30)
    live, checkpoints = prefilled_with_checkpoints(hybrid, first, [10])
    cache.store(first, live, 30, checkpoints)
    second = first[:10] + tokens(2, 20)
    fetched = cache.fetch(hybrid, second)
    assert fetched.reused == 10
    model_call = hybrid(mx.array(second[10:])[None], cache=fetched.prompt_cache)
    mx.eval(model_call)
    cache.store(second, fetched.prompt_cache, 30, fetched.inherited)
    entries = list(cache.entries.values())
    assert len(entries) == 2 and entries[0].checkpoints[0] is entries[1].checkpoints[0]
    assert cache.stats()["bytes"] == cache.blocks.nbytes + entries[0].nbytes + entries[1].nbytes + checkpoints[0].nbytes


def test_a_hybrid_entry_is_never_larger_than_the_budget(hybrid):
    stored = tokens(1, 40)
    live, checkpoints = prefilled_with_checkpoints(hybrid, stored, [10, 20])
    whole = cache_layers.state_nbytes(live) + sum(c.nbytes for c in checkpoints)
    cache = RamTier(budget_bytes=whole - 1)
    cache.store(stored, live, 40, checkpoints)
    stats = cache.stats()
    assert stats["bytes"] <= whole - 1
    assert stats["entry_tokens"] == [20] and stats["trimmed_to_fit"] == 1


def test_an_entry_with_too_many_checkpoints_drops_the_earlier_of_the_closest_pair(hybrid):
    cache = RamTier(budget_bytes=10**9)
    stored = tokens(1, 60)
    # A message start at 40 and the chat head right after its role header, at 43.
    live, checkpoints = prefilled_with_checkpoints(hybrid, stored, [3, 10, 20, 40, 43, 50, 55])
    cache.store(stored, live, 60, checkpoints)
    assert cache.stats()["entry_checkpoints"] == [[3, 10, 20, 43, 50, 55]]


def test_the_pinned_chat_head_checkpoint_is_never_dropped(hybrid):
    cache = RamTier(budget_bytes=10**9)
    stored = tokens(1, 60)
    live, checkpoints = prefilled_with_checkpoints(hybrid, stored, [3, 10, 20, 40, 41, 50, 55])
    checkpoints[3].pinned = True  # the head at 40, one token before a branch point
    cache.store(stored, live, 60, checkpoints)
    assert 40 in cache.stats()["entry_checkpoints"][0]


# --- blocks held once -------------------------------------------------------------


def served(cache: RamTier, model, prompt: list[int]) -> int:
    """One request as the engine runs it: restore, prefill the rest, store. Returns the tokens reused."""
    fetched = cache.fetch(model, prompt)
    model(mx.array(prompt[fetched.reused :])[None], cache=fetched.prompt_cache)
    cache.store(prompt, fetched.prompt_cache)
    return fetched.reused


def test_a_block_key_names_every_token_before_the_block_s_end_and_its_start():
    prompt = np.asarray(tokens(1, 600))
    segments = [(0, 256), (256, 512), (512, 600)]
    keys = block_keys(prompt, segments)
    assert keys == block_keys(prompt.copy(), segments) and len(set(keys)) == 3
    edited = prompt.copy()
    edited[10] += 1  # an earlier token changes every later block's key
    assert [a == b for a, b in zip(keys, block_keys(edited, segments))] == [False, False, False]
    assert block_keys(prompt, [(0, 256), (256, 600)])[1] != keys[2]  # same end, another start


def test_three_explore_lanes_sharing_a_head_hold_it_once(model):
    per_token = bytes_per_token(model)
    head = tokens(1, 1100)
    lanes = [head + tokens(10 + instance, 120) for instance in range(3)]
    cache = RamTier(budget_bytes=10**9)
    reused = [served(cache, model, lane) for lane in lanes]
    assert reused == [0, 1100, 1100]
    unique = len(head) + 3 * 120
    # Each later lane adds its own tokens and at most half a block it copies (it straddles the head's end).
    assert unique * per_token <= cache.stats()["bytes"] <= (unique + 2 * cache.block_tokens // 2) * per_token
    assert cache.stats()["bytes"] < 0.45 * sum(len(lane) for lane in lanes) * per_token


def test_a_fork_carrying_the_whole_main_conversation_adds_only_its_own_tokens(model):
    per_token = bytes_per_token(model)
    main = tokens(1, 2000)
    cache = RamTier(budget_bytes=10**9)
    served(cache, model, main)
    fork = main + tokens(2, 50)
    main_next = main + tokens(3, 80)
    assert served(cache, model, fork) == 2000 and served(cache, model, main_next) == 2000
    assert cache.stats()["bytes"] == (2000 + 50 + 80) * per_token
    assert sorted(cache.stats()["entry_tokens"]) == [2050, 2080]


def test_a_turn_copies_only_its_new_tokens_and_keeps_the_previous_turn_s_blocks(model):
    cache = RamTier(budget_bytes=10**9)
    turn1 = tokens(1, 700)
    served(cache, model, turn1)
    (first,) = cache.entries.values()
    turn2 = turn1 + tokens(2, 300)
    served(cache, model, turn2)
    (second,) = cache.entries.values()
    assert [ref.block for ref in second.blocks[:3]] == [ref.block for ref in first.blocks]  # the very objects
    assert [(ref.start, ref.end) for ref in second.blocks[3:]] == [(700, 768), (768, 1000)]
    assert cache.stats()["bytes"] == 1000 * bytes_per_token(model) and cache.stats()["block_tokens"] == 1000


def test_a_reply_rendered_again_a_little_differently_reuses_the_block_in_part(model):
    cache = RamTier(budget_bytes=10**9)
    prompt, reply = tokens(1, 600), tokens(2, 40)
    live = prefilled(model, prompt + reply[:-1])  # the last generated token is never fed
    cache.store(prompt + reply, live, prompt_length=600)
    next_turn = prompt + reply[:-3] + tokens(3, 50)  # the reply's last tokens render differently
    assert served(cache, model, next_turn) == 637
    (entry,) = cache.entries.values()
    # The reply has blocks of its own (#37): the prompt's last one is used whole, the reply's in part.
    assert [(ref.start, ref.end, ref.block.end) for ref in entry.blocks[2:]] == [(512, 600, 600), (600, 637, 639), (637, 687, 687)]


def test_a_block_many_lanes_share_is_freed_with_the_last_lane_that_uses_it(model):
    per_token = bytes_per_token(model)
    head = tokens(1, 512)
    cache = RamTier(budget_bytes=10**9)
    for instance in range(3):
        served(cache, model, head + tokens(10 + instance, 64))
    head_blocks = {ref.block.key for ref in next(iter(cache.entries.values())).blocks[:2]}
    while len(cache.entries) > 1:
        cache._remove(next(iter(cache.entries)))
        assert head_blocks <= {ref.block.key for entry in cache.entries.values() for ref in entry.blocks}
        assert cache.stats()["bytes"] == (512 + 64 * len(cache.entries)) * per_token
    cache._remove(next(iter(cache.entries)))
    assert cache.stats()["bytes"] == 0 and cache.stats()["blocks"] == 0


def test_one_shot_lanes_are_evicted_before_older_lanes_in_use(model):
    per_token = bytes_per_token(model)
    cache = RamTier(budget_bytes=200 * per_token)
    in_use, title, new = tokens(1, 100), tokens(2, 60), tokens(3, 80)
    served(cache, model, in_use)
    served(cache, model, in_use + tokens(4, 5))  # used again: no longer one-shot (and older than the title)
    served(cache, model, title)
    served(cache, model, new)  # needs room: the title goes, though the other lane is older
    held = cache.stats()["entry_tokens"]
    assert held == [105, 80] and cache.stats()["evictions"] == 1


def test_a_restore_from_many_blocks_the_last_in_part_computes_what_a_full_prefill_does(model, hybrid):
    for served_model, positional in ((model, False), (hybrid, True)):
        cache = RamTier(budget_bytes=10**9, block_tokens=8)
        stored = tokens(1, 60)
        live, checkpoints = prefilled_with_checkpoints(served_model, stored, [21]) if positional else (prefilled(served_model, stored), [])
        cache.store(stored, live, 60, checkpoints)
        edited = stored[:45] + tokens(2, 6)
        fetched = cache.fetch(served_model, edited)
        assert fetched.reused == (21 if positional else 45)
        cached = last_logits(served_model, fetched.prompt_cache, edited[fetched.reused :])
        full = last_logits(served_model, make_prompt_cache(served_model), edited)
        np.testing.assert_allclose(cached, full, atol=1e-4)
