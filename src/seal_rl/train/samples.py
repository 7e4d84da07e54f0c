"""What TRL trains on: one episode as samples (completion ids, loss mask, sampling log-probs, reward).

``episode`` layout: :func:`trl_sample`, the whole episode token-exact; ``turn`` layout:
:func:`turn_samples`, one model message per sample, prompted as at inference. Both give an
unscorable episode no reward, so TRL leaves it out of its group baseline.
"""

from __future__ import annotations

from typing import Any

from seal_rl.credit import NO_TURN, token_turns
from seal_rl.rollout import Rollout


REWARD_FIELDS = {"binary": "reward", "progress": "progress"}
"""what the verifier's score for training is, and the episode record's field that holds it: the
paper's all-or-nothing success (``binary``) or Environment Tuning's share of user turns passed
(``progress``, :attr:`seal_rl.verify.Verdict.progress`)"""
REWARDS = tuple(REWARD_FIELDS)


def trl_sample(rollout: Rollout, filler_token: int, reward: str = "binary") -> dict[str, Any]:
    """What TRL trains on for one episode: completion ids, the loss mask, sampling log-probs, reward,
    and the user turn of each completion token (``turns``, for turn-level credit).

    An episode that produced no tokens (its opening prompt exceeded ``max_prompt_tokens``, or its
    first generation failed) cannot be handed to TRL as is (an empty completion crashes it): it
    becomes one masked ``filler_token`` with no reward, so it carries no loss and no advantage, and
    its record says why (``dropped``). Unscorable episodes (checker error, generation error) get
    no reward either: TRL leaves them out of the group baseline and gives them advantage 0.
    """
    record, trajectory = rollout.record, rollout.trajectory
    if not trajectory.completion_ids:
        record["dropped"] = record["end_reason"]
        return {"completion_ids": [filler_token], "env_mask": [0], "logprobs": [0.0], "reward": None, "turns": [NO_TURN]}
    return {"completion_ids": trajectory.completion_ids, "env_mask": trajectory.env_mask,
            "logprobs": trajectory.logprobs, "reward": training_reward(record, reward),
            "turns": token_turns(trajectory.message_turns, trajectory.env_mask)}  # fmt: skip


def training_reward(record: dict[str, Any], reward: str = "binary") -> float | None:
    """An episode's reward for TRL (one of :data:`REWARDS`): None when it is unscorable (checker
    error, generation error)."""
    unscorable = record["verdict"].get("checker_error") or record["end_reason"] == "generation_error"
    return None if unscorable else record[REWARD_FIELDS[reward]]


def turn_samples(rollout: Rollout, count: int, filler_token: int, seed: int, reward: str = "binary") -> list[dict[str, Any]]:
    """What TRL trains on for one episode in the ``turn`` layout: ``count`` samples, each one model
    message with the prompt it was generated from (the model's own template's rendering of the
    conversation so far), a loss mask of ones and the user turn the message answers (``turns``,
    one per token).

    An episode with more messages gives ``count`` of them, drawn without replacement from
    ``seed`` (in message order); one with fewer gives all of them, then masked copies of its last,
    which carry no loss. Every sample has the episode's reward, so a task's group of
    ``num_generations x count`` samples has the mean of its episodes' rewards and, up to Bessel's
    correction, their spread: TRL's group advantage of each sample is its episode's (docs/guides/train.md).
    An episode with no message (or an unscorable one) gives samples with no reward, as
    :func:`trl_sample` does.
    """
    import random

    record, turns = rollout.record, rollout.trajectory.turns
    value = training_reward(record, reward)
    if not turns:
        record["dropped"] = record["end_reason"]
        return [{"prompt_ids": rollout.trajectory.prompt_ids, "completion_ids": [filler_token], "env_mask": [0],
                 "logprobs": [0.0], "reward": None, "turns": [NO_TURN]}] * count  # fmt: skip
    chosen = sorted(random.Random(seed).sample(range(len(turns)), count)) if len(turns) > count else list(range(len(turns)))
    answers = [turn for _, turn in rollout.trajectory.message_turns]
    samples = [{"prompt_ids": turns[i][0], "completion_ids": turns[i][1], "env_mask": [1] * len(turns[i][1]),
                "logprobs": turns[i][2], "reward": value, "turns": [answers[i]] * len(turns[i][1])} for i in chosen]  # fmt: skip
    last = samples[-1]
    samples += [{**last, "env_mask": [0] * len(last["completion_ids"])}] * (count - len(samples))
    return samples
