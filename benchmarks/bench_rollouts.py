"""Rollout generation under both schedulers, continuous and lockstep, on the real SmolLM2-135M-Instruct.

Every row runs the same episodes twice, once per scheduler, in the same process:

* ``round greedy``: one training round of the study (docs/results/real-study.md) at 4x its width: 8
  TradingBot training-split tasks x G = 4 = 32 episodes, ``seal`` protocol, the study recipe's
  budgets (8192 / 512 / 128), concurrency 8 and generation batch 8, greedy so that both schedulers
  must produce the same tokens (checked: the row says ``same``, or where episodes part and
  whether each place is a near-tie of the model's logits: SmolLM2 computes in bfloat16, where
  ties are common);
* ``round sampled``: the same at temperature 1, as training samples (each scheduler draws its own
  samples, so compare tokens per second);
* ``equal lengths``: the greedy round with ``max_new_tokens`` 8, where nearly every message hits the
  cap and continuous batching has nothing to gain (the no-regression check);
* ``eval 20``: ``seal eval --policy hf:smollm2-135m-instruct`` as it plays 20 test tasks (the first 5
  of each category, as benchmarks/real_eval.py), ``bfcl`` protocol, greedy, its default
  concurrency 8, ``--max-new-tokens 128`` and ``--max-completion-tokens 512``.

Columns: generation seconds (time inside the generator), wall seconds of the whole rollout,
model tokens generated, decoding steps, occupancy (tokens per decoding step: the mean number of
messages in flight), the longest episode's share of the wall time, and the speed-up (tokens per
generation second, continuous over lockstep: the rows' token counts differ where samples differ).

Every row loads the model in ``--dtype`` (``seal eval --dtype`` for the ``eval 20`` row):
``float32`` by default, the dtype the CPU recipes train and so generate with (``model.dtype``);
``bfloat16`` is SmolLM2's checkpoint dtype, what ``seal eval --policy hf:`` loads by default where the
CPU computes bfloat16 natively (AMX-BF16 or AVX512-BF16; float32 elsewhere, :mod:`seal_rl.precision`). On a
CPU the two differ in kind, not only in speed: a float32 step costs about the same for 1 row as for
8, a bfloat16 one grows with its rows (``make bench-decode-rows``).

Each finished measurement is kept in ``runs/bench-rollouts/`` and a rerun skips it (``--fresh``
starts over); a row's two schedulers run back to back. ``--rows`` picks rows, ``--tasks`` and
``--group`` scale the round. The model is the pulled one (``make models``).

Usage: python benchmarks/bench_rollouts.py [--rows round-greedy,round-sampled,equal-lengths,eval-20] [--tasks 8] [--group 4]
       [--dtype float32] [--fresh]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.evaluate import ModelSettings, make_generator
from seal_rl.generators import HFGenerator
from seal_rl.generators.decode_batch import divergence
from seal_rl.policies import parse_policy
from seal_rl.rollout import Budgets, DriverStats, run_episodes
from seal_rl.tasks import TaskSet
from seal_rl.trajectory import ChatTokens

from harness import provenance_console, require_model, times
from real_eval import fixed_tasks

MODEL = "smollm2-135m-instruct"
ROWS = ("round-greedy", "round-sampled", "equal-lengths", "eval-20")
SCHEDULERS = ("lockstep", "continuous")
STUDY_BUDGETS = Budgets(max_prompt_tokens=8192, max_completion_tokens=512, max_new_tokens=128)
OUT = Path("runs/bench-rollouts")


def trading_tasks(task_set: TaskSet, count: int) -> list:
    """The first ``count`` training-split tasks whose only backend is TradingBot (the study's class)."""
    return [t for t in task_set.select("train") if t.involved_classes == ("TradingBot",)][:count]


def measure(row: str, scheduler: str, path: Path, task_set: TaskSet, args) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stats = DriverStats()
    if row == "eval-20":
        settings = ModelSettings(max_new_tokens=128, max_completion_tokens=512, rollout_scheduler=scheduler, dtype=args.dtype)
        config = EnvConfig(protocol="bfcl")
        policy = parse_policy(f"hf:{path}")
        episodes = policy.episodes([task_set.get(t) for t in fixed_tasks(5)], task_set, config.call_format)
        generator, chat, budgets = make_generator(policy, settings, config, episodes)
        items, concurrency = [(e.index, e.task, {}) for e in episodes], settings.concurrency
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=args.dtype)
        model.eval()
        generator = HFGenerator(model, tokenizer, temperature=1.0 if row == "round-sampled" else 0.0, max_batch=8)
        chat, config, concurrency = ChatTokens(tokenizer), EnvConfig(protocol="seal"), 8
        budgets = STUDY_BUDGETS if row != "equal-lengths" else Budgets(8192, 512, 8)
        tasks = trading_tasks(task_set, args.tasks)
        items = [(i, task, {}) for i, task in enumerate(t for t in tasks for _ in range(args.group))]
    began = time.perf_counter()
    rollouts = run_episodes(items, generator, lambda: BfclEnv(config), chat=chat, budgets=budgets, concurrency=concurrency,
                            seed=11, stats=stats, scheduler=scheduler)  # fmt: skip
    wall = time.perf_counter() - began
    return {
        "row": row, "scheduler": stats.scheduler, "episodes": len(rollouts), "generation_s": round(stats.generation, 2),
        "wall_s": round(wall, 2), "tokens": stats.tokens, "decode_steps": stats.decode_steps,
        "occupancy": round(stats.occupancy or 0, 2), "longest_share": round(stats.longest_share or 0, 3),
        "samples": [r.trajectory.ids for r in rollouts], "rewards": [r.record["reward"] for r in rollouts],
    }  # fmt: skip


