"""``seal eval --benchmark tau2-DOMAIN``: τ²-bench conversations, run and scored by τ²'s own code.

Each conversation is τ²'s ``Orchestrator`` (built here, as ``tau2.run.run_task`` builds it) between
an agent and a user simulator, with τ²'s ``max_steps``, ``max_errors`` and per-trial seeds, and is
scored by ``tau2.evaluator.evaluator.evaluate_simulation`` with ``EvaluationType.ALL`` (database
hash against a replay of the gold actions, gold actions, ``communicate_info``, environment
assertions; no LLM judge). Players (``--policy`` for the agent, ``--user`` for the user):

* ``oracle`` — :mod:`seal_rl.ood.tau2_oracle` (the harness check);
* ``hf:`` / ``vllm:`` — a local model behind litellm's ``seal-rl`` provider
  (:mod:`seal_rl.ood.tau2_models`), one engine per model shared by all conversations;
* ``openai:MODEL@URL`` — litellm's own OpenAI provider against the server.

The run directory holds, as for BFCL runs, ``config.json``, ``results.jsonl`` (one line per
conversation in input order, with τ²'s whole ``SimulationRun``: re-scoring a line with
``evaluate_simulation`` gives its reward) and ``summary.json`` (τ²'s own ``compute_metrics``:
average reward and pass^k for k = 1..trials), plus ``tau2_results.json``, τ²'s ``Results`` file
that its own tools read. Re-running the same command resumes; a conversation that ended in a
generation error (a server down) is played again. A player that fails (an empty reply, a
conversation past the model's context) ends its conversation as τ²'s ``agent_error`` /
``user_error`` with reward 0, the trajectory kept, as ``tau2 run --skip-failed-samples`` records it.
"""

from __future__ import annotations

import json
import platform
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from seal_rl import __version__, jsonl
from seal_rl.errors import SealError
from seal_rl.ood.tau2_bench import TAU2_VERSION, Protocol, trial_seeds
from seal_rl.ood.tau2_models import Engine, EngineError, PlayerFailure, serving
from seal_rl.ood.tau2_oracle import oracle_classes
from seal_rl.runlock import run_lock
from seal_rl.stats import wilson

TAU2_RESULTS_FILE = "tau2_results.json"
"""τ²'s own ``Results`` file in the run directory (``tau2.data_model.simulation.Results``)"""
SUCCESS = 1 - 1e-6
"""τ²'s ``is_successful``: a conversation succeeds when its reward is 1 (up to rounding)"""


@dataclass(frozen=True)
class Player:
    """Who plays one side: ``oracle``, or a litellm model (``llm``, ``llm_args``) for τ²'s LLM classes."""

    spec: str
    llm: str | None = None
    llm_args: dict[str, Any] = field(default_factory=dict)
    engine: Engine | None = None
    """the engine behind a local model (``hf:``, ``vllm:``), served as ``llm`` while the run lasts"""

    @property
    def scripted(self) -> bool:
        return self.spec == "oracle"


def _user_tools(env: Any) -> list[Any] | None:
    try:
        return env.get_user_tools() or None
    except Exception:  # noqa: BLE001 - τ²'s run_task does the same: a domain without user tools raises
        return None


def play(tau2: SimpleNamespace, domain: str, task: Any, agent: Player, user: Player, protocol: Protocol, seed: int,
         played: Any | None = None) -> Any:  # fmt: skip
    """One τ² conversation on ``task``, scored by ``evaluate_simulation`` (``ALL``): τ²'s
    ``SimulationRun`` with its ``reward_info``. ``played``: the task the scripted players play
    instead (the negative control's oracle); the score is always against ``task``.

    A player's failure ends the conversation as ``agent_error`` / ``user_error`` (trajectory kept,
    reward 0); an :class:`EngineError` (no message could be generated) is raised."""
    oracle_agent, oracle_user = oracle_classes(tau2)
    script = played if played is not None else task
    env = tau2.registry.get_env_constructor(domain)()
    if agent.scripted:
        agent_obj = oracle_agent(tools=env.get_tools(), domain_policy=env.get_policy(), task=script)
    else:
        agent_obj = tau2.llm_agent.LLMAgent(tools=env.get_tools(), domain_policy=env.get_policy(), llm=agent.llm, llm_args=dict(agent.llm_args))
    tools = _user_tools(env)
    if user.scripted:
        user_obj = oracle_user(task=script, tools=tools)
    else:
        user_obj = tau2.user_simulator.UserSimulator(tools=tools, instructions=str(task.user_scenario), llm=user.llm,
                                                     llm_args=dict(user.llm_args))  # fmt: skip
    Orchestrator, Reason = tau2.orchestrator.Orchestrator, tau2.simulation.TerminationReason
    orchestrator = Orchestrator(domain=domain, agent=agent_obj, user=user_obj, environment=env, task=task,
                                max_steps=protocol.max_steps, max_errors=protocol.max_errors, seed=seed)  # fmt: skip
    started, began = tau2.orchestrator.get_now(), time.perf_counter()
    try:
        simulation = orchestrator.run()
        failure = None
    except Exception as exc:  # noqa: BLE001 - model output must never stop the run (module docstring)
        if _engine_failure(tau2, exc):
            raise EngineError(str(exc)) from exc
        failed = tau2.orchestrator.Role.USER if orchestrator.to_role == tau2.orchestrator.Role.USER else tau2.orchestrator.Role.AGENT
        reason = Reason.USER_ERROR if failed == tau2.orchestrator.Role.USER else Reason.AGENT_ERROR
        failure = f"{failed.value}: {type(exc).__name__}: {str(exc)[:500]}"
        simulation = tau2.simulation.SimulationRun(
            id=str(uuid.uuid4()), task_id=task.id, start_time=started, end_time=tau2.orchestrator.get_now(),
            duration=time.perf_counter() - began, termination_reason=reason, messages=orchestrator.get_trajectory(), seed=seed,
        )  # fmt: skip
    simulation.reward_info = tau2.evaluator.evaluate_simulation(simulation=simulation, task=task, domain=domain, solo_mode=False,
                                                                evaluation_type=tau2.evaluator.EvaluationType.ALL)  # fmt: skip
    return simulation, failure


