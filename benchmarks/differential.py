"""Differential check of the verifier against the official BFCL checker, at scale.

1. Ground truth: ``verify`` on every task's ground-truth calls (expect 800/800), and the oracle
   played through ``BfclEnv`` under the strict protocol (expect 799/800: ``multi_turn_miss_func_49``
   calls ``tail`` before the task offers it).
2. Perturbed transcripts (default 5,200: 1,300 per category, see ``seal_rl.differential``) played
   through ``BfclEnv``; our reward and first failing turn must equal the official
   ``multi_turn_checker``'s on every one. Exits 1 on any disagreement.

Usage: python benchmarks/differential.py [--per-category 1300] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter

from rich.table import Table

from seal_rl.differential import official_check, official_failure, perturbed_steps
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.tasks import CATEGORIES, TaskSet
from seal_rl.tools import get_format
from seal_rl.verify import ground_truth_calls, verify

from harness import provenance_console


def _play(env: BfclEnv, task, steps) -> None:
    fmt = get_format(env.config.call_format)
    env.reset(task)
    for turn in steps:
        for step in turn:
            env.step(fmt.render(step))
        if not env.done:
            env.step("Done.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=1300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    console = provenance_console(width=130)
    task_set = TaskSet.load()

    truth_ok = sum(verify(t, [[list(c)] if c else [] for c in ground_truth_calls(t)]).reward == 1.0 for t in task_set)
    env = BfclEnv()
    oracle_failures = []
    for task in task_set:
        _play(env, task, [[list(c)] if c else [] for c in ground_truth_calls(task)])
        if env.verdict.reward != 1.0:
            oracle_failures.append(task.id)
    console.print(f"ground truth through verify: {truth_ok}/800; oracle through BfclEnv: {800 - len(oracle_failures)}/800 "
                  f"(failing: {', '.join(oracle_failures) or 'none'})")  # fmt: skip

    env = BfclEnv(EnvConfig(max_model_calls=200))
    table = Table(title=f"Perturbed transcripts vs the official multi_turn_checker (seed {args.seed})")
    for column in ("category", "transcripts", "official pass", "seal-rl pass", "reward agrees", "first failure agrees"):
        table.add_column(column, justify="right" if column != "category" else "left")
    mismatches = []
    failure_types: Counter[str] = Counter()
    started = time.perf_counter()
    totals = Counter()
    for category in CATEGORIES:
        rng = random.Random(f"{args.seed}:{category}")
        pool = [t for t in task_set if t.category == category]
        row = Counter()
        for _ in range(args.per_category):
            task = rng.choice(pool)
            _play(env, task, perturbed_steps(task, ground_truth_calls(task), rng))
            official = official_check(task, env.calls_by_turn)
            ours = env.verdict.first_failure
            ours_failure = None if ours is None else (ours.turn, ours.failure)
            row["n"] += 1
            row["official"] += bool(official["valid"])
            row["ours"] += env.verdict.reward == 1.0
            row["reward"] += env.verdict.reward == float(official["valid"])
            row["failure"] += ours_failure == official_failure(official)
            failure_types[official_failure(official)[1] if not official["valid"] else "pass"] += 1
            if env.verdict.reward != float(official["valid"]) or ours_failure != official_failure(official):
                mismatches.append((task.id, ours_failure, official_failure(official)))
        totals.update(row)
        table.add_row(category, *(str(row[k]) for k in ("n", "official", "ours", "reward", "failure")))
    table.add_row("all", *(str(totals[k]) for k in ("n", "official", "ours", "reward", "failure")), style="bold")
    console.print(table)
    console.print("official verdicts: " + ", ".join(f"{k} {v}" for k, v in failure_types.most_common()))
    console.print(f"{totals['n']} transcripts in {time.perf_counter() - started:.0f}s; disagreements: {len(mismatches)}")
    for mismatch in mismatches[:20]:
        console.print(f"  MISMATCH {mismatch}")
    return 1 if mismatches or truth_ok != 800 else 0


if __name__ == "__main__":
    sys.exit(main())
