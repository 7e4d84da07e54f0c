"""How far a round's behaviour policy is from the trainer's: the importance ratios, three ways.

TRL 1.16 corrects every sampled token by ρ = π_old / π_behaviour, the trainer's probability before
the update over the sampler's (``old_per_token_logps − sampling_per_token_logps``), either per
token (``token_*`` modes) or once per sequence as the product over its tokens (``sequence_*``; its
default, ``sequence_mask``), and truncates ρ to [C_min, C_max] or masks what falls outside. Under
``staleness`` ≥ 1 the sampler is up to k updates old, and a multi-turn episode has hundreds or
thousands of model tokens: a product over all of them drifts far from 1 even when each token's
ratio is close to it, so a sequence-level mask would drop most stale episodes from the loss. The
geometric mean exp(mean log ρ) is the length-normalised sequence ratio (GSPO's, Zheng et al. 2025),
which TRL does not offer.

:func:`importance_spread` measures, on one round's batch, the share of what each granularity would
truncate or mask at TRL's bounds; the round log records it (``rollout/importance/...``) whichever
mode trains, so the choice can be read off a run (docs/concepts/rounds.md, "Asynchronous rounds").
"""

from __future__ import annotations

import math
from typing import Any


def importance_spread(old: Any, sampling: Any, mask: Any, c_min: float | None, c_max: float | None) -> dict[str, float]:
    """Share of tokens (``token``) and of sequences (``sequence``: the product; ``geometric``: the
    length-normalised product) whose ratio lies outside [c_min, c_max], and the largest |log ρ| of
    each. Without c_min (TRL's default) the band is [1/c_max, c_max]: a ratio of e^-5 is not masked
    but scales its tokens' loss to almost nothing, which is as good as dropping them. ``old``, ``sampling``: ``(B, T)`` log-probabilities; ``mask``: 1 on
    the model's own tokens. Tokens whose sampling log-probability is NaN count as ρ = 1 (TRL's rule)."""
    import torch

    mask = mask.to(old.dtype)
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    high = math.inf if c_max is None else math.log(c_max)
    low = -high if c_min is None else math.log(c_min) if c_min > 0 else -math.inf
    tokens = mask.sum(dim=1)
    rows = tokens > 0
    if not bool(rows.any()):
        return {}
    by_sequence = diff.sum(dim=1)[rows]
    geometric = by_sequence / tokens[rows]
    kept = mask.bool()

    def outside(values: Any) -> float:
        return float(((values < low) | (values > high)).float().mean())

    return {
        "token_outside": outside(diff[kept]), "sequence_outside": outside(by_sequence), "geometric_outside": outside(geometric),
        "token_max_abs_log": float(diff[kept].abs().max()), "sequence_max_abs_log": float(by_sequence.abs().max()),
        "geometric_max_abs_log": float(geometric.abs().max()),
    }  # fmt: skip
