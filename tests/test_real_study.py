"""The held-out study's harness (benchmarks/bench_real_study.py, docs/real-study.md) on the tiny model:
every arm trains and is measured on held-out and test tasks, a stopped study resumes without redoing
finished runs, and the smoke fails when no rollout carries an advantage and passes when some do.
The real-model study itself is ``make bench-real-study``; its smoke on SmolLM2 is ``make bench-real-study-smoke``
(out of CI since issue 57: too slow on an AVX2-only CPU)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.verify import ground_truth_calls
from tests.helpers import ground_truth_steps, play_steps

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = ["multi_turn_base_118", "multi_turn_base_121"]


def _study(path: Path) -> Path:
    path.write_text(json.dumps({
        "recipe": "smoke-cpu", "rounds": 2, "held_out": HELD_OUT,
        "arms": {"vanilla-grpo": {"recipe": "vanilla-grpo", "seeds": [0]},
                 "seal-full": {"recipe": "seal-full", "seeds": [0], "set": ["interface.min_count=3"]}},
        "test": {"per_category": 1, "max_new_tokens": 8, "arms": ["vanilla-grpo", "seal-full"]},
    }))  # fmt: skip
    return path


def _run(study: Path, out: Path, *extra: str, records: Path | None = None) -> subprocess.CompletedProcess:
    """The harness on ``study``; its records beside ``out`` (never in the repository's benchmarks/results)."""
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_real_study.py"), "--study", str(study), "--out", str(out),
               "--records", str(records or out.parent / f"{out.name}-records"), "--set", "budgets.max_new_tokens=8", *extra]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    design = _study(root / "study.json")
    done = _run(design, root / "out", "--jobs", "2")  # both arms at once, a core each
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return design, root / "out", done.stdout


def test_every_arm_is_trained_and_measured_on_held_out_and_test_tasks(study):
    _, out, stdout = study
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["arms"]) == ["vanilla-grpo", "seal-full"] and summary["held_out"] == HELD_OUT
    for arm, entry in summary["arms"].items():
        (seed,) = entry["seeds"]
        for key in ("held_out_success", "held_out_call_share", "held_out_tools"):
            assert len(seed[key]) == 3  # round 0 (the start) + 2 rounds
        assert len(seed["rollout_success"]) == len(seed["nonzero_advantage_groups"]) == len(seed["turns"]) == 2
        assert all(set(tasks) == set(HELD_OUT) for tasks in seed["held_out_tasks"])
        assert entry["test_final"]["turns"] > 0 and entry["test_final"]["messages"] > 0
        config = (out / arm / "seed0" / "config.yaml").read_text()
        assert "protocol: bfcl" in config and "multi_turn_base_118" in config  # measured under bfcl, on the held-out tasks
        assert ("min_count: 3" in config) == (arm == "seal-full")  # an arm's own `set` reaches its runs, and only them
        results = (out / "test" / f"{arm}-seed0" / "results.jsonl").read_text().splitlines()
        assert len(results) == 4 and all(json.loads(r)["category"] for r in results)  # one test task per category
    validated = [[json.loads(line)["round"] for line in (out / arm / "seed0" / "metrics.jsonl").read_text().splitlines()
                  if '"kind": "validation"' in line] for arm in summary["arms"]]  # fmt: skip
    assert validated == [[0, 1, 2], [1, 2]]  # the shared start is measured once, by the first run
    assert summary["warm_start"]["held_out"]["success"] == summary["arms"]["seal-full"]["seeds"][0]["held_out_success"][0]
    interface = [s["interface"] for s in summary["arms"]["seal-full"]["seeds"]][0]
    assert [s["interface"] for s in summary["arms"]["vanilla-grpo"]["seeds"]][0] == [[], []]  # vanilla sees no interface
    assert interface != [[], []]  # the label-driven interface reacts to the tiny model's failures
    assert "seal-full" in summary["arms"] and "test_vs_vanilla" in summary["arms"]["seal-full"]
    assert "By round" in stdout and "Outcomes" in stdout
    assert "| rollout turns passed |" in (out / "table.md").read_text()  # the dense measure, beside the binary one
    each_run = (out / "table.md").read_text().split("**Each run, by round**")[1].strip().splitlines()[2:]
    assert len(each_run) == 4  # 2 runs x 2 rounds
    for line in each_run:
        arm, seed, r, *cells = [c.strip() for c in line.strip("|").split("|")]
        entry = summary["arms"][arm]["seeds"][0]
        k = entry["held_out_rounds"].index(int(r))
        assert cells[4] == str(sum(entry["tools"][int(r) - 1].values()))  # accepted calls of the round's rollouts
        assert cells[5] == f"{sum(v == 1.0 for v in entry['held_out_tasks'][k].values())}/2"  # that round's held-out check
    assert "Writing model shards" not in stdout and (out / "seal-full" / "seed0.log").stat().st_size > 0  # each run's output in its log
    records = out.parent / "out-records"
    assert sorted(p.name for p in records.iterdir()) == ["seal-full-seed0.json", "vanilla-grpo-seed0.json"]  # a tiny start: no warm start to test
    vanilla = json.loads((records / "vanilla-grpo-seed0.json").read_text())
    assert vanilla["entry"] == summary["arms"]["vanilla-grpo"]["seeds"][0] and len(vanilla["test"]) == 4
    assert vanilla["start"] == {"model": "tiny", "warm_start": False, "sha256": None} and vanilla["costs"]["vanilla-grpo/seed0/train"] > 0
    page = (out / "report.html").read_text()
    assert page.count("<table>") == 4 and "data:image/png;base64," in page and (out / "curves.png").stat().st_size > 10_000


