"""One arm of a learn-cpu comparison: ``seal train --config learn-cpu`` with some settings, and
where its time and tokens went (shared by ``bench_vllm_cpu.py`` and ``bench_layouts.py``).

From the run's ``metrics.jsonl`` and ``time.json``: the validation curve (greedy, strict, on the
recipe's four tasks: warm start → after each round), seconds per phase (cumulative in
``time.json``), TRL's ``num_tokens`` (every prompt and completion token the update read) and the
tokens the policy's pass forwarded (``kind: update`` lines; fewer with shared prefixes).
"round" is one SEAL round: generation, environment, diagnosis, A-Patch, weight sync and the update
with its validation; "start" is everything else (warm start SFT, model load, an engine's start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUND_PHASES = ("generation", "environment", "diagnosis", "apatch", "weight_sync", "optimisation")


def run_arm(arm: str, sets: list[str], out: Path, seed: int) -> dict:
    """Train learn-cpu into ``out`` with ``--set`` ``sets`` and seed ``seed``; its figures."""
    sets = [f"grpo.seed={seed}", *sets]
    command = [sys.executable, "-m", "seal_rl", "train", "--config", "learn-cpu", "--out", str(out), "--force",
               *[a for s in sets for a in ("--set", s)]]  # fmt: skip
    started = time.perf_counter()
    with (out.parent / f"{arm}.log").open("w") as log:
        subprocess.run(command, check=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
    wall = time.perf_counter() - started
    timing = json.loads((out / "time.json").read_text())
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [line["validation/average"] for line in lines if line.get("kind") == "validation"]
    tokens = [float(line["num_tokens"]) for line in lines if line.get("kind") == "trainer" and "num_tokens" in line]
    forwarded = sum(line.get("update/policy/forwarded_tokens", 0) for line in lines if line.get("kind") == "update")
    seconds = timing["time/seconds"]
    rounds = timing["round"]
    in_rounds = sum(seconds.get(phase, 0.0) for phase in ROUND_PHASES)
    return {
        "arm": arm, "wall": wall, "rounds": rounds, "curve": curve,
        "start": wall - in_rounds, "round": in_rounds / rounds,
        "generation": seconds["generation"] / rounds, "update": seconds["optimisation"] / rounds,
        "weight_sync": seconds.get("weight_sync", 0.0) / rounds,
        "tokens": (max(tokens) / rounds) if tokens else 0.0,
        "forwarded": forwarded / rounds,
    }  # fmt: skip
