"""LoRA adapters through SEAL training (``model.lora``): the recipe block, its checks, and what a
run with adapters saves.

With ``model.lora`` set, ``seal train`` hands TRL's ``GRPOTrainer`` a PEFT ``LoraConfig``: TRL wraps
the model, trains only the adapter tensors and computes the reference log-probabilities with the
adapters disabled (the base model; no second copy). Every seal-rl path then sees a ``PeftModel``:
the shared-prefix update, A-Patch, turn credit and bf16 change nothing in it; the weights pushed
to a vLLM engine or generation server are the merged ones, computed here without touching the
base weights (:func:`merged_tensors`; PEFT's merge-then-unmerge would leave float rounding in the
base weights at every sync). Checkpoints hold the adapter and its optimizer state only; ``model/``
holds the merged model, a plain model directory that every reader takes (``seal eval --policy
hf:``, ``seal train --set model.path=``, ``vllm serve``), and ``model/adapter/`` the adapter alone.
``lora.json`` records the base model's fingerprint, so resuming on another base is one line.

A LoRA warm start (``model.lora.warm_start``) trains the adapter in SFT (:func:`seal_rl.sft.run_sft`
takes the PEFT config), and RL continues that adapter (:func:`warm_adapter`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seal_rl.errors import SealError

LORA_FILE = "lora.json"
"""the run's adapter settings and its base model's fingerprint (:func:`record_base`)"""
ADAPTER_DIR = "adapter"
"""``model/adapter`` (and ``best/adapter``): the trained adapter alone, beside the merged model"""


@dataclass
class LoraSettings:
    """``model.lora``: train LoRA adapters instead of every weight (absent or null: full fine-tuning)."""

    rank: int = 8
    """r, the adapters' rank"""
    alpha: float | None = None
    """lora_alpha (the update is scaled by alpha / rank); null: 2 x rank"""
    dropout: float = 0.0
    """dropout on the adapters' input (0: the update is deterministic, as full fine-tuning's)"""
    target_modules: Any = "all-linear"
    """which layers get an adapter: ``all-linear`` (every linear layer but the output head), a list
    of module names (``[q_proj, v_proj]``: a layer whose name ends with one), or one regular
    expression matched against the whole module name"""
    warm_start: bool = True
    """with a warm start (``warm_start.data``): true trains the same adapter there (SFT), and RL goes
    on with it on the base model, against the warm-started adapter as its reference; false fine-tunes
    every weight in the warm start and RL starts a fresh adapter on the warm-started model"""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise SealError(f"model.lora.rank must be a whole number >= 1, got {self.rank!r}.")
        if self.alpha is not None and not self.alpha > 0:
            raise SealError(f"model.lora.alpha must be > 0 (or null: 2 x rank), got {self.alpha!r}.")
        if not 0 <= self.dropout < 1:
            raise SealError(f"model.lora.dropout must be in [0, 1), got {self.dropout!r}.")
        targets = self.target_modules
        if isinstance(targets, (list, tuple)):
            targets = self.target_modules = list(targets)
        if not (isinstance(targets, str) and targets) and not (
                isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)):  # fmt: skip
            raise SealError(f"model.lora.target_modules must be all-linear, a list of module names or a regular expression, "
                            f"got {self.target_modules!r}.")  # fmt: skip


def check_recipe(recipe: Any) -> None:
    """What cannot run with adapters: one line, before anything starts."""
    if recipe.model.lora is None:
        return
    if recipe.grpo.extra.get("sync_ref_model"):
        raise SealError("model.lora with grpo.extra.sync_ref_model: the reference is the base model with the adapters "
                        "disabled, which has no weights of its own to sync; drop sync_ref_model or model.lora.")  # fmt: skip


def check_launch(environ: dict[str, str]) -> None:
    """LoRA on sharded weights (FSDP, DeepSpeed ZeRO) is not supported yet: one line, nothing starts."""
    for variable, name in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if environ.get(variable, "").lower() == "true":
            raise SealError(f"model.lora is not supported under {name} yet (its checkpoints, saved model and weight syncs "
                            "would hold sharded adapter names): launch without it (one process, or plain data parallel "
                            "with accelerate launch --multi_gpu), or train without model.lora.")  # fmt: skip


