"""The episode driver: many episodes at once against one generator, token-exact samples out.

The driver plays up to ``concurrency`` episodes at once: it asks the generator for each active
episode's next assistant message, steps that episode's environment with it, and extends its
token-exact :class:`~seal_rl.trajectory.Trajectory`. Episodes start as others finish. How the
asking is scheduled (``scheduler``, the recipe's ``rollout_scheduler``):

* ``continuous``: no episode waits for another. Engines that admit requests between decoding
  steps (:class:`ContinuousGenerator`: transformers, vLLM) get each episode's request as soon as
  its environment has stepped and hand back each message as it ends; generators that answer in the
  background (:class:`StreamingGenerator`: HTTP servers) step each episode as its own answer arrives.
* ``lockstep``: ticks. Each tick asks for the next message of every active episode in one batched
  call (:class:`Generator`), waits for all of them, then steps every episode.
* ``auto`` (the default): ``continuous`` where the generator can, else ``lockstep``.

The generators themselves (transformers, vLLM, OpenAI-compatible servers, scripts, simulations)
live in :mod:`seal_rl.generators`; this module holds only the driver and the types it speaks.

Budgets (SEAL recipe): the opening prompt may use ``max_prompt_tokens`` (8192), everything after
it ``max_completion_tokens`` (4096), each model call at most ``max_new_tokens``, and optionally its
reasoning at most ``max_thinking_tokens``. An episode that runs out is truncated (``end_reason``
says which budget) and its sample cut at the budget. A generator that knows its context window
(``context_tokens``: a vLLM engine's ``max_model_len``) also bounds each call: a message may not
run past the window, and an episode whose next prompt fills it ends with ``context_window``
instead of a request the engine would refuse.
"""

from __future__ import annotations

import time
import zlib
from concurrent.futures import FIRST_COMPLETED, Future, wait
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from seal_rl.env import BfclEnv
from seal_rl.errors import SealError
from seal_rl.interface import Message
from seal_rl.tasks import Task
from seal_rl.trajectory import ChatTokens, Trajectory


@dataclass(frozen=True)
class Budgets:
    """Token budgets of one episode (SEAL recipe: 8192 / 4096; at most 20 model calls in the env)."""

    max_prompt_tokens: int = 8192
    """longest opening prompt (system block + first question); longer episodes are not played"""
    max_completion_tokens: int = 4096
    """all tokens after the prompt: model messages, observations and template tokens"""
    max_new_tokens: int = 1024
    """longest single model message"""
    max_thinking_tokens: int = 0
    """longest reasoning of one model message (``<think>`` block, harmony analysis channel); a
    message still reasoning past it is cut there and the episode ends (``thinking_budget``).
    0: no cap beyond ``max_new_tokens``"""

    def __post_init__(self) -> None:
        if min(self.max_prompt_tokens, self.max_completion_tokens, self.max_new_tokens) < 1:
            raise SealError("Token budgets must be positive.")
        if self.max_thinking_tokens < 0:
            raise SealError(f"max_thinking_tokens must be >= 0 (0: no cap), got {self.max_thinking_tokens}.")


@dataclass
class Request:
    """What a generator is asked: the next message of one episode."""

    episode: int
    task: Task
    messages: list[Message]
    observation: list[Message]
    info: dict[str, Any]
    prompt_ids: list[int] | None
    max_new_tokens: int
    tools: list[dict[str, Any]] | None = None
    """the available tool specs, in ``chat_template`` prompt mode (for servers that take ``tools``)"""


@dataclass
class Generation:
    """A generated assistant message. ``token_ids`` None: the generator works on text only."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float | None] | None = None
    """the sampled token's log-probability, aligned with ``token_ids`` (vLLM)"""
    end_turn: bool | None = None
    """a recorded turn boundary to replay (``bfcl-result:`` files; see ``BfclEnv.step``)"""
    weight_versions: tuple[int, int] | None = None
    """the policy weight versions a generation server held when the request was sent and when its
    answer came back (:mod:`seal_rl.generators.vllm_server`; they differ when a weight sync paused it
    half-way); None: the generator runs the trainer's own weights"""
    error: str | None = None
    """set when no message could be generated (server down, retries exhausted): the episode ends
    with ``end_reason="generation_error"`` and is excluded from success rates, not failed"""


