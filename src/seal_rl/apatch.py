"""A-Patch: diagnosis-guided reweighting of GRPO advantages (SEAL §3.4, Eq. 10–12).

    p_j(z) = (1/T_j) Σ_i 1[z_i = z]                          (Eq. 10)
    w_j    = clip(Σ_z p_j(z) ρ(z), w_min, w_max)              (Eq. 11)
    Ã_j    = w_j · A_j                                        (Eq. 12)

plus the released code's closed-loop update of the label utilities ρ(z) from the capability
profile, its optional "budget", and ``apply_to``. Everything here is a pure function; the trainer
calls them and logs.

Departures from the paper: none in the formulas. Two presets: ``seal`` uses this project's labels
and utilities (DESIGN.md §4); ``reference`` uses the released code's label set and the paper's
Table 6 utilities, so its recipe can be reproduced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from seal_rl.errors import SealError

if TYPE_CHECKING:  # torch is imported where tensors are used: the environment and CLI stay light
    import torch

# DESIGN.md §4: this project's labels.
DEFAULT_UTILITY: Mapping[str, float] = {
    "spurious_tool_call": 2.0, "correct_abstention": 1.8, "invalid_tool_call": 1.5, "missing_tool_call": 1.5,
    "argument_mismatch": 1.4, "recovery_failure": 1.2, "state_mismatch": 1.0, "pass": 1.0,
    "response_mismatch": 0.9, "instance_mismatch": 0.6,
}  # fmt: skip
# SEAL Table 6 on the released code's labels (fixed across backbones).
REFERENCE_UTILITY: Mapping[str, float] = {
    "spurious_tool_call": 2.0, "correct_abstention": 1.8, "empty_turn_model_response": 1.5,
    "state_mismatch": 1.0, "response_mismatch": 0.9, "instance_mismatch": 0.6, "pass": 1.0,
}  # fmt: skip
EXCLUDED: Mapping[str, frozenset[str]] = {
    "seal": frozenset({"gt_error", "checker_error", "not_reached"}),
    "reference": frozenset({"gt_error", "checker_error"}),
}
APPLY_TO: tuple[str, ...] = ("all", "positive_advantage", "negative_advantage")


@dataclass
class ApatchConfig:
    """Diagnosis-guided advantage reweighting, SEAL §3.4."""

    enabled: bool = True
    """apply Eq. 12; False gives plain GRPO advantages (the "without reweighting" ablation)"""
    preset: str = "seal"
    """``seal``: our labels and DESIGN.md utilities; ``reference``: the released labels and Table 6"""
    w_min: float = 0.5
    """lower clip of Eq. 11 (paper: 0.5); must be > 0 so no advantage changes sign"""
    w_max: float = 2.0
    """upper clip of Eq. 11 (paper: 2.0)"""
    apply_to: str = "all"
    """``all`` | ``positive_advantage`` | ``negative_advantage``: which advantages are scaled"""
    dynamic: bool = True
    """closed-loop update of ρ(z) from the profile each round (False: the "static weights" ablation)"""
    alpha: float = 1.0
    """strength of the closed-loop target (released: 1.0)"""
    beta: float = 0.25
    """EMA rate of ρ(z) toward its target (released: 0.25)"""
    k: int = 32
    """a label needs this many occurrences in the window for its full target (released: 32)"""
    count_inherited: bool = False
    """count labels of turns whose failure is carried over from an earlier failed turn (evidence
    ``inherited``); off: a trajectory is weighted by the turns its own calls got wrong"""
    budget: bool = False
    """shrink scales toward 1 and renormalise their mean to 1 (off in the release)"""
    budget_strength: float = 0.5
    """s <- 1 + strength * (s - 1) when ``budget`` is on"""
    utility: dict[str, float] | None = field(default=None)
    """override the preset's utilities ρ (labels missing from the table weigh 1)"""

    def __post_init__(self) -> None:
        if self.preset not in EXCLUDED:
            raise SealError(f"Unknown A-Patch preset {self.preset!r}; expected 'seal' or 'reference'.")
        if self.apply_to not in APPLY_TO:
            raise SealError(f"Unknown apply_to {self.apply_to!r}; expected one of {', '.join(APPLY_TO)}.")
        if not 0.0 < self.w_min <= 1.0 <= self.w_max:
            raise SealError(
                f"Need 0 < w_min <= 1 <= w_max so weights never flip an advantage's sign; got "
                f"w_min={self.w_min}, w_max={self.w_max}. To turn reweighting off, set enabled=False."
            )
        if not 0.0 <= self.beta <= 1.0 or self.k < 1 or not 0.0 <= self.budget_strength <= 1.0:
            raise SealError("Need 0 <= beta <= 1, k >= 1 and 0 <= budget_strength <= 1.")

    @property
    def base_utility(self) -> dict[str, float]:
        if self.utility is not None:
            return dict(self.utility)
        return dict(DEFAULT_UTILITY if self.preset == "seal" else REFERENCE_UTILITY)

    @property
    def excluded(self) -> frozenset[str]:
        return EXCLUDED[self.preset]


