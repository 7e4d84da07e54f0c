"""The GPU check's measurements that run in a process of their own (``seal doctor --gpu``'s checks
``environment``, ``update`` and ``generate``; ``server_round`` is :mod:`seal_rl.doctor.server_round`).

:mod:`seal_rl.doctor.gpu_check` starts each as ``python -m seal_rl.doctor.probes NAME WORK [--cpu]``;
the check writes its figures to ``WORK/NAME.json`` with ``passed`` and ``why_not``. What each
measures is told in :mod:`seal_rl.doctor.gpu_check`'s docstring.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 2**30
MAX_LOGP_DELTA = 0.5
"""check ``update`` fails when the paths' log-probabilities differ by more (bf16 noise is ~0.15 on sharp toy models)"""


QWEN25_1_5B = {  # config.json of Qwen/Qwen2.5-1.5B-Instruct: the numbers that size it (the weights here are random)
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 1536, "intermediate_size": 8960,
    "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "torch_dtype": "bfloat16",
}  # fmt: skip
TINY_QWEN2 = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
    "max_position_embeddings": 4096, "rope_theta": 1000000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "torch_dtype": "float32",
}  # fmt: skip


@dataclass(frozen=True)
class Shapes:
    """The model and batch of the checks `update` and `generate`."""

    name: str
    config: dict[str, Any]
    """config.json values; the weights are random"""
    prompt_tokens: int
    """the group's shared prompt"""
    completion_tokens: tuple[int, ...]
    """one completion length per sample: G = len"""
    new_tokens: int
    """tokens `generate` generates per sequence"""

    @property
    def group(self) -> int:
        return len(self.completion_tokens)


GPU_SHAPES = Shapes("qwen2.5-1.5b (random weights)", QWEN25_1_5B, 6144, (4096, 3584, 3072, 2560, 2048, 1536, 1024, 512), 256)
"""the paper's shapes: a ~6k-token prompt (system prompt, tool docs, first question), G = 8, completions up to 4k"""
CPU_SHAPES = Shapes("tiny qwen2 (random weights)", TINY_QWEN2, 64, (32, 26, 20, 14), 32)


# -- the checks ----------------------------------------------------------------------------------


def check_environment(cpu: bool) -> dict[str, Any]:
    """Versions, the GPU, and where TRL and datasets are imported from."""
    import platform

    import torch

    import datasets
    import seal_rl.env  # noqa: F401  (the core: it must import on the node)
    import seal_rl.train  # noqa: F401  (the trainer: TRL, transformers, accelerate)
    import trl
    from seal_rl.doctor.facts import gpus, version

    packages = ("torch", "transformers", "trl", "accelerate", "datasets", "pyarrow", "fsspec", "huggingface-hub", "numpy",
                "pandas", "tokenizers", "safetensors", "omegaconf", "pydantic", "jsonschema", "typer", "rich", "bfcl-eval")  # fmt: skip
    devices = gpus()["devices"]
    gpu = {**devices[0], "count": len(devices), "bf16": torch.cuda.is_bf16_supported()} if devices else None
    passed = cpu or gpu is not None
    return {"passed": passed, "why_not": None if passed else "torch sees no CUDA device", "python": platform.python_version(),
            "executable": sys.executable, "cuda": torch.version.cuda, "gpu": gpu, "versions": {n: version(n) for n in packages},
            "imported_from": {"trl": str(Path(trl.__file__).parent), "datasets": str(Path(datasets.__file__).parent)}}  # fmt: skip


def _config_dir(shapes: Shapes, work: Path) -> Path:
    """The configuration as a model directory's ``config.json``: transformers builds the model from it and
    ``seal plan`` reads the same file."""
    folder = work / "model-config"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(shapes.config, indent=1))
    return folder


def _device_memory_gib(cpu: bool) -> float:
    """What the plan is given as the device's memory: the GPU's, or the host's RAM."""
    if cpu:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GiB
    import torch

    return torch.cuda.get_device_properties(0).total_memory / GiB


