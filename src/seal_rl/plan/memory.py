"""The memory terms of a training process, each counted in bytes from a model shape.

Model states (weights, gradients, Adam) per ZeRO stage, the precision that sizes them,
activations of one micro-batch, the fused LM head's working set, and the colocated vLLM engine's
share (weights, KV cache). The package docstring (:mod:`seal_rl.plan`) gives the sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from seal_rl.errors import SealError
from seal_rl.plan.shapes import ModelShape
from seal_rl.precision import training_dtype
from seal_rl.train.recipe import resolve_bf16, samples_per_task

if TYPE_CHECKING:
    from seal_rl.train.recipe import SealRecipe

GiB = 2**30


STRATEGIES = ("zero3", "zero2", "zero1", "fsdp", "ddp")
DEVICES = ("cuda", "cpu")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
VLLM_DTYPE_BYTES = 2
"""vLLM's ``dtype="auto"`` (what TRL's colocated engine uses) serves bf16 checkpoints in bf16 and
fp32/fp16 ones in fp16: 2 bytes for weights and KV cache either way."""

# TRL 1.16 fused LM head (trl/kernels/chunked_logprob.py): tokens x vocabulary tile sizes.
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768


# -- model states (ZeRO) -----------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of the weights, gradients and optimizer state, and per activation value."""

    name: str
    weight_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    """K in the ZeRO paper: 12 for mixed-precision Adam (fp32 master weights, momentum, variance)"""
    activation_bytes: int


def precision(recipe: SealRecipe, shape: ModelShape, device: str = "cuda") -> Precision:
    """The training precision of a recipe.

    ``grpo.bf16``: mixed precision, 2 + 2 + 12 bytes per parameter (ZeRO paper §3.1; DeepSpeed's
    bf16 mode). Under DDP/FSDP autocast with float32 weights the split is 4 + 4 + 8, the same total.
    Otherwise Adam runs in the weights' own dtype: 4 + 4 + 8 in float32, or 2 + 2 + 4 for bfloat16
    weights (no master copy: Adam's moments in bfloat16).

    On CPU (``device="cpu"``) ``grpo.bf16`` is torch's CPU autocast: weights, gradients and Adam stay
    in the loaded dtype (``model.dtype``; float32 for ``auto``, as ``seal train`` loads it) and only the
    activations are bfloat16. Without it a CPU loads ``auto`` as :func:`seal_rl.precision.training_dtype`
    says (float32 on a CPU without native bfloat16). ``grpo.bf16: auto`` is resolved for the planned device
    (:func:`~seal_rl.train.recipe.resolve_bf16`: a GPU is assumed to support bfloat16; a CPU is this one).
    """
    bf16, _ = resolve_bf16(recipe.grpo.bf16, cuda=device != "cpu")
    dtype, _ = training_dtype(recipe.model.dtype, shape.dtype, bf16, cuda=device != "cpu")  # as seal train loads it
    weight_bytes = DTYPE_BYTES.get(dtype, 4)
    if bf16 and device == "cpu":
        if weight_bytes == 4 or recipe.model.dtype == "auto":  # seal train loads an auto checkpoint in float32 here
            return Precision("float32 weights, bf16 autocast: 4+4+8 bytes/param", 4, 4, 8, 2)
        return Precision("pure bf16 (no fp32 master): 2+2+4 bytes/param", 2, 2, 4, 2)
    if bf16:
        return Precision("mixed bf16: 2+2+12 bytes/param", 2, 2, 12, 2)
    if weight_bytes == 4:
        return Precision("float32: 4+4+8 bytes/param", 4, 4, 8, 4)
    return Precision("pure bf16 (no fp32 master): 2+2+4 bytes/param", 2, 2, 4, 2)


@dataclass(frozen=True)
class ModelStates:
    """Per-GPU bytes of weights, gradients and optimizer state."""

    weights: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


