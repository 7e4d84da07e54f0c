"""Asynchronous rounds (``staleness`` 1 and 2) against on-policy rounds (0) on fake generation servers, in the same run.

Every arm plays the same schedule with the real episode driver (:func:`seal_rl.rollout.run_episodes`
on :class:`~seal_rl.env.BfclEnv` with real BFCL training tasks, token-exact, through
:class:`~seal_rl.generators.vllm_server.VLLMServerGenerator`) against fake ``vllm serve``
processes (tests/fake_vllm_server.py) whose latency per request is long-tailed (lognormal by
default), and a simulated update: ``--update`` seconds of sleep (the trainer's GPU work), then the
real weight-sync calls (``/pause?mode=keep``, ``/collective_rpc``, ``/reset_prefix_cache``,
``/resume``) and the version raised by one, as :mod:`seal_rl.train.server_sync` does.

* ``staleness 0`` (on-policy, the loop's ``_play_round``): each round plays its ``--groups`` groups
  of ``--group-size`` episodes at once, waits for the last episode, then updates;
* ``staleness k`` (``AsyncRounds``, the loop's ``_take_groups``): a producer plays groups ahead
  under AReaL's admission rule while the trainer updates; each round takes ``--groups`` groups,
  dropping those more than k versions old.

Group g plays the same task with the same seed in every arm (``task_order``, as the loop orders
them), and the fake's tokens and latencies are functions of the request, so the arms differ only in
scheduling. Per arm: seconds per step (take + update), the trainer's idle share (time waiting for
rollouts / wall), the staleness histogram of the groups trained on, the drop rate, the driver's
CPU share (this process's CPU seconds / wall: the servers are other processes) and steps per second
against staleness 0 measured in this run.

Usage: python benchmarks/bench_async.py [--rounds 8] [--groups 8] [--group-size 4] [--update 3.0]
       [--latency lognormal:0.3:1.0:20] [--servers 2] [--staleness 0,1,2] [--out runs/bench-async]
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness import ROOT, provenance_console, times, write_summary

BUDGETS = {"max_prompt_tokens": 16384, "max_completion_tokens": 1024, "max_new_tokens": 64}


def start_fakes(n: int, tokenizer_dir: Path, latency: str, seed: int, log_dir: Path) -> list[tuple[subprocess.Popen, str]]:
    """``n`` fake servers, each a process of its own, with the same latency law (each its own draws)."""
    started = []
    for i in range(n):
        log = open(log_dir / f"fake-{i}.log", "w")  # noqa: SIM115 - the process writes it until it ends
        process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_vllm_server.py"), "--tokenizer-dir", str(tokenizer_dir),
                                    "--latency", latency, "--latency-seed", str(seed * 100 + i)],
                                   stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
                                   env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "OMP_NUM_THREADS": "1"})  # fmt: skip
        line = process.stdout.readline()
        if not line.startswith("URL "):
            raise SystemExit(f"fake server {i} did not start: {(log_dir / f'fake-{i}.log').read_text()[-2000:]}")
        started.append((process, line.split()[1]))
    return started


def run_arm(staleness: int, args: argparse.Namespace, tasks: list, chat, tokenizer_dir: Path) -> dict:
    """One arm's rounds; what the table shows of it."""
    from seal_rl.env import BfclEnv
    from seal_rl.generators.vllm_server import ServerConfig, ServerPool, VLLMServerGenerator
    from seal_rl.rollout import Budgets, derived_seed, run_episodes
    from seal_rl.train.async_rounds import AsyncRounds, task_order

    fakes = start_fakes(args.servers, tokenizer_dir, args.latency, args.seed, args.out)
    failures: list[str] = []  # a server leaving the pool during the arm (none should)
    pool = ServerPool(ServerConfig(urls=[url for _, url in fakes]), log=failures.append)
    pool.connect()
    generator = VLLMServerGenerator(pool, chat)
    budgets = Budgets(**BUDGETS)
    played = Counter()

    def play(group: int) -> list:
        task = task_order(tasks, args.seed, group, 0, 1)
        episodes = [(i, task, {}) for i in range(args.group_size)]
        rollouts = run_episodes(episodes, generator, BfclEnv, chat=copy.copy(chat), budgets=budgets, concurrency=args.group_size,
                                seed=derived_seed(args.seed, "group", group), scheduler="continuous")  # fmt: skip
        played["groups"] += 1
        played["requests"] += sum(len(r.record.get("weight_versions", [])) for r in rollouts)
        played["errors"] += sum(r.record["end_reason"] == "generation_error" for r in rollouts)
        return rollouts

    def update() -> None:
        time.sleep(args.update)
        pool.reload(str(args.out / f"weights-v{generator.version + 1}"))  # the fake reads nothing; the calls are real
        generator.version += 1

    histogram: Counter[int] = Counter()
    waited = dropped = 0.0
    steps: list[float] = []
    began, cpu = time.perf_counter(), time.process_time()
    if staleness == 0:
        with ThreadPoolExecutor(args.groups) as workers:  # the round's episodes all at once, as _play_round plays them
            for round_index in range(args.rounds):
                step = time.perf_counter()
                first = round_index * args.groups
                groups = list(workers.map(play, range(first, first + args.groups)))
                waited += time.perf_counter() - step
                for rollouts in groups:  # measured, not assumed: versions behind at the take
                    sent = [v[0] for r in rollouts for v in r.record.get("weight_versions", [])]
                    histogram[generator.version - min(sent, default=generator.version)] += 1
                update()
                steps.append(time.perf_counter() - step)
    else:
        producer = AsyncRounds(play, lambda: generator.version, staleness=staleness, groups_per_round=args.groups, workers=args.groups)
        for _ in range(args.rounds):
            step = time.perf_counter()
            _, stats = producer.take(args.groups)
            waited += stats.waited
            dropped += stats.dropped
            histogram.update(stats.staleness)
            update()
            steps.append(time.perf_counter() - step)
        producer.close()
    wall = time.perf_counter() - began
    cpu = time.process_time() - cpu
    measured, failed = dict(played), list(failures)
    for process, _ in fakes:  # groups still in flight end now (their requests fail fast), not during the next arm
        process.kill()
        process.wait()
    generator.close()
    taken = sum(histogram.values())
    return {"staleness": staleness, "wall": wall, "step": wall / args.rounds, "steps": steps, "idle": waited / wall,
            "histogram": dict(sorted(histogram.items())), "dropped": dropped, "drop_rate": dropped / (taken + dropped),
            "cpu_share": cpu / wall, "played_groups": measured.get("groups", 0), "requests": measured.get("requests", 0),
            "generation_errors": measured.get("errors", 0), "server_failures": failed}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--groups", type=int, default=8, help="groups a round trains on (B)")
    parser.add_argument("--group-size", type=int, default=4, help="episodes per group (num_generations)")
    parser.add_argument("--update", type=float, default=3.0, help="seconds of the simulated update")
    parser.add_argument("--latency", default="lognormal:0.3:1.0:20", help="the fake's seconds per request: KIND:SCALE:SHAPE:CAP")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--staleness", default="0,1,2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-async")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    arms = [int(k) for k in args.staleness.split(",")]
    if 0 not in arms:
        raise SystemExit("--staleness must include 0: the other arms are measured against it")

    from transformers import AutoTokenizer

    from seal_rl.tasks import TaskSet
    from seal_rl.tiny import build_tokenizer
    from seal_rl.trajectory import ChatTokens

    tokenizer_dir = args.out / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").exists():
        build_tokenizer(4096).save_pretrained(tokenizer_dir)  # the tiny model's tokenizer: the fake's tokens, the driver's chat
    chat = ChatTokens(AutoTokenizer.from_pretrained(tokenizer_dir))
    tasks = TaskSet.load().select(split="train")

    console = provenance_console(width=200, stderr=True)
    console.print(f"bench-async: {args.rounds} rounds of {args.groups} groups x {args.group_size} episodes, update {args.update} s, "
                  f"latency {args.latency} per request, {args.servers} fake servers")  # fmt: skip
    results = []
    for k in sorted(arms):
        console.print(f"staleness {k} ...")
        results.append(run_arm(k, args, tasks, chat, tokenizer_dir))
    base = next(r for r in results if r["staleness"] == 0)
    table = Table("staleness", "s / step", "steps / s vs 0", "trainer idle", "staleness histogram (groups)", "drop rate",
                  "groups played", "driver CPU", title="bench-async")  # fmt: skip
    for r in results:
        r["speedup"] = base["step"] / r["step"]
        table.add_row(str(r["staleness"]), f"{r['step']:.2f}", times(base["step"], r["step"]), f"{r['idle']:.0%}",
                      " ".join(f"{k}:{v}" for k, v in r["histogram"].items()), f"{r['drop_rate']:.1%}",
                      str(r["played_groups"]), f"{r['cpu_share']:.0%}")  # fmt: skip
    Console(width=200).print(table)
    write_summary(args.out / "summary.json", {"args": {k: str(v) for k, v in vars(args).items()}, "arms": results})


if __name__ == "__main__":
    main()
