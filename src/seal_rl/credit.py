"""Turn-level credit: every user turn the verifier checks gets its own group-relative advantage.

GiGPO (arXiv 2505.10978, Eq. 7–9) adds to GRPO's episode advantage a step advantage normalised
among the steps that share an anchor state. In BFCL multi-turn the G episodes of a group answer
the same user questions in the same order, so "user turn k of this task" is the anchor: the
outcome of turn k in episode g (1 when it passes the official state and execution checks, 0 when
it fails) is normalised over the group's episodes that reached turn k, with no learned critic.
Each model token of turn k in episode g is then trained with

    A(g, t) = w_g · A_g  +  ω · v(z_{g,k}) · Ã(g, k)

where A_g is TRL's group advantage of the episode, w_g its A-Patch weight (SEAL Eq. 12), Ã(g, k)
the turn advantage, ω the recipe's ``credit_weight`` and v(z) the A-Patch weight of turn k's own
label: Eq. 11 on a trajectory of that one turn, clip(ρ(z_{g,k}), w_min, w_max), so SEAL's
per-turn labels weight the per-turn term (docs/concepts/credit.md, "Turn-level credit"). With ω = 0 the
advantages are exactly those of ``credit: episode``.

Everything here is pure Python on lists; the trainer turns the result into TRL's ``[B, T]`` tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

CREDITS = ("episode", "turn")
"""``episode``: one advantage per episode (GRPO, the paper's); ``turn``: plus each user turn's own"""

NO_TURN = -1
"""the user turn of a completion token the model did not write (template, tool results, filler)"""


def turn_outcomes(record: Mapping[str, Any]) -> list[float | None]:
    """Each user turn's outcome in a finished episode: 1.0 when it was reached and passes the
    official checks (state, instances, execution results: :attr:`seal_rl.verify.TurnCheck.passed`),
    0.0 when it was reached and fails, None when it carries no outcome — not reached, not scored
    by the official checker (empty ground truth), or the whole episode is unscorable (checker
    error, generation error), as :func:`seal_rl.train.samples.training_reward` leaves it out.

    A turn that fails only because an earlier turn left the state wrong (``inherited``) fails here
    too, as it does in the official checker and the progress reward."""
    verdict = record["verdict"]
    if verdict.get("checker_error") or record["end_reason"] == "generation_error":
        return [None] * record["num_turns"]
    outcomes: list[float | None] = [None] * record["num_turns"]
    for check in verdict["turns"]:
        if check["scorable"] and check["reached"]:
            outcomes[check["turn"]] = 0.0 if check["failure"] else 1.0
    return outcomes


def turn_advantages(group: Sequence[Sequence[float | None]], *, scale: bool = True) -> list[list[float]]:
    """Ã(g, k) for one group (GiGPO's step advantage with anchor (task, user turn k)).

    ``group``: the G episodes' :func:`turn_outcomes`. For each turn k the outcomes of the episodes
    that have one are centred on their mean and, with ``scale`` (TRL's ``scale_rewards`` other than
    ``none``), divided by their standard deviation plus 1e-4, Bessel-corrected as TRL's group
    advantage is. A turn with fewer than two outcomes, and an episode without an outcome at k,
    get 0.

    >>> turn_advantages([[1.0, 0.0], [0.0, 0.0], [1.0, None]], scale=False)
    [[0.33333333333333337, 0.0], [-0.6666666666666666, 0.0], [0.33333333333333337, 0.0]]
    """
    turns = max((len(o) for o in group), default=0)
    result = [[0.0] * turns for _ in group]
    for k in range(turns):
        seen = [(g, o[k]) for g, o in enumerate(group) if k < len(o) and o[k] is not None]
        if len(seen) < 2:
            continue
        values = [v for _, v in seen]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for g, v in seen:
            result[g][k] = (v - mean) / (std + 1e-4) if scale else v - mean
    return result


def token_turns(message_turns: Sequence[tuple[int, int]], env_mask: Sequence[int]) -> list[int]:
    """The user turn of each completion token of the ``episode`` layout: a token the model wrote
    belongs to the turn of the message it is part of (``message_turns``: each model message's first
    completion position and user turn, :attr:`seal_rl.trajectory.Trajectory.message_turns`);
    every other token is :data:`NO_TURN`."""
    result, starts, current, m = [], sorted(message_turns), NO_TURN, 0
    for position, mask in enumerate(env_mask):
        while m < len(starts) and starts[m][0] <= position:
            current = starts[m][1]
            m += 1
        result.append(current if mask else NO_TURN)
    return result


def applies(apply_to: str, advantage: float) -> bool:
    """Whether A-Patch's ``apply_to`` scales an advantage of this sign (SEAL Eq. 12 options)."""
    return apply_to == "all" or (apply_to == "positive_advantage" and advantage > 0) or (
        apply_to == "negative_advantage" and advantage < 0)  # fmt: skip


def token_advantages(episode: float, turn_terms: Sequence[float], turns_of_tokens: Sequence[int], *, omega: float,
                     turn_weights: Sequence[float] = (), apply_to: str = "all") -> list[float]:  # fmt: skip
    """Each completion token's advantage: ``episode`` (w_g · A_g, already reweighted) plus, on a
    token of user turn k, ω · v_k · Ã(g, k), where v_k (``turn_weights``, 1 when absent) scales the
    turn term only where ``apply_to`` takes its sign. Tokens of no turn keep ``episode``."""
    per_turn = []
    for k, term in enumerate(turn_terms):
        weight = turn_weights[k] if k < len(turn_weights) and applies(apply_to, term) else 1.0
        per_turn.append(omega * weight * term)
    return [episode + per_turn[k] if 0 <= k < len(per_turn) else episode for k in turns_of_tokens]


def anchors_with_signal(groups: Sequence[Sequence[Sequence[float | None]]]) -> tuple[int, int]:
    """(anchors whose outcomes differ, anchors with at least two outcomes) over groups of
    :func:`turn_outcomes`: how many (task, turn) anchors give turn-level credit a gradient."""
    varied = total = 0
    for group in groups:
        for k in range(max((len(o) for o in group), default=0)):
            values = {o[k] for o in group if k < len(o) and o[k] is not None}
            seen = sum(1 for o in group if k < len(o) and o[k] is not None)
            if seen >= 2:
                total += 1
                varied += len(values) > 1
    return varied, total
