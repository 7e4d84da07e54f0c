"""`seal report` on big runs: seconds and page size as runs grow, against reading the run's files.

Training runs are written by hand (tests/report_runs.py: every field the report reads, messages of
a realistic length) with 10, 100 and 1000 rounds of 16 rollouts; the evaluation run is the faulty
oracle on all 800 tasks. The baseline, measured in the same run, is what any report must do:
parse every line of the run's JSONL files. The page must stay bounded (the trajectory browser
keeps at most EPISODE_CAP episodes, spread evenly, and says so) and the report must stay within a
small multiple of the baseline plus a fixed cost for the charts.

Usage: python benchmarks/bench_report.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from rich.table import Table

from harness import ROOT, parse_jsonl_seconds, provenance_console, timed, times

sys.path.insert(0, str(ROOT))

from seal_rl.report import write_report  # noqa: E402
from seal_rl.report.page import EPISODE_CAP, ROLLOUT_CAP  # noqa: E402
from tests.report_runs import write_training_run  # noqa: E402

PAGE_LIMIT_MB = 40.0


def measure(run: Path, label: str, table: Table) -> float:
    baseline = parse_jsonl_seconds(run / name for name in ("metrics.jsonl", "trajectories.jsonl", "results.jsonl"))
    seconds, page = timed(lambda: write_report(run))
    size = page.stat().st_size / 2**20
    episodes = page.read_text(encoding="utf-8").count('class="episode"')
    table.add_row(label, f"{sum(1 for _ in open(run / ('trajectories.jsonl' if (run / 'metrics.jsonl').exists() else 'results.jsonl')))}",
                  str(episodes), f"{baseline:.2f}", f"{seconds:.2f}", times(seconds, max(baseline, 1e-9), 1), f"{size:.1f}")  # fmt: skip
    return size


def main() -> int:
    console = provenance_console(width=140)
    table = Table("run", "episodes in run", "episodes on page", "parse files (s)", "report (s)", "report / parse", "page (MiB)",
                  title=f"seal report on big runs (browser keeps {EPISODE_CAP} eval episodes, {ROLLOUT_CAP} rollouts)")  # fmt: skip
    sizes = []
    text = "I will look into the directory and report what I find there. " * 8  # ~500 characters per message
    with tempfile.TemporaryDirectory() as tmp:
        for rounds in (10, 100, 1000):
            run = write_training_run(Path(tmp) / f"train-{rounds}", rounds=rounds, per_round=16, text=text)  # 16 rollouts a round
            sizes.append(measure(run, f"training, {rounds} rounds", table))
        from seal_rl.env import EnvConfig
        from seal_rl.evaluate import evaluate
        from seal_rl.policies import parse_policy
        from seal_rl.tasks import TaskSet

        task_set = TaskSet.load()
        episodes = parse_policy("oracle:faults=0.3,seed=0").episodes(list(task_set), task_set, "hermes")
        evaluate(episodes, EnvConfig(), Path(tmp) / "eval", policy="oracle:faults=0.3,seed=0")
        sizes.append(measure(Path(tmp) / "eval", "evaluation, 800 tasks", table))
    console.print(table)
    ok = max(sizes) < PAGE_LIMIT_MB
    console.print(f"largest page {max(sizes):.1f} MiB (limit {PAGE_LIMIT_MB:.0f} MiB): {'ok' if ok else 'TOO BIG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