def test_a_stopped_study_resumes_without_redoing_finished_runs(study, tmp_path):
    design, out, _ = study
    finished = (out / "vanilla-grpo" / "seed0" / "metrics.jsonl").stat().st_mtime_ns
    tested = (out / "test" / "vanilla-grpo-seed0" / "results.jsonl").stat().st_mtime_ns
    rounds_before = (out / "seal-full" / "seed0" / "metrics.jsonl").read_text().count('"kind": "rollout"')
    import shutil

    shutil.rmtree(out / "seal-full" / "seed0" / "model")  # stopped after its last checkpoint, before the model was written
    (out.parent / "out-records" / "seal-full-seed0.json").unlink()  # (and so before its record)
    done = _run(design, out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "vanilla-grpo" / "seed0" / "metrics.jsonl").stat().st_mtime_ns == finished
    assert (out / "test" / "vanilla-grpo-seed0" / "results.jsonl").stat().st_mtime_ns == tested
    assert (out / "seal-full" / "seed0" / "model" / "config.json").exists()
    assert (out / "seal-full" / "seed0" / "metrics.jsonl").read_text().count('"kind": "rollout"') == rounds_before


def test_a_study_goes_on_from_its_records_on_a_machine_that_kept_nothing_else(study, tmp_path):
    """A new machine holds the repository (the committed records) and no run directory: recorded runs are
    neither trained nor tested again, ``--max-runs 0`` starts none of the others, and the tables made from
    the records are the tables made from the runs."""
    import shutil

    design, out, _ = study
    records = tmp_path / "records"
    shutil.copytree(out.parent / "out-records", records)
    whole = json.loads((out / "summary.json").read_text())
    (records / "seal-full-seed0.json").rename(tmp_path / "seal-full-seed0.json")  # a run no session has finished
    part = _run(design, tmp_path / "new", "--max-runs", "0", records=records)
    assert part.returncode == 0, part.stdout[-3000:] + part.stderr[-3000:]
    assert not (tmp_path / "new" / "vanilla-grpo").exists() and not (tmp_path / "new" / "seal-full").exists()
    summary = json.loads((tmp_path / "new" / "interim" / "summary.json").read_text())  # runs left to train: interim
    assert summary["interim"] is True and list(summary["arms"]) == ["vanilla-grpo"]
    assert summary["arms"]["vanilla-grpo"]["seeds"] == whole["arms"]["vanilla-grpo"]["seeds"]
    assert summary["arms"]["vanilla-grpo"]["test_final"] == whole["arms"]["vanilla-grpo"]["test_final"]
    (tmp_path / "seal-full-seed0.json").rename(records / "seal-full-seed0.json")
    done = _run(design, tmp_path / "new", records=records)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    again = json.loads((tmp_path / "new" / "summary.json").read_text())
    assert again["interim"] is False and again["arms"] == whole["arms"]  # comparisons, intervals, round 0 included
    assert not (tmp_path / "new" / "vanilla-grpo").exists() and not (tmp_path / "new" / "test").exists()
    (records / "seal-full-seed0.json").write_text('{"arm": "seal-full", "se')  # torn, as a copy cut short leaves it
    torn = _run(design, tmp_path / "new", records=records)
    assert torn.returncode != 0 and "not a study record" in torn.stderr and "Traceback" not in torn.stderr
    other = json.loads((out.parent / "out-records" / "seal-full-seed0.json").read_text())
    (records / "seal-full-seed0.json").write_text(json.dumps({**other, "rounds": 6}))  # another design's run
    longer = _run(design, tmp_path / "new", records=records)
    assert longer.returncode != 0 and "asks for 2" in longer.stderr and "Traceback" not in longer.stderr


