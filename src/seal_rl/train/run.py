"""One SEAL training run, from recipe to saved model: :func:`train`.

It selects the tasks, takes the run directory (one writer at a time), prepares the model and the
warm start, builds TRL's ``GRPOConfig`` from the recipe and the batch layout, builds the loop and
the trainer, restores a checkpoint when resuming, trains, and saves ``model/``.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from seal_rl.budgets import count_for_recipe, summary_line
from seal_rl.errors import SealError, SealWarning
from seal_rl.families import resolve_auto
from seal_rl.generators import vllm_cpu
from seal_rl.generators.vllm_engines import trl_engine_dtype
from seal_rl.precision import checkpoint_dtype, training_dtype
from seal_rl.rollout import Budgets
from seal_rl.runlock import run_lock
from seal_rl.sft import checkpointing_argument
from seal_rl.environments.family import BfclFamily
from seal_rl.environments.load import load_family
import seal_rl.train.lora as lora
from seal_rl.train.loop import CONSOLE, SealLoop, SealState
from seal_rl.train.recipe import SealRecipe, batch_layout, planned_interface, planned_scheduler, resolve_bf16, samples_per_task
from seal_rl.train.run_dir import (
    METRICS_FILE, SEAL_STATE_FILE, TIME_FILE, _best_validation, _drop_logs_after, _tensorboard_dir, latest_checkpoint,
    read_metrics, save_model,
)  # fmt: skip
from seal_rl.train.trainer import (
    _fsdp_on_cpu, _seal_callback, _validation_callback, gradient_without_advantages, make_trainer_class, seal_reward,
)  # fmt: skip
from seal_rl.train.prepare import _prepare_model, select_tasks, warm_start


PRECISION_FILE = "precision.json"
"""what ``model.dtype`` and ``grpo.bf16`` resolved to when the run started (:mod:`seal_rl.precision`);
a resumed run keeps them, on whichever machine it resumes"""


def _started_precision(out: Path) -> dict[str, Any] | None:
    """The precision a run being resumed started with, or None (a run from before it was recorded)."""
    try:
        recorded = json.loads((Path(out) / PRECISION_FILE).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(recorded, dict) and recorded.get("model.dtype") in ("float32", "bfloat16", "float16") \
        and isinstance(recorded.get("grpo.bf16"), bool)
    return recorded if ok else None


def train(recipe: SealRecipe, out: Path, *, resume: Path | None = None, generator_factory: Any = None,
          recipe_path: Path | None = None, family: Any = None) -> dict[str, Any]:
    """Run SEAL (or an ablation) as the recipe says; return a short summary.

    ``resume``: continue the run in ``out`` from its newest checkpoint (model, optimizer, RNG and
    SEAL state; log lines of rounds after that checkpoint are dropped first).

    ``seal train`` checks first that the recipe fits this machine's memory
    (:func:`seal_rl.fit.check_before_training`, called by the CLI before this function). Once the
    model directory exists this prints how many of the training tasks' ground truths fit the budgets
    (:mod:`seal_rl.budgets`). ``family``: the recipe's family, when the caller has loaded it already.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if recipe.model.lora is not None:
        lora.check_launch(dict(os.environ))
    if resume is not None:
        lora.check_resume(Path(resume), recipe.model.lora)
    owned = family is None
    if owned:  # a bad family is one line before anything starts
        family = load_family(recipe.family, **recipe.family_settings)
    bfcl = isinstance(family, BfclFamily)
    task_set = family.task_set()
    tasks, validation = select_tasks(recipe, task_set, family)
    if len(tasks) < recipe.grpo.tasks_per_step:
        raise SealError(f"{len(tasks)} tasks selected but tasks_per_step is {recipe.grpo.tasks_per_step}.")

    from accelerate import PartialState

    # Joins the process group under torchrun / accelerate launch. A singleton: on a CPU-only machine
    # it must be created with cpu=True (as TRL's use_cpu does), or it stays single-process.
    distributed = PartialState(cpu=not torch.cuda.is_available())
    layout = batch_layout(recipe, distributed.num_processes)
    is_main = distributed.is_main_process
    out = Path(out)
    with ExitStack() as held:
        if owned:
            held.callback(getattr(family, "close", lambda: None))  # a simulated user's model, once the run is over
        if is_main:
            held.enter_context(run_lock(out))  # one writer per run directory
        if resume is not None and Path(resume).resolve() != out.resolve():
            raise SealError("--resume continues a run in place: pass the same directory as --out (or omit --out).")
        if is_main:
            out.mkdir(parents=True, exist_ok=True)
            if resume is None and (out / METRICS_FILE).exists():
                raise SealError(f"{out} already holds a training run; choose another --out or resume it with --resume {out}.")
            resolved = OmegaConf.structured(recipe)
            resolved.data.task_ids = [t.id for t in tasks]
            resolved.eval.tasks = [t.id for t in validation]
            (out / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
            CONSOLE.print(start_banner(recipe, out, layout, distributed.num_processes, recipe_path), highlight=False, soft_wrap=True)
            never = planned_interface(recipe, max(getattr(t, "num_turns", 1) for t in tasks))[1]
            if never:
                warnings.warn(never, SealWarning, stacklevel=2)
        with distributed.main_process_first():  # the main process builds a tiny model; the others reuse it
            model_path = _prepare_model(recipe, out, task_set)
            if is_main and os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
                for lock in clear_stale_build_locks():
                    _say(f"removed {lock}: an interrupted DeepSpeed build left it, and the next build would wait on it forever")
        recipe.env, picked = resolve_auto(recipe.env, AutoTokenizer.from_pretrained(model_path))
        if is_main and picked:
            _say(picked)
            resolved.env = recipe.env
            (out / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
        if is_main and bfcl:  # how many ground truths fit the budgets: BFCL's ground truth replayed
            _say(summary_line(count_for_recipe(recipe, AutoTokenizer.from_pretrained(model_path), task_set, tasks)))
        if recipe.warm_start.data:
            if distributed.num_processes > 1:
                raise SealError("The warm start runs in one process: run `seal sft` first, then train with "
                                "--set model.path=SFT_DIR/model and without warm_start.data.")  # fmt: skip
            if not (out / "warm_start" / "model" / "config.json").exists():
                warm_start(recipe, out / "warm_start", task_set, tasks, model_path, family)
            adapter = lora.warm_adapter(recipe.model.lora, out / "warm_start" / "model")
            if adapter is None:  # with a LoRA warm start, RL goes on with its adapter on the base model
                model_path = str(out / "warm_start" / "model")
        else:
            adapter = None

        g = recipe.grpo
        budgets = Budgets(**recipe.budgets)
        save_steps = g.save_steps or layout["updates_per_round"]
        if save_steps % layout["updates_per_round"]:
            raise SealError(f"save_steps ({save_steps}) must be a multiple of the updates per round ({layout['updates_per_round']}).")
        bf16, said = resolve_bf16(g.bf16)
        precision = _started_precision(out) if resume is not None else None
        if precision is not None and g.bf16 not in (True, False):  # auto: as the run started, on any machine
            bf16, said = precision["grpo.bf16"], f"grpo.bf16 auto: {'on' if precision['grpo.bf16'] else 'off'}, as this run started"
        if is_main:
            _say(said)
        args = GRPOConfig(
            output_dir=str(out / "checkpoints"),
            per_device_train_batch_size=g.per_device_train_batch_size,
            gradient_accumulation_steps=layout["gradient_accumulation_steps"],
            steps_per_generation=layout["steps_per_generation"],
            num_generations=samples_per_task(recipe),
            learning_rate=g.learning_rate,
            lr_scheduler_type=g.lr_scheduler_type,
            num_train_epochs=g.num_train_epochs,
            max_steps=g.max_steps,
            beta=g.beta,
            epsilon=g.epsilon,
            delta=g.delta,
            loss_type=g.loss_type,
            temperature=g.temperature,
            top_p=g.top_p,
            seed=g.seed,
            bf16=bf16,
            weight_decay=g.weight_decay,
            use_bias_correction_kl=g.use_bias_correction_kl,
            use_vllm=g.use_vllm,
            vllm_mode=g.vllm_mode,
            vllm_gpu_memory_utilization=g.vllm_gpu_memory_utilization,
            vllm_tensor_parallel_size=g.vllm_tensor_parallel_size,
            vllm_importance_sampling_correction=g.vllm_importance_sampling_correction,
            vllm_importance_sampling_mode=g.vllm_importance_sampling_mode,
            # The engine's context is one whole episode; a single call generates at most max_new_tokens
            # (the driver asks for less when the episode's budget is nearly spent).
            vllm_max_model_length=budgets.max_prompt_tokens + budgets.max_completion_tokens,
            max_completion_length=budgets.max_new_tokens,
            logging_steps=g.logging_steps,
            save_strategy="steps",
            save_steps=save_steps,
            save_total_limit=g.save_total_limit,
            report_to=g.report_to,
            **checkpointing_argument(recipe.model.gradient_checkpointing),
            remove_unused_columns=False,
            use_cpu=not torch.cuda.is_available(),
            **g.extra,
        )
        if g.use_vllm:  # TRL's colocated sync reaches the engine's worker: the engine must run in this process
            vllm_cpu.in_process()
            if not torch.cuda.is_available():  # vLLM's CPU build would size its KV cache to most of the memory
                os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        dtype, said = training_dtype(recipe.model.dtype, checkpoint_dtype(model_path), bf16)
        if precision is not None and recipe.model.dtype == "auto":
            dtype, said = precision["model.dtype"], f"model.dtype auto: {precision['model.dtype']}, as this run started"
        if is_main:
            _say(said)
            (out / PRECISION_FILE).write_text(json.dumps({"model.dtype": dtype, "grpo.bf16": bf16}) + "\n")
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        adapters = None if recipe.model.lora is None or adapter else lora.peft_config(recipe.model.lora, model)
        if adapter is not None:
            model = lora.load_adapter(model, adapter)
        if recipe.model.lora is not None and is_main:
            lora.record_base(out, recipe.model.lora, model_path, resume=resume is not None)
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t.id}], "task_id": t.id} for t in tasks])

        loop = SealLoop(recipe, task_set, out, is_main=is_main, generator_factory=generator_factory, validation=validation,
                        family=family)  # fmt: skip
        checkpoint = None
        if resume is not None:
            checkpoint = latest_checkpoint(resume, required=False)
            if checkpoint is None:  # killed before the first checkpoint: nothing to keep but the recipe
                warnings.warn(f"{out} has no checkpoint yet; starting the run over from round 1.", SealWarning, stacklevel=2)
            else:
                loop.state = SealState.from_json(json.loads((checkpoint / SEAL_STATE_FILE).read_text()))
                if (checkpoint / TIME_FILE).exists():  # older checkpoints have none: the count restarts
                    loop.restore_timing(json.loads((checkpoint / TIME_FILE).read_text())["time/seconds"])
            if is_main:
                _drop_logs_after(out, loop.state.round)
            loop.best_validation = _best_validation(out)
        trainer_class = make_trainer_class()
        engine_dtype = str(model.dtype).removeprefix("torch.") if g.vllm_dtype == "auto" else g.vllm_dtype
        with _tensorboard_dir(out / "tensorboard"), trl_engine_dtype(engine_dtype) if g.use_vllm else nullcontext():
            trainer = trainer_class(
                model=model, reward_funcs=[seal_reward], args=args, train_dataset=dataset, processing_class=tokenizer,
                rollout_func=loop.rollout, callbacks=[_seal_callback(loop)], peft_config=adapters,
            )  # fmt: skip
        trainer.seal = loop
        if recipe.silent_updates == "skip" and (reason := gradient_without_advantages(trainer)):
            raise SealError(f"silent_updates: skip cannot skip a round with nothing to learn here: {reason} has a gradient "
                            "in every round. Set silent_updates: step, or turn that term off.")  # fmt: skip
        if g.use_vllm:
            lora.install_merged_sync(trainer.vllm_generation)  # LoRA: merged weights, the base ones untouched
            vllm_cpu.install_weight_sync(trainer.vllm_generation, loop.timing)  # on vLLM's CPU build only
        _fsdp_on_cpu(trainer)
        loop.train_tasks = list(tasks)
        if recipe.generator == "server":
            from seal_rl.generators.vllm_server import ServerConfig
            from seal_rl.train.server_sync import attach_servers, detach_servers

            attach_servers(trainer, loop, ServerConfig(**recipe.server), out, _say)
            lora.install_merged_sync(trainer.vllm_generation)
            held.callback(detach_servers, loop)
        if validation and recipe.eval.every_rounds:
            trainer.add_callback(_validation_callback(loop, trainer, layout["updates_per_round"], recipe.eval.every_rounds))
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        if loop.rounds_played:  # book the last round's update, which no next round will
            loop.print_update()
        if is_main and loop.rounds_played:
            loop.write_timing(out / TIME_FILE, trainer.state.global_step)
        if loop.apatch_hook_calls != loop.rounds_played:
            raise RuntimeError(
                f"A-Patch was applied in {loop.apatch_hook_calls} of {loop.rounds_played} rounds: TRL no longer "
                f"calls GRPOTrainer._generate_and_score_completions as seal-rl expects (pinned trl==1.16.0)."
            )
        save_model(trainer, out / "model")
        if distributed.num_processes > 1 and torch.distributed.is_initialized():
            # Leave the process group before exiting: gloo's threads still joinable at interpreter exit
            # abort a rank now and then ("terminate called without an active exception", seen under load).
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        return {"rounds": loop.state.round, "steps": trainer.state.global_step, "model": str(out / "model"),
                "apatch_hook_calls": loop.apatch_hook_calls,
                "validation": [line["validation/average"] for line in read_metrics(out, "validation")]}  # fmt: skip


