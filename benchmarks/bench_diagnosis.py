"""Diagnosis on injected faults, and the speed of `seal diagnose`.

1. The oracle with typed faults (``oracle:faults=P``) plays all 800 tasks for several seeds; every
   faulted turn's label is tallied against its fault type (a confusion table), and turns before
   an episode's first fault are tallied too. Fault types with a determined label must get it on
   at least 95% of their turns, and per label precision and recall (given labels that are right,
   expected labels found; a turn the official check passes anyway is expected ``pass``) must
   reach 98%.
2. ``seal diagnose`` on a run directory of 800 episodes: wall time of reading ``results.jsonl`` and
   aggregating (in process), and of the whole command (a fresh interpreter), each against the
   baseline measured in the same run: parsing every line of ``results.jsonl`` and nothing more.

Usage: python benchmarks/bench_diagnosis.py [--faults 0.3] [--seeds 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.table import Table

from seal_rl.diagnose import LABELS
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.evaluate import evaluate, play, read_results
from seal_rl.faults import EXPECTED_LABEL as EXPECTED, FAULT_TYPES, determined, expected_label, precision_recall
from seal_rl.policies import OraclePolicy
from seal_rl.profile import describe_run
from seal_rl.tasks import TaskSet

from harness import parse_jsonl_seconds, provenance_console, timed, times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=float, default=0.3)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    console = provenance_console(width=160)
    task_set = TaskSet.load()
    env = BfclEnv()

    confusion: dict[str, Counter] = {kind: Counter() for kind in FAULT_TYPES}
    untouched: Counter = Counter()
    pairs: list[tuple[str, str]] = []
    inherited_faults = 0
    scored, scored_hits = Counter(), Counter()  # determined faults: the label Ψ must give, and hits
    started = time.perf_counter()
    for seed in range(args.seeds):
        for episode in OraclePolicy(args.faults, seed).episodes(list(task_set), task_set, "hermes"):
            record = play(env, episode)
            labels = [t["label"] for t in record["diagnosis"]["labels"]]
            faults = episode.extra["faults"]
            expected = [(expected_label(f, record), labels[f["turn"]]) for f in determined(faults)]
            pairs += [pair for pair in expected if pair[0] is not None]
            for f in determined(faults):
                if expected_label(f, record) is not None:
                    scored[f["type"]] += 1
                    scored_hits[f["type"]] += labels[f["turn"]] == expected_label(f, record)
            inherited_faults += sum(1 for pair in expected if pair[0] is None)
            for fault in faults:
                confusion[fault["type"]][labels[fault["turn"]]] += 1
            untouched.update(labels[: min((f["turn"] for f in faults), default=len(labels))])
    seconds = time.perf_counter() - started

    columns = [label for label in LABELS if any(label in row for row in [*confusion.values(), untouched])]
    table = Table("fault \\ label", *columns, "faulted turns", "expected label", "hit rate (determined)",
                  title=f"Label at the faulted turn (oracle, faults={args.faults}, {args.seeds} seeds x 800 tasks)")  # fmt: skip
    hits = total = 0
    for kind in FAULT_TYPES:
        row = confusion[kind]
        n = sum(row.values())
        expected = EXPECTED.get(kind)
        rate = f"{scored_hits[kind] / scored[kind]:.1%} of {scored[kind]}" if expected and scored[kind] else "-"
        if expected:
            hits, total = hits + scored_hits[kind], total + scored[kind]
        table.add_row(kind, *(str(row.get(label, "")) for label in columns), str(n), expected or "(depends)", rate)
    table.add_row("untouched earlier turns", *(str(untouched.get(label, "")) for label in columns), str(sum(untouched.values())), "pass", "")
    console.print(table)
    console.print(f"determined faults: {hits}/{total} = {hits / total:.1%} got their label "
                  f"({args.seeds * 800} episodes in {seconds:.0f}s)")  # fmt: skip

    scores = precision_recall(pairs)
    quality = Table("label", "expected turns", "precision", "recall", title="Determined faults: precision and recall per label (target 98%)")
    for label, (precision, recall, n) in scores.items():
        quality.add_row(label, str(n), f"{precision:.1%}", f"{recall:.1%}")
    console.print(quality)
    console.print(f"left out: {inherited_faults} determined-fault turns that fail only through an earlier turn (inherited)")
    on_target = all(min(precision, recall) >= 0.98 for precision, recall, _ in scores.values())
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        episodes = OraclePolicy(0.3, 0).episodes(list(task_set), task_set, "hermes")
        evaluate(episodes, EnvConfig(), run, policy="oracle:faults=0.3")
        parse = parse_jsonl_seconds([run / "results.jsonl"])
        in_process, _ = timed(lambda: describe_run(read_results(run)))
        command, result = timed(lambda: subprocess.run([sys.executable, "-m", "seal_rl", "diagnose", str(run)], capture_output=True, text=True))
        size = (run / "results.jsonl").stat().st_size / 2**20
    speed = Table("what", "episodes", "results.jsonl MiB", "seconds", "vs parsing the file", title="seal diagnose")
    speed.add_row("parse every line of results.jsonl (baseline)", "800", f"{size:.1f}", f"{parse:.2f}", "1.0x")
    speed.add_row("read + aggregate (in process)", "800", f"{size:.1f}", f"{in_process:.2f}", times(in_process, parse, 1))
    speed.add_row("`seal diagnose RUN` (fresh interpreter)", "800", f"{size:.1f}", f"{command:.2f}", times(command, parse, 1))
    console.print(speed)
    return 0 if result.returncode == 0 and hits / total >= 0.95 and on_target else 1


if __name__ == "__main__":
    sys.exit(main())