def _engine_failure(tau2: SimpleNamespace, exc: BaseException) -> bool:
    """Whether ``exc`` says no message could be generated (a server down, an engine that failed),
    not something a player did: an :class:`EngineError` or litellm's connection-level errors,
    unless a :class:`PlayerFailure` of seal-rl's provider is what litellm wrapped."""
    litellm = tau2.litellm
    infrastructure = (litellm.APIConnectionError, litellm.Timeout, litellm.RateLimitError, litellm.ServiceUnavailableError,
                      litellm.InternalServerError, litellm.AuthenticationError, litellm.NotFoundError)  # fmt: skip
    chain, seen = [], exc
    while seen is not None and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(e, EngineError) for e in chain):
        return True
    if any(isinstance(e, PlayerFailure) for e in chain):
        return False
    return isinstance(exc, infrastructure)


def record(domain: str, index: int, trial: int, seed: int, simulation: Any, failure: str | None) -> dict[str, Any]:
    """The ``results.jsonl`` line of one conversation."""
    reward = float(simulation.reward_info.reward)
    return {
        "index": index, "benchmark": f"tau2-{domain}", "task_id": simulation.task_id, "trial": trial, "seed": seed,
        "reward": reward, "success": reward >= SUCCESS, "termination_reason": _value(simulation.termination_reason),
        "player_error": failure, "messages": len(simulation.messages), "simulation": simulation.model_dump(mode="json"),
    }  # fmt: skip


def _value(reason: Any) -> str:
    return getattr(reason, "value", reason)


def pass_hat_k(records: Sequence[dict[str, Any]], trials: int, tau2: SimpleNamespace) -> dict[int, float]:
    """τ²'s pass^k (``tau2.metrics.agent_metrics.pass_hat_k``: C(s,k)/C(n,k) per task, averaged)
    for k = 1..trials, over tasks with every trial recorded."""
    by_task: dict[str, list[bool]] = {}
    for r in records:
        by_task.setdefault(r["task_id"], []).append(bool(r["success"]))
    complete = [s for s in by_task.values() if len(s) == trials]
    if not complete:
        return {}
    return {k: sum(tau2.metrics.pass_hat_k(trials, sum(s), k) for s in complete) / len(complete) for k in range(1, trials + 1)}


def summarize(records: Sequence[dict[str, Any]], trials: int, tau2: SimpleNamespace) -> dict[str, Any]:
    """Average reward, success rate with its Wilson interval, pass^k, endings; generation errors
    are left out (they are played again on resume)."""
    scored = [r for r in records if not r.get("error")]
    successes = sum(bool(r["success"]) for r in scored)
    low, high = wilson(successes, len(scored))
    return {
        "conversations": len(scored), "generation_errors": len(records) - len(scored),
        "avg_reward": sum(r["reward"] for r in scored) / len(scored) if scored else 0.0,
        "success_rate": successes / len(scored) if scored else 0.0, "success_interval": [low, high],
        "pass_hat_k": {str(k): v for k, v in pass_hat_k(scored, trials, tau2).items()},
        "terminations": dict(Counter(r["termination_reason"] for r in scored)),
        "player_errors": sum(bool(r.get("player_error")) for r in scored),
    }  # fmt: skip


