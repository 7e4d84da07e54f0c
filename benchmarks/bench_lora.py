"""Peak memory of one SEAL round on a real model, full fine-tuning against LoRA, in one run (issue 72).

Each arm is ``seal train --config real-cpu`` (SmolLM2-135M-Instruct, pulled by ``seal models pull``)
for one round without the warm start, in a process of its own, so its peak resident memory is that
process's alone (``os.wait4``'s ``ru_maxrss``). The LoRA arm adds ``model.lora.rank=R`` (all-linear).
The checkpoint each arm saves after its round is measured beside it (the LoRA one holds the adapter
and its optimizer state; the full one the whole model and its optimizer state). Prints a table and
the ratios LoRA / full.

Usage: python benchmarks/bench_lora.py [--rank 8] [--out DIR] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.table import Table

from harness import provenance_console, run_child, times


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_arm(name: str, out: Path, extra: list[str]) -> dict:
    """One round of ``seal train`` in a child process: its peak RSS, wall time and checkpoint size."""
    command = [sys.executable, "-m", "seal_rl", "train", "--config", "real-cpu", "--out", str(out), "--set", "warm_start.data=[]",
               "--set", "grpo.max_steps=1", "--set", "grpo.save_steps=1", "--set", "eval.every_rounds=0",
               "--set", "eval.at_start=false", *extra]  # fmt: skip
    with open(out.with_suffix(".log"), "w") as log:
        code, seconds, peak = run_child(command, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        sys.exit(f"{name}: seal train failed (log: {out.with_suffix('.log')})")
    checkpoints = sorted((out / "checkpoints").glob("checkpoint-*"))
    return {"arm": name, "peak_rss": peak, "seconds": seconds, "checkpoint": _size(checkpoints[-1]) if checkpoints else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="where the two runs go (default: a temporary folder)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a recipe override for both arms")
    args = parser.parse_args()
    extra = [a for o in args.overrides for a in ("--set", o)]
    with tempfile.TemporaryDirectory() as scratch:
        root = args.out or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        rows = [run_arm("full fine-tuning", root / "full", extra),
                run_arm(f"LoRA rank {args.rank}", root / "lora", [*extra, "--set", f"model.lora.rank={args.rank}"])]  # fmt: skip
    table = Table("arm", "peak RSS (MiB)", "checkpoint (MiB)", "wall (s)",
                  title="one SEAL round of SmolLM2-135M-Instruct (real-cpu, no warm start)")  # fmt: skip
    for row in rows:
        table.add_row(row["arm"], f"{row['peak_rss'] / 2**20:,.0f}", f"{row['checkpoint'] / 2**20:,.1f}", f"{row['seconds']:.0f}")
    console = provenance_console()
    console.print(table)
    full, lora = rows
    console.print(f"LoRA / full: peak memory {times(lora['peak_rss'], full['peak_rss'])}, checkpoint "
                  f"{times(lora['checkpoint'], full['checkpoint'], 4)}")  # fmt: skip


if __name__ == "__main__":
    main()
