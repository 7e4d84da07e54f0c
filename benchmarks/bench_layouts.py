"""The learn-cpu recipe in the ``turn`` sample layout against the ``episode`` layout, in the same run.

Both arms run ``seal train --config learn-cpu`` with the same seed, so the same warm start, and
differ only in what one training sample is (docs/training.md, "Sample layouts"):

* ``episode``: one token-exact sample per episode (the recipe's default, the paper's);
* ``turn``: ``layout: turn``, ``turn_samples: 4``: four samples per episode, each one model
  message prompted by the model's own template's rendering of the conversation before it.

Per arm: the validation curve, seconds per round (all, generation, update), the tokens TRL's
update read per round (prompts and completions) and the tokens its policy pass forwarded
(shared prefixes once; ``learn_cpu.run_arm``). Both arms hold 4 episodes per micro-batch (the
``turn`` arm's micro-batch is 4 x ``turn_samples`` samples). The ratios are turn / episode.
Usage: python benchmarks/bench_layouts.py [--out runs/bench-layouts] [--seed 0] [--turn-samples 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learn_cpu import ROOT, run_arm  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-layouts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--turn-samples", type=int, default=4)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # The same episodes per micro-batch in both arms (learn-cpu's 4), so both share prompts alike.
    arms = {"episode": [], "turn": ["layout=turn", f"turn_samples={args.turn_samples}",
                                    f"grpo.per_device_train_batch_size={4 * args.turn_samples}"]}
    results = [run_arm(arm, sets, args.out / arm, args.seed) for arm, sets in arms.items()]

    console = Console(width=200)
    table = Table("layout", "validation (warm start → rounds)", "wall s", "round s", "generation s/round", "update s/round",
                  "tokens/round", "forwarded/round", title="learn-cpu, 2 cores")  # fmt: skip
    for r in results:
        table.add_row(r["arm"], " → ".join(f"{v:.2f}" for v in r["curve"]), f"{r['wall']:.0f}", f"{r['round']:.1f}",
                      f"{r['generation']:.2f}", f"{r['update']:.1f}", f"{r['tokens']:,.0f}", f"{r['forwarded']:,.0f}")  # fmt: skip
    console.print(table)
    episode, turn = results
    keys = ("wall", "round", "generation", "update", "tokens", "forwarded")
    ratios = {key: turn[key] / episode[key] for key in keys if episode[key]}
    console.print("turn / episode: " + ", ".join(f"{key} {value:.2f}x" for key, value in ratios.items()))
    (args.out / "summary.json").write_text(json.dumps({"arms": results, "turn_over_episode": ratios}, indent=1) + "\n")


if __name__ == "__main__":
    main()
