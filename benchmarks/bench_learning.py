"""Does SEAL learn, and does it beat vanilla GRPO at CPU scale? Six arms, same warm start, several seeds.

One warm start (``configs/learn-cpu.yaml``'s SFT on oracle / faulty-oracle transcripts of its four
training tasks) is shared by every arm. Each arm then trains with GRPO from it under the recipe's
budget (tasks, rollouts, rounds, learning rate), changing only the SEAL components, which are
taken from the shipped recipes of the same name:

=================  =========================================  ===================================
arm                interface                                  A-Patch
=================  =========================================  ===================================
vanilla-grpo       vanilla                                    off
seal-paper         paper (static observation-lite)            released labels, closed loop
seal-full          seal (label-driven, all components)        our labels, closed loop
no-interface       vanilla                                    released labels, closed loop
no-reweighting     paper                                      off
static-weights     paper                                      released labels, fixed ρ
=================  =========================================  ===================================

Per arm and seed: rollout success per round (sampled, T=1), in-training validation (greedy, strict,
interface removed) on the training tasks each round, and a final strict greedy ``seal eval`` of the
model on the training tasks and on held-out training-split tasks. Per arm, pooled over seeds:
Wilson intervals, and a paired comparison against vanilla-grpo (exact McNemar over (task, seed)
pairs, bootstrap interval of the difference), as ``seal compare`` computes them.

Usage: python benchmarks/bench_learning.py [--seeds 0 1 2] [--arms ...] [--out runs/bench-learning]
(``make bench-learning``; about 90 minutes on 2 cores with the defaults). Prints a table, writes
``OUT/summary.json``, ``OUT/table.md`` and ``OUT/curves.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from seal_rl.evaluate import ModelSettings, evaluate
from seal_rl.policies import ModelPolicy
from seal_rl.stats import compare_runs, wilson
from seal_rl.tasks import TaskSet
from seal_rl.train import load_recipe, read_metrics, scenario, select_tasks, sft, train

from harness import ROOT, provenance_console, write_summary
RECIPE = ROOT / "configs" / "learn-cpu.yaml"
ARMS = {  # arm -> the shipped recipe whose interface and A-Patch settings it uses
    "vanilla-grpo": "vanilla-grpo.yaml",
    "seal-paper": "paper-qwen2.5-7b.yaml",
    "seal-full": "seal-full.yaml",
    "no-interface": "no-interface.yaml",
    "no-reweighting": "no-reweighting.yaml",
    "static-weights": "static-weights.yaml",
}
HELD_OUT = 8


def arm_overrides(arm: str) -> list[str]:
    """The SEAL settings of ``arm``'s shipped recipe, as overrides of the CPU recipe."""
    shipped = OmegaConf.load(ROOT / "configs" / ARMS[arm])
    overrides = ["interface=" + json.dumps(OmegaConf.to_container(shipped.interface)),
                 "apatch=" + json.dumps(OmegaConf.to_container(shipped.get("apatch", {})))]  # fmt: skip
    return overrides


