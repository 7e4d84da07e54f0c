"""What a run starts from: its training and validation tasks, its model, and the warm start.

:func:`select_tasks` picks a recipe's training tasks and its held-out validation tasks;
:func:`_prepare_model` finds the model directory (or builds the tiny model); :func:`warm_start`
fine-tunes it on the recipe's warm-start sources (:mod:`seal_rl.sft`) before RL, and :func:`sft`
is ``seal sft``: that warm start alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from seal_rl.env import EnvConfig
from seal_rl.errors import SealError
from seal_rl.rollout import Budgets
from seal_rl.sft import build_samples, check_source, run_sft
from seal_rl.tasks import Task, TaskSet
from seal_rl.train.lora import peft_config
from seal_rl.train.recipe import SealRecipe


def scenario(task_id: str) -> str:
    """The BFCL scenario of a task: the four categories of one number share their questions."""
    return task_id.rsplit("_", 1)[1]


def select_tasks(recipe: SealRecipe, task_set: TaskSet, family: Any = None) -> tuple[list[Task], list[Task]]:
    """The training tasks and the validation tasks of a recipe.

    Validation defaults to ``eval.holdout`` tasks of the training split, spread over categories,
    from scenarios not trained on; when training covers every scenario of the split, those
    scenarios are held out of training. The test split is never used unless ``eval.tasks`` names it.
    ``family`` (default BFCL) says which tasks share a scenario (:meth:`Family.scenario`).
    """
    scenario_of = family.scenario if family is not None else scenario
    ids = recipe.data.task_ids or None
    tasks = task_set.select(recipe.data.split, recipe.data.categories or None, ids)
    if recipe.data.limit:
        tasks = tasks[: recipe.data.limit]
    v = recipe.eval
    if v.tasks:
        return tasks, [task_set.get(t) for t in v.tasks]
    if not (v.every_rounds or v.keep_best) or not v.holdout:
        return tasks, []
    trained = {scenario_of(t.id) for t in tasks}
    split = task_set.select("train", None, None)
    pool = [t for t in split if scenario_of(t.id) not in trained]
    held_out = _spread(pool or tasks, v.holdout, recipe.grpo.seed, scenario_of)
    if not pool:  # training covers the split: hold these scenarios out of training
        removed = {scenario_of(t.id) for t in held_out}
        tasks = [t for t in tasks if scenario_of(t.id) not in removed]
    return tasks, held_out


def _spread(pool: Sequence[Task], n: int, seed: int, scenario_of: Any = scenario) -> list[Task]:
    """``n`` tasks of ``pool``, round-robin over categories, each category in a seeded order."""
    import zlib

    by_category: dict[str, list[Task]] = {}
    for task in sorted(pool, key=lambda t: zlib.crc32(f"{seed}:{t.id}".encode())):
        by_category.setdefault(task.category, []).append(task)
    chosen: list[Task] = []
    while len(chosen) < n and any(by_category.values()):
        for queue in by_category.values():
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    def order(task: Task) -> tuple[Any, ...]:  # numbered scenarios in numeric order (BFCL's are all numbers)
        name = scenario_of(task.id)
        return (task.category, not name.isdigit(), int(name) if name.isdigit() else 0, name)

    return sorted(chosen, key=order)


def warm_start(recipe: SealRecipe, out: Path, task_set: TaskSet, tasks: Sequence[Task], base_model: str,
               family: Any = None) -> Path:  # fmt: skip
    """SFT ``base_model`` on the recipe's warm-start sources into ``out`` (model in ``out/model``).

    Samples are played under the recipe's environment and budgets and every preset of
    ``warm_start.interfaces`` (see :mod:`seal_rl.sft`); ``out/samples.json`` says what was kept.
    """
    from transformers import AutoTokenizer

    ws = recipe.warm_start
    samples, summary = build_samples(ws.data, tasks, task_set, AutoTokenizer.from_pretrained(base_model),
                                     EnvConfig(**recipe.env), Budgets(**recipe.budgets), ws.interfaces, family)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.json").write_text(json.dumps(summary, indent=1) + "\n")
    settings = recipe.model.lora
    adapters = partial(peft_config, settings) if settings is not None and settings.warm_start else None
    return run_sft(base_model, samples, ws.sft, out, dtype=recipe.model.dtype,
                   gradient_checkpointing=recipe.model.gradient_checkpointing, adapters=adapters)  # fmt: skip


def _prepare_model(recipe: SealRecipe, out: Path, task_set: Any) -> str:
    """The model directory: the recipe's, or the tiny model built into ``out`` (its tokenizer learns BFCL's
    text, from ``task_set`` when that is BFCL's, whatever the recipe's family: byte-level, it encodes any text)."""
    if recipe.model.path == "tiny":
        from seal_rl.tiny import build_tiny_model

        target = out / "tiny-init"
        if not (target / "config.json").exists():
            m = recipe.model
            build_tiny_model(target, vocab_size=m.tiny_vocab_size, hidden_size=m.tiny_hidden_size, layers=m.tiny_layers,
                             heads=m.tiny_heads, kv_heads=m.tiny_kv_heads, seed=recipe.grpo.seed,
                             task_set=task_set if isinstance(task_set, TaskSet) else None)  # fmt: skip
        return str(target)
    from seal_rl.models import resolve_model

    path = Path(resolve_model(recipe.model.path)).expanduser()
    if not (path / "config.json").exists():
        raise SealError(
            f"model.path {recipe.model.path!r} is not a local model directory (no config.json) nor a pulled model "
            "(`seal models list`). Pull one (`seal models pull smollm2-135m-instruct`) or download the weights first "
            "(e.g. `huggingface-cli download Qwen/Qwen2.5-7B-Instruct --local-dir ...`); seal-rl never fetches weights "
            "at run time."
        )
    return str(path)


def sft(recipe: SealRecipe, out: Path, sources: Sequence[Any] = (), family: Any = None) -> dict[str, Any]:
    """``seal sft``: the recipe's warm start alone (or with ``sources`` instead of ``warm_start.data``);
    ``family``: the recipe's family when the caller has loaded it already (``seal study``).

    The model goes to ``out/model``; ``seal train --set model.path=OUT/model`` and
    ``seal eval --policy hf:OUT/model`` take it.
    """
    import torch
    from accelerate import PartialState

    if PartialState(cpu=not torch.cuda.is_available()).num_processes > 1:
        raise SealError("seal sft runs in one process; launch it without accelerate/torchrun.")
    for source in sources:  # the recipe's own sources were checked when it was loaded
        check_source(source)
    if sources:
        recipe.warm_start.data = list(sources)
    from seal_rl.environments import load_family

    if family is None:
        family = load_family(recipe.family, **recipe.family_settings)
    task_set = family.task_set()
    tasks, _ = select_tasks(recipe, task_set, family)
    out = Path(out)
    if (out / "model" / "config.json").exists():
        raise SealError(f"{out}/model already exists; choose another --out.")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(recipe)))
    model = warm_start(recipe, out, task_set, tasks, _prepare_model(recipe, out, task_set), family)
    return {"model": str(model), **json.loads((out / "samples.json").read_text()), **json.loads((out / "sft.json").read_text())}