def test_the_smoke_fails_without_advantages_and_passes_with_them(study, tmp_path):
    design, _, _ = study
    flat = _run(design, tmp_path / "flat", "--smoke")  # the untrained tiny model earns no reward: every advantage is 0
    assert flat.returncode == 1 and "every advantage is zero" in flat.stdout, flat.stdout[-2000:] + flat.stderr[-2000:]
    # scripted rollouts (half the ground truth, half plain text) give every group a reward spread
    moving = _run(design, tmp_path / "moving", "--smoke", "--set", "generator=tests.generators:oracle_or_plain",
                  "--set", "rollout_scheduler=auto")  # scripted generations answer whole batches: lockstep
    assert moving.returncode == 0, moving.stdout[-2000:] + moving.stderr[-2000:]
    assert "rollouts of" in moving.stdout and "carry a non-zero advantage" in moving.stdout
    assert not (tmp_path / "moving" / "vanilla-grpo").exists()  # the smoke is the SEAL arm alone


def test_the_pilot_plays_one_round_of_every_arm_and_fails_an_arm_without_signal(study, tmp_path):
    """``--pilot``: every arm's first seed for one round, nothing measured; the untrained tiny model
    earns no reward (every arm below the bar: exit 1); scripted rollouts with a reward spread pass."""
    design, _, _ = study
    flat = _run(design, tmp_path / "flat", "--pilot")
    assert flat.returncode == 1 and "change the setting" in flat.stdout, flat.stdout[-2000:] + flat.stderr[-2000:]
    verdict = json.loads((tmp_path / "flat" / "pilot.json").read_text())
    assert verdict["weak"] == verdict["main"] == ["vanilla-grpo", "seal-full"]  # one seed each: both are the main comparison
    assert verdict["arms"]["seal-full"]["nonzero_advantage_groups"] == 0.0
    moving = _run(design, tmp_path / "moving", "--pilot", "--set", "generator=tests.generators:oracle_or_plain",
                  "--set", "rollout_scheduler=auto", "--set", "budgets.max_completion_tokens=4096")  # the oracle's whole episodes
    assert moving.returncode == 0, moving.stdout[-2000:] + moving.stderr[-2000:]
    verdict = json.loads((tmp_path / "moving" / "pilot.json").read_text())
    assert verdict["weak"] == [] and all(a["nonzero_advantage_groups"] >= 0.5 for a in verdict["arms"].values())
    for arm in ("vanilla-grpo", "seal-full"):
        metrics = (tmp_path / "moving" / arm / "seed0" / "metrics.jsonl").read_text()
        assert metrics.count('"kind": "rollout"') == 1 and '"kind": "validation"' not in metrics  # one round, nothing measured
    assert not (tmp_path / "moving" / "test").exists()


def test_the_report_reads_a_study_in_progress_and_trains_nothing(study, tmp_path):
    """``--report``: a study stopped with one arm at round 1 of 2 and the other not started gives the
    tables of what is there (in ``interim/``), each run at the round it reached, and starts nothing."""
    import shutil

    design, finished, _ = study
    out = tmp_path / "out"
    shutil.copytree(finished / "vanilla-grpo", out / "vanilla-grpo")
    metrics = out / "vanilla-grpo" / "seed0" / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if json.loads(line).get("round", 0) <= 1]
    metrics.write_text("\n".join(kept) + "\n" + '{"round": 2, "kind": "rollo')  # and a torn line, as a kill leaves it
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    done = _run(design, out, "--report")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "interim" / "summary.json").read_text())
    assert summary["interim"] is True and list(summary["arms"]) == ["vanilla-grpo"]  # seal-full never started
    (seed,) = summary["arms"]["vanilla-grpo"]["seeds"]
    assert seed["held_out_rounds"] == [0, 1] and len(seed["rollout_success"]) == 1
    assert "test_final" not in summary["arms"]["vanilla-grpo"]
    table = (out / "interim" / "table.md").read_text()
    assert table.startswith("Interim") and "| vanilla-grpo | 0 | 1 |" in table  # arm, seeds, rounds validated
    after = sorted(str(p.relative_to(out)) for p in out.rglob("*") if "interim" not in p.parts)
    assert after == before  # no warm start, no training, no test evaluation
    empty = _run(design, tmp_path / "empty", "--report")
    assert empty.returncode != 0 and "nothing to report" in empty.stderr and "Traceback" not in empty.stderr


