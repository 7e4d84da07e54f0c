"""A study's results: per arm, its seeds' curves, pooled outcomes and the paired comparisons with the
baseline arm.

Outcomes are pooled over seeds: success with its Wilson 95% interval (:func:`rate`), and against the
baseline over (task, seed) pairs the exact McNemar test and the bootstrap interval of the difference
(:func:`versus`, as ``seal compare`` computes them, :func:`seal_rl.stats.compare_runs`) — on the
held-out tasks after the last validated round, and on the test tasks.
"""

from __future__ import annotations

from pathlib import Path

from seal_rl.environments.family import TaskSource
from seal_rl.evaluate import turn_measures
from seal_rl.stats import compare_runs, wilson
from seal_rl.study.records import run_dir, seed_entry
from seal_rl.tasks import TaskSet


def rate(records: list[dict]) -> list[float]:
    """[success, Wilson 95% low, high] of episode records (success: reward 1)."""
    ok, n = sum(r["reward"] == 1.0 for r in records), len(records)
    return [ok / n if n else 0.0, *wilson(ok, n)]


def summary_on_test(records: list[dict]) -> dict:
    """Success with its interval and the turn measures of :func:`test_outcome` records."""
    return {"success": rate(records), **turn_measures(r["counts"] for r in records if r["counts"])}


def versus(baseline: list[dict], records: list[dict]) -> dict:
    """An arm against the baseline over paired (task, sample) episodes: the difference in success with
    its bootstrap 95% interval, the exact McNemar p-value, the discordant pairs and the pairs."""
    c = compare_runs(baseline, records)
    return {"difference": c.average_difference[0], "ci95": list(c.average_difference[1:]), "p_mcnemar": c.overall.p_value,
            "discordant": [c.overall.only_a, c.overall.only_b], "pairs": c.overall.pairs}  # fmt: skip


def held_out_records(curves: dict, seed: int, task_set: TaskSet | TaskSource) -> list[dict]:
    """The final held-out validation as episode records, for the paired comparison."""
    final = curves["held_out_tasks"][-1] if curves["held_out_tasks"] else {}
    return [{"task_id": t, "category": task_set.get(t).category, "reward": r, "sample": seed} for t, r in final.items()]


def summarize_study(study: dict, steps: list, out: Path, task_set: TaskSet | TaskSource, test_results: dict, kept: dict) -> dict:
    """Per arm, its seeds' entries (from their records in ``kept``, else from their run directories),
    pooled outcomes and comparisons with the baseline."""
    arms: dict[str, dict] = {}
    for arm, _spec, seed in steps:
        entry = arms.setdefault(arm, {"seeds": [], "held_out": [], "test": []})
        curves = kept[arm, seed]["entry"] if (arm, seed) in kept else seed_entry(run_dir(out, arm, seed), seed, task_set)
        entry["seeds"].append(dict(curves))
        entry["held_out"] += held_out_records(curves, seed, task_set)
        entry["test"] += [{**r, "sample": seed} for r in test_results.get((arm, seed), [])]
    for arm, entry in arms.items():
        entry["held_out_final"] = rate(entry["held_out"])
        if entry["test"]:
            entry["test_final"] = summary_on_test(entry["test"])
        baseline = study["baseline"]
        if arm != baseline and baseline in arms:
            entry["held_out_vs_vanilla"] = versus(arms[baseline]["held_out"], entry["held_out"])
            if entry["test"] and arms[baseline]["test"]:
                entry["test_vs_vanilla"] = versus(arms[baseline]["test"], entry["test"])
    warm = {}
    if ("warm_start", None) in test_results:
        warm["test"] = summary_on_test(test_results["warm_start", None])
    seeds = [seed for entry in arms.values() for seed in entry["seeds"]]
    measured = next((seed for seed in seeds if seed["held_out_rounds"][:1] == [0]), None)
    if measured:  # round 0: the shared start, greedy — measured by the first run, the start of every curve
        warm["held_out"] = {"success": measured["held_out_success"][0], "call_share": measured["held_out_call_share"][0],
                            "turn_pass_rate": measured["held_out_turn_pass"][0], "labels": measured["held_out_labels"][0]}  # fmt: skip
        for seed in seeds:
            if seed["held_out_rounds"][:1] != [0]:
                for key in ("held_out_rounds", "held_out_success", "held_out_call_share", "held_out_turn_pass", "held_out_labels", "held_out_tasks", "held_out_tools"):
                    seed[key] = [measured[key][0], *seed[key]]
    for entry in arms.values():  # records are kept in the run directories, not in the summary
        entry.pop("held_out"), entry.pop("test")
    return {"warm_start": warm, "arms": arms, "baseline": study["baseline"]}
