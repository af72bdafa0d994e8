"""The chi-square test the sampled-drafting tests rely on: it passes samples of the distribution it is
given and fails samples of another: here what a wrong acceptance rule makes of it, one that after
rejecting a draft d draws again from the whole distribution instead of the renormalised rest
(d then comes out with p(d)(2 - p(d)) instead of p(d))."""

import numpy as np

from tests.support.sampled_continuations import chi_square_p_value, chi_square_survival

CELLS = {(a, b): p for (a, b), p in zip([(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)], [0.35, 0.25, 0.2, 0.15, 0.05])}


def draws(probabilities: dict, count: int, seed: int) -> list[tuple]:
    cells = list(probabilities)
    picked = np.random.default_rng(seed).choice(len(cells), size=count, p=list(probabilities.values()))
    return [cells[index] for index in picked]


def test_the_survival_function_matches_tabulated_chi_square_quantiles():
    assert abs(chi_square_survival(37.697, 15) - 0.001) < 1e-5
    assert abs(chi_square_survival(3.841, 1) - 0.05) < 1e-4


def test_samples_of_the_distribution_pass_and_samples_of_a_skewed_one_fail():
    drafted = (0, 0)
    skewed = {cell: p * (1 - CELLS[drafted]) for cell, p in CELLS.items()}
    skewed[drafted] = CELLS[drafted] * (2 - CELLS[drafted])
    assert all(chi_square_p_value(draws(CELLS, 500, seed), CELLS) > 0.001 for seed in range(5))
    assert all(chi_square_p_value(draws(skewed, 500, seed), CELLS) < 0.001 for seed in range(5))


def test_a_sample_outside_the_support_fails_at_once():
    assert chi_square_p_value([(0, 0), (9, 9)], CELLS) == 0.0
