"""``seal study`` (src/seal_rl/study/, docs/guides/preflight-and-studies.md) on the tiny model: a study of 2 arms x 2 seeds x 2
rounds trains every arm, measures it on held-out and test tasks and writes the table and the page; a
stopped study resumes without redoing finished runs and goes on from its records; ``--report`` reads a
study in progress; a bad study file is one line and starts nothing; the second CPU study's committed
records give its tables back byte for byte. The real-model studies are ``make bench-real-study`` and
``make bench-study-tradingbot``; the smoke on SmolLM2 is ``make bench-real-study-smoke`` (out of CI since
issue 57: too slow on an AVX2-only CPU)."""

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
SEEDS = [0, 1]


def _study(path: Path, seeds: list[int] = SEEDS) -> Path:
    path.write_text(json.dumps({
        "recipe": "smoke-cpu", "rounds": 2, "held_out": HELD_OUT,
        "arms": {"vanilla-grpo": {"recipe": "vanilla-grpo", "seeds": seeds},
                 "seal-full": {"recipe": "seal-full", "seeds": seeds, "set": ["interface.min_count=3"]}},
        "test": {"per_category": 1, "max_new_tokens": 8, "arms": ["vanilla-grpo", "seal-full"]},
    }))  # fmt: skip
    return path


