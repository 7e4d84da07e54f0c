"""``seal study`` on an environment family (docs/guides/preflight-and-studies.md, docs/guides/your-environment.md): a tiny real study of
2 arms x 1 seed x 2 rounds on ``examples/families/inventory.py`` trains both arms, validates them on
the family's held-out tasks under the seal protocol, tests them with ``seal eval --family`` (the
family's verifier scores every test episode), records them and writes a page that says what scored
them; ``--plan`` checks a family study without running it; a task the family lacks is one line, exit
2, and nothing starts; a τ² study loads τ² once and tests through ``--family tau2-mock --family-set``."""

import json
from pathlib import Path

import pytest

from tests.test_study import ROOT, _seal

FAMILY = "examples/families/inventory.py:Inventory"
TRAINED = ["inventory_1", "inventory_3", "inventory_4", "inventory_7"]
HELD_OUT = ["inventory_2", "inventory_6"]
ARMS = ["vanilla-grpo", "seal-full"]
FAMILY_SETS = ("--set", f"family={FAMILY}", "--set", f"data.task_ids={json.dumps(TRAINED)}")


def _design(path: Path, **changes) -> Path:
    design = {"recipe": "smoke-cpu", "rounds": 2, "held_out": list(HELD_OUT),
              "arms": {"vanilla-grpo": {"recipe": "vanilla-grpo", "seeds": [0]},
                       "seal-full": {"recipe": "seal-full", "seeds": [0], "set": ["interface.min_count=3"]}},
              "test": {"per_category": 1, "max_new_tokens": 8, "arms": list(ARMS)}, **changes}  # fmt: skip
    path.write_text(json.dumps(design))
    return path


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-study")
    out = root / "out"
    done = _seal("study", str(_design(root / "study.json")), "--out", str(out), "--records", str(root / "records"),
                 *FAMILY_SETS, "--set", "budgets.max_new_tokens=8", "--jobs", "2")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, root / "records", done.stdout


def test_a_family_study_trains_validates_tests_and_records_every_arm_on_the_family(study):
    out, records, stdout = study
    summary = json.loads((out / "summary.json").read_text())
    assert summary["family"] == FAMILY and list(summary["arms"]) == ARMS and summary["held_out"] == HELD_OUT
    test_ids = ["inventory_0", "inventory_5", "inventory_10", "inventory_15"]  # the first test-split task of each category
    assert summary["tests"] == test_ids and summary["interim"] is False
    for arm in ARMS:
        config = (out / arm / "seed0" / "config.yaml").read_text()
        assert f"family: {FAMILY}" in config and "protocol: seal" in config and "protocol: bfcl" not in config
        seed = summary["arms"][arm]["seeds"][0]
        assert len(seed["held_out_success"]) == 3 and all(set(tasks) == set(HELD_OUT) for tasks in seed["held_out_tasks"])
        # one conversation, one check: every sampled episode is a first turn, none has a later one
        assert [t["first_reached"] for t in seed["turns"]] == [8, 8] and all(t["later_reached"] == 0 for t in seed["turns"])
        results = [json.loads(line) for line in (out / "test" / f"{arm}-seed0" / "results.jsonl").read_text().splitlines()]
        assert [r["task_id"] for r in results] == test_ids
        for r in results:  # scored by Inventory.verify: its own evidence, its family's name
            assert r["family"] == "inventory" and r["verdict"]["evidence"] == {"kind": r["category"]}
            assert r["reward"] in (0.0, 1.0) and r["diagnosis"]["labels"]
        assert json.loads((out / "test" / f"{arm}-seed0" / "config.json").read_text())["env"]["protocol"] == "seal"
        record = json.loads((records / f"{arm}-seed0.json").read_text())
        assert [t["task_id"] for t in record["test"]] == test_ids and record["entry"]["turns"] == seed["turns"]
        assert summary["arms"][arm]["test_final"]["turns"] == 4  # a turn per conversation
    assert sorted(p.name for p in records.iterdir()) == ["seal-full-seed0.json", "vanilla-grpo-seed0.json"]
    assert summary["arms"]["seal-full"]["test_vs_vanilla"]["pairs"] == 4
    table = (out / "table.md").read_text()
    assert f"family {FAMILY}" in table and "scored by the family's verifier" in table
    assert "bfcl" not in table and "turn pass" not in table and "Conversations of the sampled episodes" in table
    page = (out / "report.html").read_text()
    assert FAMILY in page and "family&#x27;s verifier" in page and page.count("<table>") == 4
    assert "scored by the family's verifier" in stdout