def _random_model(folder: Path, device: str, dtype: Any) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):  # initialised on the device: a 1.5B model's CPU init alone would take a minute
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype, attn_implementation="sdpa")


def _plan(folder: Path, shapes: Shapes, *, device: str, memory_gib: float, shared_prefix: bool, completion: int,
          new_tokens: int) -> Any:  # fmt: skip
    """``seal plan``'s estimate for one GPU (or one CPU process), micro-batch = the whole group, checkpointing on."""
    from seal_rl.plan import estimate
    from seal_rl.train import load_recipe

    g = shapes.group
    recipe = load_recipe("smoke-cpu", [
        f"model.path={folder}", "model.dtype=auto", "model.gradient_checkpointing=true",
        f"budgets.max_prompt_tokens={shapes.prompt_tokens}", f"budgets.max_completion_tokens={completion}",
        f"budgets.max_new_tokens={new_tokens}", f"grpo.num_generations={g}", "grpo.tasks_per_step=1",
        "grpo.tasks_per_update=1", f"grpo.per_device_train_batch_size={g}", "grpo.bf16=true", "grpo.beta=0",
        f"generation_batch={g}", f"concurrency={g}", f"shared_prefix={str(shared_prefix).lower()}",
    ])  # fmt: skip
    return estimate(recipe, gpus=1, gpu_memory_gb=memory_gib, strategy="ddp", num_tasks=1, device=device)


UPDATE_LINES = ("weights", "gradients", "activations", "tree attention", "LM-head")
"""the plan's memory lines that the measured update holds (not the optimizer's state, the reference
model or the generation's KV cache: no optimizer step, beta = 0, no generation here)"""


def check_update(cpu: bool, work: Path) -> dict[str, Any]:
    """Check `update`: both paths' passes over one group at the shapes (:mod:`seal_rl.doctor.gpu_check`)."""
    from collections import Counter
    from types import SimpleNamespace

    import torch
    from accelerate import Accelerator
    from trl.trainer.utils import add_fused_lm_head

    from seal_rl.train.trainer import make_trainer_class

    shapes, device = (CPU_SHAPES, "cpu") if cpu else (GPU_SHAPES, "cuda")
    folder = _config_dir(shapes, work)
    model = _random_model(folder, device, getattr(torch, shapes.config["torch_dtype"]))
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    trainer = object.__new__(make_trainer_class())  # the real methods, without a dataset or a run
    trainer.accelerator = Accelerator(cpu=cpu, mixed_precision="bf16")
    trainer.seal = SimpleNamespace(recipe=SimpleNamespace(shared_prefix=True), tokens=Counter(), timing=Counter())
    trainer.ref_model = None

    vocab = shapes.config["vocab_size"]
    draw = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (shapes.prompt_tokens,), generator=draw)
    batch = _trl_batch(prompt, [torch.randint(0, vocab, (n,), generator=draw) for n in shapes.completion_tokens], device)
    warm = _trl_batch(prompt[:16], [torch.randint(0, vocab, (n,), generator=draw) for n in (8, 5)], device)
    memory_gib = _device_memory_gib(cpu)
    found: dict[str, Any] = {"model": shapes.name, "parameters": sum(p.numel() for p in model.parameters()),
                             "prompt_tokens": shapes.prompt_tokens, "completion_tokens": list(shapes.completion_tokens),
                             "held_tokens": batch["held"], "padded_tokens": batch["ids"].numel(),
                             "weights_dtype": shapes.config["torch_dtype"], "autocast": "bf16",
                             "gradient_checkpointing": True}  # fmt: skip
    old = {}
    for path, shared in (("shared", True), ("trl", False)):
        trainer.seal.recipe.shared_prefix = shared
        _update_passes(trainer, model, warm, device)  # kernels, cuBLAS handles and (shared) the probe, before timing
        plan = _plan(folder, shapes, device=device, memory_gib=memory_gib, shared_prefix=shared,
                     completion=max(shapes.completion_tokens), new_tokens=max(shapes.completion_tokens))  # fmt: skip
        lines = {line.name: line.bytes for line in plan.memory}
        planned = {"plan_update_gib": sum(b for n, b in lines.items() if n.startswith(UPDATE_LINES)) / GiB,
                   "plan_total_gib": plan.training_bytes / GiB, "plan_lines_gib": {n: b / GiB for n, b in lines.items()},
                   "plan_forwarded_tokens": plan.trained_tokens}  # fmt: skip  (the round is this one micro-batch)
        try:
            result, old[path] = _update_passes(trainer, model, batch, device)
            found[path] = {"status": "ok", **result, **planned}
        except torch.OutOfMemoryError as exc:
            peak = torch.cuda.max_memory_allocated() / GiB
            found[path] = {"status": "oom", "error": str(exc).splitlines()[0], "peak_gib_at_oom": peak, **planned}
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        if found[path]["status"] == "ok":
            found[path]["peak_vs_plan"] = (found[path]["peak_gib"] / planned["plan_update_gib"]) if found[path]["peak_gib"] else None
    completion = batch["completion_mask"].bool().cpu()
    delta = (old["shared"] - old["trl"]).abs()[completion].max().item() if len(old) == 2 else None
    found["max_abs_logp_delta"] = delta
    if "shared" in old and "trl" in old:
        found["speedup_policy"] = found["trl"]["policy_seconds"] / found["shared"]["policy_seconds"]
        found["speedup_no_grad"] = found["trl"]["no_grad_seconds"] / found["shared"]["no_grad_seconds"]
    why = []
    if found["shared"]["status"] != "ok":
        why.append(f"the shared-prefix path: {found['shared']['status']}")
    for path in old:
        if not (math.isfinite(found[path]["grad_norm"]) and torch.isfinite(old[path][completion]).all()):
            why.append(f"{path}: non-finite log-probabilities or gradients")
    if delta is not None and not delta <= MAX_LOGP_DELTA:
        why.append(f"the paths' log-probabilities differ by {delta:.3g} (> {MAX_LOGP_DELTA})")
    return {"passed": not why, "why_not": "; ".join(why) or None, **found}


