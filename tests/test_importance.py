"""The round log's importance-ratio spread (:mod:`seal_rl.train.importance`), on hand-built batches."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seal_rl.train.importance import importance_spread


def test_a_product_over_many_small_token_ratios_leaves_the_band_while_its_tokens_stay_inside():
    """Two sequences of 40 model tokens, each token 1.05x more likely under the trainer than under
    the sampler, and one of 4 such tokens; masked positions carry junk that must not count. Per
    token every ratio is 1.05 (inside [1/3, 3]); the 40-token product is 1.05^40 = 7.04 (outside),
    the 4-token one 1.22 (inside); the geometric mean is 1.05 for all."""
    step = math.log(1.05)
    old = torch.zeros(3, 48)
    sampling = torch.full((3, 48), -step)
    mask = torch.zeros(3, 48)
    mask[0, :40] = mask[1, 8:48] = mask[2, :4] = 1
    sampling[mask == 0] = 25.0  # environment tokens and padding: never part of a ratio
    found = importance_spread(old, sampling, mask, None, 3.0)
    assert found["token_outside"] == 0.0 and found["geometric_outside"] == 0.0
    assert math.isclose(found["sequence_outside"], 2 / 3, rel_tol=1e-6)
    assert math.isclose(found["sequence_max_abs_log"], 40 * step, rel_tol=1e-5)
    assert math.isclose(found["token_max_abs_log"], step, rel_tol=1e-5)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=1, max_size=30), st.floats(1.1, 10))
def test_shares_match_a_direct_count(log_ratios, c_max):
    """One sequence: the token share is the count of |log ρ| > log c_max over the tokens, the sequence
    share whether |Σ log ρ| exceeds it, the geometric one whether |mean log ρ| does."""
    old = torch.tensor([log_ratios], dtype=torch.float64)
    sampling = torch.zeros_like(old)
    mask = torch.ones_like(old)
    found = importance_spread(old, sampling, mask, None, c_max)
    bound = math.log(c_max)
    assert math.isclose(found["token_outside"], sum(abs(x) > bound for x in log_ratios) / len(log_ratios), rel_tol=1e-6)
    assert found["sequence_outside"] == float(abs(sum(log_ratios)) > bound)
    assert found["geometric_outside"] == float(abs(sum(log_ratios) / len(log_ratios)) > bound)


def test_nan_sampling_log_probabilities_count_as_ratio_one_and_an_empty_batch_says_nothing():
    old, sampling = torch.zeros(1, 3), torch.tensor([[float("nan"), 0.0, -5.0]])
    found = importance_spread(old, sampling, torch.ones(1, 3), 0.5, 3.0)
    assert math.isclose(found["token_outside"], 1 / 3, rel_tol=1e-6) and found["sequence_outside"] == 1.0
    assert importance_spread(old, sampling, torch.zeros(1, 3), 0.5, 3.0) == {}
