"""A study's design: the study file, checked before anything starts, and what each arm's runs set.

A study file (a shipped study's name, :mod:`seal_rl.studies`, or a YAML path) names the training
``recipe``, the ``rounds``, the ``arms`` (each a shipped or local recipe whose interface and A-Patch
sections it takes, its integer ``seeds`` and optional ``set`` overrides), the ``baseline`` arm the
others are compared with, the ``held_out`` tasks measured every round (never trained on) and the
``test`` tasks measured at the end. :func:`load_study` rejects a file with an unknown key, arm, recipe
or task, seeds that are not integers, or a held-out task that is also trained on, with one
:class:`~seal_rl.errors.SealError` line naming what is wrong — before any run starts.

A recipe that names an environment family (``family:``, docs/guides/your-environment.md) is checked against the
family's own tasks (:func:`study_tasks`: loaded once per process, τ² takes seconds): its ids, splits
and categories; its runs are validated under the ``seal`` protocol (a family's only one).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import yaml

from seal_rl import recipes, studies
from seal_rl.errors import SealError
from seal_rl.tasks import CATEGORIES, TaskSet

BASELINE = "vanilla-grpo"
"""the arm the others are compared with when the study file names none"""
KEYS = {"recipe", "rounds", "arms", "baseline", "held_out", "test", "plan"}
REQUIRED = ("recipe", "rounds", "arms", "held_out", "test")
ARM_KEYS = {"recipe", "seeds", "set"}
TEST_KEYS = {"tasks", "per_category", "max_new_tokens", "arms", "engine"}
ENGINES = ("hf", "vllm")
PLAN_KEYS = {"model", "gpus", "gpu_memory"}


def study_name(study: str | Path) -> str:
    """The name a study's runs go under (``runs/NAME``): a shipped study's name, else its file's stem
    with ``_`` as ``-`` (``benchmarks/study_tradingbot.yaml``: ``study-tradingbot``)."""
    path = Path(study)
    if path.name == "real_study.yaml":  # the first study's file, as the harness named its runs
        return "real-study"
    return path.name.removesuffix(".yaml").replace("_", "-")


def load_study(study: str | Path, recipe: str | None = None, overrides: list[str] | tuple[str, ...] = (),
               task_set: TaskSet | None = None, planning: bool = False) -> dict[str, Any]:  # fmt: skip
    """The study file ``study`` (a path or a shipped study's name), checked: every problem is one
    :class:`SealError` naming the file and what is wrong. ``recipe`` replaces the file's training
    recipe (``seal study --recipe``); ``overrides`` are the ``--set`` of every run. ``planning``
    (``seal study --plan``): the file's ``plan.model`` (a ``seal plan`` preset, no weights) stands in
    for the model unless ``overrides`` set ``model.path``."""
    path = studies.resolve(study)
    where = str(study)
    try:
        design = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SealError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc}).") from None
    if not isinstance(design, dict):
        raise SealError(f"{where}: a study file is a mapping with {', '.join(REQUIRED)} (see `seal study --list`).")
    _known(where, "", design, KEYS)
    for key in REQUIRED:
        if key not in design:
            raise SealError(f"{where}: missing '{key}' (every study names {', '.join(REQUIRED)}; see docs/guides/preflight-and-studies.md).")
    design.setdefault("baseline", BASELINE)
    if recipe:
        design["recipe"] = recipe
    hardware = design.setdefault("plan", {})
    if not isinstance(hardware, dict):
        raise SealError(f"{where}: plan is a mapping with {', '.join(sorted(PLAN_KEYS))}, got {hardware!r}.")
    _known(where, "plan.", hardware, PLAN_KEYS)
    overrides = list(overrides)
    if planning and "model" in hardware and not any(o.startswith("model.path=") for o in overrides):
        overrides.insert(0, f"model.path={hardware['model']}")
    check_design(design, where, overrides, task_set)
    design["overrides"] = overrides
    return design


def study_tasks(recipe: Any, task_set: TaskSet | None = None) -> tuple[Any, Any]:
    """(the family, its tasks) of a study's recipe: (None, BFCL's :class:`TaskSet` — ``task_set`` when
    given) for BFCL, else the recipe's family (built with its ``family_settings``) and its
    :class:`~seal_rl.environments.TaskSource`, loaded once per process."""
    if recipe.family == "bfcl":
        return None, task_set or TaskSet.load()
    return _loaded_family(recipe.family, json.dumps(recipe.family_settings, sort_keys=True, default=str))


@functools.lru_cache(maxsize=4)
def _loaded_family(spec: str, settings: str) -> tuple[Any, Any]:
    from seal_rl.environments import load_family

    family = load_family(spec, **json.loads(settings))
    return family, family.task_set()


def _known(where: str, section: str, values: dict, allowed: set[str]) -> None:
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise SealError(f"{where}: unknown key '{section}{unknown[0]}'; {section.rstrip('.') or 'a study'} takes "
                        f"{', '.join(sorted(allowed))}.")  # fmt: skip


def check_design(design: dict[str, Any], where: str, overrides: list[str], task_set: TaskSet | None = None) -> None:
    """Every check of :func:`load_study` on an already parsed design (see the module docstring); the
    tasks are BFCL's (``task_set``) or those of the family the recipe names."""
    from seal_rl.train import load_recipe, select_tasks

    rounds = design["rounds"]
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise SealError(f"{where}: rounds must be a whole number of at least 1, got {rounds!r}.")
    arms = design["arms"]
    if not isinstance(arms, dict) or not arms:
        raise SealError(f"{where}: arms must map each arm's name to {{recipe, seeds, set}}, got {arms!r}.")
    try:
        base = load_recipe(design["recipe"], overrides)
    except SealError as exc:
        raise SealError(f"{where}: recipe {design['recipe']!r}: {exc}") from None
    try:
        family, task_set = study_tasks(base, task_set)
    except SealError as exc:
        raise SealError(f"{where}: recipe {design['recipe']!r}: {exc}") from None
    named = base.family if family is not None else None  # a family's unknown task is named with it
    for arm, spec in arms.items():
        if not isinstance(spec, dict) or "recipe" not in spec or "seeds" not in spec:
            raise SealError(f"{where}: arm '{arm}' needs a recipe and seeds, e.g. {{recipe: vanilla-grpo, seeds: [0, 1, 2]}}.")
        _known(where, f"arms.{arm}.", spec, ARM_KEYS)
        seeds = spec["seeds"]
        if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            raise SealError(f"{where}: arm '{arm}': seeds must be a list of integers, got {seeds!r}.")
        if len(set(seeds)) != len(seeds):
            raise SealError(f"{where}: arm '{arm}': seed listed twice in {seeds}.")
        if not isinstance(spec.get("set", []), list):
            raise SealError(f"{where}: arm '{arm}': set is a list of KEY=VALUE overrides, got {spec['set']!r}.")
        try:
            load_recipe(design["recipe"], [*overrides, *arm_overrides(spec["recipe"]), *map(str, spec.get("set", []))])
        except SealError as exc:
            raise SealError(f"{where}: arm '{arm}': {exc}") from None
    if not any(spec["seeds"] for spec in arms.values()):
        raise SealError(f"{where}: no arm has a seed: nothing to run.")
    if design["baseline"] not in arms:
        raise SealError(f"{where}: unknown arm '{design['baseline']}' as baseline; the arms are {', '.join(arms)}.")
    held_out = design["held_out"]
    if not isinstance(held_out, list):
        raise SealError(f"{where}: held_out is a list of training-split task ids, got {held_out!r}.")
    for task in held_out:
        _task(where, "held_out", task, task_set, named)
    trained = {t.id for t in (select_tasks(base, task_set, family) if family is not None else select_tasks(base, task_set))[0]}
    overlap = [task for task in held_out if task in trained]
    if overlap:
        raise SealError(f"{where}: held-out task {overlap[0]} is also trained on (recipe {design['recipe']}'s training tasks); "
                        "a held-out task must be one the runs never see: pick another or remove it from data.task_ids.")  # fmt: skip
    test = design["test"]
    if not isinstance(test, dict):
        raise SealError(f"{where}: test is a mapping with tasks or per_category, max_new_tokens and arms.")
    _known(where, "test.", test, TEST_KEYS)
    if "tasks" not in test and "per_category" not in test:
        raise SealError(f"{where}: test needs 'tasks' (a list) or 'per_category' (the baseline's first N test tasks of each category).")
    for task in test.get("tasks", []):
        _task(where, "test", task, task_set, named)
    if "tasks" not in test and family is not None and not tasks_on_test(test, task_set):
        raise SealError(f"{where}: test: family {named} has no test-split task for per_category; name them in test.tasks.")
    for arm in test.setdefault("arms", []):
        if arm not in arms:
            raise SealError(f"{where}: unknown arm '{arm}' in test.arms; the arms are {', '.join(arms)}.")
    if test["arms"] and "max_new_tokens" not in test:
        raise SealError(f"{where}: test needs max_new_tokens (the test episodes' completion budget).")
    if test.get("engine", "hf") not in ENGINES:
        raise SealError(f"{where}: unknown test.engine {test['engine']!r}; choose one of: {', '.join(ENGINES)}.")


