"""Agents that answer from a script (replay files, the oracle) as a batched generator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from seal_rl.rollout import Generation, Request

if TYPE_CHECKING:
    from seal_rl.policies import Agent


class ScriptedGenerator:
    """Asks each episode's :class:`~seal_rl.policies.Agent` (replay files, the oracle)."""

    def __init__(self, agents: dict[int, Agent]) -> None:
        self.agents = agents

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        out = []
        for request in requests:
            said = self.agents[request.episode].act(request.observation, request.info)
            out.append(Generation(said) if isinstance(said, str) else said)  # recordings may say a Generation
        return out
