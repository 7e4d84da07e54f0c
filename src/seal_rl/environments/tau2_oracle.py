"""The scripted τ² oracle (``--policy oracle``): the harness check of the τ²-bench runner.

The agent says the task's gold assistant actions in order (``evaluation_criteria.actions`` with
``requestor == "assistant"``), one tool call per message, then one message holding every
``communicate_info`` string. The user opens the conversation, runs the task's user-side gold
actions (telecom's device toggles) one at a time once the agent has answered, and then sends τ²'s
``###STOP###``. Played through τ²'s ``Orchestrator`` and scored by its ``evaluate_simulation``,
this earns reward 1.0 on every test task of the three domains; a wrong value in a gold action that
writes to the database (:func:`with_wrong_write`) must lose it: the negative control.

Both classes are τ²'s own plug points (``LocalAgent``, ``BaseUser``), built on the classes
:func:`seal_rl.environments.tau2_bench.load_tau2` imports.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

OPENING = "Hi, I need some help with my account."
"""the scripted user's first message"""


def gold_actions(task: Any) -> list[Any]:
    """The task's gold actions (``evaluation_criteria.actions``), both requestors, in order."""
    criteria = task.evaluation_criteria
    return list(criteria.actions or []) if criteria is not None else []


def oracle_classes(tau2: SimpleNamespace) -> tuple[type, type]:
    """``(OracleAgent, OracleUser)``, subclasses of τ²'s ``LocalAgent`` and ``BaseUser``."""
    m = tau2.message

    def call(index: int, action: Any, requestor: str) -> Any:
        return m.ToolCall(id=f"oracle_{requestor}_{index}", name=action.name, arguments=copy.deepcopy(action.arguments),
                          requestor=requestor)  # fmt: skip

    def gold(task: Any, requestor: str) -> list[Any]:
        return [a for a in gold_actions(task) if a.requestor == requestor]

    class OracleAgent(tau2.agent_base.LocalAgent):
        """τ²'s gold assistant actions in order, then the task's ``communicate_info`` in one message."""

        def __init__(self, tools: list[Any], domain_policy: str, task: Any) -> None:
            super().__init__(tools=tools, domain_policy=domain_policy)
            self.task = task
            self.actions = gold(task, "assistant")

        def get_init_state(self, message_history: list[Any] | None = None) -> dict[str, int]:
            return {"next": 0}

        def generate_next_message(self, message: Any, state: dict[str, int]) -> tuple[Any, dict[str, int]]:
            if state["next"] < len(self.actions):
                index = state["next"]
                state["next"] += 1
                reply = m.AssistantMessage(role="assistant", tool_calls=[call(index, self.actions[index], "assistant")], cost=0.0)
                return reply, state
            criteria = self.task.evaluation_criteria
            info = [str(i) for i in ((criteria.communicate_info or []) if criteria is not None else [])]
            return m.AssistantMessage(role="assistant", content=" ".join(info) or "Your request is done.", cost=0.0), state

        def set_seed(self, seed: int) -> None:
            pass  # scripted: nothing to seed

    class OracleUser(tau2.user_base.BaseUser):
        """Opens, runs the user-side gold actions once the agent has answered, then stops."""

        def __init__(self, task: Any, tools: list[Any] | None = None) -> None:
            super().__init__(instructions=str(task.user_scenario))
            self.task = task
            self.tools = tools
            self.actions = gold(task, "user")

        def get_init_state(self, message_history: list[Any] | None = None) -> Any:
            return tau2.user_base.UserState(system_messages=[], messages=list(message_history or []))

        def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
            said = [msg for msg in state.messages if isinstance(msg, m.UserMessage)]
            state.messages.append(message)
            done = sum(1 for msg in said if msg.is_tool_call())
            if not said:
                reply = m.UserMessage(role="user", content=OPENING, cost=0.0)
            elif done < len(self.actions):
                reply = m.UserMessage(role="user", tool_calls=[call(done, self.actions[done], "user")], cost=0.0)
            else:
                reply = m.UserMessage(role="user", content=tau2.user_base.STOP, cost=0.0)
            state.messages.append(reply)
            return reply, state

        @classmethod
        def is_stop(cls, message: Any) -> bool:
            return tau2.user_simulator.UserSimulator.is_stop(message)

        def set_seed(self, seed: int) -> None:
            pass  # scripted: nothing to seed

    return OracleAgent, OracleUser


def write_actions(tau2: SimpleNamespace, domain: str, task: Any) -> list[int]:
    """Positions (in ``evaluation_criteria.actions``) of the task's gold actions that change the
    database: the tool writes (its ``ToolType`` in the domain's agent or user toolkit) and the
    gold call succeeds when the gold actions are replayed on the task's initial state (a gold
    write that fails, as in retail task 12, leaves the database as it was)."""
    env = tau2.registry.get_env_constructor(domain)()
    state = task.initial_state
    env.set_state(initialization_data=state.initialization_data if state else None,
                  initialization_actions=state.initialization_actions if state else None, message_history=[])  # fmt: skip
    kits = [kit for kit in (env.tools, getattr(env, "user_tools", None)) if kit is not None]
    found = []
    for index, action in enumerate(gold_actions(task)):
        call = tau2.message.ToolCall(id=f"replay_{index}", name=action.name, arguments=copy.deepcopy(action.arguments),
                                     requestor=action.requestor)  # fmt: skip
        succeeded = not env.get_response(call).error
        writes = any(kit.has_tool(action.name) and kit.tool_type(action.name).value == "write" for kit in kits)
        if writes and succeeded:
            found.append(index)
    return found


def _wrong(value: Any) -> Any:
    """A value of the same kind that differs from ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return value[:-1] if value else ["_x"]
    if isinstance(value, dict):
        return {**value, "_x": "_x"} if not value else {k: _wrong(v) if i == 0 else v for i, (k, v) in enumerate(value.items())}
    return "_x"


def with_wrong_write(tau2: SimpleNamespace, domain: str, task: Any) -> Any | None:
    """The task with the first argument of its last database-writing gold action changed (the
    negative control's oracle plays this and is scored against the original), or None when the
    task has no writing action with an argument."""
    actions = gold_actions(task)
    for index in reversed(write_actions(tau2, domain, task)):
        if actions[index].arguments:
            changed = task.model_copy(deep=True)
            arguments = changed.evaluation_criteria.actions[index].arguments
            key = next(iter(arguments))
            arguments[key] = _wrong(arguments[key])
            return changed
    return None
