"""SEAL training on TRL: multi-turn GRPO rollouts, A-Patch and the closed loop (SEAL Algorithm 1).

One round, top to bottom (one TRL generation batch: ``tasks_per_step`` tasks × ``num_generations``
rollouts), and the module that does each step:

1. rollouts — TRL calls :meth:`~seal_rl.train.loop.SealLoop.rollout` (``loop``) with this
   process's task ids; every episode is played under the current interface Ω_t (training mode)
   through :func:`seal_rl.rollout.run_episodes`, building token-exact samples (loss mask = model
   tokens);
2. verification — the environment's verifier (:mod:`seal_rl.verify`) gives each episode its binary
   reward, which becomes the GRPO reward (an unscorable episode gets ``None`` and no advantage;
   ``samples``' :func:`~seal_rl.train.samples.trl_sample`);
3. diagnosis — Ψ labels every turn (:func:`seal_rl.diagnose.add_diagnosis`, called by ``loop``);
4. profile — labels from all ranks update the capability profile C_t (``loop``,
   :mod:`seal_rl.profile`);
5. interface and A-Patch — the label utilities ρ(z) take one closed-loop step (before scaling, as
   the released code does), each trajectory gets its A-Patch weight w_j (Eq. 10–11), and
   Ω_{t+1} = Evolve(Ω_t, C_t) for the next round (``loop``, :mod:`seal_rl.apatch`,
   :mod:`seal_rl.interface`);
6. TRL update — TRL computes the group advantages (gathered across ranks);
   ``SealGRPOTrainer`` (``trainer``) multiplies them by w_j (Eq. 12) — its one override of TRL —
   and, under ``credit: turn``, adds each user turn's own advantage per token (:mod:`seal_rl.credit`),
   and ``loop`` logs the round: trajectories, metrics, profile, Ω; TRL then runs the optimizer
   steps, whose log-probability passes (policy, old, reference) forward each micro-batch once as a
   prefix tree (:mod:`seal_rl.prefix_tree`: a group's shared prompt is computed once, exactly);
7. validation — every ``eval.every_rounds`` rounds a callback (``trainer``) has ``loop`` play the
   held-out tasks greedily and strictly with the interface removed, keeping the best model;
8. checkpoint — TRL saves model, optimizer and RNG, and a callback (``trainer``) adds the SEAL state
   (C_t, Ω_t, ρ, round) that ``--resume`` restores (``run_dir``).

What TRL trains on (an episode, or its messages in the ``turn`` layout) is built by ``samples``.
Around the rounds: ``recipe`` loads and checks the recipe and derives the batch layout;
``prepare`` selects the training and validation tasks, prepares the model and runs the optional
supervised warm start (``seal sft``); ``run`` is :func:`train`, which wires it all together;
``run_dir`` owns the run directory's files (metrics, checkpoints to resume, TensorBoard).
With ``generator: server`` the episodes are played on ``vllm serve`` processes of their own:
``server_sync`` pushes the weights to them before every round and checks what they serve, and under
``staleness`` ≥ 1 ``async_rounds`` plays groups ahead of the update (step 1 then takes ready groups
instead of playing TRL's prompts), with ``importance`` measuring the behaviour policy's ratios.
With ``model.lora`` TRL trains LoRA adapters (``lora``): the reference is the base model with the
adapters off, checkpoints hold the adapter, ``model/`` the merged model.

Departures from the reference: TRL normalises group advantages with ``std + 1e-4`` (the reference
uses ``1e-6``); each SEAL round is one TRL generation batch.
"""

from seal_rl.train.loop import SealLoop, SealState, round_metrics, round_summary, update_summary
from seal_rl.train.recipe import (
    DataConfig, DiagnosisConfig, GRPOSettings, ModelConfig, SealRecipe, ValidationConfig, batch_layout, load_recipe,
    recipe_fields, validate,
)  # fmt: skip
from seal_rl.train.run import train
from seal_rl.train.run_dir import (
    METRICS_FILE, SEAL_STATE_FILE, TIME_FILE, _drop_logs_after, latest_checkpoint, read_metrics, save_model, scalar_metrics,
)  # fmt: skip
from seal_rl.train.samples import trl_sample, turn_samples
from seal_rl.train.trainer import make_trainer_class, seal_reward
from seal_rl.train.prepare import scenario, select_tasks, sft, warm_start

__all__ = [
    "METRICS_FILE", "SEAL_STATE_FILE", "TIME_FILE", "DataConfig", "DiagnosisConfig", "GRPOSettings", "ModelConfig",
    "SealLoop", "SealRecipe", "SealState", "ValidationConfig", "_drop_logs_after", "batch_layout", "latest_checkpoint",
    "load_recipe", "make_trainer_class", "read_metrics", "recipe_fields", "round_metrics", "round_summary",
    "save_model", "scalar_metrics", "scenario", "select_tasks", "seal_reward", "sft", "train", "trl_sample",
    "turn_samples", "update_summary", "validate", "warm_start",
]  # fmt: skip