def _task(where: str, section: str, task: Any, task_set: Any, family: str | None = None) -> None:
    if family is not None:  # a family's tasks: the line names the family
        if not isinstance(task, str) or task not in task_set:
            ids = [t.id for t in task_set]
            known = ", ".join(ids[:8]) + (", ..." if len(ids) > 8 else "")
            raise SealError(f"{where}: {section}: family {family} has no task {task!r} (its {len(ids)} tasks: {known}).")
        return
    try:
        task_set.get(task)
    except SealError as exc:
        raise SealError(f"{where}: {section}: {exc}") from None


def narrow_to_pilot(design: dict[str, Any]) -> dict[str, Any]:
    """The pilot's design: every arm with a seed, its first seed, one round, nothing measured;
    ``main`` lists the arms with the most seeds (the comparison the study is for)."""
    most = max(len(spec["seeds"]) for spec in design["arms"].values())
    return {**design, "main": [arm for arm, spec in design["arms"].items() if spec["seeds"] and len(spec["seeds"]) == most],
            "arms": {arm: {**spec, "seeds": spec["seeds"][:1]} for arm, spec in design["arms"].items() if spec["seeds"]},
            "rounds": 1, "held_out": [], "test": {**design["test"], "arms": []}}  # fmt: skip


def tasks_on_test(test: dict[str, Any], task_set: Any) -> list[str]:
    """The study's test tasks: its ``tasks``, or the real-model baseline's, the first ``per_category``
    of each category (docs/guides/real-models.md); a family's: the first ``per_category`` of each category of
    its test split, the categories in the order they first come."""
    if "tasks" in test:
        return list(test["tasks"])
    if not isinstance(task_set, TaskSet):  # a family's TaskSource
        pool = task_set.select("test")
        return [t.id for category in dict.fromkeys(t.category for t in pool)
                for t in [t for t in pool if t.category == category][: test["per_category"]]]  # fmt: skip
    return [t.id for category in CATEGORIES for t in task_set.select("test", [category])[: test["per_category"]]]


