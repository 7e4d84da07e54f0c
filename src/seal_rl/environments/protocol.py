"""What the episode driver (:func:`seal_rl.rollout.run_episodes`) asks of an environment.

A Gymnasium-style contract (STYLE.md §2) with what a multi-turn chat needs besides: the whole
conversation so far (``messages``), the tools available now (``tools``), the user turn the agent
is in (``turn``), a way to end the episode early (``truncate``) and the finished episode as a
record (``record``). :class:`~seal_rl.env.BfclEnv`, every family's episode
(:class:`~seal_rl.environments.episode.FamilyEnv`) and the service's ``RemoteEnv`` keep it;
``tests/test_environments.py`` checks that they do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]


@runtime_checkable
class Environment(Protocol):
    """One environment, reset and reused for one episode after another (the driver's ``make_env()``)."""

    config: Any
    """the episode's settings; ``config.prompt_mode`` says whether the chat template renders the tools"""
    messages: list[Message]
    """the conversation so far, opening messages included"""
    turn: int
    """the user turn the agent is in (0-based)"""

    def reset(self, task: Any, *, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Open an episode of ``task``: its opening messages and an info dict."""
        ...

    def step(self, action: str | bytes | Mapping[str, Any]) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Feed one assistant message: (observation, reward, terminated, truncated, info)."""
        ...

    def truncate(self, reason: str) -> tuple[float, dict[str, Any]]:
        """End the episode now (a budget ran out): the verifier's reward and the end's info."""
        ...

    def record(self) -> dict[str, Any]:
        """The finished episode as JSON-able data (task_id, category, reward, messages, trace, verdict, ...)."""
        ...

    @property
    def tools(self) -> list[dict[str, Any]]:
        """OpenAI-style specs of the tools available now."""
        ...

    @property
    def done(self) -> bool:
        ...
