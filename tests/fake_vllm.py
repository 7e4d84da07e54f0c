"""A CPU fake of vLLM's offline engine, for TRL's colocated vLLM path (``use_vllm: true``).

Built from vLLM's public API as TRL 1.16's ``trl/generation/vllm_generation.py`` uses it (vLLM
0.22–0.31, the range TRL supports) and checked against that file by ``tests/test_vllm_path.py``:

* ``LLM(model=..., **engine_args)`` with every keyword TRL passes; ``LLM.generate(prompts,
  sampling_params, use_tqdm=...)`` on ``{"prompt_token_ids": [...]}`` prompts, one
  ``SamplingParams`` for all prompts or one per prompt, returning one ``RequestOutput`` per prompt
  whose ``outputs[0]`` has ``token_ids`` and ``logprobs`` — a ``{token_id: Logprob}`` dict per token;
* ``reset_prefix_cache``, ``sleep`` / ``wake_up`` and the weight path TRL's colocated sync writes
  through: ``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(pairs)``;
* the engine underneath, as vLLM 0.30's V1 ``LLMEngine`` has it (continuous rollouts feed it one
  request at a time): ``llm.llm_engine.add_request(request_id, prompt, params)``, ``step()`` returning
  ``RequestOutput``s as each request's ``SamplingParams.output_kind`` asks (``CUMULATIVE``, ``DELTA``,
  ``FINAL_ONLY``; ``finished`` on the last), ``has_unfinished_requests`` and ``abort_request``;
  ``LLM.generate`` runs on it, as vLLM's does;
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
from enum import Enum
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


class RequestOutputKind(Enum):
    """``vllm.sampling_params.RequestOutputKind``: what each engine step returns of a request."""

    CUMULATIVE = 0
    """every step: the whole output so far"""
    DELTA = 1
    """every step: the tokens new in it"""
    FINAL_ONLY = 2
    """nothing until the request finishes (what ``LLM.generate`` asks for)"""


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
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE


@dataclass
class CompletionOutput:
    """``vllm.outputs.CompletionOutput`` (its fields up to ``stop_reason``, in vLLM 0.30's order)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    routed_experts: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """``vllm.outputs.RequestOutput`` (its leading fields, in vLLM 0.30's order): ``request_id`` is
    the id the caller gave ``add_request``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool


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
class _Sequence:
    """One request being decoded: its own KV cache and generator, one token per engine step."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    limit: int
    generator: Any
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sent: int = 0
    """tokens already returned (``DELTA``)"""
    past: Any = None
    finish_reason: str | None = None


class _Engine:
    """``llm.llm_engine`` (vLLM 0.30's V1 ``LLMEngine``): the weight path TRL's sync writes through,
    and ``add_request`` / ``step`` / ``has_unfinished_requests`` / ``abort_request`` as vLLM has them.

    Each :meth:`step` decodes one token of every running request (at most ``max_num_seqs``, first
    come first served; the others wait) and returns a ``RequestOutput`` per request as its
    ``output_kind`` asks. As in vLLM, ``add_request`` returns an internal id (the caller's id and a
    random suffix) while outputs carry the caller's id."""

    def __init__(self, llm: LLM, hf_model: Any) -> None:
        self.llm = llm
        self.model_executor = SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=_Model(hf_model))))
        self.model_config = SimpleNamespace(max_model_len=llm.max_model_len)
        self.requests: dict[str, _Sequence] = {}  # internal id -> sequence, in arrival order

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams, arrival_time: float | None = None,
                    lora_request: Any = None, tokenization_kwargs: dict[str, Any] | None = None,
                    trace_headers: Any = None, priority: int = 0, session_id: str | None = None,
                    prompt_text: str | None = None) -> str:  # fmt: skip
        import copy
        import secrets

        import torch

        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id)}")
        if self.llm.sleeping:
            raise RuntimeError("add_request() on a sleeping engine")
        ids = list(prompt["prompt_token_ids"])
        max_len = self.llm.max_model_len
        if len(ids) >= max_len:
            raise ValueError(f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of {max_len}.")
        params = copy.copy(params)  # vLLM clones the request's params
        self.llm.calls.append({"prompt_tokens": len(ids), "max_tokens": params.max_tokens, "seed": params.seed, "logprobs": params.logprobs})
        generator = torch.Generator().manual_seed(params.seed if params.seed is not None else (self.llm.seed or 0))
        internal = f"{request_id}-{secrets.token_hex(4)}"
        self.requests[internal] = _Sequence(request_id, ids, params, min(params.max_tokens or 16, max_len - len(ids)), generator)
        return internal

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        for key, sequence in list(self.requests.items()):
            if (key if internal else sequence.request_id) in request_ids:
                del self.requests[key]

    def step(self) -> list[RequestOutput]:
        if self.llm.sleeping:
            raise RuntimeError("step() on a sleeping engine")
        running = list(self.requests.items())[: self.llm.max_num_seqs or None]
        outputs = []
        for key, sequence in running:
            self._advance(sequence)
            output = self._output(sequence)
            if output is not None:
                outputs.append(output)
            if sequence.finish_reason is not None:
                del self.requests[key]
        return outputs

    def _advance(self, s: _Sequence) -> None:
        """Decode one token of ``s``; sampling as vLLM: temperature, then top-p, processed log-probs."""
        import torch

        p = s.params
        step_input = torch.tensor([s.prompt if not s.tokens else s.tokens[-1:]])
        with torch.no_grad():
            out = self.llm.hf_model(input_ids=step_input, past_key_values=s.past, use_cache=True)
        s.past = out.past_key_values
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
            token = int(torch.multinomial(probs, 1, generator=s.generator))
        s.tokens.append(token)
        s.logprobs.append(float(log_probs[token]))
        if token in self.llm.eos_ids or token in (p.stop_token_ids or ()):  # vLLM keeps the stop token in token_ids
            s.finish_reason = "stop"
        elif len(s.tokens) >= s.limit:
            s.finish_reason = "length"

    def _output(self, s: _Sequence) -> RequestOutput | None:
        kind = s.params.output_kind
        finished = s.finish_reason is not None
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        first = s.sent if kind == RequestOutputKind.DELTA else 0
        s.sent = len(s.tokens)
        logprobs = [{t: Logprob(lp, 1)} for t, lp in zip(s.tokens[first:], s.logprobs[first:])] if s.params.logprobs is not None else None
        completion = CompletionOutput(0, "", s.tokens[first:], sum(s.logprobs), logprobs, finish_reason=s.finish_reason)
        return RequestOutput(s.request_id, None, s.prompt, None, [completion], finished)


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
    """every request added (by ``generate`` or ``llm_engine.add_request``): prompt length and
    sampling params (for tests)"""

    def __post_init__(self) -> None:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(self.model, dtype="float32").eval()
        eos = hf_model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.max_model_len = self.max_model_len or hf_model.config.max_position_embeddings
        self.sleeping = False
        self.llm_engine = _Engine(self, hf_model)
        self._counter = 0

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
        """As vLLM's: every prompt added to the engine with ``FINAL_ONLY`` outputs under a numbered
        id, the engine stepped until none is left, the outputs sorted by id."""
        if self.sleeping:
            raise RuntimeError("generate() on a sleeping engine")
        prompts = prompts if isinstance(prompts, list) else [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        added = []
        try:
            for prompt, p in zip(prompts, params):
                p.output_kind = RequestOutputKind.FINAL_ONLY
                added.append(self.llm_engine.add_request(str(self._counter), prompt, p))
                self._counter += 1
        except Exception:
            self.llm_engine.abort_request(added, internal=True)
            raise
        outputs = []
        while self.llm_engine.has_unfinished_requests():
            outputs += [o for o in self.llm_engine.step() if o.finished]
        return sorted(outputs, key=lambda o: int(o.request_id))


def install(monkeypatch: Any) -> None:
    """Make TRL's vLLM backend use this fake (TRL imports vLLM's names into its module)."""
    from trl.generation import vllm_generation

    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *a, **k: True)
    for name in ("LLM", "SamplingParams", "RequestOutput", "StructuredOutputsParams"):
        monkeypatch.setattr(vllm_generation, name, globals()[name], raising=False)
