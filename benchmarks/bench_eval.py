"""`seal eval` throughput with a simulated model: episodes/s at concurrency 1, 8 and 32.

The simulated generator answers every request after a fixed latency (a stand-in for a model
server) with a plain-text reply, so every turn costs one call. Each level evaluates 2 x N
episodes of 4-turn tasks end to end: environment, verifier, diagnosis and the results file.

Usage: python benchmarks/bench_eval.py [--latency 0.2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from seal_rl.env import EnvConfig
from seal_rl.evaluate import ModelSettings, evaluate
from seal_rl.policies import Episode
from seal_rl.rollout import SimulatedGenerator
from seal_rl.tasks import TaskSet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per batched generator call")
    args = parser.parse_args()
    tasks = [t for t in TaskSet.load() if t.num_turns == 4]
    table = Table("concurrency", "episodes", "seconds", "episodes/s", "speed-up", "efficiency",
                  title=f"seal eval with a simulated model ({args.latency:.2f}s per call)")  # fmt: skip
    base = None
    efficiency = 0.0
    for concurrency in (1, 8, 32):
        n = 2 * concurrency
        episodes = [Episode(i + 1, tasks[(i * 5) % len(tasks)], None) for i in range(n)]
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            evaluate(episodes, EnvConfig(), Path(tmp) / "run", policy="simulated",
                     settings=ModelSettings(concurrency=concurrency), generator=SimulatedGenerator(args.latency))  # fmt: skip
            seconds = time.perf_counter() - started
        rate = n / seconds
        base = base or rate
        efficiency = rate / (concurrency * base)
        table.add_row(str(concurrency), str(n), f"{seconds:.2f}", f"{rate:.2f}", f"{rate / base:.1f}x", f"{efficiency:.0%}")
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