STALE_BUILD_LOCK_S = 600
"""A build lock older than this was left by a dead build: DeepSpeed's CPU op builds in about a minute here."""


def clear_stale_build_locks(*, now: float | None = None) -> list[Path]:
    """Remove the ``lock`` files that killed DeepSpeed op builds left behind; return them.

    Under its CPU accelerator DeepSpeed JIT-builds its shared-memory collective op
    (``deepspeed_shm_comm``) with torch's ``cpp_extension``, which waits without limit while the
    build directory holds a ``lock`` file. A build interrupted mid-way (Ctrl-C, a timeout) leaves
    one, and every later ZeRO-3 run hangs in ``from_pretrained`` (seen: 15 minutes, then a kill).
    Only locks older than :data:`STALE_BUILD_LOCK_S` go, so a build running now keeps its own.
    The build directories are torch's: ``$TORCH_EXTENSIONS_DIR/NAME``, else
    ``~/.cache/torch_extensions/py311_cpu/NAME`` (a folder per Python and accelerator).
    """
    from torch.utils.cpp_extension import get_default_build_root

    chosen = os.environ.get("TORCH_EXTENSIONS_DIR")
    locks = Path(chosen).glob("deepspeed_*/lock") if chosen else Path(get_default_build_root()).glob("*/deepspeed_*/lock")
    now = time.time() if now is None else now
    stale = [lock for lock in locks if now - lock.stat().st_mtime > STALE_BUILD_LOCK_S]
    for lock in stale:
        lock.unlink(missing_ok=True)
    return stale


