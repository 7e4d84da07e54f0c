"""What a family's code hands back to the episode: the verifier's :class:`Outcome` of a finished
episode, and :class:`ToolError`, a tool's refusal of a call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ToolError(Exception):
    """Raised by :meth:`Family.call` for a call the tool refuses (a bad value, a missing record):
    the agent sees ``Error: <message>`` as the call's result and Ψ sees an execution error."""


@dataclass(frozen=True)
class Outcome:
    """The verifier's reward for one finished episode and the evidence Ψ labels it with.

    reward: V(τ), in [0, 1]; an episode succeeds at 1.
    state_ok / state_differences: whether the environment ended in the state the task asks for, and
        which parts differ (``"what.attribute"`` strings); ``None`` means ``reward >= 1``.
    response_ok / missing_responses: whether the agent told the user everything it had to, and what
        it left out.
    expected_tools: tools a solution calls (an expected tool never called is ``missing_tool_call``).
    evidence: anything else the family wants kept with the record (JSON-able).
    """

    reward: float
    state_ok: bool | None = None
    state_differences: tuple[str, ...] = ()
    response_ok: bool = True
    missing_responses: tuple[str, ...] = ()
    expected_tools: tuple[str, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
