"""``seal study``: SEAL against its baselines over seeds, from one start (docs/guides/preflight-and-studies.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from seal_rl.cli.console import out, print_shipped
from seal_rl.errors import SealError


def study_command(
    study: Annotated[str | None, typer.Argument(metavar="STUDY", help="A study file (YAML) or a shipped study's name (--list).")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", "-o", help="The runs' directory (default: runs/STUDY; runs/STUDY-pilot with --pilot).")] = None,
    records: Annotated[Path | None, typer.Option("--records", help="Where each finished run's record is kept and read (default: OUT/records). Commit it: the study goes on from it on another machine.")] = None,
    max_runs: Annotated[int | None, typer.Option("--max-runs", metavar="N", help="Start at most N training runs (new or resumed), then test, record and report what is finished.")] = None,
    recipe: Annotated[str | None, typer.Option("--recipe", help="Train with this recipe instead of the study file's (e.g. paper-qwen2.5-7b on a GPU).")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="A recipe override for every run: key=value (repeatable).")] = None,
    jobs: Annotated[int, typer.Option("--jobs", help="Training runs at once, each with its share of the CPU cores.")] = 1,
    skip_test: Annotated[bool, typer.Option("--skip-test", help="Start no test evaluation; report the finished ones.")] = False,
    pilot: Annotated[bool, typer.Option("--pilot", help="Before the study is spent: seal preflight on one round of every arm's first seed; exit 1 unless every main arm has a reward spread in half of its groups.")] = False,
    report: Annotated[bool, typer.Option("--report", help="The tables of the runs so far (records and local runs, each at the round it reached) in OUT/interim/; trains nothing.")] = False,
    plan: Annotated[bool, typer.Option("--plan", help="seal plan's memory and time for every arm on the study's GPUs (8 x 80 GB unless its plan section says otherwise); trains nothing.")] = False,
    list_studies: Annotated[bool, typer.Option("--list", help="List the shipped studies and exit.")] = False,
) -> None:
    """Run a study: every arm (SEAL, vanilla GRPO, ablations) over seeds from one shared start, validated
    on held-out tasks every round and tested at the end; resumable (run it again after a kill).

    Writes OUT/summary.json, table.md (Wilson intervals; exact McNemar and bootstrap against the
    baseline arm, paired over task x seed), curves.png and report.html. A bad study file (unknown key,
    arm, recipe or task; seeds that are not integers; a held-out task that is also trained on) is
    refused before anything starts. A recipe that names an environment family (family: tau2-DOMAIN or
    path/to/file.py:Class) runs on that family's tasks and is tested with seal eval --family.
    """
    from seal_rl import studies

    if list_studies:
        print_shipped("study", "what it asks", studies.names(), studies.describe)
        return
    if study is None:
        raise SealError("seal study needs a STUDY: a study file or a shipped study's name (seal study --list).")
    if sum((pilot, report, plan)) > 1:
        raise SealError("--pilot, --report and --plan are different jobs: give one.")
    if max_runs is not None and max_runs < 0:
        raise SealError("--max-runs: give 0 or more (0: train nothing, test and record the finished runs).")
    if jobs < 1:
        raise SealError(f"--jobs: give 1 or more, got {jobs}.")
    from seal_rl.study import StudyRun, load_study, narrow_to_pilot, run_pilot, run_study, study_name

    design = load_study(study, recipe, overrides or [], planning=plan)
    if plan:
        _print_plan(design, study)
        return
    name = study_name(study)
    run_out = out_dir or Path("runs") / (name + ("-pilot" if pilot else ""))
    run = StudyRun(source=study, out=run_out, records=records or run_out / "records", recipe=design["recipe"],
                   overrides=design["overrides"], max_runs=max_runs, jobs=jobs, skip_test=skip_test, report=report)  # fmt: skip
    if pilot:
        if run_pilot(narrow_to_pilot(design), run, out):
            raise typer.Exit(1)
        return
    run_study(design, run, out)


def _print_plan(design: dict, study: str) -> None:
    """``seal study --plan``'s table: one row per arm, then the study's total."""
    from seal_rl.study.plan import plan_arms

    plans = plan_arms(design, design["recipe"], design["overrides"])
    first = plans[0]
    table = Table("arm", "fits", "micro-batch", "training GiB/GPU", "vLLM KV tokens", "per round", "rounds x seeds", "GPU-hours",
                  title=f"seal study --plan: {study} on {first.gpus} x {design['plan'].get('gpu_memory', 80):g} GB")  # fmt: skip
    for p in plans:
        table.add_row(p.arm, "yes" if p.fits else "no", str(p.micro_batch), f"{p.memory_gib:.1f} of {p.budget_gib:.1f}",
                      f"{p.kv_tokens:,}" if p.kv_tokens is not None else "—", f"{p.seconds_per_round / 60:.1f} min",
                      f"{p.rounds} x {p.seeds}", f"{p.gpu_hours:.0f}")  # fmt: skip
    out.print(table)
    total = sum(p.gpu_hours for p in plans)
    out.print(f"study: {total:.0f} GPU-hours ({total / first.gpus:.0f} h on {first.gpus} GPUs); seal plan's assumptions "
              "(H100 SXM: 989 TFLOP/s at 35% MFU, 3.35 TB/s; see seal plan --help)", markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    for p in plans:
        if not p.fits:
            out.print(f"{p.arm} does not fit: {p.reason}", markup=False, highlight=False, soft_wrap=True)
    if not all(p.fits for p in plans):
        raise typer.Exit(1)
