"""``seal study --plan``: ``seal plan``'s memory and time for every arm of a study, before it is spent.

Each arm's recipe (the study's recipe with the arm's interface, A-Patch and ``set``) is planned as
``seal plan`` plans it (:func:`seal_rl.plan.estimate`, the micro-batch chosen as ``auto`` chooses
it) on the study's hardware — ``plan: {gpus, gpu_memory}`` of the study file, 8 × 80 GB unless it
says otherwise — and its rounds × seeds give the arm's GPU-hours. Arithmetic only: nothing is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GPUS, GPU_MEMORY = 8, 80.0
"""the hardware a study is planned for when its file names none: 8 × 80 GB (H100 / A100 80GB)"""


@dataclass(frozen=True)
class ArmPlan:
    """One arm's plan: whether a run fits, its peak training memory per GPU, vLLM's KV cache, the time
    of a round and of the arm (every seed), and why it does not fit (empty when it does)."""

    arm: str
    fits: bool
    micro_batch: int
    memory_gib: float
    budget_gib: float
    kv_tokens: int | None
    seconds_per_round: float
    rounds: int
    seeds: int
    gpus: int
    reason: str

    @property
    def gpu_hours(self) -> float:
        """Every seed's run of the arm on ``gpus`` GPUs, in GPU-hours."""
        return self.seconds_per_round * self.rounds * self.seeds * self.gpus / 3600


def plan_arms(design: dict[str, Any], recipe_name: str, overrides: list[str]) -> list[ArmPlan]:
    """An :class:`ArmPlan` per arm with seeds (see the module docstring)."""
    from seal_rl.plan import Assumptions, GiB, estimate
    from seal_rl.plan.micro_batch import AUTO, choose_micro_batch, with_micro_batch
    from seal_rl.study.design import arm_overrides, run_overrides
    from seal_rl.train import load_recipe

    hardware = design.get("plan", {})
    gpus, memory = int(hardware.get("gpus", GPUS)), float(hardware.get("gpu_memory", GPU_MEMORY))
    shared = run_overrides(design, recipe_name, overrides)

    def planned(recipe: Any) -> Any:
        return estimate(recipe, gpus=gpus, gpu_memory_gb=memory, strategy="ddp" if recipe.model.lora is not None else "zero3",
                        assumptions=Assumptions())  # fmt: skip

    plans = []
    for arm, spec in design["arms"].items():
        if not spec["seeds"]:
            continue
        recipe = load_recipe(recipe_name, [*shared, *arm_overrides(spec["recipe"]), *map(str, spec.get("set", []))])
        if recipe.grpo.per_device_train_batch_size == AUTO:
            recipe = with_micro_batch(recipe, choose_micro_batch(recipe, gpus, planned).size)
        plan = planned(recipe)
        plans.append(ArmPlan(arm=arm, fits=plan.fits, micro_batch=plan.micro_batch, memory_gib=plan.training_bytes / GiB,
                             budget_gib=plan.training_budget / GiB, kv_tokens=plan.vllm.kv_tokens if plan.vllm else None,
                             seconds_per_round=plan.seconds_per_round, rounds=design["rounds"], seeds=len(spec["seeds"]),
                             gpus=gpus, reason=plan.reason))  # fmt: skip
    return plans
