"""``grpo.per_device_train_batch_size: auto``: the largest group-aligned micro-batch that fits.

A micro-batch that holds a whole GRPO group forwards the group's shared prompt once in a
shared-prefix update (``shared_prefix``, :mod:`seal_rl.prefix_tree`); at the paper's
micro-batch of 1 every sample forwards its own copy of it. ``auto`` tries the sizes that keep
groups whole — multiples of the group, or divisors of it — and that TRL's batch arithmetic accepts
(they divide the samples of one optimizer step per process; in the ``turn`` layout they hold whole
episodes), largest first, and takes the first that seal plan's estimate says fits. When none fits
it takes the smallest, and the fit check says what would make the run fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from seal_rl.errors import SealError
from seal_rl.plan.estimate import Plan
from seal_rl.plan.memory import GiB

if TYPE_CHECKING:
    from seal_rl.train.recipe import SealRecipe

AUTO = "auto"


def with_micro_batch(recipe: SealRecipe, size: int) -> SealRecipe:
    return dataclasses.replace(recipe, grpo=dataclasses.replace(recipe.grpo, per_device_train_batch_size=size))


def group_aligned_sizes(recipe: SealRecipe, processes: int) -> list[int]:
    """The micro-batch sizes ``auto`` may take on ``processes`` processes, largest first."""
    from seal_rl.train.recipe import samples_per_task

    group = samples_per_task(recipe)
    per_update = recipe.grpo.tasks_per_update * group
    if per_update % processes:
        raise SealError(f"tasks_per_update x num_generations = {per_update} samples cannot be split evenly over {processes} "
                        "processes; change tasks_per_update.")  # fmt: skip
    most = per_update // processes
    return [b for b in range(most, 0, -1)
            if most % b == 0 and (b % group == 0 or group % b == 0)
            and (recipe.layout != "turn" or b % recipe.turn_samples == 0)]  # fmt: skip


@dataclass(frozen=True)
class MicroBatchChoice:
    """What ``auto`` chose, the estimate at that size and at the smallest size, and what it passed over."""

    size: int
    plan: Plan
    smallest: Plan
    """the estimate at the smallest allowed size (1 in the ``episode`` layout): what the choice saves against"""
    too_large: tuple[tuple[int, int], ...] = ()
    """larger sizes that do not fit, with their training bytes per process"""

    def describe(self) -> str:
        """One line for ``seal plan`` and ``seal train``."""
        p, s = self.plan, self.smallest
        skipped = f"; {self.too_large[-1][0]} would need {self.too_large[-1][1] / GiB:.1f} GiB" if self.too_large else ""
        how = "the largest group-aligned size that fits" if p.fits else "none fits: the smallest"
        line = f"micro-batch: auto -> {self.size} ({how}{skipped})"
        if self.size != s.micro_batch and s.trained_tokens:
            line += (f"; a round's update forwards {p.trained_tokens:,} tokens against {s.trained_tokens:,} at micro-batch "
                     f"{s.micro_batch} ({s.trained_tokens / p.trained_tokens:.1f}x fewer): about "
                     f"{p.train_seconds_per_round / 60:.1f} min of training a round against {s.train_seconds_per_round / 60:.1f}")  # fmt: skip
        return line


def choose_micro_batch(recipe: SealRecipe, processes: int, plan_of: Callable[[SealRecipe], Plan]) -> MicroBatchChoice:
    """The largest of :func:`group_aligned_sizes` whose estimate (``plan_of``) fits; the smallest when none does."""
    sizes = group_aligned_sizes(recipe, processes)
    smallest = plan_of(with_micro_batch(recipe, sizes[-1]))
    too_large = []
    for size in sizes[:-1]:
        plan = plan_of(with_micro_batch(recipe, size))
        if plan.fits:
            return MicroBatchChoice(size, plan, smallest, tuple(too_large))
        too_large.append((size, plan.training_bytes))
    return MicroBatchChoice(sizes[-1], smallest, smallest, tuple(too_large))