def _trl_batch(prompt: Any, completions: list[Any], device: str) -> dict[str, Any]:
    """TRL's layout: prompts left-padded, completions right-padded, the completion the last columns."""
    import torch
    from trl.trainer.utils import pad

    prompts = [prompt] * len(completions)
    prompt_ids = pad(prompts, padding_value=0, padding_side="left")
    prompt_mask = pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left")
    completion_ids = pad(completions, padding_value=0, padding_side="right")
    completion_mask = pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right")
    return {"ids": torch.cat([prompt_ids, completion_ids], 1).to(device), "mask": torch.cat([prompt_mask, completion_mask], 1).to(device),
            "completion_mask": completion_mask.to(device), "held": sum(len(prompt) + len(c) for c in completions)}  # fmt: skip


def _update_passes(trainer: Any, model: Any, batch: dict[str, Any], device: str) -> tuple[dict[str, Any], Any]:
    """The old log-probabilities' no-grad pass, then the policy's forward and backward of an
    advantage-weighted token-mean loss; seconds, tokens, peak memory (CUDA) and the old log-probs."""
    from contextlib import ExitStack

    import torch

    cuda = device == "cuda"
    ids, mask, completion_mask = batch["ids"], batch["mask"], batch["completion_mask"]
    width, size = completion_mask.size(1), ids.size(0)
    advantages = torch.linspace(-1.0, 1.0, size, device=device)[:, None]
    loss_mask = completion_mask.float()
    trainer.seal.tokens.clear()
    model.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        old, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, width, size)
    if cuda:
        torch.cuda.synchronize()
    no_grad = time.perf_counter() - started
    started = time.perf_counter()
    trainer._seal_switched = set()
    try:
        with ExitStack() as trainer._seal_after_backward:  # as training_step holds it over the backward pass
            logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, width, size, compute_entropy=True)
            loss = -(advantages * logps * loss_mask).sum() / loss_mask.sum()
            loss.backward()
    finally:
        trainer._seal_after_backward = None
    if cuda:
        torch.cuda.synchronize()
    policy = time.perf_counter() - started
    grad_norm = float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)))
    kind = "update/old_logprobs"
    result = {
        "no_grad_seconds": no_grad, "policy_seconds": policy,
        "no_grad_tokens_per_s": batch["held"] / no_grad, "policy_tokens_per_s": batch["held"] / policy,
        "forwarded_tokens": trainer.seal.tokens[f"{kind}/forwarded"], "rows_tokens": trainer.seal.tokens[f"{kind}/rows"],
        "peak_gib": torch.cuda.max_memory_allocated() / GiB if cuda else None, "grad_norm": grad_norm, "loss": float(loss),
    }  # fmt: skip
    model.zero_grad(set_to_none=True)
    return result, old.detach().float().cpu()


