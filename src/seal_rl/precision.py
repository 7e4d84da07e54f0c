"""Which precision a model computes in on this machine: ``--dtype auto`` / ``model.dtype: auto``, and
bfloat16 mixed precision (``grpo.bf16``, ``warm_start.sft.bf16``), ``auto`` resolved.

One rule for both: bfloat16 is used where the device computes it natively — a CUDA GPU, or a CPU that
reports AMX-BF16 or AVX512-BF16 — and float32 otherwise. Without those instructions torch's bfloat16
matrix products run through converting fallbacks: on an AVX2-only AMD EPYC one `seal eval` episode of
Qwen2.5-Coder-0.5B took 13 min 17 s in bfloat16 and 3 min 59 s in float32 (issue 57, docs/guides/evaluate.md).

On a GPU, bf16 is TRL's (transformers') mixed precision. On a CPU it is torch's CPU autocast with
float32 master weights, which pays only where the CPU has bfloat16 matrix instructions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

BF16_CPU_FEATURES = ("amx_bf16", "avx512_bf16")
"""CPU features whose bfloat16 matrix products make bfloat16 pay (``torch.cpu.get_capabilities()``)"""

ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")
"""``ONEDNN_MAX_CPU_ISA`` values that keep torch's oneDNN bfloat16 matrix products from the CPU's
bfloat16 instructions (oneDNN's ISA names below ``AVX512_CORE_BF16``): with one set, the CPU computes
bfloat16 as an AVX2-only CPU does, whatever it reports (the suite's "slower kind" is measured so)"""

HALF_DTYPES = ("bfloat16", "float16")
"""checkpoint dtypes that ``auto`` replaces with float32 on a CPU without native bfloat16"""


def native_bf16(*, cuda: bool | None = None, capabilities: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Whether this machine (or the one described: ``cuda``, CPU ``capabilities``) computes bfloat16
    natively, and why, in words: a CUDA GPU that supports it, or a CPU with :data:`BF16_CPU_FEATURES`."""
    try:
        import torch
    except ImportError:  # the torch-free core: nothing computes here (loading a model says what to install)
        return False, "torch is not installed"

    cuda = torch.cuda.is_available() if cuda is None else cuda
    if cuda:
        on = torch.cuda.is_bf16_supported() if torch.cuda.is_available() else True
        return on, f"the GPU {'supports' if on else 'lacks'} bfloat16"
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if capabilities is None and limit in ONEDNN_ISAS_WITHOUT_BF16:
        return False, f"ONEDNN_MAX_CPU_ISA={limit} keeps torch from this CPU's bfloat16 instructions"
    if capabilities is None:
        try:
            capabilities = torch.cpu.get_capabilities()
        except Exception:  # an older torch or an unknown CPU: no claim
            capabilities = {}
    found = [f for f in BF16_CPU_FEATURES if capabilities.get(f)]
    if found:
        return True, f"this CPU reports {' and '.join(f.upper().replace('_', '-') for f in found)}"
    return False, "this CPU reports neither AMX-BF16 nor AVX512-BF16"


def checkpoint_dtype(path: str | Path) -> str:
    """The dtype a model directory's weights are stored in (its ``config.json``'s ``dtype``, or
    ``torch_dtype`` before transformers 5); ``float32`` when it says none (transformers' default)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    return str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")


def resolve_dtype(setting: str, checkpoint: str, *, cuda: bool | None = None, capabilities: dict[str, Any] | None = None,
                  name: str = "--dtype") -> tuple[str, str]:  # fmt: skip
    """The dtype a model is loaded in for ``setting`` (``auto`` or an explicit dtype, which always
    wins), given the ``checkpoint``'s dtype, and the line a run prints about it. ``auto``: the
    checkpoint's dtype where the device computes it natively (:func:`native_bf16`), float32 for a
    bfloat16 or float16 checkpoint on a CPU that does not."""
    if setting != "auto":
        return setting, f"{name} {setting}"
    if checkpoint not in HALF_DTYPES:
        return checkpoint, f"{name} auto: {checkpoint} (the checkpoint's)"
    native, why = native_bf16(cuda=cuda, capabilities=capabilities)
    if native:
        return checkpoint, f"{name} auto: {checkpoint}, the checkpoint's — {why}"
    return "float32", (f"{name} auto: float32, not the checkpoint's {checkpoint} — {why}, where {checkpoint} runs "
                       f"several times slower (--dtype {checkpoint} forces it)")  # fmt: skip


def resolve_bf16(setting: Any, *, cuda: bool | None = None, capabilities: dict[str, Any] | None = None,
                 name: str = "grpo.bf16") -> tuple[bool, str]:  # fmt: skip
    """``grpo.bf16`` (or the setting ``name``, e.g. ``warm_start.sft.bf16``) on this machine (or on
    the one described: ``cuda``, CPU ``capabilities``), and the line ``seal train`` prints about it."""
    import torch

    cuda = torch.cuda.is_available() if cuda is None else cuda
    if setting is not True and setting is not False:  # auto
        on, why = native_bf16(cuda=cuda, capabilities=capabilities)
        if cuda:
            return on, f"{name} auto: {'on' if on else 'off'} ({why})"
        if on:
            return True, f"{name} auto: on — {why}: bfloat16 autocast with float32 master weights"
        return False, f"{name} auto: off — {why} (autocast would be slower)"
    where = "GPU" if cuda else "CPU autocast, float32 master weights"
    return setting, f"{name} {'on' if setting else 'off'}" + (f" ({where})" if setting else "")


def training_dtype(setting: str, checkpoint: str, bf16: bool, *, cuda: bool | None = None,
                   capabilities: dict[str, Any] | None = None, name: str = "model.dtype") -> tuple[str, str]:  # fmt: skip
    """The dtype ``seal train`` / ``seal sft`` load the weights in for ``model.dtype`` (``setting``),
    with ``bf16`` the resolved mixed precision (:func:`resolve_bf16`), and the line said at start.
    CPU autocast keeps float32 master weights, so ``auto`` under it is float32 (a bfloat16 checkpoint
    would otherwise train in pure bfloat16); otherwise ``auto`` is :func:`resolve_dtype`'s."""
    import torch

    cuda = torch.cuda.is_available() if cuda is None else cuda
    if setting == "auto" and bf16 and not cuda:
        return "float32", f"{name} auto: float32 master weights under CPU autocast"
    return resolve_dtype(setting, checkpoint, cuda=cuda, capabilities=capabilities, name=name)