SCHEDULERS = ("continuous", "lockstep")
"""the rollout schedulers a user can choose (``auto``: continuous where the generator can)"""


class Generator(Protocol):
    """Answers a batch of requests, in order; ``None`` for an episode means "nothing more to say".

    A generator may also have ``context_tokens``, the longest sequence (prompt and message) its
    engine takes; the driver then never asks past it (module docstring)."""

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]: ...


class StreamingGenerator(Generator, Protocol):
    """A generator that also takes one request at a time and answers it in the background (HTTP
    servers). The driver then steps each episode as soon as its own answer arrives."""

    def submit(self, request: Request, seed: int) -> Future[Generation | None]: ...


class ContinuousGenerator(Generator, Protocol):
    """A generator whose engine admits requests between decoding steps (continuous batching)."""

    continuous_unsupported: str | None
    """why this engine cannot run continuously after all (a model's cache layout, a parallel
    layout), or None"""
    decode_steps: int
    """decoding steps (forward passes that generated tokens) so far"""

    def add(self, request: Request, seed: int) -> None:
        """Queue ``request``; it starts decoding at the next :meth:`step` with room."""

    def step(self) -> list[tuple[int, Generation | None]]:
        """One decoding step; the ``(episode, message)`` pairs that ended with it."""


@dataclass
class Rollout:
    """A finished episode: its result record (as ``results.jsonl`` holds it) and its sample."""

    index: int
    record: dict[str, Any]
    trajectory: Trajectory | None
    seconds_env: float = 0.0


@dataclass
class _Active:
    index: int
    task: Task
    env: BfclEnv
    trajectory: Trajectory | None
    observation: list[Message]
    info: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    seconds_env: float = 0.0
    prompt_ids: list[int] | None = None  # what the pending message is generated from
    started: float = 0.0


@dataclass
class DriverStats:
    """Where the driver's time went (seconds), and how full the engine was."""

    generation: float = 0.0
    environment: float = 0.0
    ticks: int = 0
    scheduler: str = ""
    """the scheduler that ran: ``continuous`` or ``lockstep``"""
    tokens: int = 0
    """model tokens generated"""
    decode_steps: int = 0
    """decoding steps the engine ran (0: the generator does not say, e.g. an HTTP server)"""
    wall: float = 0.0
    """seconds from the first episode's start to the last one's end"""
    longest_episode: float = 0.0
    """seconds the longest episode took, from its start to its end"""

    @property
    def occupancy(self) -> float | None:
        """Mean requests in flight per decoding step (tokens generated per step); None if unknown."""
        return self.tokens / self.decode_steps if self.decode_steps else None

    @property
    def longest_share(self) -> float | None:
        """The longest episode's share of the wall time (1.0: one episode set the round's length)."""
        return self.longest_episode / self.wall if self.wall else None

    def summary(self) -> dict[str, Any]:
        """What the round log records of the rollout."""
        return {
            "scheduler": self.scheduler, "tokens": self.tokens, "decode_steps": self.decode_steps,
            "occupancy": None if self.occupancy is None else round(self.occupancy, 3),
            "longest_share": None if self.longest_share is None else round(self.longest_share, 3),
        }  # fmt: skip


