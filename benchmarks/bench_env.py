"""Environment throughput and memory: ground-truth replay of all 800 BFCL multi-turn tasks.

seal-rl path: ``BfclEnv`` parses each ground-truth turn rendered as hermes text, validates and
executes the calls on private backends, then ``verify`` re-executes and scores the episode.

Baseline, measured in the same run: the official executor (``execute_multi_turn_func_call`` on the
ground-truth call strings, turn by turn, as BFCL's inference loop does) plus the official
``multi_turn_checker`` called directly. The baseline starts from call strings (no parsing of model
text, no schema validation) and, as the official code does, keeps every instance in module
globals; it gets a unique model name per episode so episodes do not share state.

Each measurement runs in a fresh process so peak and current RSS belong to it alone.

Usage: python benchmarks/bench_env.py [--soak 10000] [--official-soak 2000]
"""

from __future__ import annotations

import argparse
import gc
import time

from rich.table import Table

from harness import in_fresh_process, peak_mib, provenance_console, rss_mib, times


def _plans():
    from seal_rl.tasks import TaskSet
    from seal_rl.tools import get_format
    from seal_rl.verify import ground_truth_calls

    fmt = get_format("hermes")
    plans = []
    for task in TaskSet.load():
        messages = []
        for turn in ground_truth_calls(task):
            if turn:
                messages.append(fmt.render(list(turn)))
            messages.append("Done.")
        plans.append((task, messages))
    return plans


def run_seal(episodes: int, checkpoints: tuple[int, ...] = (), warmup: int = 0) -> dict:
    from seal_rl.env import BfclEnv

    plans = _plans()
    env = BfclEnv()
    rss = {}
    passed = 0
    for i in range(warmup):
        task, messages = plans[i % len(plans)]
        env.reset(task)
        for message in messages:
            env.step(message)
    started = time.perf_counter()
    for i in range(episodes):
        task, messages = plans[i % len(plans)]
        env.reset(task)
        for message in messages:
            env.step(message)
        passed += env.verdict.reward == 1.0
        if i + 1 in checkpoints:
            gc.collect()
            rss[i + 1] = rss_mib()
    seconds = time.perf_counter() - started
    return {"episodes": episodes, "seconds": seconds, "passed": passed, "rss": rss, "peak": peak_mib()}


def run_official(episodes: int, checkpoints: tuple[int, ...] = (), warmup: int = 0) -> dict:
    from seal_rl.bfcl import import_bfcl

    utils = import_bfcl("eval_checker.multi_turn_eval.multi_turn_utils")
    checker = import_bfcl("eval_checker.multi_turn_eval.multi_turn_checker")
    plans = [(task, [list(turn) for turn in task.ground_truth]) for task, _ in _plans()]
    rss = {}
    passed = 0
    started = time.perf_counter()
    for i in range(-warmup, episodes):
        if i == 0:
            passed, started = 0, time.perf_counter()
        task, truth = plans[i % len(plans)]
        entry = task.bfcl_entry()
        name = f"bench_{i}"
        decoded = []
        for turn in truth:  # the inference loop executes each turn's calls as one step
            utils.execute_multi_turn_func_call(
                turn, entry["initial_config"], entry["involved_classes"], name, task.id, long_context=task.long_context
            )
            decoded.append([turn] if turn else [])
        result = checker.multi_turn_checker(decoded, truth, entry, f"multi_turn_{task.category}", name)
        passed += bool(result["valid"])
        if i + 1 in checkpoints:
            gc.collect()
            rss[i + 1] = rss_mib()
    seconds = time.perf_counter() - started
    return {"episodes": episodes, "seconds": seconds, "passed": passed, "rss": rss, "peak": peak_mib()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--soak", type=int, default=10_000, help="episodes in the seal-rl memory soak")
    parser.add_argument("--official-soak", type=int, default=2_000, help="episodes in the official memory soak")
    args = parser.parse_args()
    console = provenance_console(width=130)

    # Best of three passes over all 800 tasks, each after a warm-up pass, each in a fresh process.
    seal = min((in_fresh_process(run_seal, 800, (), 800) for _ in range(3)), key=lambda r: r["seconds"])
    official = min((in_fresh_process(run_official, 800, (), 800) for _ in range(3)), key=lambda r: r["seconds"])
    table = Table(title="Ground-truth replay of all 800 tasks (one process, one core)")
    for column in ("path", "episodes", "passed", "seconds", "episodes/s", "vs official", "peak RSS MiB"):
        table.add_column(column, justify="right" if column != "path" else "left")
    for label, row in (("seal-rl: parse + execute + verify", seal), ("official executor + checker", official)):
        rate = row["episodes"] / row["seconds"]
        ratio = times(rate, official["episodes"] / official["seconds"])
        table.add_row(label, str(row["episodes"]), str(row["passed"]), f"{row['seconds']:.2f}", f"{rate:.0f}", ratio, f"{row['peak']:.0f}")
    console.print(table)

    seal_points = tuple(sorted({1_000, args.soak // 4, args.soak // 2, args.soak * 3 // 4, args.soak}))
    official_points = tuple(sorted({1_000, args.official_soak // 2, args.official_soak}))
    seal_soak = in_fresh_process(run_seal, args.soak, seal_points)
    official_soak = in_fresh_process(run_official, args.official_soak, official_points)
    memory = Table(title="RSS (MiB) after N episodes in one process")
    memory.add_column("episodes", justify="right")
    memory.add_column("seal-rl", justify="right")
    memory.add_column("official executor + checker", justify="right")
    for n in sorted(set(seal_points) | set(official_points)):
        seal_rss = seal_soak["rss"].get(n)
        official_rss = official_soak["rss"].get(n)
        memory.add_row(f"{n:,}", f"{seal_rss:.0f}" if seal_rss else "-", f"{official_rss:.0f}" if official_rss else "-")
    console.print(memory)
    half = args.soak * 3 // 4
    growth = seal_soak["rss"][args.soak] - seal_soak["rss"][half]
    official_growth = (official_soak["rss"][args.official_soak] - official_soak["rss"][1_000]) / (args.official_soak - 1_000) * 1_000
    console.print(
        f"seal-rl RSS growth over the last quarter of the soak ({half:,} -> {args.soak:,} episodes): "
        f"{growth:+.1f} MiB (peak {seal_soak['peak']:.0f} MiB). "
        f"Official executor + checker: {official_growth:+.1f} MiB per 1,000 episodes (instances are never freed)."
    )


if __name__ == "__main__":
    main()
