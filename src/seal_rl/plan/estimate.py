"""The plan of one recipe on N devices: its memory lines, its run length and its time per round.

:func:`estimate` adds up the memory terms (:mod:`seal_rl.plan.memory`) at the training peak,
sizes the vLLM engine, counts rounds and optimizer steps as TRL does, and prices a round in FLOPs
at an assumed MFU plus generated tokens at a decode roofline, under stated :class:`Assumptions`.
The answer is a :class:`Plan`, which knows whether it fits and why not.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from seal_rl.errors import SealError
from seal_rl.plan.memory import (
    DEVICES, STRATEGIES, GiB, Precision, VLLMPlan, backbone_activation_bytes, gathered_parameter_bytes,
    kv_cache_bytes_per_token, lm_head_bytes, materialised_logits_bytes, micro_batch_tokens, model_states, precision,
    tree_attention_bytes, vllm_engine, vllm_weight_bytes,
)  # fmt: skip
from seal_rl.plan.lora import ADAPTER_ADAM_BYTES, ADAPTER_BYTES, ADAPTER_GRAD_BYTES, LoraPlan, lora_plan
from seal_rl.plan.shapes import ModelShape, model_shape

if TYPE_CHECKING:
    from seal_rl.train.recipe import SealRecipe


@dataclass(frozen=True)
class Assumptions:
    """Hardware and efficiency assumptions (defaults: an H100 SXM); every one is a ``seal plan`` option."""

    peak_tflops: float = 989.0
    """dense bf16 TFLOP/s per GPU (H100 SXM: 989; A100: 312)"""
    mfu: float = 0.35
    """model FLOPs utilisation of training"""
    hbm_tb_per_s: float = 3.35
    """memory bandwidth per GPU, TB/s (H100 SXM: 3.35; A100 80GB: 2.0)"""
    decode_efficiency: float = 0.5
    """share of the bandwidth roofline vLLM decoding reaches"""
    gen_tokens_per_s: float | None = None
    """generated tokens/s per GPU; None: from the decode roofline"""
    overhead_gib: float = 3.0
    """CUDA context, NCCL buffers and allocator fragmentation per GPU, outside any estimate"""
    vllm_overhead_gib: float = 1.5
    """vLLM's non-KV memory besides the weights: profiling activations and CUDA graphs"""
    vllm_kv_cache_gib: float | None = None
    """vLLM's KV cache where it is set by size rather than by share (the CPU build's
    ``VLLM_CPU_KVCACHE_SPACE``): the engine then takes its weights, its overhead and this; None:
    ``vllm_gpu_memory_utilization`` of the device"""
    server_memory_utilization: float = 0.92
    """share of each generation server's GPU that its vLLM engine takes (``seal plan --server-gpus``):
    vLLM 0.30's default ``--gpu-memory-utilization`` (``CacheConfig.gpu_memory_utilization`` in
    ``vllm/config/cache.py``)"""
    sync_gb_per_s: float = 50.0
    """GB/s of the weight sync from the training GPUs to the generation servers: one 400 Gb/s
    InfiniBand NDR link (NVIDIA ConnectX-7, one per GPU in a DGX H100), the path of one NCCL
    broadcast from the trainers' rank 0 to servers on another node. Servers on the same node
    reach NVLink's 450 GB/s per direction (H100 SXM: 900 GB/s both ways)"""

    def __post_init__(self) -> None:
        if min(self.peak_tflops, self.hbm_tb_per_s) <= 0 or not 0 < self.mfu <= 1 or not 0 < self.decode_efficiency <= 1:
            raise SealError("--peak-tflops and --hbm-tb-s must be positive, --mfu and --decode-efficiency in (0, 1].")
        if self.gen_tokens_per_s is not None and self.gen_tokens_per_s <= 0:
            raise SealError("--gen-tokens-per-s must be positive.")
        if min(self.overhead_gib, self.vllm_overhead_gib, self.vllm_kv_cache_gib or 0.0) < 0:
            raise SealError("--overhead-gib and --vllm-overhead-gib must be >= 0.")
        if not 0 < self.server_memory_utilization <= 1 or self.sync_gb_per_s <= 0:
            raise SealError("--server-memory-utilization must be in (0, 1] and --sync-gb-s positive.")


