"""Model shapes for ``seal plan``: the config numbers of a decoder, from a preset or a ``config.json``.

:class:`ModelShape` holds what the estimates need (layers, widths, heads, vocabulary, biases,
experts, dtype) and counts the parameters Ψ; :data:`PRESETS` are published configs, named in a
recipe as ``model.path=preset:NAME``, so a plan needs no weights on disk.

A Mixture-of-Experts model (gpt-oss, Qwen3-MoE) has two counts: :attr:`ModelShape.parameters`,
every parameter, which sizes weights, gradients, optimizer state and vLLM's copy; and
:attr:`ModelShape.active_parameters`, what one token runs through (its routed experts only), which
sizes compute. A dense model has one expert per layer and both counts are equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from seal_rl.errors import SealError

PRESET_PREFIX = "preset:"


@dataclass(frozen=True)
class ModelShape:
    """The config numbers of a Llama/Qwen2-layout decoder (no weights), dense or Mixture-of-Experts."""

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
    num_experts: int = 1
    """MLPs per layer (config ``num_local_experts`` / ``num_experts``); 1: a dense model. Each expert
    is a gate/up/down MLP of ``intermediate_size``; with more than one, a linear router picks them"""
    experts_per_token: int = 1
    """experts each token is routed to (config ``num_experts_per_tok``)"""
    router_bias: bool = False
    """gpt-oss's router has a bias (one per expert); Qwen3-MoE's has none"""
    attention_sinks: bool = False
    """gpt-oss: one learned sink logit per attention head and layer"""
    qk_norm: bool = False
    """Qwen3: RMSNorm weights on each head's q and k (2·head_dim per layer)"""
    sliding_window: int = 0
    """the window of the sliding-window layers (0: none)"""
    sliding_layers: int = 0
    """layers attending only to the last ``sliding_window`` tokens (gpt-oss: every other one)"""

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
    def expert_parameters(self) -> int:
        """One gate/up/down MLP (an expert, or a dense model's MLP), with its biases if any: gpt-oss's
        ``gate_up_proj_bias`` (2·I) and ``down_proj_bias`` (h), as Llama's ``mlp_bias``."""
        h, i = self.hidden_size, self.intermediate_size
        return 3 * h * i + (2 * i + h if self.mlp_bias else 0)

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: q/k/v/o projections (+ biases, sinks, q/k norms), its MLP or all its
        experts and their router, two RMSNorm weights."""
        h = self.hidden_size
        attention = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.qkv_bias:
            attention += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            attention += h
        if self.attention_sinks:
            attention += self.num_attention_heads
        if self.qk_norm:
            attention += 2 * self.head_dim
        router = h * self.num_experts + (self.num_experts if self.router_bias else 0) if self.num_experts > 1 else 0
        return attention + self.num_experts * self.expert_parameters + router + 2 * h

    @property
    def parameters(self) -> int:
        """Ψ: embeddings + layers + final norm + LM head (unless tied to the embeddings); every expert
        counts, as every one has weights, gradients and Adam state."""
        head = 0 if self.tie_word_embeddings else self.embedding_parameters
        return self.embedding_parameters + self.num_layers * self.layer_parameters + self.hidden_size + head

    @property
    def active_parameters(self) -> int:
        """Parameters one token goes through: Ψ less the experts it is not routed to; Ψ for a dense model."""
        unrouted = self.num_experts - self.experts_per_token
        return self.parameters - self.num_layers * unrouted * self.expert_parameters

    @property
    def matmul_parameters(self) -> int:
        """Parameters used in a matrix product per token: the active ones but the embedding lookup
        (the LM head is that same matrix when tied). For gpt-oss this is the model card's "active
        parameters" (3.61B of 20.91B; it counts the unembedding, not the embedding)."""
        return self.active_parameters - (0 if self.tie_word_embeddings else self.embedding_parameters)


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
    # config.json of Qwen/Qwen3-8B (its per-head q/k norms, 9,216 parameters, are not counted)
    "qwen3-8b": ModelShape(hidden_size=4096, num_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                           intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False,
                           max_position_embeddings=40960),
    # config.json of openai/gpt-oss-20b: 32 experts of 2880 with biases, 4 per token, a router with bias,
    # attention biases and sinks, sliding window 128 on every other layer. 20,914,757,184 parameters,
    # 3.61B active (OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card", 2025, Table 1). The hub's experts
    # are MXFP4; training dequantizes them to bfloat16, which is what is planned.
    "gpt-oss-20b": ModelShape(hidden_size=2880, num_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                              intermediate_size=2880, vocab_size=201088, tie_word_embeddings=False, qkv_bias=True,
                              o_bias=True, mlp_bias=True, max_position_embeddings=131072, num_experts=32,
                              experts_per_token=4, router_bias=True, attention_sinks=True, sliding_window=128,
                              sliding_layers=12),
    # config.json of meta-llama/Llama-3.1-8B-Instruct
    "llama3.1-8b": ModelShape(hidden_size=4096, num_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                              intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
                              max_position_embeddings=131072),
}  # fmt: skip

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gpt_oss")


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
    """A :class:`ModelShape` from a transformers ``config.json`` of a Llama, Mistral, Qwen2, Qwen3,
    Qwen3-MoE or gpt-oss model (their modeling code in transformers decides which biases exist)."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise SealError(f"{source}: model_type {model_type!r} is not supported by seal plan; supported: "
                        f"{', '.join(SUPPORTED_MODEL_TYPES)}.")  # fmt: skip
    if model_type == "qwen3_moe" and (config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1):
        raise SealError(f"{source}: a Qwen3-MoE model with dense layers (mlp_only_layers, decoder_sparse_step) is not "
                        "supported by seal plan.")  # fmt: skip
    try:
        heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        layers = config["num_hidden_layers"]
        attention_bias = bool(config.get("attention_bias", False))
        biased = model_type == "gpt_oss" or (model_type in ("llama", "qwen3", "qwen3_moe") and attention_bias)
        moe = model_type in ("gpt_oss", "qwen3_moe")  # Qwen3-MoE's hub configs say num_experts, transformers 5 writes both
        window = (config.get("sliding_window") or 0) if model_type == "gpt_oss" else 0
        alternating = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]  # GptOssConfig's default
        layer_types = config.get("layer_types") or alternating
        return ModelShape(
            hidden_size=hidden,
            num_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            intermediate_size=config["moe_intermediate_size" if model_type == "qwen3_moe" else "intermediate_size"],
            vocab_size=config["vocab_size"],
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or biased,
            o_bias=biased,
            mlp_bias=model_type == "gpt_oss" or (model_type == "llama" and bool(config.get("mlp_bias", False))),
            max_position_embeddings=config.get("max_position_embeddings") or 0,
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
            num_experts=(config.get("num_local_experts") or config["num_experts"]) if moe else 1,
            experts_per_token=(config.get("num_experts_per_tok") or config["experts_per_token"]) if moe else 1,
            router_bias=model_type == "gpt_oss",
            attention_sinks=model_type == "gpt_oss",
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            sliding_window=window,
            sliding_layers=sum(t == "sliding_attention" for t in layer_types) if window else 0,
        )
    except KeyError as exc:
        raise SealError(f"{source} lacks {exc.args[0]!r}; is it a causal language model's config?") from None
