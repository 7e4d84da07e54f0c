import doctest
import itertools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import seal_rl.stats as stats
from seal_rl.stats import bootstrap_average_difference, mcnemar_exact, mean_interval, pass_at_k, paired, wilson


def test_doctests():
    assert doctest.testmod(stats).failed == 0


@given(n=st.integers(1, 500), data=st.data())
def test_wilson_contains_the_estimate_and_stays_in_range(n, data):
    k = data.draw(st.integers(0, n))
    low, high = wilson(k, n)
    assert 0.0 <= low <= k / n <= high <= 1.0


def test_wilson_by_the_formula_and_its_coverage():
    # Wilson's other closed form: (2np + z^2 -/+ z sqrt(z^2 + 4np(1-p))) / (2(n + z^2))
    z = 1.959963984540054
    for k, n in ((80, 100), (3, 17), (1, 2)):
        p = k / n
        root = z * math.sqrt(z * z + 4 * n * p * (1 - p))
        expected = ((2 * n * p + z * z - root) / (2 * (n + z * z)), (2 * n * p + z * z + root) / (2 * (n + z * z)))
        assert wilson(k, n) == pytest.approx(expected)
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0
    # Coverage check by simulation: a 95% interval covers the true p about 95% of the time.
    rng = random.Random(0)
    p, n, trials = 0.3, 100, 3000
    covered = 0
    for _ in range(trials):
        k = sum(rng.random() < p for _ in range(n))
        low, high = wilson(k, n)
        covered += low <= p <= high
    assert 0.93 < covered / trials < 0.97


@given(n=st.integers(1, 8), data=st.data())
def test_pass_at_k_equals_brute_force_over_subsets(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_pass_at_k_needs_enough_samples():
    with pytest.raises(ValueError, match="needs at least 3 samples"):
        pass_at_k(2, 1, 3)


def test_mcnemar_exact_by_hand():
    # b=1, c=9: 2 * P(X <= 1), X ~ Bin(10, 1/2) = 2 * 11/1024
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)


def test_paired_comparison_counts_discordant_pairs():
    a = {"t1": True, "t2": True, "t3": False, "t4": False, "only_a": True}
    b = {"t1": True, "t2": False, "t3": True, "t4": True, "only_b": False}
    result = paired(a, b)
    assert (result.pairs, result.only_a, result.only_b) == (4, 1, 2)
    assert result.rate_a == 0.5 and result.rate_b == 0.75 and result.difference == 0.25


def test_bootstrap_interval_brackets_the_estimate_and_is_reproducible():
    rng = random.Random(1)
    data = {c: [(rng.random() < 0.3, rng.random() < 0.5) for _ in range(100)] for c in ("base", "miss_func")}
    estimate, low, high = bootstrap_average_difference(data, resamples=2000, seed=3)
    assert low < estimate < high
    assert (estimate, low, high) == bootstrap_average_difference(data, resamples=2000, seed=3)
    identical = {"base": [(True, True), (False, False)] * 10}
    assert bootstrap_average_difference(identical, resamples=200) == (0.0, 0.0, 0.0)


def test_mean_interval_of_category_rates():
    mean, low, high = mean_interval([(50, 100), (20, 100)])
    assert mean == pytest.approx(0.35)
    # Price & Bonett: each of m = 2 rates gets z²/4 successes in z²/2 trials.
    z = 1.959964
    p1, p2, n = (50 + z * z / 4) / (100 + z * z / 2), (20 + z * z / 4) / (100 + z * z / 2), 100 + z * z / 2
    centre, se = (p1 + p2) / 2, math.sqrt(p1 * (1 - p1) / n + p2 * (1 - p2) / n) / 2
    assert (low, high) == pytest.approx((centre - z * se, centre + z * se), abs=1e-6)
    assert mean_interval([(0, 10)] * 4)[2] > 0.02  # all zero: still an honest interval, not a point


@pytest.mark.parametrize("rates", [(0.02, 0.05, 0.1, 0.03), (0.5, 0.3, 0.2, 0.6), (0.9, 0.95, 0.99, 0.85), (0.0, 0.0, 0.01, 0.0)])
@pytest.mark.parametrize("n", [10, 50])
def test_mean_interval_covers_the_true_average_95_percent_of_the_time(rates, n):
    rng = random.Random(f"{rates}{n}")
    truth = sum(rates) / len(rates)
    trials = 1000
    covered = 0
    for _ in range(trials):
        counts = [(sum(rng.random() < p for _ in range(n)), n) for p in rates]
        _, low, high = mean_interval(counts)
        covered += low <= truth <= high
    assert covered / trials >= 0.93