def _seal(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """``seal ARGS`` in a child process (as a user runs it)."""
    return subprocess.run([sys.executable, "-m", "seal_rl", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _run(study: Path, out: Path, *extra: str, records: Path | None = None) -> subprocess.CompletedProcess:
    """``seal study`` on ``study``; its records beside ``out`` (never in the repository's benchmarks/results)."""
    return _seal("study", str(study), "--out", str(out), "--records", str(records or out.parent / f"{out.name}-records"),
                 "--set", "budgets.max_new_tokens=8", *extra)  # fmt: skip


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    design = _study(root / "study.json")
    done = _run(design, root / "out", "--jobs", "2")  # both arms at once, a core each
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return design, root / "out", done.stdout


def test_every_arm_is_trained_and_measured_on_held_out_and_test_tasks(study):
    """The tiny study (2 arms x 2 seeds x 2 rounds): every run validated each round on the held-out
    tasks and tested at the end; the table and the page written with every run's rows in them."""
    _, out, stdout = study
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["arms"]) == ["vanilla-grpo", "seal-full"] and summary["held_out"] == HELD_OUT
    assert summary["interim"] is False
    for arm, entry in summary["arms"].items():
        assert [s["seed"] for s in entry["seeds"]] == SEEDS
        for seed in entry["seeds"]:
            for key in ("held_out_success", "held_out_call_share", "held_out_tools"):
                assert len(seed[key]) == 3  # round 0 (the start) + 2 rounds
            assert len(seed["rollout_success"]) == len(seed["nonzero_advantage_groups"]) == len(seed["turns"]) == 2
            assert all(set(tasks) == set(HELD_OUT) for tasks in seed["held_out_tasks"])
        assert entry["test_final"]["turns"] > 0 and entry["test_final"]["messages"] > 0
        assert entry["held_out_final"][1] <= entry["held_out_final"][0] <= entry["held_out_final"][2]  # Wilson interval around the rate
        for seed in SEEDS:
            config = (out / arm / f"seed{seed}" / "config.yaml").read_text()
            assert "protocol: bfcl" in config and "multi_turn_base_118" in config  # measured under bfcl, on the held-out tasks
            assert ("min_count: 3" in config) == (arm == "seal-full")  # an arm's own `set` reaches its runs, and only them
            assert f"seed: {seed}\n" in config  # each run its own seed
            results = (out / "test" / f"{arm}-seed{seed}" / "results.jsonl").read_text().splitlines()
            assert len(results) == 4 and all(json.loads(r)["category"] for r in results)  # one test task per category
    validated = [[json.loads(line)["round"] for line in (out / arm / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()
                  if '"kind": "validation"' in line] for seed in SEEDS for arm in summary["arms"]]  # fmt: skip
    assert validated == [[0, 1, 2], [1, 2], [1, 2], [1, 2]]  # the shared start is measured once, by the first run
    assert summary["warm_start"]["held_out"]["success"] == summary["arms"]["seal-full"]["seeds"][1]["held_out_success"][0]
    assert all(s["interface"] == [[], []] for s in summary["arms"]["vanilla-grpo"]["seeds"])  # vanilla sees no interface
    assert any(s["interface"] != [[], []] for s in summary["arms"]["seal-full"]["seeds"])  # the label-driven one reacts
    versus = summary["arms"]["seal-full"]["test_vs_vanilla"]
    assert versus["pairs"] == 8 and 0.0 <= versus["p_mcnemar"] <= 1.0  # 4 test tasks x 2 seeds, paired with the baseline's
    assert "test_vs_vanilla" not in summary["arms"]["vanilla-grpo"]  # the baseline is not compared with itself
    assert "By round" in stdout and "Outcomes" in stdout
    table = (out / "table.md").read_text()
    assert "| rollout turns passed |" in table  # the dense measure, beside the binary one
    assert "| vanilla-grpo | 0,1 | 2,2 |" in table and "| seal-full | 0,1 | 2,2 |" in table  # arm, seeds, rounds validated
    outcome = next(line for line in table.split("**Outcomes (pooled over seeds)**")[1].splitlines() if line.startswith("| seal-full"))
    final = summary["arms"]["seal-full"]["held_out_final"]
    assert f"{final[0]:.2f} ({final[1]:.2f}–{final[2]:.2f})" in outcome and f"p={versus['p_mcnemar']:.2f}" in outcome
    each_run = table.split("**Each run, by round**")[1].strip().splitlines()[2:]
    assert len(each_run) == 8  # 4 runs x 2 rounds
    for line in each_run:
        arm, seed, r, *cells = [c.strip() for c in line.strip("|").split("|")]
        entry = summary["arms"][arm]["seeds"][SEEDS.index(int(seed))]
        k = entry["held_out_rounds"].index(int(r))
        assert cells[4] == str(sum(entry["tools"][int(r) - 1].values()))  # accepted calls of the round's rollouts
        assert cells[5] == f"{sum(v == 1.0 for v in entry['held_out_tasks'][k].values())}/2"  # that round's held-out check
    assert "Writing model shards" not in stdout and (out / "seal-full" / "seed0.log").stat().st_size > 0  # each run's output in its log
    records = out.parent / "out-records"
    assert sorted(p.name for p in records.iterdir()) == sorted(f"{arm}-seed{seed}.json" for arm in summary["arms"] for seed in SEEDS)
    vanilla = json.loads((records / "vanilla-grpo-seed0.json").read_text())  # a tiny start: no warm start to test
    assert vanilla["entry"] == summary["arms"]["vanilla-grpo"]["seeds"][0] and len(vanilla["test"]) == 4
    later = json.loads((records / "vanilla-grpo-seed1.json").read_text())  # the shared start's round 0 is the first run's
    assert later["entry"]["held_out_rounds"] == [1, 2] and summary["arms"]["vanilla-grpo"]["seeds"][1]["held_out_rounds"] == [0, 1, 2]
    assert vanilla["start"] == {"model": "tiny", "warm_start": False, "sha256": None} and vanilla["costs"]["vanilla-grpo/seed0/train"] > 0
    page = (out / "report.html").read_text()
    assert page.count("<table>") == 4 and "data:image/png;base64," in page and (out / "curves.png").stat().st_size > 10_000
    assert "<td>seal-full</td><td>0,1</td><td>2,2</td>" in page  # the table's rows, in the page


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
    for seed in SEEDS:  # runs no session has finished
        (records / f"seal-full-seed{seed}.json").rename(tmp_path / f"seal-full-seed{seed}.json")
    part = _run(design, tmp_path / "new", "--max-runs", "0", records=records)
    assert part.returncode == 0, part.stdout[-3000:] + part.stderr[-3000:]
    assert not (tmp_path / "new" / "vanilla-grpo").exists() and not (tmp_path / "new" / "seal-full").exists()
    summary = json.loads((tmp_path / "new" / "interim" / "summary.json").read_text())  # runs left to train: interim
    assert summary["interim"] is True and list(summary["arms"]) == ["vanilla-grpo"]
    assert summary["arms"]["vanilla-grpo"]["seeds"] == whole["arms"]["vanilla-grpo"]["seeds"]
    assert summary["arms"]["vanilla-grpo"]["test_final"] == whole["arms"]["vanilla-grpo"]["test_final"]
    for seed in SEEDS:
        (tmp_path / f"seal-full-seed{seed}.json").rename(records / f"seal-full-seed{seed}.json")
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


def _smoke(design: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The benchmark's smoke (benchmarks/bench_real_study.py, through ``seal study``) on ``design``."""
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_real_study.py"), "--study", str(design), "--out", str(out),
               "--set", "budgets.max_new_tokens=8", *extra]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_the_smoke_fails_without_advantages_and_passes_with_them(study, tmp_path):
    design, _, _ = study
    flat = _smoke(design, tmp_path / "flat")  # the untrained tiny model earns no reward: every advantage is 0
    assert flat.returncode == 1 and "every advantage is zero" in flat.stdout, flat.stdout[-2000:] + flat.stderr[-2000:]
    # scripted rollouts (half the ground truth, half plain text) give every group a reward spread
    moving = _smoke(design, tmp_path / "moving", "--set", "generator=tests.generators:oracle_or_plain",
                    "--set", "rollout_scheduler=auto")  # scripted generations answer whole batches: lockstep
    assert moving.returncode == 0, moving.stdout[-2000:] + moving.stderr[-2000:]
    assert "rollouts of" in moving.stdout and "carry a non-zero advantage" in moving.stdout
    assert not (tmp_path / "moving" / "vanilla-grpo").exists() and not (tmp_path / "moving" / "seal-full" / "seed1").exists()  # SEAL, seed 0


def test_the_pilot_runs_preflight_on_every_arm_and_fails_a_main_arm_without_spread(study, tmp_path):
    """``--pilot``: ``seal preflight`` on one round of every arm's first seed, no update, nothing measured;
    the untrained tiny model earns no reward, so no group has a spread: every arm is weak, exit 1."""
    design, _, _ = study
    flat = _run(design, tmp_path / "flat", "--pilot")
    assert flat.returncode == 1 and "change the setting" in flat.stdout, flat.stdout[-2000:] + flat.stderr[-2000:]
    verdict = json.loads((tmp_path / "flat" / "pilot.json").read_text())
    assert verdict["weak"] == verdict["main"] == ["vanilla-grpo", "seal-full"]  # two seeds each: both are the main comparison
    for arm in ("vanilla-grpo", "seal-full"):
        assert verdict["arms"][arm]["nonzero_advantage_groups"] == 0.0 and verdict["arms"][arm]["verdict"] == "fail"
        spread = next(c for c in verdict["arms"][arm]["checks"] if c["name"] == "reward spread")
        assert spread["verdict"] == "fail" and "0 of 4 groups" in spread["number"]  # smoke-cpu: 4 tasks a round
        preflight = json.loads((tmp_path / "flat" / arm / "preflight.json").read_text())
        assert preflight["seed"] == 0 and preflight["verdict"] == "fail"
        assert not (tmp_path / "flat" / arm / "metrics.jsonl").exists()  # played, not trained
    assert not (tmp_path / "flat" / "test").exists()


def test_the_pilot_verdict_fails_only_a_main_arm_below_the_bar(tmp_path):
    """On hand-made preflight reports: a main arm at the bar passes, an arm outside the main comparison
    below it is reported but does not fail the pilot, a main arm below it (or with a failed check) does."""
    from rich.console import Console

    from seal_rl.study import PILOT_SIGNAL, pilot_verdict

    def report(share: float, verdict: str = "ok") -> dict:
        return {"verdict": verdict, "checks": [{"name": "reward spread", "verdict": verdict, "number": "", "advice": ""}],
                "reward": "binary", "credit": "episode", "nonzero_advantage_groups": share}  # fmt: skip

    quiet = Console(file=open(tmp_path / "console.txt", "w"))
    reports = {"vanilla": report(PILOT_SIGNAL), "seal": report(0.75), "ablation": report(0.25, "warn")}
    assert pilot_verdict(reports, ["vanilla", "seal"], tmp_path / "a", quiet) == 0
    assert json.loads((tmp_path / "a" / "pilot.json").read_text())["weak"] == ["ablation"]
    assert pilot_verdict({**reports, "seal": report(0.25, "warn")}, ["vanilla", "seal"], tmp_path / "b", quiet) == 1
    assert pilot_verdict({**reports, "seal": report(0.75, "fail")}, ["vanilla", "seal"], tmp_path / "c", quiet) == 1  # e.g. it does not fit


def test_seal_report_writes_a_study_directory_s_page_again(study, tmp_path):
    """``seal report OUT`` on a study's directory writes its page from summary.json: the same tables."""
    import shutil

    _, out, _ = study
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(out / "summary.json", copy / "summary.json")
    done = _seal("report", str(copy))
    assert done.returncode == 0, done.stderr[-2000:]
    page, before = (copy / "report.html").read_text(), (out / "report.html").read_text()
    assert page.split("<p><img")[0] == before.split("<p><img")[0] and "data:image/png;base64," in page
    assert (copy / "table.md").read_text() == (out / "table.md").read_text()


def test_the_report_reads_a_study_in_progress_and_trains_nothing(study, tmp_path):
    """``--report``: a study stopped with one arm at round 1 of 2 and the other not started gives the
    tables of what is there (in ``interim/``), each run at the round it reached, and starts nothing."""
    import shutil

    design, finished, _ = study
    out = tmp_path / "out"
    shutil.copytree(finished / "vanilla-grpo" / "seed0", out / "vanilla-grpo" / "seed0")  # seed 1 not started
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
    from seal_rl.study.records import sampled_episodes, turn_breakdown

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

    from seal_rl.study.records import held_out_tool_calls, sampled_episodes, tool_calls
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
    """A run that fails once started (its recipe is sound; its generator cannot be imported) stops the
    study with the command that failed, and the queued run never starts."""
    design = tmp_path / "study.json"
    design.write_text(json.dumps({
        "recipe": "smoke-cpu", "rounds": 1, "held_out": HELD_OUT[:1],
        "arms": {"broken": {"recipe": "vanilla-grpo", "seeds": [0], "set": ["generator=tests.generators:no_such_generator"]},
                 "vanilla-grpo": {"recipe": "vanilla-grpo", "seeds": [0]}},
        "test": {"per_category": 1, "max_new_tokens": 8, "arms": []},
    }))  # fmt: skip
    done = _run(design, tmp_path / "out")
    assert done.returncode == 2 and "`seal train --config smoke-cpu …` exited" in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    assert "no_such_generator" in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "vanilla-grpo").exists()  # the queued run never started


def test_the_start_fingerprint_is_the_sha256_of_the_weights_in_name_order(tmp_path):
    """A record names the warm start it came from by its weights: two shards hash as one stream in name
    order (so a reshuffled or changed shard gives another fingerprint); a model given by name has none."""
    import hashlib

    from seal_rl.study.records import weights_sha256

    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"second" * 1000)
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"first" * 1000)
    (tmp_path / "config.json").write_text("{}")  # not weights: left out
    assert weights_sha256(tmp_path) == hashlib.sha256(b"first" * 1000 + b"second" * 1000).hexdigest()
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"second" * 999 + b"SECOND")
    assert weights_sha256(tmp_path) != hashlib.sha256(b"first" * 1000 + b"second" * 1000).hexdigest()
    assert weights_sha256(tmp_path / "smollm2-135m-instruct") is None and weights_sha256(Path("tiny")) is None


