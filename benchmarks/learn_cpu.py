"""One arm of a learn-cpu comparison: ``seal train --config learn-cpu`` with some settings, and
where its time and tokens went (shared by ``bench_vllm_cpu.py`` and ``bench_layouts.py``).

From the run's ``metrics.jsonl`` and ``time.json``: the validation curve (greedy, strict, on the
recipe's four tasks: warm start → after each round), seconds per phase (cumulative in
``time.json``), TRL's ``num_tokens`` (every prompt and completion token the update read) and the
tokens the policy's pass forwarded (``kind: update`` lines; fewer with shared prefixes).
"round" is one SEAL round: generation, environment, diagnosis, A-Patch, weight sync and the update
with its validation; "start" is everything else (warm start SFT, model load, an engine's start).
:func:`report` prints the arms' table and their ratios, and writes ``summary.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.table import Table

from harness import ROOT, provenance_console, ratio_line, write_summary

ROUND_PHASES = ("generation", "environment", "diagnosis", "apatch", "weight_sync", "optimisation")


COLUMNS = {"wall": ("wall s", ".0f"), "start": ("start s", ".0f"), "round": ("round s", ".1f"),
           "generation": ("generation s/round", ".2f"), "update": ("update s/round", ".1f"),
           "weight_sync": ("weight sync s/round", ".3f"), "tokens": ("tokens/round", ",.0f"),
           "forwarded": ("forwarded/round", ",.0f")}  # fmt: skip
"""the figures of :func:`run_arm` a table can show: key -> (column, format)"""


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


def report(results: list[dict], label: str, columns: list[str], title: str, ratios: list[str], over: tuple[str, str],
           out: Path) -> dict[str, float]:  # fmt: skip
    """Print the arms' table (``label``: what tells the arms apart; ``columns``: keys of :data:`COLUMNS`)
    and the ratios of ``ratios`` between the arms ``over`` (numerator, baseline), and write them to
    ``out/summary.json`` under ``NUMERATOR_over_BASELINE``."""
    console = provenance_console(width=200)
    table = Table(label, "validation (warm start → rounds)", *(COLUMNS[key][0] for key in columns), title=title)
    for r in results:
        table.add_row(r["arm"], " → ".join(f"{v:.2f}" for v in r["curve"]), *(format(r[key], COLUMNS[key][1]) for key in columns))
    console.print(table)
    first, second = (next(r for r in results if r["arm"] == arm) for arm in over)
    measured = {key: first[key] / second[key] for key in ratios if second[key]}
    console.print(ratio_line(" / ".join(over), measured))
    write_summary(out / "summary.json", {"arms": results, "_over_".join(over): measured})
    return measured
