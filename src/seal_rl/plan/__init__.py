"""``seal plan``: will a training recipe fit on N GPUs, and how long will a round take? (estimates)

Everything here is arithmetic on a model's config numbers and the recipe; nothing is loaded or
measured. Memory is per GPU, in bytes, itemised; docs/guides/planning.md gives every formula, its source
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
* time per round is FLOPs at an assumed MFU plus generated tokens at a decode roofline;
* with generation servers on M of the N GPUs (``seal plan --server-gpus M``), the servers are sized
  with the same vLLM arithmetic, the other N − M GPUs train with no engine on them, and a round
  costs generation + update + weight sync in series (``staleness: 0``) or max(generation, update) +
  weight sync (``staleness >= 1``), next to the colocated plan on all N.
* with ``model.lora`` only the adapters train (rank x (in + out) per adapted linear layer, in float32
  with their gradients and Adam state), the base weights are frozen and the KL reference is the same
  model with the adapters off (no copy), under plain data parallel only.

``device="cpu"`` plans a run on the host instead (what ``seal train`` checks on a machine without
CUDA, :mod:`seal_rl.fit`): the same terms in host RAM, with the precision torch actually trains in on
CPU (no DeepSpeed mixed-precision master copy).

The concepts: the model's shape (``shapes``: presets and ``config.json``); the memory and time
model (``memory``: each memory term in bytes; ``estimate``: the :class:`Plan` of a recipe, with its
run length and time per round; ``lora``: what ``model.lora`` trains); the micro-batch ``auto`` chooses (``micro_batch``); generation
servers on their own GPUs (``split``: the :class:`Split` of N GPUs into servers and trainers); and
the rendering of the answer (``render``).
"""

from seal_rl.plan.estimate import (
    Assumptions, MemoryLine, Plan, decode_tokens_per_s, estimate, forward_flops_per_token, forward_passes, launch_strategy,
    run_length,
)  # fmt: skip
from seal_rl.plan.memory import (
    DEVICES, DTYPE_BYTES, STRATEGIES, TRL_TOKEN_CHUNK, TRL_VOCAB_CHUNK, VLLM_DTYPE_BYTES, GiB, ModelStates, Precision, VLLMPlan,
    backbone_activation_bytes, gathered_parameter_bytes, kv_cache_bytes_per_token, layer_activation_bytes_per_token,
    lm_head_bytes, materialised_logits_bytes, model_states, precision, vllm_engine,
)  # fmt: skip
from seal_rl.plan.render import render, render_split
from seal_rl.plan.shapes import PRESET_PREFIX, PRESETS, SUPPORTED_MODEL_TYPES, ModelShape, model_shape, shape_from_config
from seal_rl.plan.split import Servers, Split, estimate_split, size_servers

__all__ = [
    "DEVICES", "DTYPE_BYTES", "PRESETS", "PRESET_PREFIX", "STRATEGIES", "SUPPORTED_MODEL_TYPES", "TRL_TOKEN_CHUNK",
    "TRL_VOCAB_CHUNK", "VLLM_DTYPE_BYTES", "Assumptions", "GiB", "MemoryLine", "ModelShape", "ModelStates", "Plan",
    "Precision", "Servers", "Split", "VLLMPlan", "backbone_activation_bytes", "decode_tokens_per_s", "estimate", "estimate_split",
    "forward_flops_per_token",
    "forward_passes", "gathered_parameter_bytes", "kv_cache_bytes_per_token", "launch_strategy",
    "layer_activation_bytes_per_token", "lm_head_bytes", "materialised_logits_bytes", "model_shape", "model_states",
    "precision", "render", "render_split", "run_length", "shape_from_config", "size_servers", "vllm_engine",
]  # fmt: skip
