"""What of a study's run outlives its machine: its curves, per-round counts and test outcomes.

A run is a ``seal train`` directory (metrics.jsonl, trajectories.jsonl, validation/round_N.jsonl) and,
for the tested arms, a ``seal eval`` directory. :func:`seed_entry` reads what the tables need of a run;
:func:`run_record` adds its test episodes' outcomes, what it cost and the warm start it came from
(the sha256 of its weights, :func:`weights_sha256`), a few kB written atomically by
:func:`write_record` — committed, so that a study spread over machines that keep nothing but the
repository's commits goes on from its records.

A run of an environment family (docs/guides/your-environment.md) reads the same: its episodes are one
conversation scored once by the family's verifier, so each counts as one turn (the first), with no
later turns and no turn-local check; ``task_set`` is then the family's task source.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

from seal_rl import jsonl
from seal_rl.env import accepted_calls
from seal_rl.errors import SealError
from seal_rl.environments.family import TaskSource
from seal_rl.evaluate import episode_counts
from seal_rl.tasks import TaskSet
from seal_rl.verify import turn_local_passes


def run_dir(out: Path, arm: str, seed: int) -> Path:
    """Where the study trains ``arm``'s run with ``seed``."""
    return out / arm / f"seed{seed}"


def trained(run: Path) -> bool:
    """Whether ``seal train`` finished in ``run`` (its final model is written last)."""
    return (run / "model" / "config.json").exists()


def episodes_on_test(out: Path) -> list[dict]:
    """A finished ``seal eval`` run's episodes, each as :func:`outcome_on_test`."""
    path = out / "results.jsonl"
    return [outcome_on_test(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] if path.exists() else []


def outcome_on_test(record: dict) -> dict:
    """What the study keeps of a test episode: what the paired comparison reads (task, category,
    reward, error) and its turn counts (:func:`~seal_rl.evaluate.episode_counts`), not its transcript."""
    kept = {key: record[key] for key in ("task_id", "category", "reward", "error") if record.get(key) is not None}
    return {**kept, "counts": episode_counts(record) if "diagnosis" in record else None}


# -- what a run measured -------------------------------------------------------------------------



def run_curves(run: Path) -> dict:
    """Per round (validation: 0 = the warm start) what the run's metrics.jsonl says."""
    from seal_rl.train import read_metrics  # torch: not for `seal report`, which reads a study's summary

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


def turn_breakdown(episodes: list[dict], task_set: TaskSet | TaskSource) -> list[dict[str, int]]:
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
        local = turn_local_passes(task, accepted_calls(record["trace"], _num_turns(task))) if len(checks) > 1 else ()
        for k, check in enumerate(checks):
            if check["reached"]:
                where = "first" if k == 0 else "later"
                counts[f"{where}_reached"] += 1
                counts[f"{where}_passed"] += check["failure"] is None
                if k:
                    counts["later_local"] += bool(local[check["turn"]])
    return [rounds[r] for r in sorted(rounds)]


def tool_calls(episodes: list[dict], task_set: TaskSet | TaskSource) -> list[dict[str, int]]:
    """Per round, how often the sampled episodes called each tool (accepted calls only): a policy that
    collapses onto the one tool its reward favours shows here."""
    rounds: dict[int, list[dict]] = {}
    for record in episodes:
        rounds.setdefault(record["round"], []).append(record)
    return [_calls_by_tool(rounds[r], task_set) for r in sorted(rounds)]


def held_out_tool_calls(run: Path, rounds: list[int], task_set: TaskSet | TaskSource) -> list[dict[str, int]]:
    """The same count for the greedy held-out episodes of each validated round (none where the round's
    records are not there: the metrics line is written first)."""
    paths = [run / "validation" / f"round_{r}.jsonl" for r in rounds]
    return [_calls_by_tool(jsonl.read(path).values if path.exists() else [], task_set) for path in paths]


def _calls_by_tool(records: list, task_set: TaskSet | TaskSource) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for record in records:
        if isinstance(record, dict):  # a torn last line of a validation file is left out
            turns = accepted_calls(record["trace"], _num_turns(task_set.get(record["task_id"])))
            counts.update(call.name for turn in turns for step in turn for call in step)
    return dict(counts)


def _num_turns(task: object) -> int:
    """A BFCL task's user turns; a family's task is one conversation: one turn."""
    return getattr(task, "num_turns", 1)



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
    """The commit checked out in the working directory (the code a run came from); None outside a checkout."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:  # no git on this machine
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def seed_entry(run: Path, seed: int, task_set: TaskSet | TaskSource) -> dict:
    """One run's row material: its curves (:func:`run_curves`) and the per-round counts of its episodes."""
    curves, episodes = run_curves(run), sampled_episodes(run)
    return {"seed": seed, **curves, "nonzero_advantage_rollouts": nonzero_advantages(episodes),
            "turns": turn_breakdown(episodes, task_set), "tools": tool_calls(episodes, task_set),
            "held_out_tools": held_out_tool_calls(run, curves["held_out_rounds"], task_set)}  # fmt: skip


def run_record(run: Path, arm: str, seed: int, rounds: int, start: dict, task_set: TaskSet | TaskSource, test: list[dict] | None,
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
        raise SealError(f"{path}: not a study record ({exc}); delete it to train and test that run again.") from None


def write_record(path: Path, record: dict) -> None:
    """Atomically: a kill while writing leaves the old record or none, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    os.replace(partial, path)
