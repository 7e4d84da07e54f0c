"""BFCL multi-turn as an OpenEnv environment: its action, observation and state types, the
environment, the app, and the client, following OpenEnv's own layout (``openenv init``'s template:
``models``, ``server/…_environment``, ``server/app``, ``client``).

* :class:`BfclAction` — one assistant message: its raw text (``message``), or with the ``native``
  call format its structured ``tool_calls``.
* :class:`BfclObservation` — the messages the agent sees next (the opening prompt after ``reset``;
  tool results, the next question or a function reveal after ``step``), the tools available now,
  the user turn and what happened (``event``). ``reward`` is 0 until the episode ends; the final
  observation carries the verifier's ``verdict`` (the official checker's rules) and the
  ``diagnosis`` Ψ of every user turn (label and evidence), ``done`` and ``end_reason``.
* :class:`BfclEnvironment` — the server side: ``reset(task_id=..., protocol=..., prompt_mode=...,
  call_format=..., interface=...)`` opens an episode of :class:`seal_rl.env.BfclEnv`, ``step`` plays
  a message, ``state`` says where the episode is. A message is played as the protocol says (an
  unreadable or over-long one is rejected or ends the turn, as in ``seal eval``); a step before
  ``reset`` or after the end gets an observation with ``event: error`` and the reason, never a
  server error.
* :func:`create_bfcl_app` — OpenEnv's FastAPI app (``/reset``, ``/step``, ``/state``, ``/schema``,
  ``/ws``); ``seal serve-openenv`` runs it.
* :class:`BfclEnvClient` — OpenEnv's ``EnvClient`` for it (``.sync()`` for synchronous use).

    from seal_rl.integrations.openenv import BfclAction, BfclEnvClient

    with BfclEnvClient(base_url="http://localhost:8000").sync() as env:
        result = env.reset(task_id="multi_turn_base_0", protocol="bfcl")
        result = env.step(BfclAction(message="<tool_call>...</tool_call>"))

docs/guides/integrations.md says what each protocol means and how to train on it with TRL.
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from seal_rl.diagnose import add_diagnosis
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.errors import SealError
from seal_rl.interface import Interface, InterfaceState
from seal_rl.tasks import TaskSet
from seal_rl.tools import ToolCatalog

ENV_NAME = "seal_bfcl"


class BfclAction(Action):
    """One assistant message."""

    message: str = Field(default="", description="the assistant message as the model wrote it (calls in the episode's call format)")
    tool_calls: list[dict[str, Any]] | None = Field(
        default=None, description="call_format native only: the message's structured tool calls (OpenAI-style)"
    )


class BfclObservation(Observation):
    """What the agent sees after ``reset`` or ``step``; the verdict and diagnosis once the episode ends."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="the new chat messages (role, content)")
    tools: list[dict[str, Any]] | None = Field(default=None, description="OpenAI-style specs of the tools available now, when they changed")
    task_id: str = Field(default="", description="the BFCL task of the episode")
    turn: int = Field(default=0, description="the user turn (0-based)")
    event: str = Field(default="reset", description="reset | tool_results | rejected | next_turn | skipped | end | error")
    end_reason: str | None = Field(default=None, description="why the episode ended: completed, or the budget that ran out")
    verdict: dict[str, Any] | None = Field(default=None, description="at the end: the verifier's verdict per turn (official checker rules)")
    diagnosis: dict[str, Any] | None = Field(default=None, description="at the end: Ψ's label and evidence for every user turn")
    error: str | None = Field(default=None, description="event error: why the message was not played")


class BfclState(State):
    """Where the episode is."""

    task_id: str | None = None
    turn: int = 0
    protocol: str = "bfcl"
    done: bool = False
    end_reason: str | None = None


