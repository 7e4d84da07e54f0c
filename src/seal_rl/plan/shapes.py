"""Model shapes for ``seal plan``: the config numbers of a decoder, from a preset or a ``config.json``.

:class:`ModelShape` holds what the estimates need (layers, widths, heads, vocabulary, biases,
dtype) and counts the parameters Ψ; :data:`PRESETS` are published configs, named in a recipe as
``model.path=preset:NAME``, so a plan needs no weights on disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from seal_rl.errors import SealError

PRESET_PREFIX = "preset:"


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
    # config.json of Qwen/Qwen3-8B (its per-head q/k norms, 9,216 parameters, are not counted)
    "qwen3-8b": ModelShape(hidden_size=4096, num_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                           intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False,
                           max_position_embeddings=40960),
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