@dataclass(frozen=True)
class MemoryLine:
    name: str
    bytes: int
    formula: str


@dataclass(frozen=True)
class Plan:
    """A memory and time estimate for one recipe on ``gpus`` GPUs of ``gpu_memory`` bytes."""

    model: str
    shape: ModelShape
    gpus: int
    """training processes: GPUs, or processes sharing the host's memory on CPU"""
    gpu_memory: int
    strategy: str
    precision: Precision
    checkpointing: bool
    micro_batch: int
    prompt_tokens: int
    completion_tokens: int
    layout: dict[str, int]
    episodes: int
    num_tasks: int
    rounds: int
    steps: int
    memory: list[MemoryLine]
    activations_other: int
    """activations with the other checkpointing setting, for comparison"""
    logits_if_materialised: int
    training_budget: int
    vllm: VLLMPlan | None
    trained_tokens: int
    """tokens the update forwards per round (each shared prefix once when the update shares them)"""
    held_tokens: int
    """tokens the update's samples hold per round (what TRL alone forwards)"""
    generated_tokens: int
    forwards: float
    forward_flops_per_token: float
    gen_tokens_per_s: float
    assumptions: Assumptions
    notes: list[str] = field(default_factory=list)
    device: str = "cuda"
    """``cuda`` (memory per GPU) or ``cpu`` (``gpu_memory``: each process's share of the host's RAM)"""
    lora: LoraPlan | None = None
    """``model.lora``: the adapters trained instead of every weight (:mod:`seal_rl.plan.lora`)"""

    @property
    def longest_sequence(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def training_bytes(self) -> int:
        return sum(line.bytes for line in self.memory)

    @property
    def train_seconds_per_round(self) -> float:
        flops = self.trained_tokens * self.forwards * self.forward_flops_per_token
        return flops / (self.gpus * self.assumptions.peak_tflops * 1e12 * self.assumptions.mfu)

    @property
    def generation_seconds_per_round(self) -> float:
        return self.generated_tokens / (self.gpus * self.gen_tokens_per_s)

    @property
    def seconds_per_round(self) -> float:
        return self.train_seconds_per_round + self.generation_seconds_per_round

    @property
    def fits(self) -> bool:
        return not self.reason

    @property
    def reason(self) -> str:
        """Why the recipe does not fit (one line), or ``""``."""
        context = self.shape.max_position_embeddings
        if self.vllm is not None and context and self.vllm.max_model_len > context:
            return (f"the budgets ({self.vllm.max_model_len:,} tokens) exceed the model's context length ({context:,}), "
                    "which vLLM refuses as max_model_len; shorten budgets.max_prompt_tokens or max_completion_tokens.")  # fmt: skip
        if self.training_bytes > self.training_budget:
            over = (self.training_bytes - self.training_budget) / GiB
            per = "per GPU" if self.device == "cuda" else "per process"
            return (f"training needs {self.training_bytes / GiB:.1f} GiB {per} but {self.training_budget / GiB:.1f} GiB "
                    f"is available ({over:.1f} GiB short); try {self._remedies()}.")  # fmt: skip
        if self.vllm is not None and not self.vllm.starts:
            if self.vllm.kv_cache <= 0:
                return (f"vLLM's {self.vllm.budget / GiB:.1f} GiB (vllm_gpu_memory_utilization {self.vllm.utilization}) "
                        f"leaves no room for a KV cache after {self.vllm.weights / GiB:.1f} GiB of weights; raise it or "
                        "grpo.vllm_tensor_parallel_size.")  # fmt: skip
            return (f"vLLM's KV cache holds {self.vllm.kv_tokens:,} tokens, less than one full sequence (max_model_len "
                    f"{self.vllm.max_model_len:,}), so vLLM will not start; raise grpo.vllm_gpu_memory_utilization or "
                    f"grpo.vllm_tensor_parallel_size, or shorten the budgets.")  # fmt: skip
        return ""

    def _remedies(self) -> str:
        """What could make the training side fit, leaving out what the recipe already does."""
        remedies = ["more GPUs"] if self.device == "cuda" else ["a machine with more memory"]
        if self.strategy not in ("zero3", "fsdp") and (self.device == "cuda" or self.gpus > 1) and self.lora is None:
            remedies.append("--strategy zero3")
        if not self.checkpointing:
            remedies.append("model.gradient_checkpointing=true")
        if self.micro_batch > 1:
            remedies.append("a smaller grpo.per_device_train_batch_size")
        remedies.append("shorter budgets")
        if self.vllm is not None:
            remedies.append("a lower grpo.vllm_gpu_memory_utilization")
        return ", ".join(remedies[:-1]) + " or " + remedies[-1]


# -- the estimator -----------------------------------------------------------------------------


def estimate(
    recipe: SealRecipe,
    *,
    gpus: int,
    gpu_memory_gb: float,
    strategy: str = "zero3",
    assumptions: Assumptions = Assumptions(),
    shape: ModelShape | None = None,
    num_tasks: int | None = None,
    device: str = "cuda",
    server_tokens_per_s: float | None = None,
) -> Plan:
    """Plan ``recipe`` on ``gpus`` GPUs of ``gpu_memory_gb`` GiB each (see the module docstring).

    ``shape`` defaults to :func:`model_shape` of ``recipe.model.path``; ``num_tasks`` (training
    tasks) to the recipe's task selection, as ``seal train`` makes it. ``device="cpu"``: ``gpus``
    processes on one host, each with ``gpu_memory_gb`` of its RAM (see :func:`precision`).
    ``server_tokens_per_s``: generation runs on separate vLLM servers at this many tokens/s in all
    (:mod:`seal_rl.plan.split`), so these GPUs only train: no engine takes a share of them, and the
    plan's generation time is the servers' (its ``gen_tokens_per_s`` is their rate per training GPU).
    """
    from seal_rl.train.recipe import batch_layout, planned_interface, planned_scheduler, samples_per_task

    if gpus < 1:
        raise SealError(f"--gpus must be at least 1; got {gpus}.")
    if gpu_memory_gb <= 0:
        raise SealError(f"--gpu-memory must be positive (GiB per GPU); got {gpu_memory_gb}.")
    if strategy not in STRATEGIES:
        raise SealError(f"Unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}.")
    if device not in DEVICES:
        raise SealError(f"Unknown device {device!r}; choose one of {', '.join(DEVICES)}.")
    shape = shape or model_shape(recipe.model.path)
    layout = batch_layout(recipe, gpus)
    g, budgets = recipe.grpo, recipe.budgets
    p = precision(recipe, shape, device)
    gpu_memory = int(gpu_memory_gb * GiB)
    b = g.per_device_train_batch_size
    prompt, completion = budgets["max_prompt_tokens"], budgets["max_completion_tokens"]
    sequence = prompt + completion
    mean_context = prompt + completion // 2

    lora = None
    if recipe.model.lora is not None:
        warm = bool(recipe.warm_start.data) and recipe.model.lora.warm_start and recipe.grpo.beta > 0
        lora = lora_plan(recipe.model.lora, shape, strategy, warm_adapter=warm)
        p = dataclasses.replace(p, name=f"{p.weight_bytes}-byte frozen weights, float32 LoRA adapters: "
                                         f"{ADAPTER_BYTES}+{ADAPTER_GRAD_BYTES}+{ADAPTER_ADAM_BYTES} bytes/adapter param")  # fmt: skip
    memory = _training_memory(recipe, shape, p, gpus, strategy, lora)
    notes = [] if lora is None else [*lora.notes, _lora_time_note(recipe)]
    user = _user_weights(recipe)
    if user is not None:  # a simulated user loaded in every training process (family_settings.user: hf:/vllm:)
        memory.append(user)
        notes.append("user simulator in the training processes: its weights are counted, its KV cache is not.")
    if shape.attention_sinks:  # transformers' gpt-oss has no SDPA path; its eager path materialises the scores
        eager = b * shape.num_attention_heads * sequence * (sequence + 1) * p.activation_bytes
        notes.append("attention sinks (gpt-oss): activations assume a flash-attention kernel with sinks (transformers' "
                     "attn_implementation='kernels-community/vllm-flash-attn3'); its default eager attention keeps "
                     f"b x heads x s x (s + 1) softmax scores per layer, {eager / GiB:.1f} GiB more at this length.")  # fmt: skip
    vllm = None
    training_budget = gpu_memory - int(assumptions.overhead_gib * GiB)
    if server_tokens_per_s is not None:  # generation servers on other GPUs: nothing of an engine here
        notes.append("generation on separate vLLM servers: no engine on these GPUs.")
    elif recipe.generator == "server":  # the recipe's own servers: no engine here either
        served = _vllm_plan(recipe, shape, gpus, gpu_memory, assumptions)
        notes.append("generator server: no engine on these GPUs; generation time assumes the servers decode as fast as a "
                     "colocated engine would on each training GPU (seal plan --server-gpus M plans the servers too).")  # fmt: skip
    elif g.use_vllm:  # colocated: the recipe refuses server and sleep modes
        vllm = _vllm_plan(recipe, shape, gpus, gpu_memory, assumptions)
        training_budget -= vllm.budget
    else:
        running = min(recipe.generation_batch, recipe.concurrency)
        memory.append(MemoryLine(f"hf generate KV cache ({running} sequences)",
                                 kv_cache_bytes_per_token(shape, p.activation_bytes) * running * sequence,
                                 "generation phase; freed before training"))  # fmt: skip
        if recipe.prefix_cache_tokens and not (gpus > 1 and strategy in ("zero3", "fsdp")):  # off under lockstep
            memory.append(MemoryLine(f"hf prefix cache ({recipe.prefix_cache_tokens:,} tokens)",
                                     kv_cache_bytes_per_token(shape, p.activation_bytes) * recipe.prefix_cache_tokens,
                                     "generation phase; freed before training"))  # fmt: skip
        notes.append("generator hf: counted as if its KV cache were alive at the training peak (it is not: an upper bound).")
        if strategy in ("zero3", "fsdp"):
            notes.append("generator hf under ZeRO-3/FSDP gathers the weights at every decoding step: far slower than estimated.")

    notes.append(f"rollouts: scheduler {planned_scheduler(recipe)}; the generation estimate assumes the engine kept full.")
    notes.append(f"interface: {planned_interface(recipe)[0]}.")
    if server_tokens_per_s is not None:
        gen_rate = server_tokens_per_s / gpus
    elif assumptions.gen_tokens_per_s is not None:
        gen_rate = assumptions.gen_tokens_per_s
    elif vllm is not None:
        gen_rate = decode_tokens_per_s(vllm, mean_context, assumptions)
    elif recipe.generator == "server":
        gen_rate = decode_tokens_per_s(served, mean_context, assumptions)
    else:
        gen_rate = _roofline(shape.parameters * p.weight_bytes, min(recipe.generation_batch, recipe.concurrency), mean_context,
                             kv_cache_bytes_per_token(shape, p.activation_bytes), assumptions)  # fmt: skip

    num_tasks = _training_tasks(recipe) if num_tasks is None else num_tasks
    rounds, steps = run_length(recipe, layout, num_tasks)
    episodes = g.tasks_per_step * g.num_generations
    tokens = micro_batch_tokens(recipe)
    micro_batches = g.tasks_per_step * samples_per_task(recipe) // b  # over all processes
    generated_per_episode = min(completion, int(recipe.env.get("max_model_calls", 20)) * budgets["max_new_tokens"])
    return Plan(
        model=recipe.model.path, shape=shape, gpus=gpus, gpu_memory=gpu_memory, strategy=strategy, precision=p,
        checkpointing=recipe.model.gradient_checkpointing, micro_batch=b, prompt_tokens=prompt, completion_tokens=completion,
        layout=layout, episodes=episodes, num_tasks=num_tasks, rounds=rounds, steps=steps, memory=memory,
        activations_other=_activations(shape, recipe, p.activation_bytes, not recipe.model.gradient_checkpointing),
        logits_if_materialised=materialised_logits_bytes(shape, b * completion), training_budget=training_budget,
        vllm=vllm, trained_tokens=micro_batches * tokens.forwarded, held_tokens=micro_batches * tokens.held,
        generated_tokens=episodes * generated_per_episode,
        forwards=forward_passes(recipe, layout), forward_flops_per_token=forward_flops_per_token(shape, sequence),
        gen_tokens_per_s=gen_rate, assumptions=assumptions, notes=notes, device=device, lora=lora,
    )  # fmt: skip


def _lora_time_note(recipe: SealRecipe) -> str:
    """What the time estimate keeps of full fine-tuning under LoRA."""
    return ("LoRA: the training time counts full fine-tuning's backward (gradients of every weight), an upper bound: "
            "the frozen layers need only their activations' gradients, about one forward-equivalent per token less"
            + (f"; the KL reference (beta={recipe.grpo.beta:g}) is a forward of the same model with the adapters off."
               if recipe.grpo.beta > 0 else "."))  # fmt: skip


def _training_memory(recipe: SealRecipe, shape: ModelShape, p: Precision, gpus: int, strategy: str,
                     lora: LoraPlan | None = None) -> list[MemoryLine]:  # fmt: skip
    """The training side's memory lines for one GPU at its peak (the start of the backward pass)."""
    g = recipe.grpo
    psi = shape.parameters
    sharded = strategy in ("zero3", "fsdp")
    states = model_states(psi, gpus, strategy, p)

    def over(divided: bool) -> str:
        return f"/{gpus}" if divided and gpus > 1 else ""

    if lora is not None:  # unsharded (plain data parallel): every GPU holds all of it
        phi = lora.trainable
        memory = [
            MemoryLine(f"frozen base weights ({p.weight_bytes} bytes/param)", psi * p.weight_bytes, f"{p.weight_bytes}Ψ, not trained"),
            MemoryLine(f"LoRA adapters (rank {lora.rank}, float32)", phi * ADAPTER_BYTES, f"{ADAPTER_BYTES}Φ, Φ = {phi / 1e6:.1f} M"),
            MemoryLine("adapter gradients (float32)", phi * ADAPTER_GRAD_BYTES, f"{ADAPTER_GRAD_BYTES}Φ"),
            MemoryLine("optimizer state on the adapters (Adam)", phi * ADAPTER_ADAM_BYTES, f"{ADAPTER_ADAM_BYTES}Φ: float32 moments"),
        ]  # fmt: skip
        if lora.reference_adapter:  # TRL's frozen copy of the warm-started adapter; the base is shared
            memory.append(MemoryLine("reference adapter (the warm-started one, frozen)", phi * ADAPTER_BYTES,
                                     f"{ADAPTER_BYTES}Φ; the base is the policy's"))  # fmt: skip
    else:
        memory = [
            MemoryLine(f"weights ({p.weight_bytes} bytes/param)", states.weights, f"{p.weight_bytes}Ψ{over(sharded)}"),
            MemoryLine(f"gradients ({p.grad_bytes} bytes/param)", states.gradients, f"{p.grad_bytes}Ψ{over(strategy not in ('ddp', 'zero1'))}"),
            MemoryLine(f"optimizer state (Adam, K={p.optimizer_bytes})", states.optimizer, f"{p.optimizer_bytes}Ψ{over(strategy != 'ddp')}"),
        ]  # fmt: skip
    if g.beta > 0 and lora is None:  # TRL keeps a frozen reference copy; DeepSpeed ZeRO-3 and FSDP shard it too
        reference = math.ceil(psi / (gpus if sharded else 1)) * p.weight_bytes
        memory.append(MemoryLine(f"reference model (beta={g.beta:g})", reference, f"{p.weight_bytes}Ψ{over(sharded)}"))
    if sharded:
        memory.append(MemoryLine("gathered weights (2 layers + LM head)", gathered_parameter_bytes(shape, strategy, p.weight_bytes),
                                 "ZeRO-3/FSDP working set"))  # fmt: skip
    b, a, ckpt = g.per_device_train_batch_size, p.activation_bytes, recipe.model.gradient_checkpointing
    completion = recipe.budgets["max_completion_tokens"]
    sequence = recipe.budgets["max_prompt_tokens"] + completion
    tokens = micro_batch_tokens(recipe)
    held = f"{tokens.forwarded:,} of {tokens.held:,} tokens: shared prefix" if tokens.shared else f"{b} x {sequence} tokens"
    memory.append(MemoryLine(f"activations ({held}, {'checkpointed' if ckpt else 'no checkpointing'})",
                             _activations(shape, recipe, a, ckpt),
                             "L·a·h + 1 layer per token" if ckpt else "L × per-layer bytes per token"))  # fmt: skip
    if tokens.shared:
        memory.append(MemoryLine(f"tree attention: keys and values of {tokens.paths} branch(es)",
                                 tree_attention_bytes(shape, tokens, a, ckpt), f"paths x {tokens.path_tokens} x 2·kv_dim"
                                 + ("" if ckpt else " x L")))  # fmt: skip
    memory.append(MemoryLine("LM-head log-probs (TRL fused kernel)",
                             lm_head_bytes(shape, b * completion, a, p.weight_bytes, head_gradient=lora is None),
                             f"{b} x {completion} completion tokens" + ("; frozen head: no weight gradient" if lora else "")))  # fmt: skip
    return memory


def _activations(shape: ModelShape, recipe: SealRecipe, a: int, checkpointing: bool) -> int:
    """The decoder stack's activations for one micro-batch: its rows padded to the budgets, or the
    packed prefix tree when the update shares prefixes (:func:`micro_batch_tokens`)."""
    tokens = micro_batch_tokens(recipe)
    if tokens.shared:
        return backbone_activation_bytes(shape, 1, tokens.forwarded, a, checkpointing)
    sequence = recipe.budgets["max_prompt_tokens"] + recipe.budgets["max_completion_tokens"]
    return backbone_activation_bytes(shape, recipe.grpo.per_device_train_batch_size, sequence, a, checkpointing)


def _vllm_plan(recipe: SealRecipe, shape: ModelShape, gpus: int, gpu_memory: int, assumptions: Assumptions) -> VLLMPlan:
    """TRL's colocated engine as ``seal train`` configures it: ``max_model_len`` is the prompt plus
    completion budget, an engine spans ``vllm_tensor_parallel_size`` ranks and serves the
    ``concurrency`` episodes of each of them (at most that rank's episodes of the round)."""
    g = recipe.grpo
    tp = g.vllm_tensor_parallel_size
    if gpus % tp:
        raise SealError(f"grpo.vllm_tensor_parallel_size ({tp}) must divide --gpus ({gpus}).")
    sequence = recipe.budgets["max_prompt_tokens"] + recipe.budgets["max_completion_tokens"]
    per_rank = g.tasks_per_step * g.num_generations // gpus
    weights, overhead = vllm_weight_bytes(shape, tp), int(assumptions.vllm_overhead_gib * GiB)
    if assumptions.vllm_kv_cache_gib is None:
        budget = int(g.vllm_gpu_memory_utilization * gpu_memory)
    else:  # the CPU build: a KV cache of a fixed size
        budget = weights + overhead + int(assumptions.vllm_kv_cache_gib * GiB)
    return vllm_engine(shape, tensor_parallel=tp, utilization=g.vllm_gpu_memory_utilization, budget=budget, overhead=overhead,
                       max_model_len=sequence, concurrent_sequences=tp * min(recipe.concurrency, per_rank))  # fmt: skip


def run_length(recipe: SealRecipe, layout: dict[str, int], num_tasks: int) -> tuple[int, int]:
    """(rounds, optimizer steps) as TRL counts them: its ``RepeatSampler`` drops an incomplete last
    batch, so an epoch has ⌊tasks / tasks_per_step⌋ rounds, and the Trainer runs
    ⌈epochs × steps per epoch⌉ optimizer steps unless ``max_steps`` is set."""
    g = recipe.grpo
    rounds_per_epoch = num_tasks // g.tasks_per_step
    if rounds_per_epoch == 0 and g.max_steps <= 0:
        raise SealError(f"{num_tasks} training tasks but tasks_per_step is {g.tasks_per_step}; no round can be played.")
    updates = layout["updates_per_round"]
    steps = g.max_steps if g.max_steps > 0 else math.ceil(g.num_train_epochs * rounds_per_epoch * updates)
    return math.ceil(steps / updates), steps


def forward_passes(recipe: SealRecipe, layout: dict[str, int]) -> int:
    """Forward-equivalents per trained token: 3 for forward and backward, +1 recompute with
    checkpointing, +1 old log-probs (TRL 1.16 computes them when a round holds several optimizer
    steps or vLLM's importance-sampling correction is on), +1 reference forward when beta > 0."""
    g = recipe.grpo
    old_logps = layout["gradient_accumulation_steps"] % layout["steps_per_generation"] != 0 or (
        g.use_vllm and g.vllm_importance_sampling_correction
    )
    return 3 + int(recipe.model.gradient_checkpointing) + int(old_logps) + int(g.beta > 0)


def _training_tasks(recipe: SealRecipe) -> int:
    from seal_rl.environments import load_family
    from seal_rl.train.prepare import select_tasks

    family = load_family(recipe.family, **recipe.family_settings)
    tasks, _ = select_tasks(recipe, family.task_set(), family)
    return len(tasks)


def _user_weights(recipe: SealRecipe) -> MemoryLine | None:
    """A family's simulated user loaded in every training process (``family_settings.user: hf:MODEL`` or
    ``vllm:MODEL``): its weights in bfloat16 on each GPU, never trained (no gradients, no optimizer state)."""
    user = str(recipe.family_settings.get("user") or "")
    kind, _, path = user.partition(":")
    if kind not in ("hf", "vllm") or not path:
        return None
    weights = model_shape(path).parameters * 2
    return MemoryLine(f"user simulator weights ({path}, bf16)", weights, "2Ψ_user, every process; never trained")


def user_line(recipe: SealRecipe) -> str | None:
    """A recipe whose family plays a simulated user on a server (``family_settings.user``): where it runs
    and the GPUs it needs besides the plan's (none of the plan's GPUs serve it)."""
    user = str(recipe.family_settings.get("user") or "")
    if not user.startswith("openai:"):
        return None
    return (f"user simulator: {user.removeprefix('openai:')} on its own server, not among these GPUs: count its GPUs "
            "on top (a 7-8B user in bf16: one 80 GB GPU, `vllm serve`); it is never trained")


# -- throughput --------------------------------------------------------------------------------


def forward_flops_per_token(shape: ModelShape, sequence: int) -> float:
    """Forward FLOPs per token: 2 per matmul parameter plus causal attention, 2·L·s·q_dim
    (Kaplan et al. 2020, Table 1: 2N + 2·n_layer·n_ctx·d_attn, with the mean causal context s/2
    counted for both QKᵀ and AV). A backward pass costs two forwards. A Mixture-of-Experts model
    counts its active parameters only (the routed experts), and a sliding-window layer attends to
    at most ``sliding_window`` tokens (its mean context min(s/2, w))."""
    full = shape.num_layers - shape.sliding_layers
    context = full * sequence + shape.sliding_layers * min(sequence, 2 * shape.sliding_window)
    return 2 * shape.matmul_parameters + 2 * context * shape.q_dim


def decode_tokens_per_s(vllm: VLLMPlan, mean_context: int, assumptions: Assumptions) -> float:
    """Decode throughput per GPU of a vLLM engine, colocated or a generation server (see
    :func:`_roofline`): it runs as many sequences as its KV cache holds at ``mean_context`` tokens
    each (at most its concurrent sequences); under tensor parallelism every GPU reads its shard and
    the engine's tokens are shared by its GPUs."""
    running = max(1, min(vllm.concurrent_sequences, vllm.kv_tokens // max(1, mean_context)))
    engine = _roofline(vllm.weights, running, mean_context, vllm.kv_bytes_per_token_per_gpu, assumptions)
    return engine / vllm.tensor_parallel


def _roofline(weight_bytes: int, sequences: int, mean_context: int, kv_per_token: int, assumptions: Assumptions) -> float:
    """Decoding is memory-bound: each step reads the weights once and every running sequence's KV
    cache, and yields one token per sequence (Pope et al. 2022, "Efficiently Scaling Transformer
    Inference", §2)."""
    step_bytes = weight_bytes + sequences * mean_context * kv_per_token
    step_seconds = step_bytes / (assumptions.hbm_tb_per_s * 1e12 * assumptions.decode_efficiency)
    return sequences / step_seconds


def launch_strategy(environ: dict[str, str]) -> str:
    """The sharding strategy ``accelerate launch`` set up for this process: zero1-3, fsdp or ddp."""
    stage = environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    if stage:
        return f"zero{stage}"
    return "fsdp" if environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" else "ddp"
