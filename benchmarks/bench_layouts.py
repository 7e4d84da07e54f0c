"""The learn-cpu recipe in the ``turn`` sample layout against the ``episode`` layout, in the same run.

Both arms run ``seal train --config learn-cpu`` with the same seed, so the same warm start, and
differ only in what one training sample is (docs/concepts/credit.md, "Sample layouts"):

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
from pathlib import Path

from learn_cpu import ROOT, report, run_arm


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
    keys = ["wall", "round", "generation", "update", "tokens", "forwarded"]
    report(results, "layout", keys, "learn-cpu, 2 cores", keys, ("turn", "episode"), args.out)


if __name__ == "__main__":
    main()
