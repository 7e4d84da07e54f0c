"""A CPU fake of vLLM's offline engine, for TRL's colocated vLLM path (``use_vllm: true``).

Built from vLLM's public API as TRL 1.16's ``trl/generation/vllm_generation.py`` uses it (vLLM
0.22–0.31, the range TRL supports) and checked against that file by ``tests/test_vllm_path.py``:

* ``LLM(model=..., **engine_args)`` with every keyword TRL passes; ``LLM.generate(prompts,
  sampling_params, use_tqdm=...)`` on ``{"prompt_token_ids": [...]}`` prompts, one
  ``SamplingParams`` for all prompts or one per prompt, returning one ``RequestOutput`` per prompt
  whose ``outputs[0]`` has ``token_ids`` and ``logprobs`` — a ``{token_id: Logprob}`` dict per token;
* ``reset_prefix_cache``, ``sleep`` / ``wake_up`` and the weight path TRL's colocated sync writes
  through: ``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(pairs)``;
* vLLM's limits: a prompt at or beyond ``max_model_len`` is an error; generation stops at
  ``max_tokens``, at an end-of-sequence token of the model's generation config or one of the
  request's ``stop_token_ids`` (kept as the last token), or at ``max_model_len``.

Behind it is the transformers model at ``model`` (the path TRL passes: the trainer's model
directory), sampled on CPU with the request's seed after temperature and top-p; log-probabilities
are the *processed* ones (after temperature), as TRL asks with ``logprobs_mode="processed_logprobs"``.
Weights pushed through ``load_weights`` replace the engine's own, so what it samples follows training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class StructuredOutputsParams:
    regex: str | None = None
    json: Any = None


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    stop_token_ids: list[int] | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool = True


class _Model:
    """``model_runner.model``: vLLM's model accepts weights by name."""

    def __init__(self, hf_model: Any) -> None:
        self.hf_model = hf_model
        self.loaded: list[str] = []

    def load_weights(self, weights: Any) -> set[str]:
        params = dict(self.hf_model.named_parameters())
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"vLLM model has no parameter {name!r}")
            params[name].data.copy_(tensor.to(params[name].dtype))
            self.loaded.append(name)
        return set(self.loaded)


@dataclass
class LLM:
    """``vllm.LLM`` with the constructor TRL calls (see the module docstring)."""

    model: str
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    enable_sleep_mode: bool = False
    model_impl: str = "auto"
    distributed_executor_backend: str | None = None
    seed: int | None = 0
    max_num_batched_tokens: int | None = None
    logprobs_mode: str = "raw_logprobs"
    quantization: str | None = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    """set by seal-rl (``grpo.vllm_dtype``); the fake always samples in float32"""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """every generate call: prompt lengths and sampling params (for tests)"""

    def __post_init__(self) -> None:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(self.model, dtype="float32").eval()
        eos = hf_model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.max_model_len = self.max_model_len or hf_model.config.max_position_embeddings
        self.sleeping = False
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=_Model(hf_model)))),
            model_config=SimpleNamespace(max_model_len=self.max_model_len),
        )

    @property
    def hf_model(self) -> Any:
        return self.llm_engine.model_executor.driver_worker.model_runner.model.hf_model

    def reset_prefix_cache(self) -> bool:
        return True

    def sleep(self, level: int = 1) -> None:
        self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleeping = False

    def generate(self, prompts: Any, sampling_params: Any = None, *, use_tqdm: bool = True, lora_request: Any = None) -> list[RequestOutput]:
        if self.sleeping:
            raise RuntimeError("generate() on a sleeping engine")
        prompts = prompts if isinstance(prompts, list) else [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        outputs = []
        for k, (prompt, p) in enumerate(zip(prompts, params)):
            ids = list(prompt["prompt_token_ids"])
            if len(ids) >= self.max_model_len:
                raise ValueError(f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of {self.max_model_len}.")
            self.calls.append({"prompt_tokens": len(ids), "max_tokens": p.max_tokens, "seed": p.seed, "logprobs": p.logprobs})
            tokens, logprobs = self._sample(ids, p)
            completion = CompletionOutput(0, "", tokens, sum(logprobs), [{t: Logprob(lp, 1)} for t, lp in zip(tokens, logprobs)]
                                          if p.logprobs is not None else None, "stop")  # fmt: skip
            outputs.append(RequestOutput(str(k), None, ids, None, [completion]))
        return outputs

    def _sample(self, ids: list[int], p: SamplingParams) -> tuple[list[int], list[float]]:
        import torch

        generator = torch.Generator().manual_seed(p.seed if p.seed is not None else (self.seed or 0))
        limit = min(p.max_tokens or 16, self.max_model_len - len(ids))
        tokens: list[int] = []
        logprobs: list[float] = []
        past = None
        step_input = torch.tensor([ids])
        with torch.no_grad():
            while len(tokens) < limit:
                out = self.hf_model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                if p.temperature > 0:
                    logits = logits / p.temperature
                log_probs = torch.log_softmax(logits, dim=-1)
                if p.temperature == 0:
                    token = int(log_probs.argmax())
                else:
                    probs = log_probs.exp()
                    if p.top_p < 1.0:  # nucleus: keep the smallest set of tokens whose mass reaches top_p
                        sorted_probs, order = probs.sort(descending=True)
                        keep = sorted_probs.cumsum(0) - sorted_probs < p.top_p
                        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
                        log_probs = torch.log(probs / probs.sum())
                    token = int(torch.multinomial(probs, 1, generator=generator))
                tokens.append(token)
                logprobs.append(float(log_probs[token]))
                if token in self.eos_ids or token in (p.stop_token_ids or ()):  # vLLM keeps the stop token in token_ids
                    break
                step_input = torch.tensor([[token]])
        return tokens, logprobs


def install(monkeypatch: Any) -> None:
    """Make TRL's vLLM backend use this fake (TRL imports vLLM's names into its module)."""
    from trl.generation import vllm_generation

    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *a, **k: True)
    for name in ("LLM", "SamplingParams", "RequestOutput", "StructuredOutputsParams"):
        monkeypatch.setattr(vllm_generation, name, globals()[name], raising=False)
