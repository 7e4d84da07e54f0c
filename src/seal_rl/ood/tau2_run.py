"""``seal eval --benchmark tau2-DOMAIN``: τ²-bench conversations, run and scored by τ²'s own code.

Each conversation is τ²'s ``Orchestrator`` (built as ``tau2.run.run_task`` builds it) between an agent
and a user simulator, with τ²'s ``max_steps``, ``max_errors`` and per-trial seeds, played through the
same :class:`~seal_rl.environments.tau2.Conversation` as training's τ² episodes (one environment path;
here τ²'s own agent class writes the agent's messages, with τ²'s prompts), and scored by ``tau2.evaluator.evaluator.evaluate_simulation`` with ``EvaluationType.ALL`` (database
hash against a replay of the gold actions, gold actions, ``communicate_info``, environment
assertions; no LLM judge). Players (``--policy`` for the agent, ``--user`` for the user):

* ``oracle`` — :mod:`seal_rl.environments.tau2_oracle` (the harness check);
* ``hf:`` / ``vllm:`` — a local model behind litellm's ``seal-rl`` provider
  (:mod:`seal_rl.environments.tau2_models`), one engine per model shared by all conversations;
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
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from seal_rl import __version__
from seal_rl.errors import SealError
from seal_rl.environments.tau2 import Conversation, Tau2Family
from seal_rl.environments.tau2_bench import TAU2_VERSION, Protocol, trial_seeds
from seal_rl.environments.tau2_models import EngineError
from seal_rl.environments.tau2_players import Player
from seal_rl.stats import wilson

TAU2_RESULTS_FILE = "tau2_results.json"
"""τ²'s own ``Results`` file in the run directory (``tau2.data_model.simulation.Results``)"""
SUCCESS = 1 - 1e-6
"""τ²'s ``is_successful``: a conversation succeeds when its reward is 1 (up to rounding)"""


def play(family: Tau2Family, task: Any, agent: Player, seed: int, played: Any | None = None) -> tuple[Any, str | None]:
    """One τ² conversation on ``task`` through the training path's :class:`~seal_rl.environments.tau2.Conversation`
    (the same environment, orchestrator stepping and scoring), with τ²'s own agent class on the agent side:
    τ²'s ``SimulationRun`` with its ``reward_info`` (``evaluate_simulation``, ``ALL``), and the player's
    failure. ``played``: the task the scripted players play instead (the negative control's oracle); the
    score is always against ``task``.

    A player's failure ends the conversation as ``agent_error`` / ``user_error`` (trajectory kept,
    reward 0); an :class:`EngineError` (no message could be generated) is raised."""
    simulation, _, failure = Conversation(family, task, agent=agent, seed=seed, script=played).play().score()
    return simulation, failure


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
    from seal_rl.evaluate import run_directory

    if concurrency < 1:
        raise SealError(f"--concurrency must be at least 1, got {concurrency}.")
    seeds = trial_seeds(protocol.seed, protocol.trials)
    todo_all = [(trial, task) for trial in range(protocol.trials) for task in tasks]
    config = {**config, "conversations": [[task.id, trial] for trial, task in todo_all], "protocol": asdict(protocol),
              "versions": {"seal_rl": __version__, "tau2": TAU2_VERSION, "python": platform.python_version()}}  # fmt: skip
    family = Tau2Family(domain, solo=False, user=user, max_steps=protocol.max_steps, max_errors=protocol.max_errors,
                        seed=protocol.seed)  # fmt: skip
    with run_directory(Path(out), overwrite) as run:
        done = run.resume(config, on_resume)
        finished = {r["index"] for r in done}
        todo = [(i, trial, task) for i, (trial, task) in enumerate(todo_all) if i not in finished]

        def one(item: tuple[int, int, Any]) -> dict[str, Any]:
            index, trial, task = item
            try:
                simulation, failure = play(family, task, agent, seeds[trial], played=(played or {}).get(task.id))
            except EngineError as exc:
                return {"index": index, "benchmark": f"tau2-{domain}", "task_id": task.id, "trial": trial, "seed": seeds[trial],
                        "reward": 0.0, "success": False, "termination_reason": None, "error": str(exc)[:500]}  # fmt: skip
            return record(domain, index, trial, seeds[trial], simulation, failure)

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="tau2-conversation") as pool:
            for line in pool.map(one, todo):  # in input order; later conversations keep playing meanwhile
                run.add(line)
                if on_conversation is not None:
                    on_conversation(line)
        ordered = run.ordered()
        results_file = tau2_results(tau2, domain, tasks, ordered, agent, user, protocol)
        (Path(out) / TAU2_RESULTS_FILE).write_text(json.dumps(_without_surrogates(results_file.model_dump(mode="json")), indent=2,
                                                              ensure_ascii=False), encoding="utf-8")  # fmt: skip
        return run.finish({"benchmark": f"tau2-{domain}", "policy": agent.spec, "user": user.spec, "split": config.get("split"),
                           "tasks": len(tasks), "trials": protocol.trials, **summarize(ordered, protocol.trials, tau2)})  # fmt: skip