def check_generate(cpu: bool, work: Path) -> dict[str, Any]:
    """Check `generate`: transformers ``generate`` from the shared prompt, greedy, exactly ``new_tokens`` each."""
    import torch

    shapes, device = (CPU_SHAPES, "cpu") if cpu else (GPU_SHAPES, "cuda")
    folder = _config_dir(shapes, work)
    model = _random_model(folder, device, torch.bfloat16).eval()
    g, n = shapes.group, shapes.new_tokens
    prompt = torch.randint(0, shapes.config["vocab_size"], (1, shapes.prompt_tokens), generator=torch.Generator().manual_seed(0))
    ids = prompt.repeat(g, 1).to(device)

    def timed(tokens: int, inputs: Any) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=tokens,
                                 min_new_tokens=tokens, do_sample=False, pad_token_id=0)  # fmt: skip
        if device == "cuda":
            torch.cuda.synchronize()
        if out.shape[1] != inputs.shape[1] + tokens:
            raise RuntimeError(f"generate returned {out.shape[1] - inputs.shape[1]} new tokens, not {tokens}")
        return time.perf_counter() - started

    timed(4, ids[:, :16])  # kernels and caches, before timing
    prefill = timed(1, ids)  # the prompt's forward and one token
    total = timed(n, ids)
    plan = _plan(folder, shapes, device=device, memory_gib=_device_memory_gib(cpu), shared_prefix=True, completion=n, new_tokens=n)
    a = plan.assumptions
    found = {
        "model": shapes.name, "batch": g, "prompt_tokens": shapes.prompt_tokens, "new_tokens": n, "dtype": "bfloat16",
        "seconds": total, "prefill_seconds": prefill, "tokens_per_s": g * n / total,
        "decode_tokens_per_s": g * (n - 1) / max(total - prefill, 1e-9), "plan_tokens_per_s": plan.gen_tokens_per_s,
        "plan_assumptions": {"hbm_tb_per_s": a.hbm_tb_per_s, "decode_efficiency": a.decode_efficiency},
    }  # fmt: skip
    found["decode_vs_plan"] = found["decode_tokens_per_s"] / found["plan_tokens_per_s"]
    passed = total > prefill > 0
    return {"passed": passed, "why_not": None if passed else "timings out of order", **found}




def main(argv: list[str]) -> int:
    """Run the check ``argv[0]`` with the scratch folder ``argv[1]`` (``--cpu``: tiny shapes on the CPU)."""
    from seal_rl.doctor.server_round import check_server_round

    name, work, cpu = argv[0], Path(argv[1]), "--cpu" in argv[2:]
    checks = {"environment": lambda: check_environment(cpu), "update": lambda: check_update(cpu, work),
              "generate": lambda: check_generate(cpu, work), "server_round": lambda: check_server_round(cpu, work)}  # fmt: skip
    result = checks[name]()
    (work / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: python -m seal_rl.doctor.probes NAME WORK [--cpu] (started by `seal doctor --gpu`, not by hand)")
    sys.exit(main(sys.argv[1:]))
