"""`seal eval` throughput with a simulated model server: episodes/s at concurrency 1, 8 and 32.

The simulated server answers each request after a random latency (exponential, mean
``--latency`` seconds: replies differ in length) with a plain-text reply, so every turn costs one
call. Each level evaluates 2 x N episodes of 4-turn tasks end to end: environment, verifier,
diagnosis and the results file. Two drivers are measured in the same run: streaming (what
``seal eval`` does with a server: each episode moves on as soon as its own answer is in) and
lockstep ticks (the baseline: every tick waits for the slowest answer of the batch).

Usage: python benchmarks/bench_eval.py [--latency 0.2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from seal_rl.env import EnvConfig
from seal_rl.evaluate import ModelSettings, evaluate
from seal_rl.policies import Episode
from seal_rl.generators import SimulatedServer
from seal_rl.rollout import Generation, Request
from seal_rl.tasks import TaskSet

from harness import provenance_console, timed, times


class Lockstep:
    """The same server driven in batched ticks (no ``submit``): the baseline."""

    def __init__(self, server: SimulatedServer) -> None:
        self.server = server

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        return self.server.generate(requests, seed)


def episodes_per_second(generator, episodes: list[Episode], concurrency: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        seconds, _ = timed(lambda: evaluate(episodes, EnvConfig(), Path(tmp) / "run", policy="simulated",
                                            settings=ModelSettings(concurrency=concurrency), generator=generator))  # fmt: skip
        return len(episodes) / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="mean seconds per model reply")
    args = parser.parse_args()
    tasks = [t for t in TaskSet.load() if t.num_turns == 4]
    table = Table("concurrency", "episodes", "lockstep eps/s", "streaming eps/s", "streaming / lockstep",
                  "streaming speed-up vs c=1", title=f"seal eval with a simulated server (mean {args.latency:.2f}s per reply)")  # fmt: skip
    server = SimulatedServer(args.latency)
    base = None
    for concurrency in (1, 8, 32):
        n = max(16, 4 * concurrency)
        episodes = [Episode(i + 1, tasks[(i * 5) % len(tasks)], None) for i in range(n)]
        lockstep = episodes_per_second(Lockstep(server), episodes, concurrency)
        streaming = episodes_per_second(server, episodes, concurrency)
        base = base or streaming
        table.add_row(str(concurrency), str(n), f"{lockstep:.2f}", f"{streaming:.2f}", times(streaming, lockstep),
                      f"{times(streaming, base, 1)} (ideal {concurrency}x)")  # fmt: skip
    server.close()
    console = provenance_console(width=140)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