def _say(text: str) -> None:
    """A line for the person at the terminal (stderr, like the start banner), without Rich markup."""
    CONSOLE.print(text, markup=False, highlight=False, soft_wrap=True)


def start_banner(recipe: SealRecipe, out: Path, layout: dict[str, int], world_size: int, config: Path | None) -> str:
    """What ``seal train`` prints before it starts: recipe, batch layout, world size and outputs."""
    g = recipe.grpo
    episodes = g.tasks_per_step * g.num_generations
    return "\n".join([
        f"seal train: recipe {config or '(given in code)'}, resolved in {out / 'config.yaml'}",
        f"  model {recipe.model.path}; protocol {recipe.env.get('protocol', 'seal')}; interface {recipe.interface.get('preset')}; "
        f"A-Patch {recipe.apatch.get('preset')}; report_to {', '.join(g.report_to)}",
        *([f"  LoRA rank {recipe.model.lora.rank} on {recipe.model.lora.target_modules}: only the adapters train; the "
           "reference is the base model (adapters off); checkpoints hold the adapter, model/ the merged model"]
          if recipe.model.lora is not None else []),
        f"  {world_size} process(es); per round {g.tasks_per_step} tasks x {g.num_generations} rollouts = {episodes} episodes, "
        f"{layout['updates_per_round']} update(s) of {g.tasks_per_update * g.num_generations} episodes "
        f"(micro-batch {g.per_device_train_batch_size}, gradient accumulation {layout['gradient_accumulation_steps']}); "
        f"max_steps {g.max_steps}",
        *([f"  layout turn: {recipe.turn_samples} samples per episode (one model message each, prompted by the model's own "
           f"template), micro-batches count samples"] if recipe.layout == "turn" else []),
        "  update: " + {True: "shared prefixes on", False: "shared prefixes off (TRL forwards every sample whole)",
                        "auto": "shared prefixes auto"}[recipe.shared_prefix]  # fmt: skip
        + ("" if recipe.shared_prefix is False else " (each micro-batch forwarded once as a prefix tree; the round log counts the tokens)"),
        f"  interface {planned_interface(recipe)[0]}",
        f"  reward {recipe.reward}; credit {recipe.credit}"
        + (f" (each user turn's tokens also get omega {recipe.credit_weight:g} x the turn's pass/fail advantage within its group)"
           if recipe.credit == "turn" else ""),
        *(["  silent_updates skip: a round with nothing to learn (no group's rewards differ) runs no update, "
           "so Adam's momentum does not move the weights"] if recipe.silent_updates == "skip" else []),
        f"  rollouts: generator {recipe.generator}, scheduler {planned_scheduler(recipe)}",
        f"  writing {out}/: metrics.jsonl, trajectories.jsonl, profile/, interface/, checkpoints/, tensorboard/, model/",
    ])  # fmt: skip
