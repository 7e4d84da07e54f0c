"""The held-out study's smoke: does the SEAL arm's first rollouts on the real model carry an advantage?

The study itself is a command of the package, ``seal study`` (src/seal_rl/study/, docs/guides/preflight-and-studies.md):
``make bench-real-study`` and ``make bench-study-tradingbot`` run the shipped studies ``real-study``
and ``study-tradingbot`` with it. This benchmark measures one thing on top of it: the study narrowed
to the SEAL arm alone, one seed, two rounds, one held-out task, no test evaluation and a one-epoch
warm start (``SMOKE``), run through ``seal study``; it exits 1 unless some of its rollouts carry a
non-zero advantage (``make bench-real-study-smoke``; about 12.5 min on 2 cores, docs/results/real-study.md).

Usage: python benchmarks/bench_real_study.py [--study NAME_OR_FILE] [--out DIR] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

from seal_rl.study.records import nonzero_advantages, run_dir, sampled_episodes

from harness import ROOT
SMOKE = {"arm": "seal-full", "seeds": [0], "rounds": 2, "held_out": 1,
         # one epoch of the warm start's 6 samples, not two (its loss is 0.13 there; 339 s instead of
         # ~9 min), and each round's 8 episodes in one prefix tree (the same loss; 67 s an update, not 122)
         "set": ["warm_start.sft.max_steps=6", "grpo.per_device_train_batch_size=8"]}


def smoke_design(study: str) -> dict:
    """The study file narrowed to the smoke: the SEAL arm alone, one seed, two rounds, one held-out task, no test."""
    from seal_rl import studies

    design = yaml.safe_load(studies.resolve(study).read_text(encoding="utf-8"))
    design["arms"] = {SMOKE["arm"]: {**design["arms"][SMOKE["arm"]], "seeds": SMOKE["seeds"]}}
    design["rounds"], design["held_out"] = SMOKE["rounds"], design["held_out"][: SMOKE["held_out"]]
    design["test"] = {**design["test"], "arms": []}
    design["baseline"] = SMOKE["arm"]  # the only arm: compared with nothing
    return design


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="real-study", help="a shipped study's name or a study file (default: real-study)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "real-study-smoke")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a recipe override for every run")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    design = out / "smoke-study.yaml"
    design.write_text(yaml.safe_dump(smoke_design(args.study), sort_keys=False), encoding="utf-8")
    sets = [a for o in [*SMOKE["set"], *args.overrides] for a in ("--set", o)]  # yours win
    done = subprocess.run([sys.executable, "-m", "seal_rl", "study", str(design), "--out", str(out), *sets])
    if done.returncode:
        return done.returncode
    run = run_dir(out, SMOKE["arm"], SMOKE["seeds"][0])
    moving = nonzero_advantages(sampled_episodes(run))
    print(f"smoke: {moving} rollouts of {run} carry a non-zero advantage")
    if not moving:
        print("smoke failed: every advantage is zero (no reward variance in any group)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
