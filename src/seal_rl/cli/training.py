"""``seal train``, ``seal plan``, ``seal preflight``, ``seal sft`` and ``seal merge``: train from a
recipe, estimate whether it fits, check on one round of rollouts whether it can learn, run its
supervised warm start alone, and merge a LoRA adapter into its base for serving."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from seal_rl.cli.console import JsonOption, _print_json, err, out, print_shipped, run_progress
from seal_rl.errors import SealError

def train_command(
    config: Annotated[Path | None, typer.Option("--config", help="A YAML recipe: a file or a shipped recipe's name (see --list-configs).")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a recipe field: key=value (dotted, repeatable).")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory (checkpoints, metrics, trajectories, model).")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue the run in this directory from its newest checkpoint.")] = None,
    extra: Annotated[list[str] | None, typer.Argument(metavar="[KEY=VALUE]...", help="More recipe overrides, like --set.")] = None,
    list_configs: Annotated[bool, typer.Option("--list-configs", help="List the shipped recipes and exit.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Start even when seal plan's memory estimate says the recipe does not fit this machine (CPU: its available RAM; GPU: each device's memory); without it such a run is refused before anything loads.")] = False,
) -> None:
    """Train with SEAL (or vanilla GRPO / an ablation) from a recipe, on CPU, one GPU or many.

    The recipe's family says on what: BFCL (the default), τ²-bench (family=tau2-airline|retail|telecom|mock)
    or your own environment (family=path/to/file.py:Class); docs/guides/your-environment.md.

    Before loading the model it checks the recipe against this machine's memory with seal plan's
    estimate and refuses a run that cannot fit (naming the setting that would make it fit; --force
    starts anyway); then it prints how many training ground truths fit the recipe's token budgets.
    """
    from seal_rl import recipes
    from seal_rl.train import load_recipe, train

    if list_configs:
        print_shipped("recipe", "what it is", recipes.names(), recipes.describe)
        return
    if resume is not None:
        if not (resume / "config.yaml").exists():
            what = "does not exist" if not resume.exists() else "holds no config.yaml (not a `seal train` run)"
            raise SealError(f"Cannot resume {resume}: the directory {what}.")
        out_dir = out_dir or resume
        config = config or resume / "config.yaml"
    if out_dir is None or config is None:
        raise SealError("seal train needs --config RECIPE and --out DIR (or --resume DIR).")
    recipe = load_recipe(config, [*(overrides or []), *(extra or [])])
    from seal_rl.environments import load_family
    from seal_rl.fit import check_before_training, resolve_micro_batch
    from seal_rl.train import select_tasks

    processes = int(os.environ.get("WORLD_SIZE", "1"))
    family = load_family(recipe.family, **recipe.family_settings)  # a bad family is one line, before anything starts
    tasks = select_tasks(recipe, family.task_set(), family)[0]
    recipe, chosen = resolve_micro_batch(recipe, processes=processes, num_tasks=len(tasks))  # every rank: the same choice
    if os.environ.get("RANK", "0") == "0" and hasattr(family, "check_user"):  # a simulated user's server answers first
        family.check_user()
    if os.environ.get("RANK", "0") == "0":  # the main process checks the memory before anything is written or loaded
        if recipe.generator == "server":  # and that every generation server answers
            from seal_rl.generators.vllm_server import ServerConfig, ServerPool

            ServerPool(ServerConfig(**recipe.server)).connect()
        if chosen:
            err.print(chosen, markup=False, highlight=False, soft_wrap=True)
        check_before_training(recipe, processes=processes, num_tasks=len(tasks), force=force,
                              say=lambda text: err.print(text, markup=False, highlight=False, soft_wrap=True))  # fmt: skip
    try:
        summary = train(recipe, out_dir, resume=resume, recipe_path=config, family=family)
    finally:
        getattr(family, "close", lambda: None)()  # a simulated user's model
    out.print(f"trained {summary['rounds']} rounds ({summary['steps']} optimizer steps); model: {summary['model']}")
    if summary["validation"]:
        out.print("validation success (greedy, strict): " + " → ".join(f"{v:.2f}" for v in summary["validation"]))


def plan_command(
    config: Annotated[Path, typer.Option("--config", help="A YAML recipe: a file or a shipped recipe's name (seal train --list-configs).")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs (training processes).")],
    gpu_memory: Annotated[float, typer.Option("--gpu-memory", help="Memory per GPU in GiB (an '80 GB' H100 or A100: 80).")],
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a recipe field: key=value (model.path=preset:NAME needs no weights).")] = None,
    strategy: Annotated[str | None, typer.Option(help="zero3 | zero2 | zero1 | fsdp | ddp (default: zero3; ddp with model.lora, which seal train runs under plain data parallel only).")] = None,
    peak_tflops: Annotated[float, typer.Option(help="Dense bf16 TFLOP/s per GPU (H100 SXM 989, A100 312).")] = 989.0,
    mfu: Annotated[float, typer.Option(help="Model FLOPs utilisation of training.")] = 0.35,
    hbm_tb_s: Annotated[float, typer.Option("--hbm-tb-s", help="Memory bandwidth per GPU, TB/s (H100 SXM 3.35, A100 2.0).")] = 3.35,
    decode_efficiency: Annotated[float, typer.Option(help="Share of the bandwidth roofline decoding reaches.")] = 0.5,
    gen_tokens_per_s: Annotated[float | None, typer.Option(help="Generated tokens/s per GPU (default: from the decode roofline).")] = None,
    overhead_gib: Annotated[float, typer.Option("--overhead-gib", help="CUDA context, NCCL and fragmentation per GPU, GiB.")] = 3.0,
    vllm_overhead_gib: Annotated[float, typer.Option("--vllm-overhead-gib", help="vLLM's non-KV memory besides weights, GiB.")] = 1.5,
    server_gpus: Annotated[int, typer.Option("--server-gpus", help="Of the --gpus, how many run vLLM generation servers (vllm serve, generator: server); the rest train. 0: vLLM colocated on every GPU (the default). Prints the round time both ways.")] = 0,
    server_memory_utilization: Annotated[float, typer.Option("--server-memory-utilization", help="Share of a server GPU its vLLM takes (vLLM's --gpu-memory-utilization; 0.92 is vLLM 0.30's default).")] = 0.92,
    sync_gb_s: Annotated[float, typer.Option("--sync-gb-s", help="GB/s of the weight sync from the trainers to the servers (50: one 400 Gb/s InfiniBand NDR link; 450: NVLink within an H100 node).")] = 50.0,
) -> None:
    """Estimate per-GPU memory, vLLM KV cache and time per round of a recipe; exit 1 if it does not fit.

    With a model directory it also counts how many training ground truths fit the recipe's token
    budgets, with that model's tokenizer. With --server-gpus M, M of the GPUs hold vLLM generation
    servers and the others train: it plans both kinds of GPU and compares the round time with the
    colocated plan on all of them (synchronous, or asynchronous at the recipe's staleness).
    """
    from seal_rl.plan import Assumptions, estimate, estimate_split, render, render_split
    from seal_rl.plan.estimate import user_line
    from seal_rl.plan.micro_batch import AUTO, choose_micro_batch, with_micro_batch
    from seal_rl.train import load_recipe

    recipe = load_recipe(config, overrides or [])
    strategy = strategy or ("ddp" if recipe.model.lora is not None else "zero3")
    assumptions = Assumptions(peak_tflops=peak_tflops, mfu=mfu, hbm_tb_per_s=hbm_tb_s, decode_efficiency=decode_efficiency,
                              gen_tokens_per_s=gen_tokens_per_s, overhead_gib=overhead_gib, vllm_overhead_gib=vllm_overhead_gib,
                              server_memory_utilization=server_memory_utilization, sync_gb_per_s=sync_gb_s)  # fmt: skip
    if server_gpus:
        split = estimate_split(recipe, gpus=gpus, server_gpus=server_gpus, gpu_memory_gb=gpu_memory, strategy=strategy,
                               assumptions=assumptions)  # fmt: skip
        out.print(f"seal plan: {config}", markup=False, highlight=False, soft_wrap=True)
        for side, chosen in (("training GPUs", split.training_choice), ("colocated", split.colocated_choice)):
            if chosen:
                out.print(f"{side}: {chosen}", markup=False, highlight=False, soft_wrap=True)
        out.print(render_split(split, budgets=_budget_count_line(recipe)), markup=False, highlight=False, soft_wrap=True)
        if not split.fits:
            raise typer.Exit(1)
        return
    chosen = ""
    if recipe.grpo.per_device_train_batch_size == AUTO:
        choice = choose_micro_batch(recipe, gpus, lambda r: estimate(r, gpus=gpus, gpu_memory_gb=gpu_memory, strategy=strategy,
                                                                     assumptions=assumptions))  # fmt: skip
        recipe, chosen = with_micro_batch(recipe, choice.size), choice.describe()
    plan = estimate(recipe, gpus=gpus, gpu_memory_gb=gpu_memory, strategy=strategy, assumptions=assumptions)
    out.print(f"seal plan: {config}", markup=False, highlight=False, soft_wrap=True)
    if chosen:
        out.print(chosen, markup=False, highlight=False, soft_wrap=True)
    if user_line(recipe):  # a simulated user's server is GPUs on top of these
        out.print(user_line(recipe), markup=False, highlight=False, soft_wrap=True)
    # The verdict is the report's last line, printed once; the exit code tells scripts.
    out.print(render(plan, budgets=_budget_count_line(recipe)), markup=False, highlight=False, soft_wrap=True)
    if not plan.fits:
        raise typer.Exit(1)


def _budget_count_line(recipe) -> str:
    """``seal plan``'s line on the ground truths within the budgets, counted with the model
    directory's tokenizer; for a preset (no tokenizer) it says why nothing was counted."""
    from seal_rl.budgets import count_for_recipe, summary_line
    from seal_rl.models import resolve_model
    from seal_rl.plan import PRESET_PREFIX

    path = recipe.model.path
    if recipe.family != "bfcl":
        return f"ground truths within budgets: not counted (family {recipe.family} has no ground truth to replay)"
    if path.startswith(PRESET_PREFIX):
        return "ground truths within budgets: not counted (a preset has no tokenizer; give model.path=MODEL_DIR to count)"
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(Path(resolve_model(path)).expanduser()))
    except (OSError, ValueError):
        return f"ground truths within budgets: not counted (no tokenizer could be loaded from {path})"
    try:
        from seal_rl.tasks import TaskSet
        from seal_rl.train import select_tasks

        task_set = TaskSet.load()
        return summary_line(count_for_recipe(recipe, tokenizer, task_set, select_tasks(recipe, task_set)[0]))
    except SealError as exc:  # e.g. a tokenizer without a chat template
        return f"ground truths within budgets: not counted ({exc})"


