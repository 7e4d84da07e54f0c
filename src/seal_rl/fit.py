"""Will this training run fit in this machine's memory? The check ``seal train`` makes first.

Before it loads a model or plays a rollout, ``seal train`` runs ``seal plan``'s memory estimate
(:func:`seal_rl.plan.estimate`) for the machine it is on, and refuses a recipe that cannot fit —
in one line that names the setting that would make it fit — unless ``--force`` is given:

* **CUDA**: per GPU, as ``seal plan --gpus WORLD_SIZE --gpu-memory <the device's memory>
  --strategy <what accelerate launch set up>`` would (3 GiB per GPU left for the CUDA context,
  NCCL and fragmentation).
* **CPU**: one "device" per training process, each with an equal share of the host's *available*
  RAM (psutil, bounded by a cgroup memory limit when there is one), less :data:`CPU_OVERHEAD_GIB`
  per process. Weights, gradients, Adam's state, the reference model, activations, TRL's LM head
  and the hf generator's KV cache all live in host RAM, in the dtype torch trains in on CPU (see
  :func:`seal_rl.plan.precision`); vLLM is counted only when the recipe asks for it.

``model.path: tiny`` is planned from the config :func:`seal_rl.tiny.tiny_config` gives for the
recipe's ``tiny_*`` numbers, before the model is built. The estimate is an upper bound (every
sequence at its full budget), so a refusal on a borderline machine may be pessimistic: that is
what ``--force`` is for.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from seal_rl.errors import SealError
from seal_rl.models import resolve_model
from seal_rl.plan import GiB, Assumptions, ModelShape, Plan, estimate, launch_strategy, model_shape, render, shape_from_config

if TYPE_CHECKING:
    from seal_rl.train.recipe import SealRecipe

CPU_OVERHEAD_GIB = 2.0
CPU_VLLM_KV_CACHE_GIB = 2.0
"""the KV cache ``seal train`` and ``seal eval`` give vLLM's CPU build unless ``VLLM_CPU_KVCACHE_SPACE`` is set"""


def cpu_vllm_kv_cache_gib(environ: Mapping[str, str]) -> float:
    """The CPU build's KV cache in GiB: ``VLLM_CPU_KVCACHE_SPACE``, or :data:`CPU_VLLM_KV_CACHE_GIB`."""
    value = environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    try:
        return float(value) if value.strip() else CPU_VLLM_KV_CACHE_GIB
    except ValueError:
        raise SealError(f"VLLM_CPU_KVCACHE_SPACE must be a number of GiB, got {value!r}.") from None
"""host RAM each training process needs beyond the estimate: what it still imports after the check
(transformers, TRL, datasets: about 0.3 GiB measured), the BFCL environments, transient buffers of
generation and allocator fragmentation"""


@dataclass(frozen=True)
class Machine:
    """Where a run trains: its device kind, training processes and memory per process."""

    device: str
    """``cuda`` or ``cpu``"""
    processes: int
    """training processes (``WORLD_SIZE``): GPUs, or processes sharing the host on CPU"""
    memory_gib: float
    """per process: a GPU's memory, or an equal share of the host's available RAM"""
    strategy: str = "ddp"
    """what ``accelerate launch`` set up: ``zero1``-``zero3``, ``fsdp`` or ``ddp``"""
    name: str = ""
    """for messages, e.g. ``CPU, 21.3 GiB of RAM available``"""

    @classmethod
    def cpu(cls, available_gib: float, processes: int = 1, strategy: str = "ddp") -> Machine:
        """A host with ``available_gib`` of free RAM, shared by ``processes`` training processes."""
        sharing = f", shared by {processes} processes" if processes > 1 else ""
        return cls("cpu", processes, available_gib / processes, strategy, f"CPU, {available_gib:.1f} GiB of RAM available{sharing}")

    @property
    def assumptions(self) -> Assumptions:
        """On a CPU: :data:`CPU_OVERHEAD_GIB` per process, and vLLM's CPU build takes its weights
        and a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB (what seal-rl sets unless it is set:
        :data:`CPU_VLLM_KV_CACHE_GIB`), not a share of the RAM."""
        if self.device == "cuda":
            return Assumptions()
        return Assumptions(overhead_gib=CPU_OVERHEAD_GIB, vllm_kv_cache_gib=cpu_vllm_kv_cache_gib(os.environ))


