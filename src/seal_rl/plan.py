"""``seal plan``: will a training recipe fit on N GPUs, and how long will a round take? (estimates)

Everything here is arithmetic on a model's config numbers and the recipe; nothing is loaded or
measured. Memory is per GPU, in bytes, itemised; docs/planning.md gives every formula, its source
and how the estimates compare with published figures. In short:

* model states (weights, gradients, Adam) follow the ZeRO paper (Rajbhandari et al. 2020, Fig. 1):
  mixed-precision Adam keeps 2Ψ + 2Ψ + KΨ bytes with K = 12, and ZeRO stage 1 / 2 / 3 shard the
  optimizer / + gradients / + weights over N GPUs (FSDP full sharding = stage 3);
* activations of one micro-batch at the longest sequence are counted tensor by tensor for the
  Llama/Qwen2 decoder layer as transformers runs it with flash/SDPA attention (the method of
  Korthikanti et al. 2022, §4; checked against a real model in tests/test_plan.py), with or without
  full activation checkpointing;
* the log-probabilities come from TRL 1.16's fused, tiled LM head, which never materialises the
  ``(tokens, vocab)`` logits: what it holds is counted instead;
* the colocated vLLM engine takes ``vllm_gpu_memory_utilization`` of the GPU; its KV cache holds
  2 · layers · kv_heads · head_dim · dtype bytes per token (vLLM's arithmetic);
* time per round is FLOPs at an assumed MFU plus generated tokens at a decode roofline.

``device="cpu"`` plans a run on the host instead (what ``seal train`` checks on a machine without
CUDA, :mod:`seal_rl.fit`): the same terms in host RAM, with the precision torch actually trains in on
CPU (no DeepSpeed mixed-precision master copy).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from seal_rl.errors import SealError

if TYPE_CHECKING:
    from seal_rl.train import SealRecipe

GiB = 2**30
PRESET_PREFIX = "preset:"
STRATEGIES = ("zero3", "zero2", "zero1", "fsdp", "ddp")
DEVICES = ("cuda", "cpu")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
VLLM_DTYPE_BYTES = 2
"""vLLM's ``dtype="auto"`` (what TRL's colocated engine uses) serves bf16 checkpoints in bf16 and
fp32/fp16 ones in fp16: 2 bytes for weights and KV cache either way."""

# TRL 1.16 fused LM head (trl/kernels/chunked_logprob.py): tokens x vocabulary tile sizes.
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768


# -- model shapes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The config numbers of a Llama/Qwen2-layout decoder (no weights)."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    """Qwen2 has biases on q/k/v (and none on o); Llama has ``attention_bias`` on all four"""
    o_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 0
    """the longest context (0: unknown); vLLM refuses a longer ``max_model_len``"""
    dtype: str = "bfloat16"
    """the checkpoint's dtype (config ``torch_dtype``): what ``dtype: auto`` and vLLM load"""

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: q/k/v/o projections (+ biases), gate/up/down MLP, two RMSNorm weights."""
        h, i = self.hidden_size, self.intermediate_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.qkv_bias:
            attention += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            attention += h
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        return attention + mlp + 2 * h

    @property
    def parameters(self) -> int:
        """Ψ: embeddings + layers + final norm + LM head (unless tied to the embeddings)."""
        head = 0 if self.tie_word_embeddings else self.embedding_parameters
        return self.embedding_parameters + self.num_layers * self.layer_parameters + self.hidden_size + head

    @property
    def matmul_parameters(self) -> int:
        """Parameters used in a matrix product per token: all but the embedding lookup (the LM head
        is that same matrix when tied)."""
        return self.parameters - (0 if self.tie_word_embeddings else self.embedding_parameters)


PRESETS: dict[str, ModelShape] = {
    # config.json of Qwen/Qwen2.5-7B-Instruct
    "qwen2.5-7b": ModelShape(hidden_size=3584, num_layers=28, num_attention_heads=28, num_key_value_heads=4, head_dim=128,
                             intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False, qkv_bias=True,
                             max_position_embeddings=32768),
    # config.json of Qwen/Qwen2.5-3B-Instruct
    "qwen2.5-3b": ModelShape(hidden_size=2048, num_layers=36, num_attention_heads=16, num_key_value_heads=2, head_dim=128,
                             intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True, qkv_bias=True,
                             max_position_embeddings=32768),
    # config.json of Qwen/Qwen2.5-0.5B-Instruct
    "qwen2.5-0.5b": ModelShape(hidden_size=896, num_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64,
                               intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, qkv_bias=True,
                               max_position_embeddings=32768),
    # config.json of meta-llama/Llama-3.1-8B-Instruct
    "llama3.1-8b": ModelShape(hidden_size=4096, num_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                              intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
                              max_position_embeddings=131072),
}  # fmt: skip

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def model_shape(path: str) -> ModelShape:
    """``preset:NAME`` (see :data:`PRESETS`) or a model directory holding ``config.json``."""
    if path.startswith(PRESET_PREFIX):
        name = path.removeprefix(PRESET_PREFIX)
        if name not in PRESETS:
            raise SealError(f"Unknown model preset {name!r}; known presets: {', '.join(PRESETS)}.")
        return PRESETS[name]
    if path == "tiny":
        raise SealError("seal plan needs a real model shape: give model.path=preset:NAME "
                        f"({', '.join(PRESETS)}) or a model directory.")  # fmt: skip
    from seal_rl.models import resolve_model

    config = Path(resolve_model(path)).expanduser() / "config.json"
    if not config.is_file():
        raise SealError(f"{config} does not exist; give a model directory with config.json, or model.path=preset:NAME "
                        f"({', '.join(PRESETS)}).")  # fmt: skip
    try:
        data = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SealError(f"Cannot read {config}: {exc}") from None
    return shape_from_config(data, source=str(config))


def shape_from_config(config: dict, source: str = "config.json") -> ModelShape:
    """A :class:`ModelShape` from a transformers ``config.json`` of a Llama, Mistral or Qwen2 model."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise SealError(f"{source}: model_type {model_type!r} is not supported by seal plan; supported: "
                        f"{', '.join(SUPPORTED_MODEL_TYPES)}.")  # fmt: skip
    try:
        heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        attention_bias = bool(config.get("attention_bias", False))
        return ModelShape(
            hidden_size=hidden,
            num_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or (model_type == "llama" and attention_bias),
            o_bias=model_type == "llama" and attention_bias,
            mlp_bias=model_type == "llama" and bool(config.get("mlp_bias", False)),
            max_position_embeddings=config.get("max_position_embeddings") or 0,
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
        )
    except KeyError as exc:
        raise SealError(f"{source} lacks {exc.args[0]!r}; is it a causal language model's config?") from None


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
    in the loaded dtype (``model.dtype``, or the checkpoint's for ``auto``) and only the activations
    are bfloat16.
    """
    dtype = shape.dtype if recipe.model.dtype == "auto" else recipe.model.dtype
    weight_bytes = DTYPE_BYTES.get(dtype, 4)
    if recipe.grpo.bf16 and device == "cpu":
        if weight_bytes == 4:
            return Precision("float32 weights, bf16 autocast: 4+4+8 bytes/param", 4, 4, 8, 2)
        return Precision("pure bf16 (no fp32 master): 2+2+4 bytes/param", 2, 2, 4, 2)
    if recipe.grpo.bf16:
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
    """
    h = shape.hidden_size
    norms = 2 * (4 * h + 4 + 2 * a * h)
    attention = a * (2 * shape.q_dim + 2 * shape.kv_dim) + 4 * shape.num_attention_heads
    mlp = 4 * a * shape.intermediate_size
    return norms + attention + mlp


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


def lm_head_bytes(shape: ModelShape, completion_tokens: int, a: int, weight_bytes: int) -> int:
    """Peak of TRL 1.16's fused log-prob LM head (``trl/kernels/chunked_logprob.py``) for one micro-batch.

    It scores only completion tokens and never holds ``(tokens, vocab)`` logits: it saves the
    selected hidden states (a·h per token) and two float32 statistics (8), works on a
    4096 × 32768 tile, and its backward accumulates float32 gradients of the hidden states (4h per
    token) and of the whole head matrix (4·V·h) before casting the latter to the weight dtype.
    """
    h, v = shape.hidden_size, shape.vocab_size
    saved = completion_tokens * (a * h + 8)
    tile = min(completion_tokens, TRL_TOKEN_CHUNK) * min(v, TRL_VOCAB_CHUNK) * a
    backward = completion_tokens * 4 * h + v * h * (4 + weight_bytes)
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


# -- assumptions, plan -------------------------------------------------------------------------


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

    def __post_init__(self) -> None:
        if min(self.peak_tflops, self.hbm_tb_per_s) <= 0 or not 0 < self.mfu <= 1 or not 0 < self.decode_efficiency <= 1:
            raise SealError("--peak-tflops and --hbm-tb-s must be positive, --mfu and --decode-efficiency in (0, 1].")
        if self.gen_tokens_per_s is not None and self.gen_tokens_per_s <= 0:
            raise SealError("--gen-tokens-per-s must be positive.")
        if min(self.overhead_gib, self.vllm_overhead_gib) < 0:
            raise SealError("--overhead-gib and --vllm-overhead-gib must be >= 0.")


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
    generated_tokens: int
    forwards: float
    forward_flops_per_token: float
    gen_tokens_per_s: float
    assumptions: Assumptions
    notes: list[str] = field(default_factory=list)
    device: str = "cuda"
    """``cuda`` (memory per GPU) or ``cpu`` (``gpu_memory``: each process's share of the host's RAM)"""

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
        if self.strategy not in ("zero3", "fsdp") and (self.device == "cuda" or self.gpus > 1):
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
) -> Plan:
    """Plan ``recipe`` on ``gpus`` GPUs of ``gpu_memory_gb`` GiB each (see the module docstring).

    ``shape`` defaults to :func:`model_shape` of ``recipe.model.path``; ``num_tasks`` (training
    tasks) to the recipe's task selection, as ``seal train`` makes it. ``device="cpu"``: ``gpus``
    processes on one host, each with ``gpu_memory_gb`` of its RAM (see :func:`precision`).
    """
    from seal_rl.train import batch_layout

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

    memory = _training_memory(recipe, shape, p, gpus, strategy)
    notes = []
    vllm = None
    training_budget = gpu_memory - int(assumptions.overhead_gib * GiB)
    if g.use_vllm:  # colocated: the recipe refuses server and sleep modes
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

    if assumptions.gen_tokens_per_s is not None:
        gen_rate = assumptions.gen_tokens_per_s
    elif vllm is not None:
        gen_rate = decode_tokens_per_s(vllm, mean_context, assumptions)
    else:
        gen_rate = _roofline(shape.parameters * p.weight_bytes, min(recipe.generation_batch, recipe.concurrency), mean_context,
                             kv_cache_bytes_per_token(shape, p.activation_bytes), assumptions)  # fmt: skip

    num_tasks = _training_tasks(recipe) if num_tasks is None else num_tasks
    rounds, steps = run_length(recipe, layout, num_tasks)
    episodes = g.tasks_per_step * g.num_generations
    generated_per_episode = min(completion, int(recipe.env.get("max_model_calls", 20)) * budgets["max_new_tokens"])
    return Plan(
        model=recipe.model.path, shape=shape, gpus=gpus, gpu_memory=gpu_memory, strategy=strategy, precision=p,
        checkpointing=recipe.model.gradient_checkpointing, micro_batch=b, prompt_tokens=prompt, completion_tokens=completion,
        layout=layout, episodes=episodes, num_tasks=num_tasks, rounds=rounds, steps=steps, memory=memory,
        activations_other=backbone_activation_bytes(shape, b, sequence, p.activation_bytes, not recipe.model.gradient_checkpointing),
        logits_if_materialised=materialised_logits_bytes(shape, b * completion), training_budget=training_budget,
        vllm=vllm, trained_tokens=episodes * sequence, generated_tokens=episodes * generated_per_episode,
        forwards=forward_passes(recipe, layout), forward_flops_per_token=forward_flops_per_token(shape, sequence),
        gen_tokens_per_s=gen_rate, assumptions=assumptions, notes=notes, device=device,
    )  # fmt: skip


