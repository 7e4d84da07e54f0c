"""Train with TRL's own GRPOTrainer on BFCL multi-turn, through seal-rl's rollout_func.

Nothing of seal-rl's trainer is used: the model, GRPOConfig and GRPOTrainer are TRL's; seal-rl
plays the episodes (seal_rl.integrations.trl.BfclRollout) and gives the reward. On this machine,
with the tiny model of `make demo` warm-started first (no downloads):

    seal sft --config demo-cpu --out runs/trl-demo/warm
    python examples/trl_grpo_bfcl.py --model runs/trl-demo/warm/model --recipe demo-cpu \\
        --tasks multi_turn_base_100,multi_turn_base_38 --out runs/trl-demo

With a real model on a GPU (TRL's colocated vLLM engine generates the episodes):

    python examples/trl_grpo_bfcl.py --model Qwen/Qwen2.5-7B-Instruct --recipe seal-full \\
        --split train --num-generations 8 --max-steps 100 --use-vllm --bf16 --out runs/trl-qwen

Each round prints a line (success, zero-variance groups, labels, interface); the episodes with
their verdict and diagnosis go to OUT/rollouts/trajectories.jsonl, TRL's logs to OUT/log.jsonl.
docs/guides/integrations.md explains the options.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory or Hub name (GRPOTrainer loads it)")
    parser.add_argument("--recipe", default="seal-full", help="a seal-rl recipe: its env, budgets, interface and A-Patch apply")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    parser.add_argument("--split", default="train", help="train, test or all (the paper's 400/400 split)")
    parser.add_argument("--categories", default="", help="comma-separated: base, miss_func, miss_param, long_context")
    parser.add_argument("--tasks", default="", help="comma-separated task ids (instead of --split/--categories)")
    parser.add_argument("--num-generations", type=int, default=8, help="episodes per task in a group")
    parser.add_argument("--tasks-per-step", type=int, default=2, help="tasks per generation batch (one round)")
    parser.add_argument("--per-device-batch", type=int, default=4, help="episodes per micro-batch")
    parser.add_argument("--max-steps", type=int, default=1, help="optimizer steps (one per round here)")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--use-vllm", action="store_true", help="generate with TRL's colocated vLLM engine")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("runs/trl-bfcl"))
    args = parser.parse_args()

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from seal_rl.integrations.trl import BfclRollout, bfcl_dataset, bfcl_reward

    rollout = BfclRollout(args.recipe, overrides=args.overrides, out=args.out / "rollouts")
    dataset = bfcl_dataset(args.split, [c for c in args.categories.split(",") if c] or None, [t for t in args.tasks.split(",") if t] or None)
    episodes = args.tasks_per_step * args.num_generations
    if episodes % args.per_device_batch:
        parser.error(f"--tasks-per-step x --num-generations ({episodes}) must be a multiple of --per-device-batch")
    config = GRPOConfig(
        output_dir=str(args.out / "checkpoints"),
        num_generations=args.num_generations,
        per_device_train_batch_size=args.per_device_batch,
        gradient_accumulation_steps=episodes // args.per_device_batch,  # one optimizer step per round
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        temperature=args.temperature,
        max_completion_length=rollout.recipe.budgets["max_new_tokens"],
        beta=0.0,
        seed=args.seed,
        bf16=args.bf16,
        use_vllm=args.use_vllm,
        vllm_mode="colocate",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        remove_unused_columns=False,  # the dataset's task_id column reaches the rollout
        use_cpu=not torch.cuda.is_available(),
    )
    trainer = GRPOTrainer(model=args.model, reward_funcs=[bfcl_reward], args=config, train_dataset=dataset, rollout_func=rollout)
    trainer.train()
    trainer.save_model(str(args.out / "model"))
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    (args.out / "log.jsonl").write_text("".join(json.dumps(entry) + "\n" for entry in logs))
    for entry in logs:
        print(f"step {entry['step']}: reward {entry['reward']:.3f} ± {entry['reward_std']:.3f}, "
              f"groups with zero reward spread {entry.get('frac_reward_zero_std', float('nan')):.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
