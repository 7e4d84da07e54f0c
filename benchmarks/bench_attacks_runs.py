"""Issue 14's attacks on run directories, replayed: what `seal eval` and `seal train` do now.

1. Lone surrogates: 400 replayed episodes, every 10th with ``\\ud83d`` in a tool argument.
2. Two `seal eval` processes started on the same ``--out`` at once.
3. A corrupt line in the middle of ``results.jsonl``, then the same command again.
4. ``seal eval`` killed with SIGKILL at 5 random moments, resumed each time.
5. ``seal train`` (smoke recipe) killed at random moments and resumed until it finishes.

Every attack runs real `seal` processes on loopback-free local files, with bounded counts; about
two minutes in all. Prints one table; where an attack costs time, its baseline is measured in the same
run: the same replay without surrogates (1), the same evaluation played straight through (4).

Usage: python benchmarks/bench_attacks_runs.py
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness import ROOT, provenance_line, timed, times

SEAL = [sys.executable, "-m", "seal_rl"]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line.strip()]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SEAL, *args], capture_output=True, text=True, timeout=900)


def _replay(tmp: Path, name: str, argument: str) -> tuple[float, subprocess.CompletedProcess]:
    """``seal eval`` on 400 replayed episodes, every 10th calling ``mkdir`` with ``argument``."""
    call = '<tool_call>\n{"name": "mkdir", "arguments": {"dir_name": "%s"}}\n</tool_call>' % argument
    replay = tmp / f"{name}.jsonl"
    replay.write_text("".join(json.dumps({"task_id": "multi_turn_base_0", "assistant": [call if i % 10 == 0 else "ok", "Done."]}) + "\n"
                              for i in range(400)))  # fmt: skip
    return timed(lambda: _run("eval", "-p", f"replay:{replay}", "--out", str(tmp / name)))


def surrogates(tmp: Path) -> tuple[str, str, str]:
    seconds, done = _replay(tmp, "surrogates", "x\\ud83d")
    plain, _ = _replay(tmp, "plain", "x")
    kept = sum("\ud83d" in json.dumps(r["trace"], ensure_ascii=False) for r in _lines(tmp / "surrogates" / "results.jsonl"))
    return (f"exit {done.returncode}; {len(_lines(tmp / 'surrogates' / 'results.jsonl'))}/400 episodes written, "
            f"{kept}/40 with the half emoji kept as \\ud83d", f"{seconds:.1f} s",
            f"{times(seconds, plain)} the plain replay ({plain:.1f} s)")


def two_writers(tmp: Path) -> tuple[str, str, str]:
    args = ["eval", "-p", "oracle:faults=0.3,seed=1", "--split", "test", "--out", str(tmp / "shared")]
    first, second = (subprocess.Popen([*SEAL, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2))
    codes = sorted([first.wait(timeout=900), second.wait(timeout=900)])
    message = next((p.stderr.read().strip() for p in (first, second) if p.returncode == 2), "")
    lines = len(_lines(tmp / "shared" / "results.jsonl"))
    summary = json.loads((tmp / "shared" / "summary.json").read_text())["episodes"]
    return f"exit codes {codes}; results.jsonl {lines} lines, summary {summary} episodes (400 tasks); refused with: {message[:70]}…", "-", "-"


def corrupt_line(tmp: Path) -> tuple[str, str, str]:
    args = ["eval", "-p", "oracle:faults=0.3,seed=1", "--split", "test", "-c", "base", "--out", str(tmp / "corrupt")]
    _run(*args)
    path = tmp / "corrupt" / "results.jsonl"
    before = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([*before[:20], before[20][:40], *before[21:]]))
    again = _run(*args)
    warned = "results.jsonl:21: not valid JSON" in " ".join(again.stderr.split())
    same = path.read_bytes().split(b"\n") == before
    return f"warned with file:line: {warned}; later lines kept, only that episode replayed, file restored: {same}", "-", "-"


def killed_eval(tmp: Path, rng: random.Random) -> tuple[str, str, str]:
    args = ["eval", "-p", "oracle:faults=0.3,seed=2", "--split", "all", "--out", str(tmp / "killed")]
    straight, reference = timed(lambda: _run(*args[:-1], str(tmp / "straight")))
    assert reference.returncode == 0, reference.stderr
    started = time.perf_counter()
    for _ in range(5):
        process = subprocess.Popen([*SEAL, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.5, 4.0))
        process.send_signal(signal.SIGKILL)
        process.wait()
    final = _run(*args)
    seconds = time.perf_counter() - started
    same = _lines(tmp / "killed" / "results.jsonl") == _lines(tmp / "straight" / "results.jsonl")
    return (f"exit {final.returncode}; after 5 kills the results equal an uninterrupted run: {same}", f"{seconds:.1f} s",
            f"{times(seconds, straight)} the uninterrupted run ({straight:.1f} s)")


def killed_training(tmp: Path, rng: random.Random) -> tuple[str, str, str]:
    out = tmp / "train"
    command = [*SEAL, "train", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"), "--out", str(out)]
    started, kills = time.perf_counter(), 0
    for _ in range(4):
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + rng.uniform(3, 15)
        while time.time() < deadline and process.poll() is None:
            time.sleep(0.1)
        if process.poll() is not None:
            break
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
        if (out / "config.yaml").exists():  # else killed before the recipe was written: start again
            command = [*SEAL, "train", "--resume", str(out)]
    final = subprocess.run(command, capture_output=True, text=True, timeout=900)
    rounds = sorted(r["round"] for r in _lines(out / "trajectories.jsonl"))
    metrics = [m["round"] for m in _lines(out / "metrics.jsonl") if m.get("kind") == "rollout"]
    return (f"exit {final.returncode} after {kills} kills; metrics rounds {metrics}; trajectories per round "
            f"{[rounds.count(r) for r in sorted(set(rounds))]} (8 each expected)", f"{time.perf_counter() - started:.0f} s", "-")


def main() -> int:
    rng = random.Random(0)
    print(provenance_line())
    table = Table("attack", "what happens now", "time", "vs baseline (same run)", title="Run directories under attack (issue 14)")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        table.add_row("lone surrogate in a tool argument", *surrogates(tmp))
        table.add_row("two `seal eval` on one --out", *two_writers(tmp))
        table.add_row("corrupt line in the middle of results.jsonl", *corrupt_line(tmp))
        table.add_row("`seal eval` SIGKILLed 5 times", *killed_eval(tmp, rng))
        table.add_row("`seal train` SIGKILLed at random points", *killed_training(tmp, rng))
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