def strict_eval(model: Path, tasks, out: Path, max_new_tokens: int) -> list[dict]:
    from seal_rl.env import EnvConfig
    from seal_rl.policies import _generated_episodes

    settings = ModelSettings(max_new_tokens=max_new_tokens, max_completion_tokens=4096, concurrency=32)
    evaluate(_generated_episodes(tasks), EnvConfig(), out, policy=ModelPolicy(model), settings=settings, overwrite=True)
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def rate(records: list[dict]) -> tuple[float, float, float]:
    ok, n = sum(r["reward"] == 1.0 for r in records), len(records)
    low, high = wilson(ok, n)
    return ok / n if n else 0.0, low, high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-learning")
    args = parser.parse_args()
    console = provenance_console()
    task_set = TaskSet.load()
    base = load_recipe(RECIPE)
    train_tasks, _ = select_tasks(base, task_set)
    trained = {scenario(t.id) for t in train_tasks}
    held_out = [t for t in task_set.select("train", ["base"], None) if scenario(t.id) not in trained][:HELD_OUT]
    max_new = base.budgets["max_new_tokens"]
    began = time.perf_counter()

    warm = args.out / "warm_start"
    if not (warm / "model" / "config.json").exists():
        console.print(f"warm start -> {warm}")
        sft(load_recipe(RECIPE), warm)
    results: dict = {"warm_start": {}, "arms": {}, "tasks": [t.id for t in train_tasks], "held_out": [t.id for t in held_out]}
    warm_train = strict_eval(warm / "model", train_tasks, args.out / "evals" / "warm_start-train", max_new)
    warm_held = strict_eval(warm / "model", held_out, args.out / "evals" / "warm_start-held_out", max_new)
    results["warm_start"] = {"train": rate(warm_train), "held_out": rate(warm_held)}

    finals: dict[str, list[dict]] = {}
    for arm in args.arms:
        per_seed = []
        pooled_train, pooled_held = [], []
        for seed in args.seeds:
            run = args.out / arm / f"seed{seed}"
            if not (run / "model" / "config.json").exists():
                if run.exists():
                    import shutil

                    shutil.rmtree(run)
                console.print(f"{arm} seed {seed} -> {run}")
                recipe = load_recipe(RECIPE, [f"model.path={warm / 'model'}", "warm_start.data=[]", f"grpo.seed={seed}",
                                              *arm_overrides(arm)])  # fmt: skip
                train(recipe, run)
            metrics, validation = read_metrics(run, "rollout"), read_metrics(run, "validation")
            final_train = strict_eval(run / "model", train_tasks, args.out / "evals" / f"{arm}-seed{seed}-train", max_new)
            final_held = strict_eval(run / "model", held_out, args.out / "evals" / f"{arm}-seed{seed}-held_out", max_new)
            pooled_train += [{**r, "sample": seed} for r in final_train]
            pooled_held += [{**r, "sample": seed} for r in final_held]
            per_seed.append({
                "seed": seed,
                "rollout_success": [m["rollout/reward_mean"] for m in metrics],
                "zero_variance_groups": [m["rollout/groups_zero_variance"] for m in metrics],
                "validation": [v["validation/average"] for v in validation],
                "final_train": rate(final_train)[0],
                "final_held_out": rate(final_held)[0],
            })  # fmt: skip
        finals[arm] = pooled_train
        results["arms"][arm] = {"seeds": per_seed, "train": rate(pooled_train), "held_out": rate(pooled_held)}

    if "vanilla-grpo" in finals:
        for arm, records in finals.items():
            comparison = compare_runs(finals["vanilla-grpo"], records)
            results["arms"][arm]["vs_vanilla"] = {
                "difference": comparison.average_difference[0], "ci95": list(comparison.average_difference[1:]),
                "p_mcnemar": comparison.overall.p_value, "discordant": [comparison.overall.only_a, comparison.overall.only_b],
            }  # fmt: skip
    results["seconds"] = round(time.perf_counter() - began, 1)
    write_summary(args.out / "summary.json", results)
    table_md = render(results, console)
    (args.out / "table.md").write_text(table_md)
    plot(results, args.out / "curves.png")
    console.print(f"{results['seconds'] / 60:.1f} min; {args.out}/summary.json, table.md, curves.png")


def render(results: dict, console: Console) -> str:
    warm = results["warm_start"]
    table = Table(title=f"Learning at CPU scale: {len(results['tasks'])} training tasks, greedy strict success "
                        f"(warm start: {warm['train'][0]:.0%} train, {warm['held_out'][0]:.0%} held-out)")  # fmt: skip
    columns = ["arm", "seeds", "rollout success by round (mean)", "final train (95% CI)", "Δ vs warm start",
               "held-out", "vs vanilla: Δ (95% CI)", "McNemar p"]  # fmt: skip
    for column in columns:
        table.add_column(column)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for arm, data in results["arms"].items():
        seeds = data["seeds"]
        rounds = len(seeds[0]["rollout_success"])
        curve = " → ".join(f"{sum(s['rollout_success'][i] for s in seeds) / len(seeds):.2f}" for i in range(rounds))
        point, low, high = data["train"]
        vs = data.get("vs_vanilla")
        row = [arm, str(len(seeds)), curve, f"{point:.2f} ({low:.2f}–{high:.2f})", f"{point - warm['train'][0]:+.2f}",
               f"{data['held_out'][0]:.2f}",
               "—" if vs is None or arm == "vanilla-grpo" else f"{vs['difference']:+.2f} ({vs['ci95'][0]:+.2f} to {vs['ci95'][1]:+.2f})",
               "—" if vs is None or arm == "vanilla-grpo" else f"{vs['p_mcnemar']:.2f}"]  # fmt: skip
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3))]
    markers = ["o", "s", "^", "v", "D", "x"]
    for k, (arm, data) in enumerate(results["arms"].items()):
        seeds = data["seeds"]
        style = {"linestyle": styles[k % len(styles)], "marker": markers[k % len(markers)], "label": arm, "alpha": 0.85}
        rounds = range(1, len(seeds[0]["rollout_success"]) + 1)
        left.plot(rounds, [sum(s["rollout_success"][i - 1] for s in seeds) / len(seeds) for i in rounds], **style)
        steps = range(len(seeds[0]["validation"]))
        right.plot(steps, [sum(s["validation"][i] for s in seeds) / len(seeds) for i in steps], **style)
    for ax in (left, right):
        ax.xaxis.get_major_locator().set_params(integer=True)
    left.set(xlabel="round", ylabel="rollout success (sampled, mean of seeds)", ylim=(0, 1), title="Training rollouts")
    right.set(xlabel="round (0 = warm start)", ylabel="greedy success on training tasks", ylim=(0, 1),
              title="In-training validation (interface removed)")  # fmt: skip
    left.legend(fontsize=8)
    fig.suptitle("Arms that overlap had identical outcomes", fontsize=8, y=0.02)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