def model_states(parameters: int, gpus: int, strategy: str, p: Precision) -> ModelStates:
    """ZeRO paper Fig. 1: baseline (DDP) (2+2+K)Ψ; P_os 2Ψ+2Ψ+KΨ/N; P_os+g 2Ψ+(2+K)Ψ/N; P_os+g+p (2+2+K)Ψ/N.

    FSDP's full sharding is stage 3. Shards are rounded up (every rank holds ceil(Ψ/N) elements).
    """
    if strategy not in STRATEGIES:
        raise SealError(f"Unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}.")
    shard = math.ceil(parameters / gpus)
    weights = gradients = optimizer = parameters
    if strategy in ("zero1", "zero2", "zero3", "fsdp"):
        optimizer = shard
    if strategy in ("zero2", "zero3", "fsdp"):
        gradients = shard
    if strategy in ("zero3", "fsdp"):
        weights = shard
    return ModelStates(weights * p.weight_bytes, gradients * p.grad_bytes, optimizer * p.optimizer_bytes)


def gathered_parameter_bytes(shape: ModelShape, strategy: str, weight_bytes: int) -> int:
    """Full (unsharded) weights alive at once under ZeRO-3 / FSDP: the decoder layer being computed
    and the next one being prefetched, plus the LM head that TRL's fused log-prob kernel gathers
    whole; FSDP's root unit also keeps the embeddings gathered through forward and backward."""
    if strategy not in ("zero3", "fsdp"):
        return 0
    params = 2 * shape.layer_parameters + shape.embedding_parameters
    if strategy == "fsdp" and not shape.tie_word_embeddings:
        params += shape.embedding_parameters
    return params * weight_bytes


# -- activations -------------------------------------------------------------------------------


def layer_activation_bytes_per_token(shape: ModelShape, a: int) -> int:
    """Bytes one decoder layer keeps for backward per token (``a`` bytes per activation value).

    Counted tensor by tensor as transformers' Llama/Qwen2 layer saves them with flash/SDPA
    attention (Korthikanti et al. 2022 count the same way for GPT: 34·h per token with a 4h MLP):

    * each of the 2 RMSNorms: its input upcast to float32 (4h), 1/rms (4), the normalised value
      before the weight (a·h) and its output, the input of the next projections (a·h);
    * attention: q, k, v after RoPE (a·(q_dim + 2·kv_dim)), the attention output (a·q_dim, also
      o_proj's input) and the softmax log-sum-exp (4 per head);
    * SwiGLU MLP: gate and up outputs, SiLU output and their product (4·a·I).

    A Mixture-of-Experts layer keeps the MLP's tensors once for each expert a token is routed to
    (k·4·a·I) and the router's logits (a per expert); this part is counted from the modeling code,
    not measured. With checkpointing only one layer's worth is ever alive.
    """
    h = shape.hidden_size
    norms = 2 * (4 * h + 4 + 2 * a * h)
    attention = a * (2 * shape.q_dim + 2 * shape.kv_dim) + 4 * shape.num_attention_heads
    mlp = shape.experts_per_token * 4 * a * shape.intermediate_size
    router = a * shape.num_experts if shape.num_experts > 1 else 0
    return norms + attention + mlp + router


def backbone_activation_bytes(shape: ModelShape, sequences: int, length: int, a: int, checkpointing: bool) -> int:
    """Activations of the decoder stack (embeddings to final norm) for ``sequences`` x ``length`` tokens.

    Without checkpointing every layer keeps :func:`layer_activation_bytes_per_token`. With full
    checkpointing each layer keeps only its input (a·h, the "2sbh per layer" of Korthikanti et al.
    §4.1) and one layer's activations are rebuilt at a time during backward. Both add per token the
    token ids for the embedding backward (8) and the final norm (4h + 4 + a·h), and per position
    the RoPE cos and sin shared by the batch (2·a·head_dim).
    """
    h, tokens = shape.hidden_size, sequences * length
    per_token = 8 + 4 * h + 4 + a * h
    per_layer = layer_activation_bytes_per_token(shape, a)
    layers = shape.num_layers * a * h + per_layer if checkpointing else shape.num_layers * per_layer
    return tokens * (layers + per_token) + length * 2 * a * shape.head_dim