def arm_overrides(arm_recipe: str) -> list[str]:
    """The interface and A-Patch sections of a shipped (or local) recipe, as overrides of the study's recipe."""
    shipped = yaml.safe_load(recipes.resolve(arm_recipe).read_text(encoding="utf-8")) or {}
    return ["interface=" + json.dumps(shipped.get("interface", {})), "apatch=" + json.dumps(shipped.get("apatch", {}))]


def run_overrides(design: dict[str, Any], recipe_name: str, extra: list[str]) -> list[str]:
    """What every arm's run sets: the held-out tasks, measured each round under bfcl (a family: seal,
    its only protocol), and the rounds."""
    from seal_rl.train import load_recipe

    recipe = load_recipe(recipe_name, extra)
    updates = recipe.grpo.tasks_per_step // recipe.grpo.tasks_per_update  # optimizer steps a round (batch_layout)
    protocol = "bfcl" if recipe.family == "bfcl" else "seal"
    measured = ["eval.every_rounds=1", f"eval.protocol={protocol}", "eval.tasks=" + json.dumps(design["held_out"])]
    if not design["held_out"]:  # the pilot: no validation at all (an empty list would pick default held-out tasks)
        measured = ["eval.every_rounds=0", "eval.at_start=false"]
    return [*extra, "warm_start.data=[]", *measured, f"grpo.max_steps={design['rounds'] * updates}"]


def arm_run_overrides(design: dict[str, Any], arm: str, seed: int, shared: list[str], start_model: str, first: bool) -> list[str]:
    """The ``--set`` of one run: the shared overrides (:func:`run_overrides`), the shared start, its seed,
    its arm's interface and A-Patch, then the arm's own ``set`` (which wins)."""
    spec = design["arms"][arm]
    return [*shared, f"eval.at_start={first}", f"model.path={start_model}", f"grpo.seed={seed}",
            *arm_overrides(spec["recipe"]), *map(str, spec.get("set", []))]  # fmt: skip
