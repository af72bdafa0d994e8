"""Which prefill in flight a new request waits for, and where a prefill stops (pure logic)."""

from stable_prefix.engine_patch.cache.ram_tier import Fetched
from stable_prefix.engine_patch.cache.request_plan import RequestPlan
from stable_prefix.engine_patch.cache.shared_prefill import MIN_SHARED_TOKENS, Prefill, source_for
from stable_prefix.engine_patch.vllm_mlx.batched.batch_generator_access import segments_of

HEAD = list(range(1000, 1000 + 2 * MIN_SHARED_TOKENS))


def prefill(tokens: list[int], reused: int = 0, prefilled: int | None = None, checkpoint_at=()) -> Prefill:
    planned = Prefill(RequestPlan(tokens, Fetched([], reused), len(tokens), list(checkpoint_at)))
    if prefilled is not None:
        planned.prefilled = prefilled
    return planned


def test_a_prompt_sharing_a_long_head_with_a_prefill_waits_for_that_head():
    source = prefill(HEAD + [1, 2, 3])
    assert source_for([source], HEAD + [7, 8], restorable=0, positional=False) == (source, len(HEAD))


def test_a_share_shorter_than_the_minimum_beyond_what_the_cache_has_is_not_worth_waiting_for():
    source = prefill(HEAD + [1, 2, 3])
    assert source_for([source], HEAD + [7, 8], restorable=len(HEAD) - MIN_SHARED_TOKENS + 1, positional=False) is None
    assert source_for([source], HEAD[:10] + [7, 8], restorable=0, positional=False) is None


def test_the_longest_share_wins():
    short, long = prefill(HEAD[:-50] + [5]), prefill(HEAD + [1])
    assert source_for([short, long], HEAD + [9], restorable=0, positional=False) == (long, len(HEAD))


def test_a_positional_state_past_the_shared_part_cannot_serve_it_a_rewindable_one_can():
    past = prefill(HEAD + list(range(400)), prefilled=len(HEAD) + 100)
    assert source_for([past], HEAD + [9], restorable=0, positional=True) is None
    assert source_for([past], HEAD + [9], restorable=0, positional=False) == (past, len(HEAD))


def test_the_shared_part_never_covers_the_last_token_of_either_prompt():
    source = prefill(HEAD)
    assert source_for([source], HEAD + [9], restorable=0, positional=False) == (source, len(HEAD) - 1)
    assert source_for([prefill(HEAD + [9])], HEAD, restorable=0, positional=False)[1] == len(HEAD) - 1


def test_a_prefill_stops_at_its_checkpoints_and_shares_counted_from_its_first_inserted_token():
    planned = prefill(HEAD + [1, 2, 3], reused=100, checkpoint_at=[300, 500])
    planned.share_at.add(len(HEAD))
    assert planned.stops() == [200, 400, len(HEAD) - 100]
    assert planned.inserted == len(HEAD) + 3 - 100


def test_segments_cut_a_prompt_at_each_stop_inside_it():
    assert segments_of([1, 2, 3, 4, 5], [3, 1, 3, 0, 5, 9]) == [[1], [2, 3], [4, 5]]
    assert segments_of([1, 2], []) == [[1, 2]]
