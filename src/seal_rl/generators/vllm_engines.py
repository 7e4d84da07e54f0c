"""vLLM: TRL's colocated engine during training, a local engine for evaluation (GPU machines)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seal_rl.errors import SealError
from seal_rl.rollout import Generation, Request
from seal_rl.trajectory import ChatTokens


class VLLMGenerator:
    """TRL's colocated vLLM engine (``GRPOTrainer.vllm_generation``), on GPUs.

    All ranks must call it in lockstep (colocated tensor-parallel groups and server mode are
    collective): the training loop keeps ranks ticking together, padding finished ranks.
    """

    def __init__(self, trainer: Any) -> None:
        if not getattr(trainer, "use_vllm", False):
            raise SealError("The vllm generator needs `use_vllm: true` in the recipe (and vLLM on a GPU machine).")
        self.trainer = trainer
        self.chat = ChatTokens(trainer.processing_class)

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        prompts = [r.prompt_ids for r in requests]
        _, completion_ids, logprobs, _ = self.trainer.vllm_generation.generate(prompts, None, 1)
        out = []
        for request, ids, lps in zip(requests, completion_ids, logprobs, strict=True):
            ids = ids[: request.max_new_tokens]
            flat = [float(lp[0]) if lp and lp[0] is not None else 0.0 for lp in lps[: len(ids)]]
            out.append(Generation(self.chat.decode(ids), list(ids), flat))
        return out


class VLLMEngineGenerator:
    """A local vLLM engine (``vllm:PATH`` in ``seal eval``): token prompts in, token ids out.

    Needs the ``vllm`` package and a GPU; without them it says so and suggests ``hf:`` or serving
    the model and using ``openai:``.
    """

    def __init__(self, path: str, *, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, **engine: Any) -> None:
        import importlib.util

        import torch

        if importlib.util.find_spec("vllm") is None or not torch.cuda.is_available():
            raise SealError(
                "vllm: needs the vllm package and a GPU. On this machine use --policy hf:PATH, or serve the model "
                "elsewhere (`vllm serve PATH`) and use --policy openai:MODEL@http://HOST:8000/v1."
            )
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.chat = ChatTokens(self.tokenizer)
        self.engine = LLM(model=path, **engine)
        self.temperature, self.top_p, self.seed = temperature, top_p, seed

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        from vllm import SamplingParams, TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        params = [
            SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=r.max_new_tokens,
                           seed=self.seed + seed + r.episode)  # fmt: skip
            for r in requests
        ]
        outputs = self.engine.generate(prompts, params, use_tqdm=False)
        return [Generation(self.chat.decode(o.outputs[0].token_ids), list(o.outputs[0].token_ids)) for o in outputs]