class BfclEnvironment(Environment):
    """seal-rl's :class:`~seal_rl.env.BfclEnv` behind OpenEnv's ``Environment`` API; one episode per instance."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # every session gets its own instance: backends are per episode

    def __init__(self, task_set: TaskSet | None = None, catalog: ToolCatalog | None = None) -> None:
        super().__init__()
        self.task_set = task_set if task_set is not None else TaskSet.load()
        self.catalog = catalog if catalog is not None else ToolCatalog()
        self.env: BfclEnv | None = None
        self._state = BfclState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, *, task_id: str | None = None,
              split: str = "train", protocol: str = "bfcl", prompt_mode: str = "bfcl_qwen_fc", call_format: str = "hermes",
              interface: str = "vanilla", **kwargs: Any) -> BfclObservation:  # fmt: skip
        """Open an episode of ``task_id`` (default: a task of ``split`` drawn with ``seed``) under
        ``protocol`` (``bfcl``: the official loop; ``seal``: the SEAL reference's, as it trained) and
        the ``interface`` preset (``vanilla``, ``paper``, ``seal``: its Ω_0, shown as in training)."""
        if kwargs:
            raise ValueError(f"unknown reset option(s) {sorted(kwargs)}; expected task_id, split, protocol, prompt_mode, "
                             "call_format, interface")  # fmt: skip
        try:
            task = self.task_set.get(task_id) if task_id else random.Random(seed).choice(self.task_set.select(split))
            config = EnvConfig(protocol=protocol, prompt_mode=prompt_mode, call_format=call_format)
            shown = Interface(prompt_mode, InterfaceState.initial(interface), call_format=call_format,
                              training=interface != "vanilla", catalog=self.catalog, protocol=protocol)  # fmt: skip
        except SealError as exc:
            raise ValueError(str(exc)) from None
        self.env = BfclEnv(config, shown, catalog=self.catalog)
        messages, info = self.env.reset(task, seed=seed)
        self._state = BfclState(episode_id=episode_id, task_id=task.id, protocol=protocol)
        return BfclObservation(messages=messages, tools=info["tools"], task_id=task.id, turn=0, event="reset", reward=0.0)

    def step(self, action: BfclAction, timeout_s: float | None = None, **kwargs: Any) -> BfclObservation:
        env = self.env
        if env is None or env.task is None:
            return self._error("no episode: call reset first")
        if env.done:
            return self._error(f"the episode has ended ({env.end_reason}); call reset for a new one")
        played: str | dict[str, Any] = action.message
        if action.tool_calls is not None:
            played = {"role": "assistant", "content": action.message, "tool_calls": action.tool_calls}
        observation, reward, _, _, info = env.step(played)
        self._state.step_count += 1
        self._state.turn, self._state.done, self._state.end_reason = env.turn, env.done, env.end_reason
        result = BfclObservation(messages=observation, tools=info.get("tools"), task_id=env.task.id, turn=info["turn"],
                                 event=info["event"], reward=reward, done=env.done, end_reason=env.end_reason)  # fmt: skip
        if env.done:
            record = env.record()
            add_diagnosis(record)
            result.verdict, result.diagnosis = record["verdict"], record["diagnosis"]
        return result

    def _error(self, why: str) -> BfclObservation:
        env = self.env
        task_id = env.task.id if env is not None and env.task is not None else ""
        return BfclObservation(event="error", error=why, task_id=task_id, done=bool(env is not None and env.done),
                               reward=0.0)  # fmt: skip

    @property
    def state(self) -> BfclState:
        return self._state


def create_bfcl_app(max_concurrent_envs: int = 64) -> Any:
    """OpenEnv's FastAPI app for :class:`BfclEnvironment` (one instance per session, sharing the
    task set and the tool catalog, which are read-only)."""
    task_set, catalog = TaskSet.load(), ToolCatalog()
    return create_app(lambda: BfclEnvironment(task_set, catalog), BfclAction, BfclObservation, env_name=ENV_NAME,
                      max_concurrent_envs=max_concurrent_envs, state_cls=BfclState)  # fmt: skip


class BfclEnvClient(EnvClient[BfclAction, BfclObservation, BfclState]):
    """OpenEnv's client for a ``seal serve-openenv`` server (a persistent WebSocket session)."""

    def _step_payload(self, action: BfclAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"}, exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[BfclObservation]:
        observation = BfclObservation(**{**payload.get("observation", {}), "done": payload.get("done", False),
                                         "reward": payload.get("reward")})  # fmt: skip
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> BfclState:
        return BfclState(**payload)