def _cgroup_memory() -> tuple[int, int] | None:
    """The cgroup's memory limit and usage in bytes (v2, else v1), or None where there is no limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):  # fmt: skip
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and usage.isdigit() and int(limit) < 2**60:
            return int(limit), int(usage)
        return None
    return None


def host_available_bytes() -> int:
    """RAM a new allocation can get: psutil's ``available``, bounded by the cgroup's memory limit
    (containers: psutil sees the host's memory, the kernel kills at the cgroup's limit)."""
    import psutil

    available = psutil.virtual_memory().available
    cgroup = _cgroup_memory()
    return available if cgroup is None else min(available, max(0, cgroup[0] - cgroup[1]))


def host_total_bytes() -> int:
    """The host's RAM, bounded by the cgroup's memory limit: the same on every rank at any moment."""
    import psutil

    total = psutil.virtual_memory().total
    cgroup = _cgroup_memory()
    return total if cgroup is None else min(total, cgroup[0])


def this_machine(processes: int, environ: Mapping[str, str] = os.environ) -> Machine:
    """The machine this process trains on: its CUDA device (the memory of the one it uses) or the
    host's available RAM, with ``processes`` training processes and the launch strategy."""
    import torch

    strategy = launch_strategy(dict(environ))
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        memory = properties.total_memory / GiB
        return Machine("cuda", processes, memory, strategy, f"{processes} x {properties.name} ({memory:.1f} GiB)")
    return Machine.cpu(host_available_bytes() / GiB, processes, strategy)


def recipe_shape(recipe: SealRecipe) -> ModelShape:
    """The model shape ``seal train`` will train: the tiny model's config (before it is built) or
    the model directory's ``config.json`` (see :func:`seal_rl.plan.model_shape`)."""
    if recipe.model.path == "tiny":
        from seal_rl.tiny import tiny_config

        m = recipe.model
        return shape_from_config(tiny_config(vocab_size=m.tiny_vocab_size, hidden_size=m.tiny_hidden_size, layers=m.tiny_layers),
                                 source="the tiny model's config")  # fmt: skip
    return model_shape(str(Path(resolve_model(recipe.model.path)).expanduser()))


@dataclass(frozen=True)
class FitCheck:
    """The estimate for a recipe on a machine, and the smallest change of settings that makes it fit."""

    machine: Machine
    plan: Plan
    remedy: tuple[str, ...] = ()
    """``key=value`` overrides under which the recipe fits (empty: none found, or it fits as is)"""
    remedy_bytes: int = 0
    """the training memory per process with ``remedy``"""
    tried: tuple[str, ...] = ()
    """when no remedy was found: the most the settings can do (checkpointing and micro-batch 1)"""
    tried_bytes: int = 0
    """the training memory per process with ``tried``"""

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def summary(self) -> str:
        """One line: what the estimate needs and has, and the verdict."""
        p = self.plan
        verdict = "fits" if p.fits else "does not fit"
        return (f"memory (seal plan's estimate): {p.training_bytes / GiB:.1f} GiB needed per process, {p.training_budget / GiB:.1f} GiB "
                f"available ({self._available()}): {verdict}")  # fmt: skip

    def _available(self) -> str:
        """Where the available memory comes from: the machine, less vLLM's share and the overhead."""
        less = [f"{self.plan.assumptions.overhead_gib:g} GiB overhead"]
        if self.plan.vllm is not None:
            less.insert(0, f"vLLM's {self.plan.vllm.budget / GiB:.1f} GiB")
        return f"{self.machine.name}, less {' and '.join(less)} per process"

    def refusal(self) -> str:
        """One line: why the run does not fit, the setting that would make it fit, and ``--force``."""
        p = self.plan
        if p.training_bytes > p.training_budget and not _context_too_long(p):
            why = (f"training needs {p.training_bytes / GiB:.1f} GiB per process but {p.training_budget / GiB:.1f} GiB is available "
                   f"({self._available()})")  # fmt: skip
            if self.remedy:
                sets = " ".join(f"--set {r}" for r in self.remedy)
                why += f"; {sets} would make it fit ({self.remedy_bytes / GiB:.1f} GiB)."
            else:
                if self.tried:
                    sets = " ".join(f"--set {r}" for r in self.tried)
                    why += f"; even with {sets} it would need {self.tried_bytes / GiB:.1f} GiB"
                elsewhere = ["more GPUs"] if self.machine.device == "cuda" else ["a machine with more memory"]
                if p.strategy not in ("zero3", "fsdp") and p.gpus > 1:
                    elsewhere.append("--strategy zero3 (accelerate's deepspeed_zero3 config)")
                if p.vllm is not None:
                    elsewhere.append("a lower grpo.vllm_gpu_memory_utilization")
                why += f"; shorten budgets.max_prompt_tokens or budgets.max_completion_tokens, or use {' or '.join(elsewhere)}."
        else:
            why = p.reason
        return f"This run does not fit on this machine by seal plan's estimate: {why} Give --force to start anyway."


def _context_too_long(plan: Plan) -> bool:
    context = plan.shape.max_position_embeddings
    return plan.vllm is not None and bool(context) and plan.vllm.max_model_len > context


def _candidates(recipe: SealRecipe) -> list[tuple[str, ...]]:
    """Settings to try, in order: gradient checkpointing, then smaller micro-batches (largest first),
    then both."""
    b = recipe.grpo.per_device_train_batch_size
    batches = [f"grpo.per_device_train_batch_size={d}" for d in range(b - 1, 0, -1) if b % d == 0]
    if recipe.model.gradient_checkpointing:
        return [(s,) for s in batches]
    checkpointing = "model.gradient_checkpointing=true"
    return [(checkpointing,), *((s,) for s in batches), *((checkpointing, s) for s in batches)]