def sft_command(
    config: Annotated[Path, typer.Option("--config", help="A YAML recipe (model, env, budgets, warm_start.sft settings).")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output directory; the model goes to OUT/model.")],
    data: Annotated[list[str] | None, typer.Option("--data", help="Transcript source: oracle | oracle:faults=P,seed=S[,kinds=A+B][,turn=N] | replay:FILE | run:EVAL_DIR (repeatable; default: the recipe's warm_start.data).")] = None,
    only_successful: Annotated[bool, typer.Option("--only-successful", help="Keep only episodes whose replayed reward is 1 (rejection-sampling fine-tuning).")] = False,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a recipe field: key=value (dotted, repeatable).")] = None,
) -> None:
    """Supervised warm start on multi-turn transcripts, token-exact with RL rollouts (TRL SFTTrainer)."""
    from seal_rl.sft import SFTSource
    from seal_rl.train import load_recipe, sft

    recipe = load_recipe(config, overrides or [])
    sources = [SFTSource(source=spec, successful_only=only_successful) for spec in data or []]
    if not sources and not recipe.warm_start.data:
        raise SealError("No transcripts to learn from: give --data SOURCE (e.g. --data oracle) or set warm_start.data in the recipe.")
    if only_successful and not sources:
        for source in recipe.warm_start.data:
            source.successful_only = True
    summary = sft(recipe, out_dir, sources)
    out.print(f"SFT on {summary['samples']} samples ({summary['assistant_tokens']} assistant tokens), {summary['steps']} steps, "
              f"loss {summary['first_loss']} -> {summary['last_loss']}; model: {summary['model']}")


def merge_command(
    adapter: Annotated[Path, typer.Argument(metavar="ADAPTER", help="A run trained with model.lora (its newest checkpoint), one of its checkpoints (RUN/checkpoints/checkpoint-K) or an adapter directory.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="The merged model directory to write (must not exist or be empty).")],
    base: Annotated[str | None, typer.Option(help="The base model directory (default: the one the run's lora.json records; a different base is refused).")] = None,
) -> None:
    """Merge a LoRA adapter into its base model: a plain model directory for vllm serve, seal eval --policy hf:/vllm:."""
    from seal_rl.models import resolve_model
    from seal_rl.train.lora import merge_adapter

    merged, used = merge_adapter(adapter, out_dir, resolve_model(base) if base else None)
    out.print(f"merged {merged} into {used}: {out_dir} (seal eval --policy hf:{out_dir})")


def preflight_command(
    config: Annotated[Path, typer.Argument(metavar="RECIPE", help="A YAML recipe: a file or a shipped recipe's name (seal train --list-configs).")],
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a recipe field: key=value (dotted, repeatable).")] = None,
    model: Annotated[str | None, typer.Option(help="Play this model directory (or pulled model) instead of the recipe's, without its warm start.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", "-o", help="Where the round's episodes, the warm start and preflight.json go (default: runs/preflight/RECIPE).")] = None,
    tasks: Annotated[int, typer.Option(help="Tasks in the round (0: the recipe's grpo.tasks_per_step).")] = 0,
    samples: Annotated[int, typer.Option(help="Episodes per task (0: the recipe's grpo.num_generations).")] = 0,
    backend: Annotated[str, typer.Option(help="Rollout engine: auto (vLLM when grpo.use_vllm and vLLM is installed, else transformers) | hf | vllm.")] = "auto",
    spread_warn: Annotated[float, typer.Option(help="Warn when fewer than this share of groups have a reward spread (none fails).")] = 0.25,
    format_warn: Annotated[float, typer.Option(help="Warn when the interface moves completion-budget endings or the accepted-call share by more than this.")] = 0.10,
    budget_warn: Annotated[float, typer.Option(help="Warn when fewer than this share of the training ground truths fit the budgets (none fails).")] = 0.75,
    json_output: JsonOption = False,
) -> None:
    """Say whether a recipe's run can learn, before it is spent: one round of real rollouts, no update.

    Checks the memory estimate on this machine, the ground truths within the budgets, the groups with a
    reward spread (under the recipe's reward and the other one, on the same episodes) and what the
    interface the recipe would use next costs the tool-call format (paired against the base interface).
    Each check is ok / warn / fail with what to change; exit 1 when one fails (a run that cannot learn).
    """
    import sys
    from contextlib import contextmanager, redirect_stdout

    from rich.markup import escape

    from seal_rl.preflight import Thresholds, preflight
    from seal_rl.train import load_recipe

    if backend not in ("auto", "hf", "vllm"):
        raise SealError(f"Unknown --backend {backend!r}; choose one of: auto, hf, vllm.")
    for name, value in (("--spread-warn", spread_warn), ("--format-warn", format_warn), ("--budget-warn", budget_warn)):
        if not 0.0 <= value <= 1.0:
            raise SealError(f"{name} is a share between 0 and 1, got {value}.")
    recipe = load_recipe(config, overrides or [])
    out_dir = out_dir or Path("runs") / "preflight" / Path(str(config)).stem

    @contextmanager
    def progress(arm: str, total: int):
        done = {"episodes": 0, "ok": 0.0}
        with run_progress(arm, "success", total) as update:

            def advance(rollout) -> None:
                done["episodes"] += 1
                done["ok"] += rollout.record["reward"] == 1.0
                update(rate=f"{done['ok'] / done['episodes']:.0%}")

            yield advance

    with redirect_stdout(sys.stderr):  # what libraries print on import (DeepSpeed's accelerator line) stays off stdout
        report = preflight(recipe, out_dir, model=model, tasks=tasks, samples=samples, backend=backend,
                           thresholds=Thresholds(spread=spread_warn, format_cost=format_warn, budgets=budget_warn),
                           say=lambda text: err.print(text, markup=False, highlight=False, soft_wrap=True), progress=progress)  # fmt: skip
    if json_output:
        _print_json(report)
    else:
        colours = {"ok": "green", "warn": "yellow", "fail": "red"}
        table = Table("check", "verdict", "measured", "what to change", title=f"seal preflight: {config}")
        for check in report["checks"]:
            table.add_row(check["name"], f"[{colours[check['verdict']]}]{check['verdict']}[/]", escape(check["number"]), escape(check["advice"]))
        out.print(table)
        reasons = ", ".join(f"{k} {v}" for k, v in report["end_reasons"].items())
        played = ", ".join(f"{arm} {s:.0f} s" for arm, s in report["seconds"].items())
        out.print(f"round 1: {len(report['tasks'])} tasks x {report['samples']} samples at T={report['temperature']} on {report['backend']}; "
                  f"ended: {reasons}; played: {played}", markup=False, highlight=False, soft_wrap=True)  # fmt: skip
        out.print(f"verdict: {report['verdict']} ({out_dir}/preflight.json)", markup=False, highlight=False, soft_wrap=True)
    if report["verdict"] == "fail":
        raise typer.Exit(1)