# -- a bad study file: one line, and nothing starts -----------------------------------------------


def _valid() -> dict:
    return {"recipe": "smoke-cpu", "rounds": 2, "held_out": list(HELD_OUT),
            "arms": {"vanilla-grpo": {"recipe": "vanilla-grpo", "seeds": [0, 1]},
                     "seal-full": {"recipe": "seal-full", "seeds": [0, 1], "set": ["interface.min_count=3"]}},
            "test": {"per_category": 1, "max_new_tokens": 8, "arms": ["vanilla-grpo"]}}  # fmt: skip


def _with(change) -> dict:
    design = _valid()
    change(design)
    return design


BAD = {  # what is wrong -> (the design, what the line must say)
    "unknown key": (_with(lambda d: d.update(round=3)), "unknown key 'round'"),
    "unknown arm key": (_with(lambda d: d["arms"]["seal-full"].update(seed=[0])), "unknown key 'arms.seal-full.seed'"),
    "unknown test key": (_with(lambda d: d["test"].update(engines="hf")), "unknown key 'test.engines'"),
    "unknown baseline arm": (_with(lambda d: d.update(baseline="grpo")), "unknown arm 'grpo' as baseline"),
    "unknown tested arm": (_with(lambda d: d["test"].update(arms=["seal"])), "unknown arm 'seal' in test.arms"),
    "unknown arm recipe": (_with(lambda d: d["arms"]["seal-full"].update(recipe="seal-fulll")),
                           "arm 'seal-full': Recipe seal-fulll is neither a file nor a shipped recipe"),
    "unknown study recipe": (_with(lambda d: d.update(recipe="smoke")), "recipe 'smoke': Recipe smoke is neither a file"),
    "unknown recipe key in set": (_with(lambda d: d["arms"]["seal-full"].update(set=["interface.min_cout=3"])),
                                  "arm 'seal-full': "),
    "unknown held-out task": (_with(lambda d: d["held_out"].append("multi_turn_base_9999")), "held_out: Unknown task id 'multi_turn_base_9999'"),
    "unknown test task": (_with(lambda d: d["test"].update(tasks=["multi_turn_base_9999"])), "test: Unknown task id 'multi_turn_base_9999'"),
    "seeds as strings": (_with(lambda d: d["arms"]["vanilla-grpo"].update(seeds=["0", "1"])),
                         "arm 'vanilla-grpo': seeds must be a list of integers, got ['0', '1']"),
    "a fractional seed": (_with(lambda d: d["arms"]["vanilla-grpo"].update(seeds=[0, 1.5])), "seeds must be a list of integers"),
    "seeds not a list": (_with(lambda d: d["arms"]["vanilla-grpo"].update(seeds=3)), "seeds must be a list of integers, got 3"),
    "held-out task trained on": (_with(lambda d: d["held_out"].append("multi_turn_base_105")),  # smoke-cpu trains on it
                                 "held-out task multi_turn_base_105 is also trained on"),
    "rounds not a number": (_with(lambda d: d.update(rounds="two")), "rounds must be a whole number of at least 1, got 'two'"),
    "missing section": (_with(lambda d: d.pop("held_out")), "missing 'held_out'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_study_file_is_one_line_naming_what_is_wrong_and_nothing_starts(case, monkeypatch, capsys, tmp_path):
    from tests.test_cli import run_cli

    design, message = BAD[case]
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(design))
    code, stdout, stderr = run_cli(monkeypatch, capsys, "study", str(path), "--out", str(tmp_path / "out"))
    assert code == 2, (stdout, stderr)
    assert message in stderr and str(path) in stderr, stderr
    assert stderr.startswith("error:") and stderr.strip().count("\n") == 0 and "Traceback" not in stderr, stderr
    assert not (tmp_path / "out").exists()  # refused before anything started


def test_an_unknown_study_names_the_shipped_ones(monkeypatch, capsys, tmp_path):
    from tests.test_cli import run_cli

    code, _, stderr = run_cli(monkeypatch, capsys, "study", "no-such-study", "--out", str(tmp_path / "out"))
    assert code == 2 and "Study no-such-study is neither a file nor a shipped study" in stderr and "study-tradingbot" in stderr
    assert stderr.strip().count("\n") == 0 and not (tmp_path / "out").exists()


# -- the shipped CPU study: its committed records give its tables back ----------------------------

REFERENCE = ROOT / "tests" / "study-tradingbot"
RECORDS = ROOT / "benchmarks" / "results" / "study-tradingbot"


def test_the_second_cpu_study_s_records_give_its_tables_back_byte_for_byte(tmp_path):
    """``seal study study-tradingbot`` from the eight committed records alone (a new --out: no run, no
    weights) writes the bytes the harness wrote before it moved into the package (tests/study-tradingbot/,
    written by benchmarks/bench_real_study.py at cce9509): the final tables, the interim ones of
    ``--report`` and the page up to its inlined curves; it trains, tests and records nothing."""
    before = {p.name: p.read_bytes() for p in RECORDS.iterdir()}
    full = _seal("study", "study-tradingbot", "--out", str(tmp_path / "full"), "--records", str(RECORDS), "--max-runs", "0", "--skip-test")
    assert full.returncode == 0, full.stdout[-2000:] + full.stderr[-2000:]
    assert (tmp_path / "full" / "table.md").read_bytes() == (REFERENCE / "table.md").read_bytes()
    page = (tmp_path / "full" / "report.html").read_text(encoding="utf-8")
    assert page[: page.index("<p><img")] + "\n" == (REFERENCE / "page.html").read_text(encoding="utf-8")
    report = _seal("study", "study-tradingbot", "--out", str(tmp_path / "report"), "--records", str(RECORDS), "--report")
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    assert (tmp_path / "report" / "interim" / "table.md").read_bytes() == (REFERENCE / "interim-table.md").read_bytes()
    assert {p.name: p.read_bytes() for p in RECORDS.iterdir()} == before  # the records are read, never rewritten
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == ["curves.png", "report.html", "summary.json", "table.md"]  # no run, no test, no record


# -- the paper's Table 1 on a GPU node: seal study --plan -------------------------------------------


def test_the_plan_of_table_1_is_seal_plan_s_for_each_arm(monkeypatch, capsys):
    """``seal study paper-table1 --plan``: each arm's memory, micro-batch and time per round are what
    ``seal plan`` prints for that arm's recipe on 8 x 80 GB, and the study's GPU-hours are theirs
    times 72 rounds x 3 seeds x 8 GPUs."""
    import re

    from seal_rl.study import load_study
    from seal_rl.study.plan import plan_arms
    from tests.test_cli import run_cli

    design = load_study("paper-table1", planning=True)
    assert list(design["arms"]) == ["vanilla-grpo", "seal", "no-interface", "no-reweighting", "static-weights"]
    assert all(spec["seeds"] == [0, 1, 2] for spec in design["arms"].values()) and design["test"]["per_category"] == 100
    plans = {p.arm: p for p in plan_arms(design, design["recipe"], design["overrides"])}
    for arm, recipe in (("vanilla-grpo", "vanilla-grpo"), ("static-weights", "static-weights")):
        code, text, _ = run_cli(monkeypatch, capsys, "plan", "--config", recipe, "--gpus", "8", "--gpu-memory", "80",
                                "--set", "model.path=preset:qwen2.5-7b")  # fmt: skip
        assert code == 0, text
        total = float(re.search(r"^\s+total\s+([\d.]+)", text, re.M).group(1))
        minutes = float(re.search(r"per round <= ([\d.]+) min", text).group(1))
        assert f"{plans[arm].memory_gib:.2f}" == f"{total:.2f}" and f"{plans[arm].seconds_per_round / 60:.1f}" == f"{minutes:.1f}"
        assert f"micro-batch {plans[arm].micro_batch}" in text and "72 rounds" in text and plans[arm].fits
    code, text, _ = run_cli(monkeypatch, capsys, "study", "paper-table1", "--plan")
    assert code == 0, text
    hours = sum(p.seconds_per_round * 72 * 3 * 8 / 3600 for p in plans.values())
    assert f"study: {hours:.0f} GPU-hours ({hours / 8:.0f} h on 8 GPUs)" in text


def test_the_plan_exits_1_naming_an_arm_that_does_not_fit(monkeypatch, capsys, tmp_path):
    from tests.test_cli import run_cli

    yaml_text = (ROOT / "src" / "seal_rl" / "studies" / "paper-table1.yaml").read_text()
    small = yaml_text.replace("gpu_memory: 80", "gpu_memory: 16").replace("gpus: 8", "gpus: 1")
    path = tmp_path / "small.yaml"
    path.write_text(small)
    code, text, _ = run_cli(monkeypatch, capsys, "study", str(path), "--plan")
    assert code == 1 and "vanilla-grpo does not fit: training needs" in text, text
