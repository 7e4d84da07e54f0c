"""Per-episode environment time of a τ² episode: τ²'s ``AgentGymEnv`` as shipped against seal-rl's
fast path (:mod:`seal_rl.environments.tau2_world`), same tasks, same gold actions, same run.

Each episode plays a task's gold actions, scripted (no model: the whole wall time is the
environment's), and is scored by τ²'s ``evaluate_simulation`` (``EvaluationType.ALL``):

* solo domains (mock, telecom; tasks with a ``ticket``): every gold action as a tool call, then
  ``done``. AgentGymEnv(domain, task_id, solo_mode=True) gets them as JSON actions through ``reset``
  and ``step`` (it scores on the last step). The fast path builds the environment with
  ``environment_constructor(tau2, domain)(solo_mode=True)``, an ``LLMSoloAgent`` that says the same
  messages, τ²'s ``DummyUser``, τ²'s ``Orchestrator`` (``run()``), and scores with
  ``evaluate_simulation(domain=scoring_domain(tau2, domain))``.
* airline and retail (no solo mode in τ²): the assistant's gold actions, then the task's
  ``communicate_info``, with seal-rl's scripted oracle user (:mod:`seal_rl.environments.tau2_oracle`)
  instead of τ²'s LLM user simulator, in AgentGymEnv (its ``_get_user`` only is replaced) and in the
  fast path alike.

Time per episode: AgentGymEnv from its construction to the scored last step; the fast path from
building the environment to the ``RewardInfo``, with the task object at hand (an episode has it).
The fast path's one-time parse of the domain database (first ``environment_constructor`` call of
the process) is shown apart. Rewards and whole ``reward_info`` are compared per task.

Usage: python benchmarks/bench_env_tau2.py [--domains mock,telecom,airline,retail] [--tasks 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

from rich.table import Table

from harness import provenance_console, times, write_summary

SOLO = ("mock", "telecom")
"""the domains played solo (τ²'s airline and retail constructors refuse solo_mode)"""


def _tasks(tau2, domain: str, count: int) -> list:
    """The first ``count`` tasks of the set AgentGymEnv looks a task up in (the registry's loader
    with its default split), solo-playable ones only in a solo domain."""
    tasks = tau2.registry.get_tasks_loader(domain)()
    if domain in SOLO:
        tasks = [t for t in tasks if t.ticket is not None and tau2.llm_agent.LLMSoloAgent.check_valid_task(t)]
    return tasks[:count]


def _actions(task, solo: bool) -> list[str]:
    """The gym action strings of the scripted episode: JSON tool calls, then ``done`` (solo) or the
    ``communicate_info`` text (as the oracle agent says it)."""
    from seal_rl.environments.tau2_oracle import gold_actions

    gold = [a for a in gold_actions(task) if solo or a.requestor == "assistant"]
    calls = [json.dumps({"id": f"call_{i}", "name": a.name, "arguments": a.arguments}) for i, a in enumerate(gold)]
    if solo:
        return [*calls, json.dumps({"id": f"call_{len(calls)}", "name": "done", "arguments": {}})]
    info = [str(i) for i in (task.evaluation_criteria.communicate_info or [])]
    return [*calls, " ".join(info) or "Your request is done."]


def gym_episode(tau2, domain: str, task) -> tuple[float, object]:
    """AgentGymEnv as shipped (its user replaced by the oracle user outside solo mode)."""
    from tau2.gym.gym_agent import AgentGymEnv

    from seal_rl.environments.tau2_oracle import oracle_classes

    solo = domain in SOLO
    _, OracleUser = oracle_classes(tau2)

    class OracleUserGymEnv(AgentGymEnv):
        def _get_user(self):  # AgentGymEnv._get_user, with the oracle user instead of τ²'s LLM user
            environment, task = self._get_environment(), self._get_task()
            try:
                tools = environment.get_user_tools()
            except ValueError:
                tools = None
            return OracleUser(task=task, tools=tools)

    began = time.perf_counter()
    env = (AgentGymEnv if solo else OracleUserGymEnv)(domain=domain, task_id=task.id, max_steps=200, solo_mode=solo)
    env.reset(seed=0)
    terminated, info = False, {}
    for action in _actions(task, solo):
        _, _, terminated, _, info = env.step(action)
        if terminated:
            break
    seconds = time.perf_counter() - began
    if not terminated:
        raise RuntimeError(f"{domain} {task.id}: AgentGymEnv did not end after the scripted actions")
    return seconds, tau2.simulation.RewardInfo.model_validate_json(info["reward_info"])


def fast_episode(tau2, domain: str, task) -> tuple[float, object]:
    """The fast path: the episode model of seal-rl's τ² training episodes."""
    from tau2.data_model.message import MultiToolMessage
    from tau2.utils.tools import parse_action_string

    from seal_rl.environments.tau2_world import environment_constructor, scoring_domain
    from seal_rl.environments.tau2_oracle import oracle_classes

    solo = domain in SOLO
    actions = _actions(task, solo)

    class ScriptedSoloAgent(tau2.llm_agent.LLMSoloAgent):
        def generate_next_message(self, message, state):
            if isinstance(message, MultiToolMessage):
                state.messages.extend(message.tool_messages)
            elif message is not None:
                state.messages.append(message)
            # made now, not in advance: the trajectory is sorted by the messages' timestamps
            reply = self._check_if_stop_toolcall(parse_action_string(actions.pop(0)))
            state.messages.append(reply)
            return reply, state

        def set_seed(self, seed: int) -> None:
            pass  # scripted: nothing to seed

    began = time.perf_counter()
    env = environment_constructor(tau2, domain)(solo_mode=solo)
    if solo:
        tools = env.get_tools() + (env.get_user_tools() if env.user_tools is not None else [])
        agent = ScriptedSoloAgent(tools=tools, domain_policy=env.get_policy(), task=task)
        user = tau2.user_simulator.DummyUser()
    else:
        OracleAgent, OracleUser = oracle_classes(tau2)
        agent = OracleAgent(tools=env.get_tools(), domain_policy=env.get_policy(), task=task)
        user = OracleUser(task=task, tools=env.get_user_tools() if env.user_tools is not None else None)
    orchestrator = tau2.orchestrator.Orchestrator(domain, agent, user, env, task, max_steps=200, max_errors=10, seed=0,
                                                  solo_mode=solo)  # fmt: skip
    simulation = orchestrator.run()
    reward_info = tau2.evaluator.evaluate_simulation(simulation=simulation, task=task, evaluation_type=tau2.evaluator.EvaluationType.ALL,
                                                     solo_mode=solo, domain=scoring_domain(tau2, domain))  # fmt: skip
    return time.perf_counter() - began, reward_info


def bench_domain(tau2, domain: str, count: int) -> dict:
    from seal_rl.environments.tau2_world import environment_constructor

    tasks = _tasks(tau2, domain, count)
    began = time.perf_counter()
    environment_constructor(tau2, domain)  # the one-time parse of the domain database
    parse = time.perf_counter() - began
    rows = []
    for task in tasks:
        gym_s, gym_info = gym_episode(tau2, domain, task)
        fast_s, fast_info = fast_episode(tau2, domain, task)
        rows.append({"task_id": task.id, "gym_s": gym_s, "fast_s": fast_s, "gym_reward": gym_info.reward, "fast_reward": fast_info.reward,
                     "reward_info_identical": gym_info.model_dump(mode="json") == fast_info.model_dump(mode="json")})  # fmt: skip
    gym_mean = statistics.mean(r["gym_s"] for r in rows)
    fast_mean = statistics.mean(r["fast_s"] for r in rows)
    return {"domain": domain, "mode": "solo" if domain in SOLO else "oracle", "tasks": len(rows), "one_time_parse_s": parse,
            "gym_mean_s": gym_mean, "fast_mean_s": fast_mean, "speedup": gym_mean / fast_mean,
            "rewards_identical": all(r["gym_reward"] == r["fast_reward"] for r in rows),
            "reward_info_identical": all(r["reward_info_identical"] for r in rows), "episodes": rows}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", default="mock,telecom,airline,retail")
    parser.add_argument("--tasks", type=int, default=8, help="tasks per domain")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if importlib.util.find_spec("gymnasium") is None:
        print("bench_env_tau2: gymnasium is not installed (τ²'s AgentGymEnv imports it): pip install gymnasium==1.4.0")
        return 2
    from seal_rl.environments.tau2_bench import load_tau2

    tau2 = load_tau2()
    results = [bench_domain(tau2, d.strip(), args.tasks) for d in args.domains.split(",") if d.strip()]
    table = Table("domain", "mode", "tasks", "gym ms", "fast ms", "ratio", "parse ms", "reward", "same",
                  title="τ² episode environment time (reset + gold steps + scoring), ms per episode")  # fmt: skip
    for r in results:
        reward = statistics.mean(e["gym_reward"] for e in r["episodes"])
        same = "yes" if r["rewards_identical"] and r["reward_info_identical"] else "NO"
        table.add_row(r["domain"], r["mode"], str(r["tasks"]), f"{r['gym_mean_s'] * 1000:.0f}", f"{r['fast_mean_s'] * 1000:.0f}",
                      times(r["gym_mean_s"], r["fast_mean_s"], 1), f"{r['one_time_parse_s'] * 1000:.0f}", f"{reward:.2f}", same)  # fmt: skip
    console = provenance_console()
    console.print(table)
    if args.out:
        write_summary(args.out, {"domains": results})
    return 0 if all(r["rewards_identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
