import doctest

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import seal_rl.apatch as apatch
from seal_rl.apatch import (
    DEFAULT_UTILITY,
    REFERENCE_UTILITY,
    ApatchConfig,
    LabelEvidence,
    budgeted,
    reweight,
    trajectory_weight,
    update_label_weights,
)
from seal_rl.diagnose import LABELS
from seal_rl.errors import SealError


def test_doctests():
    assert doctest.testmod(apatch).failed == 0


def test_trajectory_weight_by_hand():
    # (1.0 + 1.0 + 1.5) / 3
    assert trajectory_weight(["pass", "state_mismatch", "missing_tool_call"], DEFAULT_UTILITY) == pytest.approx(3.5 / 3)
    # excluded labels never count: only the two countable turns average
    assert trajectory_weight(["spurious_tool_call", "not_reached", "not_reached", "pass"], DEFAULT_UTILITY) == 1.5
    assert trajectory_weight(["not_reached", "gt_error", "checker_error"], DEFAULT_UTILITY) == 1.0
    # clipping to [w_min, w_max]
    assert trajectory_weight(["instance_mismatch"], DEFAULT_UTILITY, w_min=0.8) == 0.8
    assert trajectory_weight(["spurious_tool_call"], DEFAULT_UTILITY, w_max=1.5) == 1.5
    # unknown labels weigh 1; the reference preset's labels and Table 6
    assert trajectory_weight(["empty_turn_model_response", "pass"], REFERENCE_UTILITY) == pytest.approx(1.25)
    assert trajectory_weight(["whatever"], {}) == 1.0


def test_every_label_has_a_default_utility():
    assert set(DEFAULT_UTILITY) | {"gt_error", "checker_error", "not_reached"} == set(LABELS)


@given(
    # normal float32 values: a subnormal like 1e-45 times 0.5 underflows to 0 (no sign is flipped)
    advantages=st.lists(st.floats(-5, 5, width=32, allow_subnormal=False), min_size=1, max_size=16),
    data=st.data(),
)
def test_reweighting_never_flips_a_sign(advantages, data):
    weights = data.draw(st.lists(st.floats(0.5, 2.0), min_size=len(advantages), max_size=len(advantages)))
    a, w = torch.tensor(advantages), torch.tensor(weights)
    for apply_to in ("all", "positive_advantage", "negative_advantage"):
        out = reweight(a, w, apply_to)
        assert torch.all(torch.sign(out) == torch.sign(a))


def test_reweight_shapes_and_apply_to():
    a = torch.tensor([1.0, -2.0, 0.0])
    w = torch.tensor([2.0, 0.5, 1.5])
    assert reweight(a, w).tolist() == [2.0, -1.0, 0.0]
    assert reweight(a, w, "positive_advantage").tolist() == [2.0, -2.0, 0.0]
    assert reweight(a, w, "negative_advantage").tolist() == [1.0, -1.0, 0.0]
    per_token = torch.ones(3, 4) * a.view(-1, 1)
    assert torch.equal(reweight(per_token, w), per_token * w.view(-1, 1))


def test_closed_loop_target_of_a_failing_label():
    # state_mismatch at 30% prevalence, never succeeding, seen >= K times: target 1.0 * (1 + 0.3) = 1.3.
    evidence = {"state_mismatch": LabelEvidence(count=40, prevalence=0.3, reward_mean=0.0)}
    one_step = update_label_weights({"state_mismatch": 1.0}, evidence, {"state_mismatch": 1.0})
    assert one_step["state_mismatch"] == pytest.approx(0.75 * 1.0 + 0.25 * 1.3)
    full = update_label_weights({"state_mismatch": 1.0}, evidence, {"state_mismatch": 1.0}, beta=1.0)
    assert full["state_mismatch"] == pytest.approx(1.3)
    # fewer than K occurrences scale the boost down: 16/32 of it
    few = {"state_mismatch": LabelEvidence(count=16, prevalence=0.3, reward_mean=0.0)}
    assert update_label_weights({}, few, {"state_mismatch": 1.0}, beta=1.0)["state_mismatch"] == pytest.approx(1.15)
    # successful labels get no boost; targets are clipped to [0.5, 2.0]
    easy = {"state_mismatch": LabelEvidence(count=40, prevalence=0.3, reward_mean=1.0)}
    assert update_label_weights({}, easy, {"state_mismatch": 1.0}, beta=1.0)["state_mismatch"] == 1.0
    big = {"spurious_tool_call": LabelEvidence(count=100, prevalence=0.9, reward_mean=0.0)}
    assert update_label_weights({}, big, DEFAULT_UTILITY, beta=1.0)["spurious_tool_call"] == 2.0


def test_pass_and_excluded_labels_have_fixed_targets():
    evidence = {
        "pass": LabelEvidence(100, 0.8, 0.1),
        "not_reached": LabelEvidence(50, 0.0, 0.0),
    }
    updated = update_label_weights({"pass": 1.0, "not_reached": 3.0}, evidence, DEFAULT_UTILITY, beta=1.0)
    assert updated["pass"] == DEFAULT_UTILITY["pass"]
    assert updated["not_reached"] == 1.0
    # labels absent from the window keep their weight
    assert update_label_weights({"argument_mismatch": 1.7}, {}, DEFAULT_UTILITY)["argument_mismatch"] == 1.7


def test_budget_shrinks_then_renormalises_tagged_samples():
    scales = torch.tensor([2.0, 0.5, 1.5, 1.0])
    tagged = torch.tensor([True, True, True, False])
    out = budgeted(scales, tagged, strength=0.5, w_min=0.5, w_max=2.0)
    shrunk = torch.tensor([1.5, 0.75, 1.25])
    assert torch.allclose(out[:3], shrunk / shrunk.mean())
    assert out[3] == 1.0 and out[:3].mean() == pytest.approx(1.0)


def test_config_validation_names_the_fix():
    with pytest.raises(SealError, match="To turn reweighting off, set enabled=False"):
        ApatchConfig(w_min=0.0)
    with pytest.raises(SealError, match="Unknown apply_to"):
        ApatchConfig(apply_to="some")
    with pytest.raises(SealError, match="Unknown A-Patch preset"):
        ApatchConfig(preset="mine")
    assert ApatchConfig(preset="reference").base_utility == dict(REFERENCE_UTILITY)
    assert ApatchConfig(utility={"pass": 2.0}).base_utility == {"pass": 2.0}


def test_inherited_turns_weigh_only_when_asked(task_set, tmp_path):
    """A-Patch weighs a trajectory by the turns its own calls got wrong (apatch.count_inherited)."""
    from pathlib import Path

    from seal_rl.train import SealLoop, load_recipe

    smoke = Path(__file__).resolve().parents[1] / "configs" / "smoke-cpu.yaml"
    record = {"diagnosis": {"labels": [
        {"turn": 0, "label": "recovery_failure", "evidence": {}},
        {"turn": 1, "label": "state_mismatch", "evidence": {"inherited": True}},
    ]}, "reference_labels": []}  # fmt: skip
    default = SealLoop(load_recipe(smoke), task_set, tmp_path / "a")
    counting = SealLoop(load_recipe(smoke, ["apatch.count_inherited=true"]), task_set, tmp_path / "b")
    assert default._labels(record) == ["recovery_failure"]
    assert counting._labels(record) == ["recovery_failure", "state_mismatch"]
    assert default._weight(record) != counting._weight(record)