def _apply(recipe: SealRecipe, settings: tuple[str, ...]) -> SealRecipe:
    for setting in settings:
        key, value = setting.split("=")
        if key == "model.gradient_checkpointing":
            recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, gradient_checkpointing=value == "true"))
        else:
            recipe = dataclasses.replace(recipe, grpo=dataclasses.replace(recipe.grpo, per_device_train_batch_size=int(value)))
    return recipe


def check_fit(recipe: SealRecipe, machine: Machine, *, num_tasks: int | None = None, shape: ModelShape | None = None) -> FitCheck:
    """Estimate ``recipe`` on ``machine``; when it does not fit, also find the first of
    :func:`_candidates` under which it does. Pure arithmetic: nothing is loaded."""
    shape = shape or recipe_shape(recipe)

    def plan_of(r: SealRecipe) -> Plan:
        return estimate(r, gpus=machine.processes, gpu_memory_gb=machine.memory_gib, strategy=machine.strategy,
                        assumptions=machine.assumptions, shape=shape, num_tasks=num_tasks, device=machine.device)  # fmt: skip

    plan = plan_of(recipe)
    if plan.fits:
        return FitCheck(machine, plan)
    candidate = plan
    candidates = _candidates(recipe)
    for settings in candidates:
        candidate = plan_of(_apply(recipe, settings))
        if candidate.fits:
            return FitCheck(machine, plan, settings, candidate.training_bytes)
    return FitCheck(machine, plan, tried=candidates[-1] if candidates else (), tried_bytes=candidate.training_bytes)


def resolve_micro_batch(recipe: SealRecipe, *, processes: int, num_tasks: int, machine: Machine | None = None) -> tuple[SealRecipe, str]:
    """The recipe with ``grpo.per_device_train_batch_size: auto`` chosen for ``machine`` (default:
    this machine, its GPU's memory or its host's *total* RAM, so that every rank chooses the same),
    and one line that says what was chosen and why; an explicit size is returned as it is, with "".

    Without an estimate (a model whose shape seal plan does not know) it takes the group size,
    where the batch arithmetic allows it."""
    from seal_rl.plan.lora import lora_plan
    from seal_rl.plan.micro_batch import AUTO, choose_micro_batch, group_aligned_sizes, with_micro_batch
    from seal_rl.train.recipe import samples_per_task

    if recipe.grpo.per_device_train_batch_size != AUTO:
        return recipe, ""
    if machine is None:
        machine = this_machine(processes)
        if machine.device == "cpu":
            total = host_total_bytes() / GiB
            machine = dataclasses.replace(machine, memory_gib=total / processes, name=f"CPU, {total:.1f} GiB of RAM in all")
    try:
        shape = recipe_shape(recipe)
        if recipe.model.lora is not None:  # adapters the plan cannot count (or a launch seal train refuses next)
            lora_plan(recipe.model.lora, shape, machine.strategy)
    except SealError as exc:
        sizes = group_aligned_sizes(recipe, processes)
        size = next((b for b in sizes if b <= samples_per_task(recipe)), sizes[-1])
        return with_micro_batch(recipe, size), f"micro-batch: auto -> {size} (one group; no memory estimate: {exc})"
    choice = choose_micro_batch(recipe, processes, lambda r: estimate(
        r, gpus=machine.processes, gpu_memory_gb=machine.memory_gib, strategy=machine.strategy,
        assumptions=machine.assumptions, shape=shape, num_tasks=num_tasks, device=machine.device))  # fmt: skip
    return with_micro_batch(recipe, choice.size), f"{choice.describe()} [{machine.name}]"


def check_before_training(
    recipe: SealRecipe,
    *,
    processes: int,
    num_tasks: int,
    force: bool = False,
    machine: Machine | None = None,
    say: Callable[[str], None] = print,
) -> FitCheck | None:
    """What ``seal train`` does before loading anything: estimate the recipe on ``machine`` (default:
    :func:`this_machine`), print the plan (on CUDA) or one line (on CPU), and raise a one-line
    :class:`SealError` when it does not fit — unless ``force``, which only warns. Returns None when
    the model's shape is not one ``seal plan`` knows (then it says so and the run goes on)."""
    import warnings

    from seal_rl.errors import SealWarning

    if recipe.model.path != "tiny" and not (Path(resolve_model(recipe.model.path)).expanduser() / "config.json").is_file():
        return None  # not a model directory: preparing the model says what is wrong
    machine = machine or this_machine(processes)
    try:
        fit = check_fit(recipe, machine, num_tasks=num_tasks)
    except SealError as exc:
        say(f"memory: no estimate ({exc}); the run goes on unchecked")
        return None
    if not fit.fits:
        if not force:
            raise SealError(fit.refusal())
        warnings.warn(fit.refusal().replace(" Give --force to start anyway.", " Starting anyway (--force)."), SealWarning, stacklevel=2)
        return fit
    say(render(fit.plan) if machine.device == "cuda" else fit.summary())
    return fit