def tau2_results(tau2: SimpleNamespace, domain: str, tasks: Sequence[Any], records: Sequence[dict[str, Any]], agent: Player,
                 user: Player, protocol: Protocol) -> Any:  # fmt: skip
    """τ²'s ``Results`` for the recorded conversations (generation errors left out)."""
    sim = tau2.simulation

    def info(player: Player, implementation: str) -> dict[str, Any]:
        args = {k: v for k, v in player.llm_args.items() if k != "api_key"}  # never written to a file
        return {"implementation": "seal_oracle" if player.scripted else implementation, "llm": player.spec, "llm_args": args}

    simulations = []
    for r in records:
        if not r.get("error"):
            simulations.append(sim.SimulationRun.model_validate({**r["simulation"], "trial": r["trial"]}))
    return sim.Results(
        info=sim.Info(git_commit=f"seal-rl {__version__}", num_trials=protocol.trials, max_steps=protocol.max_steps,
                      max_errors=protocol.max_errors, seed=protocol.seed,
                      user_info=sim.UserInfo(**info(user, "user_simulator"),
                                             global_simulation_guidelines=tau2.user_simulator.get_global_user_sim_guidelines()),
                      agent_info=sim.AgentInfo(**info(agent, "llm_agent")),
                      environment_info=tau2.run.get_environment_info(domain, include_tool_info=False)),
        tasks=list(tasks), simulations=simulations,
    )  # fmt: skip


_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_surrogates(value: Any) -> Any:
    """``value`` with lone surrogates in its strings as U+FFFD: τ²'s reader (pydantic's JSON parser)
    refuses them even escaped. ``results.jsonl`` keeps the text exactly (:mod:`seal_rl.jsonl`)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_surrogates(v) for k, v in value.items()}
    return value


def evaluate_tau2(
    tau2: SimpleNamespace,
    domain: str,
    tasks: Sequence[Any],
    out: Path,
    *,
    agent: Player,
    user: Player,
    protocol: Protocol = Protocol(),
    config: dict[str, Any],
    concurrency: int = 8,
    overwrite: bool = False,
    played: dict[str, Any] | None = None,
    on_conversation: Callable[[dict[str, Any]], None] | None = None,
    on_resume: Callable[[list[dict[str, Any]]], None] | None = None,
) -> dict[str, Any]:
    """Play every task ``protocol.trials`` times (trial-major, as τ²'s ``run_tasks``), ``concurrency``
    conversations at once, writing ``results.jsonl`` in input order; return the summary.
    ``config``: the run's settings as ``config.json`` records them (resume refuses another run's)."""
    from seal_rl.evaluate import RESULTS_FILE, SUMMARY_FILE, _resumable

    if concurrency < 1:
        raise SealError(f"--concurrency must be at least 1, got {concurrency}.")
    seeds = trial_seeds(protocol.seed, protocol.trials)
    todo_all = [(trial, task) for trial in range(protocol.trials) for task in tasks]
    config = {**config, "conversations": [[task.id, trial] for trial, task in todo_all], "protocol": asdict(protocol),
              "versions": {"seal_rl": __version__, "tau2": TAU2_VERSION, "python": platform.python_version()}}  # fmt: skip
    out = Path(out)
    with run_lock(out):
        done = [r for r in _resumable(out, config, overwrite) if not r.get("error")]
        if done and on_resume is not None:
            on_resume(done)
        jsonl.rewrite(out / RESULTS_FILE, done)
        finished = {r["index"] for r in done}
        todo = [(i, trial, task) for i, (trial, task) in enumerate(todo_all) if i not in finished]
        records = {r["index"]: r for r in done}

        def one(item: tuple[int, int, Any]) -> dict[str, Any]:
            index, trial, task = item
            try:
                simulation, failure = play(tau2, domain, task, agent, user, protocol, seeds[trial],
                                           played=(played or {}).get(task.id))  # fmt: skip
            except EngineError as exc:
                return {"index": index, "benchmark": f"tau2-{domain}", "task_id": task.id, "trial": trial, "seed": seeds[trial],
                        "reward": 0.0, "success": False, "termination_reason": None, "error": str(exc)[:500]}  # fmt: skip
            return record(domain, index, trial, seeds[trial], simulation, failure)

        engines = {name: p.engine for name, p in (("agent", agent), ("user", user)) if p.engine is not None}
        with ExitStack() as stack, open(out / RESULTS_FILE, "a", encoding="utf-8") as results:
            if engines:
                names = stack.enter_context(serving(tau2.litellm, engines))
                agent = replace(agent, llm=names["agent"]) if "agent" in names else agent
                user = replace(user, llm=names["user"]) if "user" in names else user
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="tau2-conversation"))
            for line in pool.map(one, todo):  # in input order; later conversations keep playing meanwhile
                jsonl.append(results, line)
                records[line["index"]] = line
                if on_conversation is not None:
                    on_conversation(line)
        ordered = [records[i] for i in sorted(records)]
        summary = {"benchmark": f"tau2-{domain}", "policy": agent.spec, "user": user.spec, "split": config.get("split"),
                   "tasks": len(tasks), "trials": protocol.trials, **summarize(ordered, protocol.trials, tau2)}  # fmt: skip
        (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        results_file = tau2_results(tau2, domain, tasks, ordered, agent, user, protocol)
        (out / TAU2_RESULTS_FILE).write_text(json.dumps(_without_surrogates(results_file.model_dump(mode="json")), indent=2,
                                                        ensure_ascii=False), encoding="utf-8")  # fmt: skip
        return summary