def _training_memory(recipe: SealRecipe, shape: ModelShape, p: Precision, gpus: int, strategy: str) -> list[MemoryLine]:
    """The training side's memory lines for one GPU at its peak (the start of the backward pass)."""
    g = recipe.grpo
    psi = shape.parameters
    sharded = strategy in ("zero3", "fsdp")
    states = model_states(psi, gpus, strategy, p)

    def over(divided: bool) -> str:
        return f"/{gpus}" if divided and gpus > 1 else ""

    memory = [
        MemoryLine(f"weights ({p.weight_bytes} bytes/param)", states.weights, f"{p.weight_bytes}Ψ{over(sharded)}"),
        MemoryLine(f"gradients ({p.grad_bytes} bytes/param)", states.gradients, f"{p.grad_bytes}Ψ{over(strategy not in ('ddp', 'zero1'))}"),
        MemoryLine(f"optimizer state (Adam, K={p.optimizer_bytes})", states.optimizer, f"{p.optimizer_bytes}Ψ{over(strategy != 'ddp')}"),
    ]  # fmt: skip
    if g.beta > 0:  # TRL keeps a frozen reference copy; DeepSpeed ZeRO-3 and FSDP shard it too
        reference = math.ceil(psi / (gpus if sharded else 1)) * p.weight_bytes
        memory.append(MemoryLine(f"reference model (beta={g.beta:g})", reference, f"{p.weight_bytes}Ψ{over(sharded)}"))
    if sharded:
        memory.append(MemoryLine("gathered weights (2 layers + LM head)", gathered_parameter_bytes(shape, strategy, p.weight_bytes),
                                 "ZeRO-3/FSDP working set"))  # fmt: skip
    b, a, ckpt = g.per_device_train_batch_size, p.activation_bytes, recipe.model.gradient_checkpointing
    completion = recipe.budgets["max_completion_tokens"]
    sequence = recipe.budgets["max_prompt_tokens"] + completion
    memory.append(MemoryLine(f"activations ({b} x {sequence} tokens, {'checkpointed' if ckpt else 'no checkpointing'})",
                             backbone_activation_bytes(shape, b, sequence, a, ckpt),
                             "L·a·h + 1 layer per token" if ckpt else "L × per-layer bytes per token"))  # fmt: skip
    memory.append(MemoryLine("LM-head log-probs (TRL fused kernel)", lm_head_bytes(shape, b * completion, a, p.weight_bytes),
                             f"{b} x {completion} completion tokens"))  # fmt: skip
    return memory


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
    kv_heads_per_gpu = max(1, shape.num_key_value_heads // tp)  # vLLM replicates kv heads when tp > kv_heads
    return VLLMPlan(
        utilization=g.vllm_gpu_memory_utilization, budget=int(g.vllm_gpu_memory_utilization * gpu_memory),
        weights=math.ceil(shape.parameters / tp) * VLLM_DTYPE_BYTES, overhead=int(assumptions.vllm_overhead_gib * GiB),
        kv_bytes_per_token=kv_cache_bytes_per_token(shape, VLLM_DTYPE_BYTES), tensor_parallel=tp,
        kv_bytes_per_token_per_gpu=2 * shape.num_layers * kv_heads_per_gpu * shape.head_dim * VLLM_DTYPE_BYTES,
        max_model_len=sequence, concurrent_sequences=tp * min(recipe.concurrency, per_rank), longest_sequence=sequence,
    )  # fmt: skip


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
    from seal_rl.tasks import TaskSet
    from seal_rl.train import select_tasks

    tasks, _ = select_tasks(recipe, TaskSet.load())
    return len(tasks)


# -- throughput --------------------------------------------------------------------------------


def forward_flops_per_token(shape: ModelShape, sequence: int) -> float:
    """Forward FLOPs per token: 2 per matmul parameter plus causal attention, 2·L·s·q_dim
    (Kaplan et al. 2020, Table 1: 2N + 2·n_layer·n_ctx·d_attn, with the mean causal context s/2
    counted for both QKᵀ and AV). A backward pass costs two forwards."""
    return 2 * shape.matmul_parameters + 2 * shape.num_layers * sequence * shape.q_dim


def decode_tokens_per_s(vllm: VLLMPlan, mean_context: int, assumptions: Assumptions) -> float:
    """Decode throughput per GPU of a colocated engine (see :func:`_roofline`): it runs as many
    sequences as its KV cache holds at ``mean_context`` tokens each (at most its concurrent
    sequences); under tensor parallelism every GPU reads its shard and the engine's tokens are
    shared by its GPUs."""
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


# -- rendering ---------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / GiB:6.2f}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def render(plan: Plan, budgets: str | None = None) -> str:
    """The plan as fixed-width text: recipe, batch layout, memory table, vLLM, tokens and time, and
    the verdict as its last line. ``budgets``: a line on the ground truths within the budgets
    (:func:`seal_rl.budgets.summary_line`), shown under the sequence lengths."""
    s, a = plan.shape, plan.assumptions
    lay = plan.layout
    hardware = (f"{plan.gpus} GPU(s) x {plan.gpu_memory / GiB:g} GiB" if plan.device == "cuda" else
                f"{plan.gpus} CPU process(es) x {plan.gpu_memory / GiB:.1f} GiB of host RAM")  # fmt: skip
    lines = [
        f"model      {plan.model}: {s.num_layers} layers, hidden {s.hidden_size}, heads {s.num_attention_heads} "
        f"(kv {s.num_key_value_heads}), MLP {s.intermediate_size}, vocab {s.vocab_size}; Ψ = {s.parameters / 1e9:.2f} B parameters",
        f"hardware   {hardware}, strategy {plan.strategy}, {plan.precision.name}, "
        f"gradient checkpointing {'on' if plan.checkpointing else 'off'}",
        f"sequence   prompt {plan.prompt_tokens} + completion {plan.completion_tokens} = {plan.longest_sequence} tokens at most",
        *([budgets] if budgets else []),
        f"batch      {plan.episodes} episodes per round ({plan.episodes // plan.gpus} per GPU); micro-batch {plan.micro_batch}; "
        f"steps_per_generation {lay['steps_per_generation']}, gradient_accumulation_steps {lay['gradient_accumulation_steps']}, "
        f"optimizer steps per round {lay['updates_per_round']}",
        f"run        {plan.num_tasks} training tasks -> {plan.rounds} rounds, {plan.steps} optimizer steps",
        "",
        "training memory per GPU (estimate)                    GiB  formula",
    ]  # fmt: skip
    for line in plan.memory:
        lines.append(f"  {line.name:<48} {_gib(line.bytes)}  {line.formula}")
    lines.append(f"  {'total':<48} {_gib(plan.training_bytes)}")
    if plan.vllm is not None:
        budget = (f"(1 - {plan.vllm.utilization:g}) x {plan.gpu_memory / GiB:g} GiB - {a.overhead_gib:g} GiB overhead")
    else:
        budget = f"{plan.gpu_memory / GiB:g} GiB - {a.overhead_gib:g} GiB overhead"
    lines.append(f"  {'available: ' + budget:<48} {_gib(plan.training_budget)}")
    other = "without" if plan.checkpointing else "with"
    lines.append(f"  activations {other} checkpointing would take {plan.activations_other / GiB:.2f} GiB; "
                 f"materialised fp32 logits would take {plan.logits_if_materialised / GiB:.2f} GiB (TRL's fused head avoids them)")  # fmt: skip

    v = plan.vllm
    if v is not None:
        lines += [
            "",
            f"vLLM colocated, per GPU (estimate): {v.utilization:g} x {plan.gpu_memory / GiB:g} GiB = {v.budget / GiB:.2f} GiB"
            + (f"; tensor parallel {v.tensor_parallel}: each GPU holds 1/{v.tensor_parallel} of an engine" if v.tensor_parallel > 1 else ""),
            f"  weights {v.weights / GiB:.2f} GiB + non-KV overhead {v.overhead / GiB:.2f} GiB (assumed) + KV cache {v.kv_cache / GiB:.2f} GiB",
            f"  KV cache {v.kv_bytes_per_token:,} bytes/token (2 x {s.num_layers} layers x {s.num_key_value_heads} kv heads x "
            f"{s.head_dim} x {VLLM_DTYPE_BYTES} bytes)"
            + (f", {v.kv_bytes_per_token_per_gpu:,} per GPU" if v.tensor_parallel > 1 else "")
            + f" -> {v.kv_tokens:,} tokens per engine",
            f"  max_model_len {v.max_model_len:,}: {'fits' if v.starts else 'DOES NOT FIT (vLLM will not start)'}",
        ]  # fmt: skip
        need = f"{v.concurrent_sequences} concurrent sequences x {v.longest_sequence} tokens = {v.tokens_needed:,} tokens"
        if v.covers_concurrency:
            lines.append(f"  {need}: fit")
        else:
            full = v.kv_tokens // v.longest_sequence
            lines.append(f"  {need}: only {full} fit at full length; vLLM will queue or preempt the rest (slower, not a failure)")
    lines += [
        "",
        "tokens and time per round (upper bounds: every episode at full length; estimate)",
        f"  trained   <= {plan.episodes} x {plan.longest_sequence} = {plan.trained_tokens / 1e6:.2f} M tokens; "
        f"{plan.forwards:g} forward-equivalents x {plan.forward_flops_per_token / 1e9:.1f} GFLOP/token "
        f"-> {_duration(plan.train_seconds_per_round)}",
        f"  generated <= {plan.episodes} x {plan.generated_tokens // plan.episodes} = {plan.generated_tokens / 1e6:.2f} M tokens "
        f"at {plan.gen_tokens_per_s:,.0f} tokens/s per GPU -> {_duration(plan.generation_seconds_per_round)}",
        f"  per round <= {_duration(plan.seconds_per_round)}; {plan.rounds} rounds <= {_duration(plan.rounds * plan.seconds_per_round)}",
        "",
        "assumptions (all are options of seal plan):",
        f"  training at MFU {a.mfu:g} of {a.peak_tflops:g} TFLOP/s per GPU; forward-equivalents per token: 3 for forward and "
        "backward, +1 recompute with checkpointing, +1 old log-probs (TRL computes them with vLLM or several updates per "
        "round), +1 reference forward when beta > 0",
        "  generation at " + (f"{a.gen_tokens_per_s:g} tokens/s per GPU (given)" if a.gen_tokens_per_s else
                              f"a decode roofline: {a.decode_efficiency:g} of {a.hbm_tb_per_s:g} TB/s, each step reading the weights "
                              "and every running sequence's KV cache (mean context: prompt + completion / 2); prefill not counted"),
        f"  {a.overhead_gib:g} GiB per GPU for the CUDA context, NCCL buffers and fragmentation; environment, validation and "
        "weight-sync time not counted",
    ]  # fmt: skip
    lines += [f"note: {note}" for note in plan.notes]
    spare = (plan.training_budget - plan.training_bytes) / GiB
    lines += ["", f"fits ({spare:.1f} GiB to spare per GPU)" if plan.fits else f"does not fit: {plan.reason}"]
    return "\n".join(lines)


def launch_strategy(environ: dict[str, str]) -> str:
    """The sharding strategy ``accelerate launch`` set up for this process: zero1-3, fsdp or ddp."""
    stage = environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    if stage:
        return f"zero{stage}"
    return "fsdp" if environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" else "ddp"