def trajectory_weight(
    labels: Sequence[str],
    utility: Mapping[str, float],
    *,
    w_min: float = 0.5,
    w_max: float = 2.0,
    excluded: frozenset[str] = EXCLUDED["seal"],
) -> float:
    r"""Diagnostic weight of one trajectory (SEAL Eq. 10–11).

        p_j(z) = (1/T_j) Σ_i 1[z_i = z]
        w_j    = clip(Σ_z p_j(z) ρ(z), w_min, w_max)

    Labels in ``excluded`` (scorer problems, turns never reached) do not count; a trajectory with
    no countable label keeps weight 1. Labels missing from ``utility`` weigh 1.

    >>> trajectory_weight(["pass", "state_mismatch", "missing_tool_call"], DEFAULT_UTILITY)
    1.1666666666666667
    """
    counted = [z for z in labels if z not in excluded]
    if not counted:
        return 1.0
    raw = sum(utility.get(z, 1.0) for z in counted) / len(counted)  # Σ_z p_j(z) ρ(z)
    return min(w_max, max(w_min, raw))  # Eq. 11


def reweight(advantages: torch.Tensor, weights: torch.Tensor, apply_to: str = "all") -> torch.Tensor:
    """Ã_j = w_j · A_j (SEAL Eq. 12); w_j > 0, so no advantage changes sign.

    advantages: (B,) or (B, T); weights: (B,). With ``apply_to`` = ``positive_advantage`` (or
    ``negative_advantage``) only those advantages are scaled; the others keep weight 1.
    """
    import torch

    if apply_to == "positive_advantage":
        weights = torch.where(_per_sample(advantages) > 0, weights, torch.ones_like(weights))
    elif apply_to == "negative_advantage":
        weights = torch.where(_per_sample(advantages) < 0, weights, torch.ones_like(weights))
    return advantages * weights.view(-1, *[1] * (advantages.dim() - 1))


def _per_sample(advantages: torch.Tensor) -> torch.Tensor:
    return advantages if advantages.dim() == 1 else advantages.mean(dim=tuple(range(1, advantages.dim())))


def budgeted(scales: torch.Tensor, tagged: torch.Tensor, *, strength: float, w_min: float, w_max: float) -> torch.Tensor:
    """The released code's optional budget: s <- 1 + strength·(s − 1), clip to [w_min, w_max], then
    renormalise the mean over tagged samples (those with a countable label) to 1.

    scales: (B,); tagged: (B,) bool."""
    import torch

    shrunk = (1.0 + strength * (scales - 1.0)).clamp(w_min, w_max)
    if tagged.any():
        mean = shrunk[tagged].mean()
        shrunk = torch.where(tagged, shrunk / mean, shrunk)
    return shrunk


@dataclass(frozen=True)
class LabelEvidence:
    """What the closed-loop update needs of one label over the profile window."""

    count: int
    prevalence: float
    reward_mean: float


def update_label_weights(
    weights: Mapping[str, float],
    evidence: Mapping[str, LabelEvidence],
    base_utility: Mapping[str, float],
    *,
    alpha: float = 1.0,
    beta: float = 0.25,
    k: int = 32,
    w_min: float = 0.5,
    w_max: float = 2.0,
    excluded: frozenset[str] = EXCLUDED["seal"],
) -> dict[str, float]:
    """One closed-loop step of the label utilities (the released code; SEAL_METHOD.md §4).

        target(z) = clip(ρ(z) · (1 + α · prev(z) · (1 − reward_mean(z)) · min(1, count(z)/K)), 0.5, 2.0)
        w(z)     <- (1 − β) · w(z) + β · target(z)

    with target(pass) = ρ(pass) and target = 1 for excluded labels. Labels never seen keep their
    weight (initially ρ(z)).

    >>> update_label_weights({"state_mismatch": 1.0}, {"state_mismatch": LabelEvidence(40, 0.3, 0.0)},
    ...                      {"state_mismatch": 1.0}, beta=1.0)
    {'state_mismatch': 1.3}
    """
    updated = dict(weights)
    for label in set(base_utility) | set(evidence) | set(weights):
        rho = base_utility.get(label, 1.0)
        current = weights.get(label, rho)
        seen = evidence.get(label)
        if label in excluded:
            target = 1.0
        elif label == "pass" or seen is None:
            target = rho if label == "pass" else current
        else:
            boost = alpha * seen.prevalence * (1.0 - seen.reward_mean) * min(1.0, seen.count / k)
            target = min(w_max, max(w_min, rho * (1.0 + boost)))
        updated[label] = round((1.0 - beta) * current + beta * target, 12)
    return dict(sorted(updated.items()))