def resolve_scheduler(generator: Generator, scheduler: str = "auto") -> str:
    """The scheduler that ``generator`` will run under for the choice ``scheduler``
    (``continuous``, ``lockstep`` or ``auto``); a one-line error for a choice it cannot run."""
    if scheduler not in (*SCHEDULERS, "auto"):
        raise SealError(f"Unknown rollout scheduler {scheduler!r}; choose one of: {', '.join(SCHEDULERS)}, auto.")
    if scheduler == "lockstep":
        return "lockstep"
    if hasattr(generator, "submit"):
        return "continuous"
    reason = getattr(generator, "continuous_unsupported", None) if hasattr(generator, "step") else (
        f"{type(generator).__name__} answers whole batches only (it has no add/step)")
    if reason is None:
        return "continuous"
    if scheduler == "continuous":
        raise SealError(f"rollout_scheduler continuous cannot run here: {reason}. Choose rollout_scheduler: lockstep (or auto).")
    return "lockstep"


def run_episodes(
    episodes: Iterable[tuple[int, Task, dict[str, Any]]],
    generator: Generator,
    make_env: Callable[[], BfclEnv],
    *,
    chat: ChatTokens | None = None,
    budgets: Budgets = Budgets(),
    concurrency: int = 64,
    seed: int = 0,
    on_done: Callable[[Rollout], None] | None = None,
    stats: DriverStats | None = None,
    scheduler: str = "auto",
) -> list[Rollout]:
    """Play episodes ``(index, task, extra record fields)`` to their ends; rollouts in input order.

    ``make_env`` is called at most ``concurrency`` times: environments (``BfclEnv``, or a
    ``seal_rl.service.RemoteEnv`` for a remote service) are reset and reused.

    With ``chat`` (token-level generators), every episode also yields its token-exact
    trajectory. ``seed`` seeds every generator call (with the tick number under ``lockstep``, with
    the episode and its call number otherwise), so a rerun is identical. ``scheduler``: see the
    module docstring; the one that ran is in ``stats.scheduler``.
    """
    if concurrency < 1:
        raise SealError(f"concurrency must be at least 1, got {concurrency}.")
    stats = stats if stats is not None else DriverStats()
    stats.scheduler = resolve_scheduler(generator, scheduler)
    context: int | None = getattr(generator, "context_tokens", None)
    steps_before = getattr(generator, "decode_steps", 0)
    began = time.perf_counter()
    pending = iter(episodes)
    free: list[BfclEnv] = []  # finished environments, reset for the next episode
    active: list[_Active] = []
    finished: dict[int, Rollout] = {}
    order: list[int] = []

    def finish(state: _Active) -> None:
        stats.longest_episode = max(stats.longest_episode, time.perf_counter() - state.started)
        record = {"index": state.index, **state.env.record(), **state.extra}
        rollout = Rollout(state.index, record, state.trajectory, state.seconds_env)
        finished[state.index] = rollout
        free.append(state.env)
        if on_done is not None:
            on_done(rollout)

    def admit() -> None:
        while len(active) < concurrency:
            item = next(pending, None)
            if item is None:
                return
            index, task, extra = item
            order.append(index)
            started = time.perf_counter()
            env = free.pop() if free else make_env()
            observation, info = env.reset(task)
            trajectory = None
            if chat is not None:
                chat.tools = _prompt_tools(env)
                trajectory = chat.start(env.messages)
                if len(trajectory.prompt_ids) > budgets.max_prompt_tokens:
                    env.truncate("prompt_budget")
            state = _Active(index, task, env, trajectory, observation, info, extra, time.perf_counter() - started, started=started)
            if not env.done:
                next_prompt(state)
            if env.done:
                finish(state)
            else:
                active.append(state)

    def next_prompt(state: _Active) -> None:
        """The prompt of the episode's next message; the episode ends (``context_window``) when it
        leaves the generator's context no room for a token."""
        if state.trajectory is None:
            return
        state.prompt_ids = chat.inference_prompt(state.env.messages, _prompt_tools(state.env), state.trajectory.ids)
        if context is not None and len(state.prompt_ids) >= context:
            state.env.truncate("context_window")

    def request(state: _Active) -> Request:
        used = len(state.trajectory.completion_ids) if state.trajectory else 0
        budget = min(budgets.max_new_tokens, budgets.max_completion_tokens - used)
        if context is not None and state.prompt_ids is not None:
            budget = min(budget, context - len(state.prompt_ids))
        return Request(state.index, state.task, state.env.messages, state.observation, state.info, state.prompt_ids,
                       budget, _prompt_tools(state.env))  # fmt: skip

    def advance(state: _Active, generation: Generation | None) -> bool:
        """Step ``state`` with its generation; True while the episode goes on."""
        if generation is not None and generation.token_ids is not None:
            stats.tokens += len(generation.token_ids)
        began = time.perf_counter()
        _advance(state, generation, chat, budgets)
        if not state.env.done:
            next_prompt(state)
        state.seconds_env += time.perf_counter() - began
        if state.env.done:
            finish(state)
            return False
        return True

    try:
        if stats.scheduler == "lockstep":
            _lockstep(generator, admit, active, request, advance, seed, stats)
        elif hasattr(generator, "submit"):
            _stream(generator, admit, active, request, advance, seed, stats)
        else:
            _continuous(generator, admit, active, request, advance, seed, stats)
    finally:
        for env in free + [state.env for state in active]:
            if hasattr(env, "close"):  # remote environments release their episodes
                env.close()
        stats.wall += time.perf_counter() - began
        stats.decode_steps += getattr(generator, "decode_steps", 0) - steps_before
    return [finished[index] for index in order]