@dataclass(frozen=True)
class MicroBatchTokens:
    """One micro-batch of the update at the budgets (every sample at full length)."""

    held: int
    """tokens its samples hold: what TRL forwards (``micro_batch`` x (prompt + completion))"""
    forwarded: int
    """tokens a shared-prefix update forwards: each shared prompt once, each episode's path once"""
    prompts: int
    """distinct prompts (GRPO groups) in it"""
    paths: int
    """branches below the prompts: its episodes"""
    path_tokens: int
    """tokens on one root-to-leaf path (prompt + completion): the keys a branch gathers"""
    shared: bool


def micro_batch_tokens(recipe: SealRecipe) -> MicroBatchTokens:
    """Tokens of one micro-batch with and without ``shared_prefix`` (``auto`` is counted as on: the
    plan cannot probe the model; a model the probe refuses takes TRL's path and the ``held`` count).

    A micro-batch of ``b`` samples holds whole groups (``seal train`` shuffles by group): it has
    ⌈b / group⌉ prompts of ``max_prompt_tokens``. In the ``episode`` layout each sample is a path of
    ``max_completion_tokens`` below its prompt; in the ``turn`` layout an episode's samples lie on one
    path (each message's prompt holds the conversation before it), so ⌈b / turn_samples⌉ paths.
    """
    b = recipe.grpo.per_device_train_batch_size
    prompt, completion = recipe.budgets["max_prompt_tokens"], recipe.budgets["max_completion_tokens"]
    held = b * (prompt + completion)
    group = samples_per_task(recipe)
    prompts = -(-b // group)
    paths = -(-b // recipe.turn_samples) if recipe.layout == "turn" else b
    shared = recipe.shared_prefix is not False and prompts * prompt + paths * completion < held
    forwarded = prompts * prompt + paths * completion if shared else held
    return MicroBatchTokens(held, forwarded, prompts, paths, prompt + completion, shared)


def tree_attention_bytes(shape: ModelShape, tokens: MicroBatchTokens, a: int, checkpointing: bool) -> int:
    """What the tree attention adds for backward: each branch's keys and values gathered along its
    path (prompt + its own tokens, 2 x kv_dim each), per layer without checkpointing, one layer with."""
    if not tokens.shared:
        return 0
    per_layer = tokens.paths * tokens.path_tokens * 2 * shape.kv_dim * a
    return per_layer * (1 if checkpointing else shape.num_layers)


def lm_head_bytes(shape: ModelShape, completion_tokens: int, a: int, weight_bytes: int, *, head_gradient: bool = True) -> int:
    """Peak of TRL 1.16's fused log-prob LM head (``trl/kernels/chunked_logprob.py``) for one micro-batch.

    It scores only completion tokens and never holds ``(tokens, vocab)`` logits: it saves the
    selected hidden states (a·h per token) and two float32 statistics (8), works on a
    4096 × 32768 tile, and its backward accumulates float32 gradients of the hidden states (4h per
    token) and of the whole head matrix (4·V·h) before casting the latter to the weight dtype. A
    frozen head (LoRA: ``head_gradient=False``) gets no weight gradient (the kernel asks
    ``ctx.needs_input_grad``), so only the hidden states' gradients remain.
    """
    h, v = shape.hidden_size, shape.vocab_size
    saved = completion_tokens * (a * h + 8)
    tile = min(completion_tokens, TRL_TOKEN_CHUNK) * min(v, TRL_VOCAB_CHUNK) * a
    backward = completion_tokens * 4 * h + (v * h * (4 + weight_bytes) if head_gradient else 0)
    return saved + tile + backward


def materialised_logits_bytes(shape: ModelShape, completion_tokens: int) -> int:
    """What a non-fused head would hold: float32 logits over the vocabulary for each completion token."""
    return completion_tokens * shape.vocab_size * 4


# -- vLLM --------------------------------------------------------------------------------------


def kv_cache_bytes_per_token(shape: ModelShape, dtype_bytes: int = 2) -> int:
    """vLLM's KV cache per token: 2 (K and V) · layers · kv_heads · head_dim · dtype bytes."""
    return 2 * shape.num_layers * shape.num_key_value_heads * shape.head_dim * dtype_bytes


@dataclass(frozen=True)
class VLLMPlan:
    """One GPU's share of TRL's colocated engine; an engine spans ``tensor_parallel`` GPUs."""

    utilization: float
    budget: int
    weights: int
    """this GPU's shard of the weights: 2Ψ / tensor_parallel"""
    overhead: int
    """non-KV memory: profiling activations and CUDA graphs (an assumption)"""
    kv_bytes_per_token: int
    """the whole model's KV cache per token"""
    tensor_parallel: int
    kv_bytes_per_token_per_gpu: int
    """this GPU's share: its kv heads (kv_heads / tensor_parallel, at least one)"""
    max_model_len: int
    concurrent_sequences: int
    """sequences one engine serves at once: ``concurrency`` from each rank of its group"""
    longest_sequence: int

    @property
    def kv_cache(self) -> int:
        return self.budget - self.weights - self.overhead

    @property
    def kv_tokens(self) -> int:
        """Tokens one engine's cache holds."""
        return max(0, self.kv_cache) // self.kv_bytes_per_token_per_gpu

    @property
    def tokens_needed(self) -> int:
        return self.concurrent_sequences * self.longest_sequence

    @property
    def starts(self) -> bool:
        """vLLM refuses to start without room for one sequence of ``max_model_len`` tokens."""
        return self.kv_cache > 0 and self.kv_tokens >= self.max_model_len

    @property
    def covers_concurrency(self) -> bool:
        return self.kv_tokens >= self.tokens_needed


def vllm_weight_bytes(shape: ModelShape, tensor_parallel: int) -> int:
    """One GPU's shard of a vLLM engine's weights: 2Ψ / tensor_parallel (:data:`VLLM_DTYPE_BYTES`)."""
    return math.ceil(shape.parameters / tensor_parallel) * VLLM_DTYPE_BYTES


def vllm_engine(
    shape: ModelShape,
    *,
    tensor_parallel: int,
    utilization: float,
    budget: int,
    overhead: int,
    max_model_len: int,
    concurrent_sequences: int,
) -> VLLMPlan:
    """One GPU's share of a vLLM engine that spans ``tensor_parallel`` GPUs and may take ``budget``
    bytes of each: its weight shard, ``overhead`` bytes besides the KV cache, and the KV cache in
    what is left, where each GPU holds kv_heads / tensor_parallel of the heads (at least one: vLLM
    replicates kv heads when the tensor-parallel size exceeds them). The same arithmetic sizes TRL's
    colocated engine (:mod:`seal_rl.plan.estimate`) and a ``vllm serve`` generation server
    (:mod:`seal_rl.plan.split`)."""
    kv_heads_per_gpu = max(1, shape.num_key_value_heads // tensor_parallel)
    return VLLMPlan(
        utilization=utilization, budget=budget, weights=vllm_weight_bytes(shape, tensor_parallel), overhead=overhead,
        kv_bytes_per_token=kv_cache_bytes_per_token(shape, VLLM_DTYPE_BYTES), tensor_parallel=tensor_parallel,
        kv_bytes_per_token_per_gpu=2 * shape.num_layers * kv_heads_per_gpu * shape.head_dim * VLLM_DTYPE_BYTES,
        max_model_len=max_model_len, concurrent_sequences=concurrent_sequences, longest_sequence=max_model_len,
    )  # fmt: skip
