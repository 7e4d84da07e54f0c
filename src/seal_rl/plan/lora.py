"""LoRA adapters in ``seal plan`` (``model.lora``): what they train and what they change in the memory.

PEFT adds two matrices to each adapted linear layer of ``in`` x ``out`` features: ``lora_A`` (rank x
in) and ``lora_B`` (out x rank), so it trains rank x (in + out) parameters there (``bias="none"``, as
:func:`seal_rl.train.lora.peft_config` asks). ``all-linear`` adapts every linear layer of every
decoder layer (q, k, v, o, gate, up, down) and neither the output head nor the embeddings.

Everything else follows from what TRL 1.16 does with a ``peft_config`` outside ZeRO-3: the base
weights stay as loaded and frozen (no gradients, no optimizer state); PEFT's default
``autocast_adapter_dtype=True`` keeps the adapters in float32, so each trainable parameter has a
float32 weight, a float32 gradient and Adam's two float32 moments (4 + 4 + 8 bytes, no separate
master copy); the KL reference is the same model with the adapters disabled (no second copy of the
weights; after a LoRA warm start, a frozen copy of the warm-started adapter); and the fused LM head,
frozen, computes no weight gradient. seal-rl runs LoRA under plain data parallel only
(:func:`seal_rl.train.lora.check_launch`), so the plan refuses the other strategies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from seal_rl.errors import SealError
from seal_rl.plan.shapes import ModelShape

if TYPE_CHECKING:
    from seal_rl.train.lora import LoraSettings

ADAPTER_BYTES = 4
"""float32 adapters (PEFT's ``autocast_adapter_dtype=True``, which TRL keeps outside ZeRO-3)"""
ADAPTER_GRAD_BYTES = 4
ADAPTER_ADAM_BYTES = 8
"""Adam's exp_avg and exp_avg_sq in the adapters' float32"""
ALL_LINEAR = "all-linear"


def linear_features(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of one decoder layer, by the name transformers gives
    it in Llama, Mistral, Qwen2 and Qwen3, and of the output head (``lm_head``)."""
    h, q, kv, i = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h), "lm_head": (h, shape.vocab_size)}  # fmt: skip


@dataclass(frozen=True)
class LoraPlan:
    """What ``model.lora`` trains: its rank, the layers it adapts and their adapter parameters Φ."""

    rank: int
    targets: str
    """the adapted layers as the plan counted them (``all-linear`` or the names)"""
    trainable: int
    """Φ: adapter parameters, rank x (in + out) summed over the adapted layers"""
    reference_adapter: bool
    """a LoRA warm start: TRL keeps a frozen copy of the warm-started adapter as the KL reference"""
    notes: tuple[str, ...] = ()


def lora_plan(settings: LoraSettings, shape: ModelShape, strategy: str, *, warm_adapter: bool = False) -> LoraPlan:
    """Count the adapters of ``settings`` on ``shape``; a :class:`SealError` for what seal-rl does not run
    (LoRA under ZeRO or FSDP) or the plan cannot count (a Mixture-of-Experts model, a name it does not know)."""
    if strategy != "ddp":
        raise SealError(f"model.lora under --strategy {strategy}: seal train runs LoRA under plain data parallel only "
                        "(not DeepSpeed ZeRO or FSDP, docs/guides/lora.md); plan it with --strategy ddp.")  # fmt: skip
    if shape.num_experts > 1:
        raise SealError("seal plan does not count LoRA adapters on a Mixture-of-Experts model yet (which expert tensors "
                        "PEFT adapts depends on the model's layout); plan it without model.lora.")  # fmt: skip
    features = linear_features(shape)
    targets, notes = settings.target_modules, []
    if isinstance(targets, str):
        if targets != ALL_LINEAR:
            notes.append(f"model.lora.target_modules is a regular expression ({targets!r}): counted as all-linear, an "
                         "upper bound on what it adapts.")  # fmt: skip
        names, described = [n for n in features if n != "lm_head"], ALL_LINEAR
    else:
        unknown = [t for t in targets if t not in features]
        if unknown:
            raise SealError(f"seal plan counts LoRA on the linear layers {', '.join(features)}; model.lora.target_modules "
                            f"names {', '.join(map(str, unknown))}.")  # fmt: skip
        names, described = list(dict.fromkeys(targets)), ", ".join(dict.fromkeys(targets))
    r = settings.rank
    per_layer = sum(r * sum(features[n]) for n in names if n != "lm_head")
    trainable = shape.num_layers * per_layer + (r * sum(features["lm_head"]) if "lm_head" in names else 0)
    return LoraPlan(rank=r, targets=described, trainable=trainable, reference_adapter=warm_adapter, notes=tuple(notes))