def _lockstep(generator: Generator, admit, active, request, advance, seed: int, stats: DriverStats) -> None:
    """Ticks: generate the next message of every active episode in one batched call, then step them."""
    admit()
    while active:
        requests = [request(state) for state in active]
        started = time.perf_counter()
        generations = generator.generate(requests, seed=derived_seed(seed, stats.ticks))
        stats.generation += time.perf_counter() - started
        stats.ticks += 1
        started = time.perf_counter()
        active[:] = [state for state, generation in zip(active, generations, strict=True) if advance(state, generation)]
        admit()
        stats.environment += time.perf_counter() - started


def _stream(generator: StreamingGenerator, admit, active, request, advance, seed: int, stats: DriverStats) -> None:
    """Keep one request per active episode in flight; step each episode as soon as its answer is in.

    Unlike the lockstep ticks, nobody waits for the slowest message of a batch. Environments are
    still stepped on this thread only (BFCL backends are not thread-safe); generations are seeded by
    episode and call number, so the completion order does not change what is generated.
    """
    in_flight: dict[Future, Any] = {}
    asked: set[int] = set()  # episodes with a request in flight
    calls: dict[int, int] = {}

    def submit_new() -> None:
        admit()
        for state in active:
            if state.index not in asked:
                asked.add(state.index)
                calls[state.index] = calls.get(state.index, 0) + 1
                in_flight[generator.submit(request(state), derived_seed(seed, state.index, calls[state.index]))] = state

    submit_new()
    while in_flight:
        started = time.perf_counter()
        ready, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
        stats.generation += time.perf_counter() - started
        stats.ticks += 1
        started = time.perf_counter()
        for future in ready:
            state = in_flight.pop(future)
            asked.discard(state.index)
            try:
                generation = future.result()
            except Exception as exc:  # a generator bug must not take the other episodes down
                generation = Generation("", error=f"generator failed: {type(exc).__name__}: {exc}")
            if not advance(state, generation):
                active[:] = [a for a in active if a is not state]
        submit_new()
        stats.environment += time.perf_counter() - started