def agreement(path: Path, ticked: list[list[int]], continuous: list[list[int]], dtype: str) -> str:
    """How the greedy samples of the two schedulers compare: ``same``, or how many episodes part
    and whether each first difference is a near-tie of the model's logits (``divergence``)."""
    from transformers import AutoModelForCausalLM

    parted = [(a, b) for a, b in zip(ticked, continuous, strict=True) if a != b]
    if not parted:
        return "same"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.eval()
    found = {}
    for a, b in parted:  # the G episodes of a task part at the same place: read each place once
        at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        key = tuple(a[: at if at is not None else len(a)])
        if key not in found:
            found[key] = divergence(model, a, b)
    ties = sum(d.near_tie for d in found.values())
    gaps = ", ".join(f"{d.gap:.3g}" for d in found.values())
    return f"{len(parted)} episodes part at {len(found)} places, {ties} near-ties (logit gaps {gaps})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows to run (of {', '.join(ROWS)})")
    parser.add_argument("--tasks", type=int, default=8, help="TradingBot training tasks in a round")
    parser.add_argument("--group", type=int, default=4, help="episodes per task (G)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the model's dtype (float32: what CPU training generates with; bfloat16: the checkpoint's)")
    parser.add_argument("--fresh", action="store_true", help="measure again instead of reading runs/bench-rollouts/")
    args = parser.parse_args()
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    import torch

    path, task_set = require_model(MODEL), TaskSet.load()
    OUT.mkdir(parents=True, exist_ok=True)
    console = provenance_console(width=max(Console().width, 160))  # the table is wide; a narrow or piped terminal would cut it
    console.print(f"{MODEL} at {path}; torch threads {torch.get_num_threads()}; results kept in {OUT}/")
    results: dict[tuple[str, str], dict] = {}
    for row in rows:
        for scheduler in SCHEDULERS:
            kept = OUT / f"{row}-{scheduler}-{args.tasks}x{args.group}-{args.dtype}.json"
            if kept.exists() and not args.fresh:
                results[row, scheduler] = json.loads(kept.read_text())
                continue
            console.print(f"{row}: {scheduler} ...")
            results[row, scheduler] = measure(row, scheduler, path, task_set, args)
            kept.write_text(json.dumps(results[row, scheduler]) + "\n")

    greedy = {row: agreement(path, results[row, "lockstep"]["samples"], results[row, "continuous"]["samples"], args.dtype)
              for row in rows if row != "round-sampled"}  # fmt: skip
    table = Table(title=f"rollouts on {MODEL} ({args.dtype}): lockstep vs continuous (speed-up: tokens per generation second, continuous / lockstep)")
    for column in ("row", "scheduler", "episodes", "generation s", "wall s", "tokens", "decode steps", "occupancy",
                   "longest share", "tokens/s", "speed-up", "greedy tokens"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("row", "scheduler", "greedy tokens") else "right")
    for row in rows:
        ticked, continuous = results[row, "lockstep"], results[row, "continuous"]
        rate = {s: r["tokens"] / max(r["generation_s"], 1e-9) for s, r in (("l", ticked), ("c", continuous))}
        for r, mark in ((ticked, ""), (continuous, times(rate["c"], rate["l"]))):
            table.add_row(row, r["scheduler"], str(r["episodes"]), f"{r['generation_s']:.1f}", f"{r['wall_s']:.1f}", str(r["tokens"]),
                          str(r["decode_steps"]), f"{r['occupancy']:.2f}", f"{r['longest_share']:.2f}",
                          f"{r['tokens'] / max(r['generation_s'], 1e-9):.1f}", mark, greedy.get(row, "n/a (sampled)") if mark else "")  # fmt: skip
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
