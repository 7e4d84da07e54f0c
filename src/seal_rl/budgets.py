"""How many ground truths fit a recipe's token budgets, counted with the recipe's real tokenizer.

A recipe's budgets (``budgets.max_prompt_tokens``, ``max_completion_tokens``, ``max_new_tokens``
per model call) and its environment limits (``env.max_model_calls``, ...) decide which episodes a
model *can* finish: an episode that needs more is truncated, and its reward is 0 however well the
model does. :func:`count_within_budgets` plays every task's ground truth (the oracle's transcript)
through the same episode driver, environment, interface Ω_0, call format, prompt mode and
token-exact sample builder as a training rollout, with a generator that behaves like a model
under the budgets: a message that does not fit the tokens the driver allows for that call
(``max_new_tokens``, or what is left of ``max_completion_tokens``) ends the episode there. A ground
truth is *within budgets* when its episode completes; otherwise the count says which budget or
limit ended it:

* ``prompt_budget`` — the opening prompt (system block + first question) is longer than
  ``max_prompt_tokens``;
* ``completion_budget`` — everything after the prompt (messages, observations, template tokens)
  does not fit ``max_completion_tokens``;
* ``max_new_tokens`` — one oracle message (with its end-of-message token) is longer than
  ``max_new_tokens``;
* ``max_model_calls``, ``max_steps_per_turn``, ``observation_budget``, ... — an environment limit.

``seal plan`` and ``seal train`` print :func:`summary_line` of the count (docs/guides/planning.md).
Measured on 2 cores: the 400 training tasks in 5 s with the tiny model's tokenizer, 13 s with
SmolLM2-135M's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.families import resolve_auto
from seal_rl.interface import Interface, InterfaceConfig, InterfaceState
from seal_rl.policies import OraclePolicy, ScriptedAgent
from seal_rl.rollout import Budgets, Generation, Request, run_episodes
from seal_rl.tasks import CATEGORIES, Task, TaskSet
from seal_rl.tools import ToolCatalog
from seal_rl.trajectory import ChatTokens

COMPLETED = "completed"


@dataclass
class CategoryCount:
    """Ground truths of one category: how many were played, how many fit, and what ended the rest."""

    tasks: int = 0
    within: int = 0
    ended_by: Counter[str] = field(default_factory=Counter)
    """end reason -> number of ground truths it ended (those not within budgets)"""
    longest_prompt: int = 0
    """the longest opening prompt, in tokens (every task has one, fitting or not)"""


@dataclass(frozen=True)
class BudgetCount:
    """Per-category counts (in :data:`~seal_rl.tasks.CATEGORIES` order) and how long counting took."""

    categories: dict[str, CategoryCount]
    seconds: float

    @property
    def tasks(self) -> int:
        return sum(c.tasks for c in self.categories.values())

    @property
    def within(self) -> int:
        return sum(c.within for c in self.categories.values())

    @property
    def ended_by(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for count in self.categories.values():
            total.update(count.ended_by)
        return total


class _BudgetedOracle:
    """Plays scripted messages as a model under the budgets would: the message's tokens plus the
    end-of-message token, as long as they fit the tokens the driver allows for this call. A message
    that does not fit ends the episode (``None``) and is recorded as ended by ``max_new_tokens``
    (longer than one call may be) or ``completion_budget`` (longer than what is left)."""

    def __init__(self, agents: dict[int, ScriptedAgent], chat: ChatTokens, max_new_tokens: int) -> None:
        self.agents, self.chat, self.max_new_tokens = agents, chat, max_new_tokens
        self.cut: dict[int, str] = {}

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        out: list[Generation | None] = []
        for request in requests:
            text = self.agents[request.episode].act(request.observation, request.info)
            if text is not None:
                text, ids = self.chat.as_generated(text)
                if len(ids) > request.max_new_tokens:
                    self.cut[request.episode] = "max_new_tokens" if len(ids) > self.max_new_tokens else "completion_budget"
                    text = None
            out.append(None if text is None else Generation(text, ids))
        return out


def count_within_budgets(
    tasks: Sequence[Task],
    task_set: TaskSet,
    tokenizer: Any,
    env_config: EnvConfig,
    budgets: Budgets,
    interface_preset: str = "vanilla",
    *,
    concurrency: int = 64,
) -> BudgetCount:
    """Play the ground truth of every task in ``tasks`` under the recipe's environment, interface
    preset (its Ω_0, in training mode, as the first round sees it) and budgets, tokenised with
    ``tokenizer``; return per-category counts of the ground truths within budgets (see the module
    docstring for what ends the others). Pure: nothing is written, no model is loaded."""
    began = time.perf_counter()
    chat = ChatTokens.for_episodes(tokenizer, env_config.prompt_mode, env_config.call_format)
    if chat.stops.end_id is None:
        raise ValueError("the model names no end-of-message token")
    catalog = ToolCatalog()
    interface = Interface(env_config.prompt_mode, InterfaceState.initial(interface_preset), call_format=env_config.call_format,
                          catalog=catalog, protocol=env_config.protocol)  # fmt: skip
    episodes = OraclePolicy().episodes(tasks, task_set, env_config.call_format)
    generator = _BudgetedOracle({e.index: e.agent for e in episodes}, chat, budgets.max_new_tokens)
    rollouts = run_episodes(
        [(e.index, e.task, {}) for e in episodes], generator, lambda: BfclEnv(env_config, interface, catalog=catalog),
        chat=chat, budgets=budgets, concurrency=concurrency,
    )  # fmt: skip
    counts = {name: CategoryCount() for name in CATEGORIES if any(t.category == name for t in tasks)}
    for rollout in rollouts:
        count = counts.setdefault(rollout.record["category"], CategoryCount())
        count.tasks += 1
        count.longest_prompt = max(count.longest_prompt, len(rollout.trajectory.prompt_ids))
        reason = generator.cut.get(rollout.index, rollout.record["end_reason"])
        if reason == COMPLETED:
            count.within += 1
        else:
            count.ended_by[reason] += 1
    return BudgetCount(counts, time.perf_counter() - began)


def summary_line(count: BudgetCount) -> str:
    """One line, e.g. ``ground truths within budgets: base 100/100, ..., long_context 64/100 — 36
    end with completion_budget``."""
    parts = ", ".join(f"{name} {c.within}/{c.tasks}" for name, c in count.categories.items())
    line = f"ground truths within budgets: {parts}"
    ended = count.ended_by.most_common()
    if ended:
        (first, n), rest = ended[0], ended[1:]
        line += f" — {n} end with {first}" + "".join(f", {m} with {reason}" for reason, m in rest)
    return line + f" ({count.tasks} tasks played with the recipe's tokenizer in {count.seconds:.1f} s)"


def count_for_recipe(recipe: Any, tokenizer: Any, task_set: TaskSet, tasks: Sequence[Task]) -> BudgetCount:
    """:func:`count_within_budgets` for a training recipe's ``tasks`` (as ``seal train`` selects
    them): its environment, interface preset and budgets."""
    preset = InterfaceConfig(**recipe.interface).preset
    env, _ = resolve_auto(recipe.env, tokenizer)
    return count_within_budgets(tasks, task_set, tokenizer, EnvConfig(**env), Budgets(**recipe.budgets), preset)
