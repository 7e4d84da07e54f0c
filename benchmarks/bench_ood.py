"""Conversations per hour of a real model on τ²-bench at ``--concurrency 1`` and ``--concurrency C``,
measured in the same run on the same conversations (issue 58's target: at least 2× at C = 8).

The model plays both sides (agent and τ²'s user simulator) through one engine, as
``seal eval --benchmark tau2-DOMAIN --policy hf:M --user hf:M`` does: every conversation's requests
go to one generator thread (continuous scheduling where the generator can), so concurrency is what
lets the engine batch. Each setting plays the same ``--tasks`` × ``--trials`` conversations (τ²'s
per-trial seeds) for ``--max-steps`` orchestrator steps, greedy, with the dtype rule of
``seal eval`` (``--dtype auto``). The table gives each setting's wall time, conversations per hour,
agent + user messages and the ratio against concurrency 1.

Usage: python benchmarks/bench_ood.py [--model DIR] [--domain airline] [--tasks 2] [--trials 4] [--max-steps 6]
       [--max-new-tokens 48] [--concurrency 8] [--threads N]
Without --model it takes the pulled smollm2-135m-instruct (``seal models pull``); when that is not
there the benchmark says so and exits 0 (it needs a model on disk).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

from harness import provenance_console, pulled_model, times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--domain", default="airline")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    model = args.model or pulled_model("smollm2-135m-instruct")
    if model is None:
        print("bench_ood: no model on disk (run `seal models pull smollm2-135m-instruct`); nothing measured.")
        return 0
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from seal_rl.evaluate import ModelSettings
    from seal_rl.environments.tau2_bench import Protocol, load_tasks, load_tau2
    from seal_rl.environments.tau2_players import players
    from seal_rl.ood.tau2_run import evaluate_tau2
    from seal_rl.precision import native_bf16

    tau2 = load_tau2()
    tasks = load_tasks(tau2, args.domain, "test", None)[: args.tasks]
    protocol = Protocol(max_steps=args.max_steps, trials=args.trials)
    spec = f"hf:{model}"
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for concurrency in (1, args.concurrency):
            out = Path(scratch) / f"c{concurrency}"
            settings = ModelSettings(max_new_tokens=args.max_new_tokens, concurrency=concurrency)
            with players(spec, spec, settings, prompt_mode="bfcl_qwen_fc", call_format="hermes", out=out,
                         overwrite=True) as (agent, user, precision):  # fmt: skip
                began = time.perf_counter()
                summary = evaluate_tau2(tau2, args.domain, tasks, out, agent=agent, user=user, protocol=protocol,
                                        config={"split": "test", **precision}, concurrency=concurrency, overwrite=True)  # fmt: skip
                seconds = time.perf_counter() - began
            messages = sum(len(r.get("simulation", {}).get("messages", ()))
                           for r in map(json.loads, (out / "results.jsonl").read_text().splitlines()))  # fmt: skip
            conversations = summary["conversations"] + summary["generation_errors"]
            rows.append((concurrency, seconds, conversations, messages, precision.get("precision", {}).get("dtype", "?")))
    base = rows[0][2] / rows[0][1]
    table = Table("concurrency", "wall s", "conversations", "messages", "conversations / h", "ratio", "dtype",
                  title=f"τ²-bench {args.domain}, {Path(model).name} as agent and user, {args.tasks} tasks × {args.trials} trials, "
                        f"max {args.max_steps} steps; bf16 native: {native_bf16()[0]}")  # fmt: skip
    for concurrency, seconds, conversations, messages, dtype in rows:
        rate = conversations / seconds
        table.add_row(str(concurrency), f"{seconds:.0f}", str(conversations), str(messages), f"{rate * 3600:.0f}", times(rate, base), dtype)
    console = provenance_console()
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
