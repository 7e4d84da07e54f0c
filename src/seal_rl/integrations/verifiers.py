"""BFCL multi-turn as a verifiers environment (verifiers 0.4, its ``verifiers.v1`` interface).

A verifiers environment is a taskset package: a module whose ``__all__`` exports one
``vf.Taskset`` subclass (the tasks) and, for a multi-turn game, one ``vf.Env`` subclass whose
``run(task, agents)`` plays the episode. This module is one, so every verifiers entry point finds
it by its id, ``seal-bfcl`` (verifiers imports an id as a top-level module: the package
``seal_bfcl`` re-exports this module's classes):

* ``vf-eval seal-bfcl -m MODEL --client.base-url URL`` evaluates a model;
* ``vf.load_environment(BfclEnvConfig(...))``, or :func:`load_environment` here with keyword
  options, builds the environment in Python (verifiers' eval runner and server load it this way).

:class:`BfclTaskset` yields one task per BFCL task of a split (the paper's 400/400 split, or explicit
ids). :class:`BfclVerifiersEnv` plays it with seal-rl's :class:`~seal_rl.env.BfclEnv`: the opening
prompt, then each model reply is a step; tool results come back as ``<tool_response>`` blocks in a
user message, then the next question or a miss_func reveal, until the last turn ends or a budget
does. The rubric is seal-rl's verifier (the official checker's rules): the episode's reward
``bfcl`` is 1 when every turn passes, else 0. Its metrics are the diagnosis Ψ, measured as
``seal eval`` measures it (:func:`episode_metrics`: turn pass rate, accepted-call share, one count per label);
``trace.info`` holds the verdict, the labels with their evidence and the end reason.

Calls travel as text in the episode's call format (``bfcl_qwen_fc`` prompt: tools described in the
system prompt, Hermes ``<tool_call>`` blocks), so any chat model can be evaluated and nothing
depends on the server's tool parser; the model runs under verifiers' tool-less ``null`` harness on
the local ``subprocess`` runtime. ``protocol`` (``bfcl`` or ``seal``) and ``interface`` are as in
``seal eval`` (docs/guides/integrations.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import Any, Literal

import verifiers.v1 as vf
from pydantic import model_validator

from seal_rl.diagnose import LABELS, add_diagnosis
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.errors import SealError
from seal_rl.evaluate import episode_counts
from seal_rl.generators.openai_compatible import as_text_turns
from seal_rl.interface import Interface, InterfaceState
from seal_rl.tasks import Task, TaskSet
from seal_rl.tools import ToolCatalog

__all__ = ["BfclData", "BfclEnvConfig", "BfclTask", "BfclTaskset", "BfclTasksetConfig", "BfclVerifiersEnv",
           "load_environment"]  # fmt: skip

TASKSET_ID = "seal-bfcl"
"""The id verifiers knows the environment by (``vf-eval seal-bfcl``, ``--env.taskset.id``): it
imports the top-level module ``seal_bfcl``, which re-exports this one's classes."""


class BfclTasksetConfig(vf.TasksetConfig):
    """Which BFCL tasks, and how the episode is played (the options of ``seal eval``)."""

    id: str = TASKSET_ID
    split: Literal["train", "test", "all"] = "test"
    """the paper's 400/400 split (``test``: the tasks the paper reports), or ``all``"""
    categories: list[str] | None = None
    """some of base, miss_func, miss_param, long_context (default: all four)"""
    tasks: list[str] | None = None
    """explicit task ids instead of split and categories"""
    protocol: Literal["bfcl", "seal"] = "bfcl"
    """``bfcl``: the official multi-turn loop; ``seal``: the SEAL reference's, as it trained"""
    call_format: Literal["hermes"] = "hermes"
    """how calls are written in text (the ``bfcl_qwen_fc`` prompt's Hermes ``<tool_call>`` blocks)"""
    interface: Literal["vanilla", "paper", "seal"] = "vanilla"
    """the interface preset the agent sees (``vanilla``: the evaluation interface)"""


class BfclData(vf.TaskData):
    """One BFCL task as verifiers records it (the id, and how it is played)."""

    protocol: str = "bfcl"
    call_format: str = "hermes"
    interface: str = "vanilla"


class BfclTask(vf.Task[BfclData]):
    @property
    def key(self) -> str:
        return str(self.data.id)


class BfclTaskset(vf.Taskset[BfclTask, BfclTasksetConfig]):
    """The BFCL multi-turn tasks of the config's split (one verifiers task each)."""

    @cached_property
    def bfcl(self) -> tuple[TaskSet, ToolCatalog]:
        """The tasks and the tool catalog, loaded once (read-only; about a second): the tasks are
        built from them, and the environment plays its episodes with them."""
        return TaskSet.load(), ToolCatalog()

    def load(self) -> Iterator[BfclTask]:
        config = self.config
        task_set, catalog = self.bfcl
        try:
            chosen = task_set.select(config.split, config.categories, ids=config.tasks)
        except SealError as exc:  # an unknown task id or category: verifiers reports a ValueError as a config error
            raise ValueError(str(exc)) from None
        if not chosen:
            raise ValueError(f"no BFCL task matches split {config.split!r}, categories {config.categories}, tasks {config.tasks}")
        for task in chosen:
            opening = _episode(task, config.protocol, config.call_format, config.interface, catalog)[1]
            system = next((m["content"] for m in opening if m["role"] == "system"), None)
            yield BfclTask(BfclData(id=task.id, name=task.id, prompt=None, system_prompt=system, protocol=config.protocol,
                                    call_format=config.call_format, interface=config.interface), config.task)  # fmt: skip


