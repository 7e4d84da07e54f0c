"""One episode of an environment family: seal-rl's episode engine around a family's tools and verifier.

:class:`FamilyEnv` is :class:`~seal_rl.env.BfclEnv` with the family's world in place of BFCL's
backends: the same reading of the model's message (call format, size and call-count caps, rejection
of unreadable messages and unknown tools with an ``[ERROR] Invalid tool call format`` observation),
the same schema check, step time limit, result truncation, trace and record. What differs:

* **calls** run through :meth:`Family.call` on the episode's own state; a :class:`ToolError` (or
  any exception of the family's code) becomes the call's error result, never a crash;
* **a text message** (no call) goes to the user (:meth:`Family.reply`): the answer is the next
  observation, ``None`` ends the episode (``completed``);
* **the verdict** is :meth:`Family.verify`'s :class:`Outcome`, kept as one check over the whole
  conversation (:class:`OutcomeCheck`): the family scores the end of the conversation, not each
  user turn, so Ψ gives one label per episode (docs/concepts/diagnosis.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from seal_rl.backends import CallOutcome
from seal_rl.env import BfclEnv, EnvConfig, episode_record
from seal_rl.environments.outcome import Outcome, ToolError
from seal_rl.errors import SealError
from seal_rl.interface import Message
from seal_rl.reasoning import answer
from seal_rl.verify import StateDifference, TurnCheck, Verdict

if TYPE_CHECKING:
    from seal_rl.environments.family import Family, FamilyTask

SUCCESS = 1 - 1e-6
"""an episode succeeds when its reward is 1 (up to rounding)"""


@dataclass(frozen=True)
class EpisodeTask:
    """A :class:`FamilyTask` as the episode engine reads a task: one user turn, the family's tools."""

    source: FamilyTask
    functions: tuple[dict[str, Any], ...]
    questions: tuple[tuple[Message, ...], ...]
    held_out: dict[int, tuple[dict[str, Any], ...]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.source.id

    @property
    def category(self) -> str:
        return self.source.category

    @property
    def num_turns(self) -> int:
        return len(self.questions)

    def all_functions(self) -> tuple[dict[str, Any], ...]:
        return self.functions


@dataclass(frozen=True)
class OutcomeCheck(TurnCheck):
    """The verifier's check of a whole conversation, in the shape Ψ reads (:class:`TurnCheck`).

    verified: the family's verifier passed the episode; the check then has no failure whatever the
    other fields say (a task may be solved without a call)."""

    verified: bool = False

    @property
    def failure(self) -> str | None:
        if not self.scorable or self.verified:
            return None
        return super().failure or "outcome_mismatch"


def outcome_verdict(outcome: Outcome, *, has_calls: bool, reached: bool) -> Verdict:
    """The verdict of one conversation from its :class:`Outcome`.

    A failed episode with no failed part named (state and response both ok) is a state mismatch on
    ``outcome.reward``: Ψ always has a verifier reason to fall back on."""
    reward = float(outcome.reward)
    if not 0.0 <= reward <= 1.0:
        raise ValueError(f"verify() returned reward {reward}; expected a value in [0, 1]")
    passed = reward >= SUCCESS
    state_ok = passed if outcome.state_ok is None else bool(outcome.state_ok)
    differences = [StateDifference(*(d.split(".", 1) if "." in d else (d, "")), "", "") for d in outcome.state_differences]
    if not passed and state_ok and outcome.response_ok:
        state_ok, differences = False, differences or [StateDifference("outcome", "reward", str(reward), "1.0")]
    check = OutcomeCheck(
        turn=0, scorable=True, has_calls=has_calls, reached=reached, state_ok=state_ok,
        state_differences=tuple(differences), response_ok=bool(outcome.response_ok),
        missing_responses=tuple(str(m) for m in outcome.missing_responses),
        ground_truth_tools=tuple(outcome.expected_tools), verified=passed,
    )  # fmt: skip
    return Verdict(reward=reward, turns=(check,))


class _FamilyBackends:
    """The episode's world: the family's state behind the ``execute(call)`` BFCL's backends offer."""

    def __init__(self, family: Family, state: Any) -> None:
        self.family = family
        self.state = state

    def execute(self, call: Any) -> CallOutcome:
        try:
            result = self.family.call(self.state, call.name, dict(call.arguments))
        except ToolError as exc:
            return CallOutcome(f"Error: {exc}", str(exc), raised=True)
        except Exception as exc:  # the family's code failed on model input: an error result, not a crash
            message = f"{type(exc).__name__}: {exc}"
            return CallOutcome(f"Error: {message}", message, raised=True)
        if not isinstance(result, str):
            result = json.dumps(result, ensure_ascii=False, default=str)
        return CallOutcome(result)


class FamilyEnv(BfclEnv):
    """An episode of a :class:`Family`'s task (see the module docstring); ``reset`` takes a
    :class:`FamilyTask`. Families play the ``seal`` protocol (the ``bfcl`` protocol is BFCL's own loop)."""

    def __init__(self, family: Family, config: EnvConfig | None = None, interface: Any = None, *, catalog: Any = None) -> None:
        config = config if config is not None else EnvConfig()
        if config.protocol != "seal":
            raise SealError(f"The {family.name} family plays the seal protocol; env.protocol={config.protocol!r} is BFCL's own loop.")
        super().__init__(config, interface, catalog=catalog)
        self.family = family
        self.replies = 0

    def reset(self, task: FamilyTask, *, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode: the family's fresh state, its instructions and tools, the user's opening message."""
        episode = EpisodeTask(task, tuple(self.family.tools(task)), (({"role": "user", "content": task.prompt},),))
        self.replies = 0
        observation, info = super().reset(episode, seed=seed)
        instructions = self.family.instructions(task)
        if instructions:
            if observation and observation[0]["role"] == "system":
                observation[0] = {**observation[0], "content": f"{instructions}\n\n{observation[0]['content']}".rstrip()}
            else:
                observation.insert(0, {"role": "system", "content": instructions})
            self.messages[:] = observation
        return observation, info

    @property
    def state(self) -> Any:
        """The family's state of the running episode (None once it is scored)."""
        return self._backends.state if self._backends is not None else None

    def record(self) -> dict[str, Any]:
        """As :func:`~seal_rl.env.episode_record`, with the family's name and its verifier's own
        evidence (``verdict["evidence"]``)."""
        record = episode_record(self)
        record["verdict"]["evidence"] = dict(getattr(self, "evidence", {}))
        return {**record, "family": self.family.name}

    def _open_backends(self, task: EpisodeTask) -> _FamilyBackends:
        return _FamilyBackends(self.family, self.family.start(task.source))

    def _open_turn(self, turn: int) -> list[Message]:
        self.turn_steps = 0
        return self.interface.question([{"role": "user", "content": self.family.opening(self.state, self.task.source)}])

    def _execute(self, step: int, calls: Any, ids: Any = ()) -> list[Message]:
        observation = super()._execute(step, calls, ids)
        ended = self.family.ended(self.state)
        if ended is not None and self._limit_reached is None:
            self._limit_reached = ended  # the world ended the conversation (a stop call, one of its limits)
        return observation

    def _end_turn(self, info: dict[str, Any]) -> tuple[list[Message], str]:
        """A text message goes to the user; the user's answer goes on, ``None`` ends the episode."""
        reply = None
        if self.replies < self.family.max_replies:
            text = answer(self.messages[-1].get("content") or "")
            try:
                reply = self.family.reply(self.state, self.task.source, text)
            except Exception as exc:  # the family's user failed on model text: the conversation ends, scored
                info["user_error"] = f"{type(exc).__name__}: {exc}"
        if reply is None:
            self._finish(self.family.ended(self.state) or "completed")
            return [], "end"
        self.replies += 1
        return self.interface.question([{"role": "user", "content": str(reply)}]), "user_reply"

    def _finish(self, reason: str) -> None:
        self.end_reason = reason
        has_calls = any(e.accepted for e in self.trace)
        try:
            outcome = self.family.verify(self.task.source, self.state, list(self.messages))
            if not isinstance(outcome, Outcome):
                raise TypeError(f"verify() must return an Outcome, got {type(outcome).__name__}")
            self.verdict = outcome_verdict(outcome, has_calls=has_calls, reached=self.model_calls > 0)
            self.evidence: Mapping[str, Any] = dict(outcome.evidence)
        except Exception as exc:  # a verifier failure must not crash the driver; Ψ labels it checker_error
            self.verdict = Verdict.unscorable(f"{type(exc).__name__}: {exc}")
            self.evidence = {}
        self._backends = None