def test_a_family_study_resumes_from_its_records_without_training_or_testing(study, tmp_path):
    out, records, _ = study
    again = _seal("study", str(_design(tmp_path / "study.json")), "--out", str(tmp_path / "again"), "--records", str(records),
                  *FAMILY_SETS, "--max-runs", "0")  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (tmp_path / "again" / "table.md").read_text() == (out / "table.md").read_text()
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == ["curves.png", "report.html", "summary.json", "table.md"]
    assert json.loads((records / "seal-full-seed0.json").read_text())["family"] == FAMILY
    bfcl = _seal("study", str(_design(tmp_path / "bfcl.json", held_out=["multi_turn_base_118"])), "--out", str(tmp_path / "bfcl"),
                 "--records", str(records), "--max-runs", "0")  # fmt: skip
    assert bfcl.returncode == 2 and f"a run on family {FAMILY}, but" in bfcl.stderr, bfcl.stderr[-2000:]  # not read as BFCL runs


def test_the_plan_of_a_family_study_checks_it_against_the_family_and_runs_nothing(monkeypatch, capsys, tmp_path):
    from tests.test_cli import run_cli

    design = _design(tmp_path / "study.json", plan={"model": "preset:qwen2.5-0.5b", "gpus": 1, "gpu_memory": 80})
    code, text, err = run_cli(monkeypatch, capsys, "study", str(design), "--plan", *FAMILY_SETS)
    assert code == 0, text + err
    assert text.count("2 x 1") == 2 and "study: 0 GPU-hours" in text  # a row per arm: 2 rounds x 1 seed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.json"]


BAD = {  # what the family lacks -> (the change to the design, what the line must say)
    "held-out id": ({"held_out": ["inventory_2", "inventory_99"]}, f"held_out: family {FAMILY} has no task 'inventory_99'"),
    "test id": ({"test": {"tasks": ["no_such"], "max_new_tokens": 8, "arms": []}}, f"test: family {FAMILY} has no task 'no_such'"),
    "held-out trained on": ({"held_out": ["inventory_3"]}, "held-out task inventory_3 is also trained on"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_task_the_family_lacks_is_one_line_and_nothing_starts(case, monkeypatch, capsys, tmp_path):
    from tests.test_cli import run_cli

    changes, message = BAD[case]
    path = _design(tmp_path / "study.json", **changes)
    code, stdout, stderr = run_cli(monkeypatch, capsys, "study", str(path), "--out", str(tmp_path / "out"), *FAMILY_SETS)
    assert code == 2, (stdout, stderr)
    assert message in stderr and str(path) in stderr, stderr
    assert stderr.startswith("error:") and stderr.strip().count("\n") == 0 and "Traceback" not in stderr, stderr
    assert not (tmp_path / "out").exists()


def test_a_tau2_study_loads_tau2_once_and_tests_through_its_family(monkeypatch, tmp_path):
    """The design check of a τ² study loads τ² once (the runs reuse it); mock has no test split, so
    per_category is refused in one line; the test evaluation is ``seal eval --family tau2-mock`` with
    the recipe's settings and message cap."""
    import seal_rl.environments as environments
    from seal_rl.errors import SealError
    from seal_rl.study import design as study_design
    from seal_rl.study import load_study, runner
    from seal_rl.train import load_recipe

    loads = []
    real = environments.load_family
    monkeypatch.setattr(environments, "load_family", lambda *a, **k: loads.append(a) or real(*a, **k))
    study_design._loaded_family.cache_clear()
    recipe = str(ROOT / "configs" / "tau2-mock-cpu.yaml")
    held = ["update_task_1"]
    tests = {"tasks": ["update_task_with_initialization_actions"], "max_new_tokens": 32, "arms": ["vanilla-grpo"]}
    design = load_study(_design(tmp_path / "tau2.json", recipe=recipe, held_out=held, test=tests))
    family, task_set = study_design.study_tasks(load_recipe(recipe, design["overrides"]))
    assert loads == [("tau2-mock",)] and family.name.startswith("tau2") and "update_task_1" in task_set
    assert "eval.protocol=seal" in study_design.run_overrides(design, recipe, [])
    with pytest.raises(SealError, match="family tau2-mock has no test-split task for per_category"):
        load_study(_design(tmp_path / "per.json", recipe=recipe, held_out=held, test={"per_category": 1, "max_new_tokens": 8, "arms": []}))
    with pytest.raises(SealError, match="held_out: family tau2-mock has no task 'update_task_99'"):
        load_study(_design(tmp_path / "bad.json", recipe=recipe, held_out=["update_task_99"], test=tests))
    assert loads == [("tau2-mock",)]  # the same settings: the family loaded once in this process
    commands = []
    monkeypatch.setattr(runner, "seal", lambda *args, **_: commands.append(args))
    runner.test_run(tmp_path / "model", tmp_path / "test", ["update_task_1"], recipe, [], 32)
    command = commands[0]
    assert command[command.index("--family") + 1] == "tau2-mock" and command[command.index("--family-set") + 1] == "solo=true"
    assert command[command.index("--max-model-calls") + 1] == "2" and "--protocol" not in command
    study_design._loaded_family.cache_clear()  # the next test's load_family is the real one