class BfclEnvConfig(vf.EnvConfig):
    """The environment: the BFCL taskset and its one seat, the agent under evaluation or training."""

    taskset: BfclTasksetConfig = BfclTasksetConfig()
    agent: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime={"type": "subprocess"})
    """the model's seat: verifiers' tool-less chat program (calls are text) on the local runtime"""

    @model_validator(mode="before")
    @classmethod
    def _taskset_is_ours(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("taskset"), dict):
            data = {**data, "taskset": {"id": TASKSET_ID, **data["taskset"]}}
        return data


class BfclVerifiersEnv(vf.Env[BfclEnvConfig]):
    """One BFCL episode per task: the model's replies are the steps of seal-rl's environment."""

    async def run(self, task: BfclTask, agents: vf.Agents) -> None:
        data = task.data
        task_set, catalog = self.taskset.bfcl
        env, opening = _episode(task_set.get(str(data.id)), data.protocol, data.call_format, data.interface, catalog)
        message = as_text_turns([m for m in opening if m["role"] != "system"])  # the system prompt is the task's
        async with agents.agent.interaction(task) as interaction:
            while not env.done:
                segment = await interaction.turn(message)
                if segment.terminated:  # a verifiers limit (turns, tokens, time) ended the exchange
                    break
                observation, *_ = env.step(_reply(segment))
                message = as_text_turns(observation)
            if not env.done:
                env.truncate("agent_stopped")
            # scored before the exchange closes, so verifiers' own log and hooks see the reward
            record = env.record()
            add_diagnosis(record)
            trace = interaction.trace
            trace.record_reward("bfcl", float(record["reward"] or 0.0))
            trace.record_metrics(episode_metrics(record))
            trace.info.update(seal_verdict=record["verdict"], seal_diagnosis=record["diagnosis"], seal_end_reason=record["end_reason"])


def episode_metrics(record: dict[str, Any]) -> dict[str, float]:
    """A diagnosed episode as verifiers metrics, the measures ``seal eval`` pools
    (:func:`~seal_rl.evaluate.episode_counts`): ``turn_pass_rate`` (turns Ψ passes / ground-truth
    turns), ``call_share`` (model messages that were accepted calls), ``turns``, ``messages``, and
    ``label_<name>``: how many turns got each label of the taxonomy (every label, so runs pool the same keys)."""
    counts = episode_counts(record)
    labels = [t["label"] for t in record["diagnosis"]["labels"]]
    return {"turn_pass_rate": counts["passed"] / counts["turns"] if counts["turns"] else 0.0,
            "call_share": counts["calls"] / counts["messages"] if counts["messages"] else 0.0,
            "turns": float(counts["turns"]), "messages": float(counts["messages"]),
            **{f"label_{name}": float(labels.count(name)) for name in LABELS}}  # fmt: skip


def _reply(segment: Any) -> str:
    """The model's last message as it wrote it (``Segment.last_reply`` strips it)."""
    for message in reversed(segment.messages):
        if getattr(message, "role", None) == "assistant":
            content = message.content
            return content if isinstance(content, str) else ""
    return ""


def load_environment(**taskset: Any) -> BfclVerifiersEnv:
    """The environment with these taskset options (:class:`BfclTasksetConfig`'s fields: ``split``,
    ``categories``, ``tasks``, ``protocol``, ``interface``), as verifiers' loader builds it."""
    from verifiers.v1.utils.loaders import load_environment as vf_load_environment

    return vf_load_environment(BfclEnvConfig(taskset=BfclTasksetConfig(**taskset)))


def _episode(task: Task, protocol: str, call_format: str, interface: str,
             catalog: ToolCatalog | None = None) -> tuple[BfclEnv, list[dict[str, Any]]]:  # fmt: skip
    """A fresh :class:`BfclEnv` on ``task`` (``bfcl_qwen_fc`` prompt) and its opening messages."""
    catalog = catalog if catalog is not None else ToolCatalog()
    try:
        shown = Interface("bfcl_qwen_fc", InterfaceState.initial(interface), call_format=call_format,
                          training=interface != "vanilla", catalog=catalog, protocol=protocol)  # fmt: skip
        env = BfclEnv(EnvConfig(protocol=protocol, prompt_mode="bfcl_qwen_fc", call_format=call_format), shown, catalog=catalog)
    except SealError as exc:
        raise ValueError(str(exc)) from None
    opening, _ = env.reset(task)
    return env, opening
