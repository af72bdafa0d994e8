"""How the bytes bench counts token states: new ones per request, and unique ones held (bench/measure/token_states.py)."""

import numpy as np

from stable_prefix.bench.measure.token_states import new_token_states, unique_token_states


def seq(*tokens: int) -> np.ndarray:
    return np.array(tokens, dtype=np.int64)


def test_a_request_is_new_beyond_the_longest_prefix_any_earlier_request_shares():
    first, turn, branch = seq(1, 2, 3, 4), seq(1, 2, 3, 4, 5, 6), seq(1, 2, 9)
    assert new_token_states([first, turn, branch]) == [4, 2, 1]


def test_a_repeated_or_shorter_request_makes_nothing_new():
    assert new_token_states([seq(1, 2, 3), seq(1, 2, 3), seq(1, 2)]) == [3, 0, 0]


def test_a_prefix_is_shared_only_from_the_first_token():
    # The same tokens after a different first token are other states.
    assert new_token_states([seq(1, 2, 3), seq(7, 2, 3)]) == [3, 3]


def test_unique_states_count_each_shared_prefix_once():
    lanes = [seq(1, 2, 3, 4), seq(1, 2, 3, 8, 9), seq(1, 2), seq(5)]
    assert unique_token_states(lanes) == 4 + 2 + 0 + 1


def test_new_states_of_a_session_sum_to_the_unique_states_of_all_its_sequences():
    rng = np.random.default_rng(0)
    head = rng.integers(0, 50, 30)
    sequences = [np.concatenate([head[: rng.integers(5, 30)], rng.integers(0, 50, rng.integers(0, 20))]) for _ in range(12)]
    assert sum(new_token_states(sequences)) == unique_token_states(sequences)
