"""bfloat16 mixed precision on this machine: ``grpo.bf16`` and ``warm_start.sft.bf16``, ``auto`` resolved.

On a GPU, bf16 is TRL's (transformers') mixed precision. On a CPU it is torch's CPU autocast with
float32 master weights, which pays only where the CPU has bfloat16 matrix instructions.
"""

from __future__ import annotations

from typing import Any

BF16_CPU_FEATURES = ("amx_bf16", "avx512_bf16")
"""CPU features whose bfloat16 matrix products make autocast pay (``torch.cpu.get_capabilities()``)"""


def resolve_bf16(setting: Any, *, cuda: bool | None = None, capabilities: dict[str, Any] | None = None,
                 name: str = "grpo.bf16") -> tuple[bool, str]:  # fmt: skip
    """``grpo.bf16`` (or the setting ``name``, e.g. ``warm_start.sft.bf16``) on this machine (or on
    the one described: ``cuda``, CPU ``capabilities``), and the line ``seal train`` prints about it."""
    import torch

    cuda = torch.cuda.is_available() if cuda is None else cuda
    if setting is not True and setting is not False:  # auto
        if cuda:
            on = torch.cuda.is_bf16_supported() if torch.cuda.is_available() else True
            return on, f"{name} auto: {'on' if on else 'off'} (the GPU {'supports' if on else 'lacks'} bfloat16)"
        if capabilities is None:
            try:
                capabilities = torch.cpu.get_capabilities()
            except Exception:  # an older torch or an unknown CPU: no claim, no autocast
                capabilities = {}
        found = [f for f in BF16_CPU_FEATURES if capabilities.get(f)]
        if found:
            return True, (f"{name} auto: on — this CPU reports {' and '.join(f.upper().replace('_', '-') for f in found)}: "
                          "bfloat16 autocast with float32 master weights")  # fmt: skip
        return False, f"{name} auto: off — this CPU reports neither AMX-BF16 nor AVX512-BF16 (autocast would be slower)"
    where = "GPU" if cuda else "CPU autocast, float32 master weights"
    return setting, f"{name} {'on' if setting else 'off'}" + (f" ({where})" if setting else "")
