"""The environment service under load: ground-truth replay of all 800 tasks over loopback HTTP.

Service path: ``seal serve --workers W`` in its own process; an ``AsyncClient`` keeps C episodes in
flight (create, one request per message, evaluate with diagnosis, release). Step latency is what
the client sees, queueing included. Peak RSS and CPU time are taken over the server and its worker
processes (the client runs on the same cores and is not counted).

Baseline, measured in the same run: the same 800 episodes in one fresh process through ``BfclEnv``
(reset, step, record, diagnose), the in-process path of ``seal eval``; its step latency is the time
of ``env.step``.

Usage: python benchmarks/bench_service.py [--concurrency 8 256] [--workers N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from harness import in_fresh_process, peak_mib, percentile, provenance_line, times


def _transcripts():
    from seal_rl.faults import oracle_transcript
    from seal_rl.tasks import TaskSet
    from seal_rl.tools import get_format
    from seal_rl.verify import ground_truth_calls

    fmt = get_format("hermes")
    return [(task, oracle_transcript(task, ground_truth_calls(task), fmt, 0.0, 0)[0]) for task in TaskSet.load()]


def run_in_process() -> dict:
    """The baseline, in a fresh process so its peak RSS is its own."""
    from seal_rl.diagnose import add_diagnosis
    from seal_rl.env import BfclEnv, EnvConfig

    plans = _transcripts()
    env = BfclEnv(EnvConfig())
    latencies, successes = [], 0
    started, cpu = time.perf_counter(), time.process_time()
    for task, messages in plans:
        env.reset(task)
        for message in messages:
            began = time.perf_counter()
            env.step(message)
            latencies.append(time.perf_counter() - began)
            if env.done:
                break
        record = env.record()
        add_diagnosis(record)
        successes += record["reward"] == 1.0
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    peak = peak_mib()
    return {"episodes": len(plans), "steps": len(latencies), "seconds": seconds, "latencies": latencies,
            "successes": successes, "errors": 0, "peak_mib": peak, "cpu": cpu}  # fmt: skip


class _ServerUsage:
    """Peak RSS of a process tree (sampled every 50 ms in a thread) and its CPU seconds meanwhile."""

    def __init__(self, pid: int) -> None:
        self.process, self.peak, self._stop = psutil.Process(pid), 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _cpu(self) -> float:
        return sum(sum(p.cpu_times()[:2]) for p in [self.process, *self.process.children(recursive=True)])

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            try:
                tree = [self.process, *self.process.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in tree) / 2**20)
            except psutil.Error:
                pass

    def __enter__(self):
        self.cpu = -self._cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.cpu += self._cpu()
        self._stop.set()
        self._thread.join()


async def _play_all(url: str, plans, concurrency: int) -> dict:
    from seal_rl.service.client import AsyncClient

    latencies: list[float] = []
    outcome = {"successes": 0, "errors": 0, "messages": []}
    gate = asyncio.Semaphore(concurrency)

    async def play(client, task, messages):
        async with gate:
            try:
                episode = await client.create(task.id)
                for step, message in enumerate(messages):
                    began = time.perf_counter()
                    reply = await client.step(episode["episode_id"], message, step=step)
                    latencies.append(time.perf_counter() - began)
                    if reply["done"]:
                        break
                evaluation = await client.evaluate(episode["episode_id"])
                await client.release(episode["episode_id"])
                outcome["successes"] += evaluation["reward"] == 1.0
            except Exception as exc:  # counted and shown, never hidden
                outcome["errors"] += 1
                outcome["messages"].append(f"{task.id}: {exc}")

    async with AsyncClient(url, timeout=300, max_connections=concurrency) as client:
        started = time.perf_counter()
        await asyncio.gather(*(play(client, task, messages) for task, messages in plans))
        seconds = time.perf_counter() - started
    return {"episodes": len(plans), "steps": len(latencies), "seconds": seconds, "latencies": latencies, **outcome}


def run_service(plans, concurrency: int, workers: int) -> dict:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "seal_rl", "serve", "--port", str(port), "--workers", str(workers),
                               "--max-episodes", str(max(1024, concurrency))], stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health").json()["workers_alive"] == workers:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the service did not start")
            time.sleep(0.2)
        with _ServerUsage(server.pid) as usage:
            result = asyncio.run(_play_all(url, plans, concurrency))
        result["peak_mib"], result["cpu"] = usage.peak, usage.cpu
        return result
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 256])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    print(provenance_line())
    baseline = in_fresh_process(run_in_process)
    plans = _transcripts()
    rows = [("in-process BfclEnv (baseline)", baseline)]
    rows += [(f"service, {args.workers} workers, {c} concurrent", run_service(plans, c, args.workers)) for c in args.concurrency]

    table = Table("path", "episodes/s", "steps/s", "step p50 ms", "step p99 ms", "success", "errors", "peak RSS MiB",
                  "env CPU ms/step", "ep/s vs baseline",
                  title=f"Ground-truth replay of {len(plans)} tasks on loopback ({os.cpu_count()} cores)")  # fmt: skip
    for name, r in rows:
        table.add_row(
            name, f"{r['episodes'] / r['seconds']:.1f}", f"{r['steps'] / r['seconds']:.0f}",
            f"{percentile(r['latencies'], 50) * 1e3:.2f}", f"{percentile(r['latencies'], 99) * 1e3:.2f}",
            f"{r['successes']}/{r['episodes']}", str(r["errors"]), f"{r['peak_mib']:.0f}", f"{r['cpu'] / r['steps'] * 1e3:.2f}",
            times(r["episodes"] / r["seconds"], baseline["episodes"] / baseline["seconds"]),
        )  # fmt: skip
    Console(width=200).print(table)
    print("env CPU: the environment side only (server and its workers, or the in-process loop), per message;\n"
          "on this machine the load-generating client shares the same cores.")
    errors = [m for _, r in rows for m in r.get("messages", [])]
    for message in errors[:10]:
        print("error:", message)
    if errors or any(r["successes"] != baseline["successes"] for _, r in rows):
        raise SystemExit("the service lost episodes or changed results")


if __name__ == "__main__":
    main()