def peft_config(settings: LoraSettings, model: Any) -> Any:
    """PEFT's ``LoraConfig`` for ``model``; a :class:`SealError` naming the model's linear layers when
    ``target_modules`` matches none of them."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha if settings.alpha is not None else 2 * settings.rank,
                        lora_dropout=settings.dropout, target_modules=settings.target_modules, bias="none",
                        task_type="CAUSAL_LM")  # fmt: skip
    linear = linear_layers(model)
    if settings.target_modules != "all-linear" and not any(check_target_module_exists(config, name) for name in linear):
        kinds = sorted({name.rsplit(".", 1)[-1] for name in linear})
        raise SealError(f"model.lora.target_modules {settings.target_modules!r} matches none of the model's linear layers; "
                        f"they are named {', '.join(kinds)} (or use all-linear).")  # fmt: skip
    return config


def linear_layers(model: Any) -> list[str]:
    """The names of the model's linear layers, the output head left out (what ``all-linear`` adapts)."""
    import torch

    head = model.get_output_embeddings()
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear) and module is not head]


def base_fingerprint(model_path: str | Path) -> str:
    """An identity of a model directory's weights, cheap for a 15 GB model: sha256 over config.json
    and, per weight file, its name, size and three 1 MiB samples (start, middle, end)."""
    path, digest = Path(model_path), hashlib.sha256()
    digest.update((path / "config.json").read_bytes())
    for weights in sorted([*path.glob("*.safetensors"), *path.glob("*.bin")]):
        size = weights.stat().st_size
        digest.update(f"{weights.name}:{size}".encode())
        with open(weights, "rb") as handle:
            for at in sorted({0, max(0, size // 2 - 2**19), max(0, size - 2**20)}):
                handle.seek(at)
                digest.update(handle.read(2**20))
    return digest.hexdigest()


def check_resume(out: Path, settings: LoraSettings | None) -> None:
    """A run resumed with adapters if and only if it started with them (``lora.json``): one line."""
    started = (Path(out) / LORA_FILE).exists()
    if started and settings is None:
        raise SealError(f"{out} trains LoRA adapters (lora.json; its checkpoints hold only the adapter): resume it with "
                        "its model.lora settings, not without them.")  # fmt: skip
    if not started and settings is not None and any((Path(out) / "checkpoints").glob("checkpoint-*")):
        raise SealError(f"{out} fine-tunes every weight (its checkpoints hold the whole model): resume it without "
                        "model.lora, or start a new run with it.")  # fmt: skip


def record_base(out: Path, settings: LoraSettings, model_path: str, *, resume: bool) -> None:
    """Write ``lora.json`` (the adapter settings, the base model and its fingerprint); when resuming,
    a :class:`SealError` if the run's adapter was trained on another base."""
    from dataclasses import asdict

    now = {"base": str(model_path), "base_fingerprint": base_fingerprint(model_path), "lora": asdict(settings)}
    file = Path(out) / LORA_FILE
    if resume and file.exists():
        before = json.loads(file.read_text())
        if before.get("base_fingerprint") != now["base_fingerprint"]:
            raise SealError(f"{out} trained its adapter on the base model {before.get('base')} (fingerprint "
                            f"{str(before.get('base_fingerprint'))[:12]}), but this resume loads {model_path} "
                            f"({now['base_fingerprint'][:12]}): resume on the same base model.")  # fmt: skip
        if before.get("lora") != now["lora"]:
            raise SealError(f"{out} trained an adapter with model.lora {before.get('lora')}; this resume asks for "
                            f"{now['lora']}: resume with the run's own settings.")  # fmt: skip
    file.write_text(json.dumps(now, indent=1) + "\n")


def warm_adapter(settings: LoraSettings | None, warm_model: Path) -> Path | None:
    """The warm start's adapter that RL continues on the base model (``model.lora.warm_start``), or
    None: no LoRA, or a warm start that fine-tuned every weight (RL then starts on ``warm_model``)."""
    adapter = Path(warm_model) / ADAPTER_DIR
    if settings is None or not settings.warm_start or not (adapter / "adapter_config.json").exists():
        return None
    return adapter


def load_adapter(model: Any, adapter: Path) -> Any:
    """``model`` (the base) with a saved adapter, trainable: TRL keeps a frozen copy as the reference."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)


def is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def merged_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """The PEFT model's parameters with the active adapters merged, under the base model's own names
    (``model.layers.0.self_attn.q_proj.weight``), one tensor at a time, a tied weight once; the
    model is not changed (each adapted weight is W + its adapters' delta, a new tensor)."""
    import torch
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, Any] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.disable_adapters:
            active = [a for a in module.active_adapters if a in module.lora_A]
            if active:
                deltas[f"{name}.weight"] = (module, active)
    with torch.no_grad():
        for name, parameter in base.named_parameters():  # a tied weight once (safetensors and vLLM refuse shared tensors)
            if ".lora_" in name or "lora_magnitude_vector" in name:
                continue
            tensor = parameter.detach()
            plain = name.replace(".base_layer.", ".")
            if plain in deltas and name.endswith(".base_layer.weight"):
                module, active = deltas[plain]
                merged = tensor.clone()
                for adapter in active:
                    merged += module.get_delta_weight(adapter).to(merged.dtype)
                tensor = merged
            yield plain, tensor


def save_merged(model: Any, tokenizer: Any, path: Path, adapter_path: Path | None = None) -> None:
    """``path``: the merged model as a plain model directory (weights, config, tokenizer);
    ``adapter_path``: the adapter alone (PEFT's ``save_pretrained``). The model is not changed."""
    path = Path(path)
    base = model.get_base_model()
    base.save_pretrained(str(path), state_dict=dict(merged_tensors(model)))
    tokenizer.save_pretrained(str(path))
    if adapter_path is not None:
        model.save_pretrained(str(adapter_path), selected_adapters=[model.active_adapter])  # not TRL's "ref" copy
        tokenizer.save_pretrained(str(adapter_path))


def install_merged_sync(generation: Any) -> bool:
    """Make a TRL ``VLLMGeneration`` (or seal's server weights) push merged weights computed by
    :func:`merged_tensors` instead of merging the adapters into the base weights and unmerging
    them again; return whether it did (a PEFT model)."""
    if not is_peft(generation.model):
        return False

    def named() -> Iterator[tuple[str, Any]]:
        for name, tensor in merged_tensors(generation.model):
            yield generation._fix_param_name_to_vllm(name), tensor

    generation._iter_named_params = named
    return True


def adapters_off(model: Any) -> bool:
    """Whether a PEFT model is in TRL's reference pass: its adapters disabled (a fresh adapter's
    reference, the base model) or its frozen ``ref`` copy active (a warm-started adapter's)."""
    return is_peft(model) and (bool(getattr(model, "_adapters_disabled", False)) or model.active_adapter == "ref")


def find_adapter(path: Path) -> tuple[Path, Path | None]:
    """The adapter directory ``path`` names, and the ``lora.json`` of its run (None outside a run):
    an adapter directory itself (``checkpoints/checkpoint-K``, ``model/adapter``), or a run directory
    (its newest checkpoint's adapter, else ``model/adapter``). A :class:`SealError` otherwise."""
    path = Path(path)
    if (path / "adapter_config.json").exists():
        run = next((p for p in (path.parent.parent, path.parent) if (p / LORA_FILE).exists()), None)
        return path, run / LORA_FILE if run else None
    if (path / LORA_FILE).exists():
        checkpoints = sorted((path / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[-1]))
        found = [p for p in [*reversed(checkpoints), path / "model" / ADAPTER_DIR] if (p / "adapter_config.json").exists()]
        if found:
            return found[0], path / LORA_FILE
        raise SealError(f"{path} is a LoRA run with no adapter saved yet (no checkpoint, no model/adapter): train it first.")
    raise SealError(f"{path} holds no LoRA adapter: give a run trained with model.lora, one of its checkpoints "
                    "(RUN/checkpoints/checkpoint-K) or an adapter directory (with adapter_config.json).")  # fmt: skip


def merge_adapter(path: Path, out: Path, base: str | None = None) -> tuple[Path, str]:
    """Write ``out``: the base model with the adapter ``path`` names (:func:`find_adapter`) merged in,
    a plain model directory for serving (``vllm serve``, ``seal eval --policy hf:``/``vllm:``).
    The base is ``base`` or the one the run's ``lora.json`` records; a base whose fingerprint is not
    the recorded one is a :class:`SealError`. Returns the adapter merged and the base used."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter, record_file = find_adapter(path)
    record = json.loads(record_file.read_text()) if record_file else {}
    base = base or record.get("base")
    if not base:
        raise SealError(f"{adapter} is not inside a LoRA run (no lora.json names its base model): give --base MODEL_DIR.")
    if not (Path(base) / "config.json").exists():
        raise SealError(f"The base model {base} is not a model directory (no config.json): give --base MODEL_DIR.")
    if record.get("base_fingerprint") and base_fingerprint(base) != record["base_fingerprint"]:
        raise SealError(f"{base} is not the base model this adapter was trained on ({record.get('base')}, fingerprint "
                        f"{record['base_fingerprint'][:12]}): give that model as --base.")  # fmt: skip
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise SealError(f"{out} already exists and is not empty: choose another --out.")
    tokenizer_dir = adapter if (adapter / "tokenizer_config.json").exists() else base
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype="auto"), str(adapter))
    save_merged(model, AutoTokenizer.from_pretrained(tokenizer_dir), out)
    return adapter, str(base)