def _continuous(generator: ContinuousGenerator, admit, active, request, advance, seed: int, stats: DriverStats) -> None:
    """Keep one request per active episode in the engine; step each episode as soon as its message ends.

    Everything runs on this thread: the engine takes one decoding step at a time, and between
    steps the driver steps the episodes whose messages ended and hands the engine their next
    requests. Seeds are per episode and call, as for streaming generators.
    """
    asked: dict[int, _Active] = {}  # episodes with a request in the engine
    calls: dict[int, int] = {}

    def add_new() -> None:
        admit()
        for state in active:
            if state.index not in asked:
                asked[state.index] = state
                calls[state.index] = calls.get(state.index, 0) + 1
                generator.add(request(state), derived_seed(seed, state.index, calls[state.index]))

    add_new()
    while asked:
        started = time.perf_counter()
        ended = generator.step()
        stats.generation += time.perf_counter() - started
        stats.ticks += 1
        if not ended:
            continue
        started = time.perf_counter()
        for index, generation in ended:
            state = asked.pop(index)
            if not advance(state, generation):
                active[:] = [a for a in active if a is not state]
        add_new()
        stats.environment += time.perf_counter() - started


def _prompt_tools(env: BfclEnv) -> list[dict[str, Any]] | None:
    """The tool specs the prompt carries: in ``chat_template`` mode the template renders them."""
    return env.tools if env.config.prompt_mode == "chat_template" else None


def _advance(state: _Active, generation: Generation | None, chat: ChatTokens | None, budgets: Budgets) -> None:
    env = state.env
    if generation is None:
        env.truncate("policy_exhausted")
        return
    if generation.error is not None:
        state.extra = {**state.extra, "error": generation.error}
        env.truncate("generation_error")
        return
    if generation.weight_versions is not None:  # one [sent, answered] pair per model message
        state.extra = {**state.extra, "weight_versions": [*state.extra.get("weight_versions", []), list(generation.weight_versions)]}
    before = list(env.messages)
    action: str | Message = generation.text
    if state.trajectory is not None:
        prefix = state.trajectory.ids
        if generation.token_ids is not None:
            token_ids = generation.token_ids
            state.trajectory.add_model(token_ids, generation.logprobs, turn=env.turn)
        else:  # a text-only generator: re-encoded tokens have no sampling log-probabilities
            token_ids = chat.encode(generation.text)
            state.trajectory.add_model(token_ids, turn=env.turn)
        if chat.turns:
            given = list(generation.logprobs or [])[: len(token_ids)]
            state.trajectory.turns.append((list(state.prompt_ids or prefix), list(token_ids), given + [None] * (len(token_ids) - len(given))))
        if chat.native:  # the model's own tool calls, parsed into a structured message
            action = chat.response(token_ids, prefix, env.tools)
        if budgets.max_thinking_tokens and chat.reasoning_tokens(action, prefix) > budgets.max_thinking_tokens:
            # still reasoning at the cap: what follows it was never to be generated
            state.trajectory.cut(len(state.trajectory.completion_ids) - len(token_ids) + budgets.max_thinking_tokens)
            if chat.turns:
                prompt, ids, logprobs = state.trajectory.turns[-1]
                state.trajectory.turns[-1] = (prompt, ids[: budgets.max_thinking_tokens], logprobs[: budgets.max_thinking_tokens])
            env.truncate("thinking_budget")
            return
    if generation.end_turn is None:
        observation, _, _, _, info = env.step(action)
    else:
        observation, _, _, _, info = env.step(action, end_turn=generation.end_turn)
    state.observation, state.info = observation, info
    if state.trajectory is None:
        return
    used = len(state.trajectory.completion_ids)
    if env.done:
        if used > budgets.max_completion_tokens:
            state.trajectory.cut(budgets.max_completion_tokens)
        return
    message = env.messages[len(before)]
    continuation = chat.continuation(before, message if chat.native else message["content"], token_ids, observation)
    if used + len(continuation) >= budgets.max_completion_tokens:
        state.trajectory.cut(budgets.max_completion_tokens)
        env.truncate("completion_budget")
        return
    state.trajectory.add_environment(continuation)


def derived_seed(*parts: object) -> int:
    """A 31-bit seed from its parts (run seed, round, rank, episode, call, ...): the same parts give
    the same seed in every process and every rerun (no use of Python's randomised ``hash``)."""
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF
