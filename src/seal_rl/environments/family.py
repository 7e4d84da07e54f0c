"""Environment families: what SEAL's closed loop needs from an environment, and BFCL as the first.

SEAL (Algorithm 1) needs five things from an environment, and nothing else:

1. **tasks** q with ids, categories and splits (:class:`FamilyTask`, :meth:`Family.tasks`);
2. an **episode** E that takes raw assistant messages and answers with observations
   (:meth:`Family.make_env`; the driver, :func:`seal_rl.rollout.run_episodes`, speaks to it through
   :class:`~seal_rl.environments.protocol.Environment`);
3. the **verdict** V(τ) ∈ [0, 1] with its evidence (:class:`Outcome`, :meth:`Family.verify`);
4. the evidence **Ψ** reads to label failures (SEAL Eq. 5–6; :func:`seal_rl.diagnose.diagnose`):
   the execution trace the episode records (parse, schema and execution errors) plus what the
   verifier reports (expected tools never called, state that differs, information never given);
5. the **affordances** the interface Ω points to (:attr:`Family.inspect_tools`).

A family of your own subclasses :class:`Family` and fills in :meth:`~Family.tasks`,
:meth:`~Family.tools`, :meth:`~Family.start`, :meth:`~Family.call` and :meth:`~Family.verify`
(``examples/families/inventory.py`` is a whole one; docs/guides/your-environment.md walks through it).
The episode — parsing the model's message in the recipe's call format, schema checks, error
observations, limits, the trace and the record — is seal-rl's, the same code as BFCL's, so a
family never handles model text itself.

A recipe names its family (``family:``): ``bfcl`` (the default), ``tau2-DOMAIN``, or an import
path ``package.module:Class`` / ``path/to/file.py:Class``. :func:`~seal_rl.environments.load.load_family` resolves it and
:func:`~seal_rl.environments.load.check_family` says in one line which part of the protocol a family breaks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from seal_rl.environments.outcome import Outcome
from seal_rl.errors import SealError

SPLITS: tuple[str, ...] = ("train", "test", "all")


@dataclass(frozen=True)
class FamilyTask:
    """One task of a family.

    id: unique within the family (any string: ``"retail_12"``, ``"7"``).
    category: a group reported apart (per-category success, validation spread).
    prompt: the user's opening message.
    split: ``train`` or ``test``.
    data: the family's own payload (what :meth:`Family.start` and :meth:`Family.verify` read).
    """

    id: str
    category: str
    prompt: str
    split: str = "train"
    data: Any = None


class Family:
    """An environment family: subclass it for your own environment (see the module docstring).

    Required: :meth:`tasks`, :meth:`tools`, :meth:`start`, :meth:`call`, :meth:`verify`.
    Optional: :meth:`instructions` (system text before the tools), :meth:`reply` (the user's answer
    to a text message; by default a text message ends the episode), :attr:`inspect_tools`.
    """

    name: str = "family"
    inspect_tools: tuple[str, ...] = ()
    """tools that read state without changing it: Ω's recovery hints point to them"""
    has_user: bool = True
    """whether a user reads the agent's text (False: a text message ends the episode; Ω's hints then never
    suggest asking)"""
    max_replies: int = 10
    """user replies per episode before the conversation ends (``reply`` is asked no more)"""

    # -- what a family provides ----------------------------------------------------------------

    def tasks(self) -> Sequence[FamilyTask]:
        raise NotImplementedError

    def tools(self, task: FamilyTask) -> list[dict[str, Any]]:
        """The task's tools as JSON-schema function docs: ``{"name", "description", "parameters":
        {"type": "object", "properties": {...}, "required": [...]}}``."""
        raise NotImplementedError

    def instructions(self, task: FamilyTask) -> str | None:
        """System text shown before the tools (a policy, a role); None for none."""
        return None

    def start(self, task: FamilyTask) -> Any:
        """A fresh state for one episode of ``task`` (never shared between episodes)."""
        raise NotImplementedError

    def call(self, state: Any, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call on the episode's state and return its result as text; raise
        :class:`~seal_rl.environments.outcome.ToolError` for a call the tool refuses. Arguments have been parsed from model text:
        treat them as hostile (the schema check runs before, but the call still executes)."""
        raise NotImplementedError

    def reply(self, state: Any, task: FamilyTask, text: str) -> str | None:
        """The user's answer to the agent's text message, or None to end the conversation."""
        return None

    def opening(self, state: Any, task: FamilyTask) -> str:
        """The user's first message (default: the task's prompt; a simulated user writes its own)."""
        return task.prompt

    def oracle(self, task: FamilyTask) -> list[Any] | None:
        """The assistant messages that solve ``task``, each a list of :class:`~seal_rl.tools.ToolCall`
        or a text, for a warm start (``warm_start.data: [{source: oracle}]``); None when there are none."""
        return None

    def ended(self, state: Any) -> str | None:
        """Why the world ended the episode on its own (``completed``, or a limit such as ``max_steps``),
        or None while it goes on. Asked after every step."""
        return None

    def verify(self, task: FamilyTask, state: Any, transcript: Sequence[Mapping[str, Any]]) -> Outcome:
        """V(τ): score the finished episode from its final ``state`` and the chat ``transcript``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the family holds (a simulated user's model); called once a run is over."""

    # -- what seal-rl builds from it -----------------------------------------------------------

    def task_set(self) -> TaskSource:
        return TaskSource(self.tasks())

    def make_env(self, config: Any = None, interface: Any = None, *, catalog: Any = None) -> Any:
        """One episode environment (reset and reused by the driver)."""
        from seal_rl.environments.episode import FamilyEnv

        return FamilyEnv(self, config, interface, catalog=catalog)

    def scenario(self, task_id: str) -> str:
        """Tasks of one scenario share their content: validation never holds out a trained one."""
        return task_id


class TaskSource:
    """A family's tasks by id and split (what ``TaskSet`` is for BFCL)."""

    def __init__(self, tasks: Iterable[FamilyTask]) -> None:
        self._tasks = {t.id: t for t in tasks}

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[FamilyTask]:
        return iter(self._tasks.values())

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def get(self, task_id: str) -> FamilyTask:
        try:
            return self._tasks[str(task_id)]
        except KeyError:
            known = ", ".join(list(self._tasks)[:8])
            raise SealError(f"Unknown task id {task_id!r} for this family (known: {known}"
                            f"{', ...' if len(self._tasks) > 8 else ''}).") from None  # fmt: skip

    def split_of(self, task_id: str) -> str:
        return self.get(task_id).split

    def select(self, split: str = "train", categories: Sequence[str] | None = None,
               ids: Sequence[str] | None = None) -> list[FamilyTask]:  # fmt: skip
        if split not in SPLITS:
            raise SealError(f"Unknown split {split!r}; expected one of {', '.join(SPLITS)}.")
        if ids:
            return [self.get(i) for i in ids]
        known = sorted({t.category for t in self})
        for category in categories or ():
            if category not in known:
                raise SealError(f"Unknown category {category!r}; this family has {', '.join(known)}.")
        return [t for t in self if (split == "all" or t.split == split) and (not categories or t.category in categories)]


class BfclFamily:
    """BFCL multi-turn (the paper's benchmark): :class:`~seal_rl.env.BfclEnv` episodes, the official
    checker's verdict per user turn, Ψ over its per-turn checks, the 400/400 split."""

    name = "bfcl"

    def __init__(self, task_set: Any = None) -> None:
        self._task_set = task_set

    def task_set(self) -> Any:
        if self._task_set is None:
            from seal_rl.tasks import TaskSet

            self._task_set = TaskSet.load()
        return self._task_set

    def make_env(self, config: Any = None, interface: Any = None, *, catalog: Any = None) -> Any:
        from seal_rl.env import BfclEnv

        return BfclEnv(config, interface, catalog=catalog)

    def scenario(self, task_id: str) -> str:
        """The four categories of one number share their questions (``multi_turn_base_105``: 105)."""
        return task_id.rsplit("_", 1)[1]


def affordances(family: Any) -> dict[str, Any]:
    """What Ω takes from a family (:class:`~seal_rl.interface.Interface` keywords): the tools that inspect
    state, and whether anyone reads the agent's text. BFCL (or no family): the interface's defaults."""
    if family is None or isinstance(family, BfclFamily):
        return {}
    return {"inspect_tools": tuple(getattr(family, "inspect_tools", ())), "user": bool(getattr(family, "has_user", True))}


def oracle_messages(family: Any, task: Any, call_format: str) -> list[Any]:
    """``family.oracle(task)`` as the agent would write it in ``call_format`` (one call a message
    under ``native``, as the BFCL oracle writes them); one line when the family has no oracle."""
    from seal_rl.tools import get_format

    script = family.oracle(task) if hasattr(family, "oracle") else None
    if script is None:
        raise SealError(f"family {getattr(family, 'name', family)}: no oracle for task {task.id!r}; a warm start from "
                        "`oracle` needs Family.oracle(task) (docs/guides/your-environment.md).")  # fmt: skip
    fmt, messages = get_format(call_format), []
    for item in script:
        if isinstance(item, str):
            messages.append(item)
        elif fmt.name == "native":
            messages += [fmt.render([call]) for call in item]
        else:
            messages.append(fmt.render(list(item)))
    return messages