def test_the_turn_breakdown_counts_first_and_later_turns_officially_and_turn_locally(tmp_path, task_set):
    """Round 1 of a run holds two real episodes of multi_turn_base_0 (4 turns, each with a ground
    truth): the ground truth, and the ground truth with turn 0 answered in text. The first passes all 4
    turns; the second none officially (its later turns inherit the missing mkdir/mv), but its 3 later
    turns make the right calls where the model stood."""
    from benchmarks.bench_real_study import sampled_episodes, turn_breakdown

    env, task = BfclEnv(EnvConfig()), task_set.get("multi_turn_base_0")
    truth = ground_truth_steps(ground_truth_calls(task))
    records = [{"round": 1, **play_steps(env, task, steps).record()} for steps in (truth, [[], *truth[1:]])]
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"round": 2, "ta')
    assert turn_breakdown(sampled_episodes(tmp_path), task_set) == [
        {"first_reached": 2, "first_passed": 1, "later_reached": 6, "later_passed": 3, "later_local": 6}]  # the torn round 2 is left out


def test_tool_calls_counts_each_rounds_accepted_calls_by_tool(tmp_path, task_set):
    """Round 1 plays multi_turn_base_0's ground truth; round 2 the same with turn 0 answered in text
    and one call to a tool the task does not have (rejected, so not counted)."""
    from collections import Counter

    from benchmarks.bench_real_study import held_out_tool_calls, sampled_episodes, tool_calls
    from seal_rl.tools import ToolCall

    env, task = BfclEnv(EnvConfig()), task_set.get("multi_turn_base_0")
    truth = ground_truth_calls(task)
    steps = ground_truth_steps(truth)
    records = [{"round": 1, **play_steps(env, task, steps).record()},
               {"round": 2, **play_steps(env, task, [[], *steps[1:-1], [[ToolCall("no_such_tool", {})], *steps[-1]]]).record()}]  # fmt: skip
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    expected = [dict(Counter(c.name for turn in truth for c in turn)), dict(Counter(c.name for turn in truth[1:] for c in turn))]
    assert tool_calls(sampled_episodes(tmp_path), task_set) == expected
    (tmp_path / "validation").mkdir()
    for r, record in enumerate(records, start=1):  # the held-out episodes: one file per validated round
        (tmp_path / "validation" / f"round_{r}.jsonl").write_text(json.dumps(record) + "\n")
    assert held_out_tool_calls(tmp_path, [2, 1, 3], task_set) == [expected[1], expected[0], {}]  # round 3: not written yet


def test_a_failed_run_stops_the_study_with_its_command(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("interface: {preset: nonsense}\n")
    design = tmp_path / "study.json"
    design.write_text(json.dumps({
        "recipe": "smoke-cpu", "rounds": 1, "held_out": HELD_OUT[:1],
        "arms": {"broken": {"recipe": str(broken), "seeds": [0]}, "vanilla-grpo": {"recipe": "vanilla-grpo", "seeds": [0]}},
        "test": {"per_category": 1, "max_new_tokens": 8, "arms": []},
    }))  # fmt: skip
    done = _run(design, tmp_path / "out")
    assert done.returncode != 0 and "`seal train --config smoke-cpu …` exited 2" in done.stderr + done.stdout
    assert "Unknown interface preset" in done.stderr + done.stdout
    assert not (tmp_path / "out" / "vanilla-grpo").exists()  # the queued run never started


def test_the_start_fingerprint_is_the_sha256_of_the_weights_in_name_order(tmp_path):
    """A record names the warm start it came from by its weights: two shards hash as one stream in name
    order (so a reshuffled or changed shard gives another fingerprint); a model given by name has none."""
    import hashlib

    from benchmarks.bench_real_study import weights_sha256

    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"second" * 1000)
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"first" * 1000)
    (tmp_path / "config.json").write_text("{}")  # not weights: left out
    assert weights_sha256(tmp_path) == hashlib.sha256(b"first" * 1000 + b"second" * 1000).hexdigest()
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"second" * 999 + b"SECOND")
    assert weights_sha256(tmp_path) != hashlib.sha256(b"first" * 1000 + b"second" * 1000).hexdigest()
    assert weights_sha256(tmp_path / "smollm2-135m-instruct") is None and weights_sha256(Path("tiny")) is None
