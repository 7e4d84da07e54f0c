"""Environment families (seal_rl.environments): the protocol, one-line errors for families that break
it, hostile model output through a family's episode, and the example family trained by `seal train`
with SEAL's closed loop switched on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seal_rl import jsonl
from seal_rl.env import BfclEnv
from seal_rl.environments import Environment, Family, FamilyTask, Outcome, load_family
from seal_rl.errors import SealError
from seal_rl.tools import ToolCall, get_format

from .generators import INVENTORY
from .helpers import play_family

ROOT = Path(__file__).resolve().parents[1]
HERMES = get_format("hermes")


@pytest.fixture(scope="module")
def inventory():
    return load_family(INVENTORY)


_play = play_family


def _labels(record):
    return [t["label"] for t in record["diagnosis"]["labels"]]


# -- the protocol ---------------------------------------------------------------------------------


def test_bfcl_and_family_episodes_keep_the_environment_protocol(inventory, task_set):
    bfcl = BfclEnv()
    bfcl.reset(task_set.get("multi_turn_base_0"))
    family = inventory.make_env()
    family.reset(inventory.tasks()[0])
    assert isinstance(bfcl, Environment) and isinstance(family, Environment)
    assert not isinstance(object(), Environment)


BROKEN = {
    "no_verify": ("class Broken(Family):\n    def tasks(self): return [FamilyTask('a', 'c', 'hi')]\n"
                  "    def tools(self, task): return []\n    def start(self, task): return {}\n"
                  "    def call(self, state, name, arguments): return ''\n",
                  "missing method verify (expected verify(task, state, transcript) -> Outcome)"),
    "dict_tasks": ("class Broken(Family):\n    def tasks(self): return [{'id': 'a'}]\n" + "    def tools(self, task): return []\n"
                   "    def start(self, task): return {}\n    def call(self, state, name, arguments): return ''\n"
                   "    def verify(self, task, state, transcript): return Outcome(1.0)\n",
                   "tasks() must return FamilyTask values, got dict"),
    "string_tools": ("class Broken(Family):\n    def tasks(self): return [FamilyTask('a', 'c', 'hi')]\n"
                     "    def tools(self, task): return ['move']\n    def start(self, task): return {}\n"
                     "    def call(self, state, name, arguments): return ''\n"
                     "    def verify(self, task, state, transcript): return Outcome(1.0)\n",
                     "tools(task) must return a list of function docs"),
    "same_ids": ("class Broken(Family):\n    def tasks(self): return [FamilyTask('a', 'c', 'hi'), FamilyTask('a', 'c', 'ho')]\n"
                 "    def tools(self, task): return []\n    def start(self, task): return {}\n"
                 "    def call(self, state, name, arguments): return ''\n"
                 "    def verify(self, task, state, transcript): return Outcome(1.0)\n",
                 "task ids must be unique"),
    "not_a_family": ("class Broken:\n    pass\n", "expected a seal_rl.environments.Family subclass"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_family_that_breaks_the_protocol_is_one_line_naming_the_part(case, tmp_path):
    source, expected = BROKEN[case]
    path = tmp_path / f"{case}.py"
    path.write_text("from seal_rl.environments import Family, FamilyTask, Outcome\n\n" + source)
    with pytest.raises(SealError) as raised:
        load_family(f"{path}:Broken")
    message = str(raised.value)
    assert expected in message and "\n" not in message and str(path) in message


@pytest.mark.parametrize("spec, expected", [
    ("nope", "Unknown family 'nope'"),
    ("tau2-bank", "Unknown τ² domain 'bank'"),
    ("no/such/file.py:X", "no file no/such/file.py"),
    ("seal_rl.no_such_module:X", "cannot import 'seal_rl.no_such_module'"),
    (f"{INVENTORY.rpartition(':')[0]}:Nope", "has no attribute 'Nope'"),
])  # fmt: skip
def test_unknown_families_are_one_line(spec, expected):
    with pytest.raises(SealError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_family(spec)


def test_seal_train_refuses_a_bad_family_before_anything_starts(monkeypatch, capsys, tmp_path):
    from .test_cli import run_cli

    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", "smoke-cpu", "--out", str(out), "--set", "family=nope")
    assert code == 2 and "Unknown family 'nope'" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", "smoke-cpu", "--out", str(out),
                           "--set", f"family={INVENTORY}", "--set", "data.task_ids=[inventory_1]",
                           "--set", "env.protocol=bfcl")  # fmt: skip
    assert code == 2 and "env.protocol and eval.protocol must be seal" in err and not out.exists()


# -- one episode of a family ------------------------------------------------------------------------


def test_the_oracle_solves_every_task_and_a_wrong_move_loses_it(inventory):
    from seal_rl.environments import oracle_messages

    for task in inventory.tasks():
        _, record = _play(inventory, task, oracle_messages(inventory, task, "hermes"))
        assert record["reward"] == 1.0 and _labels(record) == ["pass"], (task.id, record["messages"][-2:])
    task = next(t for t in inventory.tasks() if t.category == "move")
    d = task.data
    wrong = {"item": d["item"], "source": d["source"], "target": d["target"], "quantity": d["quantity"] - 1 or 2}
    env, record = _play(inventory, task, [HERMES.render([ToolCall("move", wrong)]), "Done."])
    assert record["reward"] == 0.0
    differences = record["diagnosis"]["labels"][0]["evidence"]
    assert _labels(record) == ["state_mismatch"] and {"class_name": d["source"], "attribute": d["item"]} in differences["differences"]


def test_model_mistakes_become_observations_and_labels(inventory):
    task = next(t for t in inventory.tasks() if t.category == "move")
    d = task.data
    # an unknown tool: rejected whole, an [ERROR] observation, invalid_tool_call
    env, record = _play(inventory, task, [HERMES.render([ToolCall("teleport", {})]), "Done."])
    assert record["messages"][3]["content"].startswith("[ERROR] Invalid tool call format: no tool named 'teleport'")
    assert _labels(record) == ["invalid_tool_call"]
    # a quantity in words breaks the schema (it still runs, and the family's own error comes back)
    bad = {"item": d["item"], "source": d["source"], "target": d["target"], "quantity": "three"}
    env, record = _play(inventory, task, [HERMES.render([ToolCall("move", bad)]), "Done."])
    assert _labels(record) == ["argument_mismatch"] and record["trace"][0]["error_kind"] == "schema"
    # the tool refuses (ToolError): an error result, then nothing fixes it: recovery_failure
    empty = {"item": d["item"], "source": d["target"], "target": d["source"], "quantity": 99}
    env, record = _play(inventory, task, [HERMES.render([ToolCall("move", empty)]), "Done."])
    assert record["trace"][0]["result"].startswith("Error: shelf") and _labels(record) == ["recovery_failure"]
    # an answer in plain text: the user has nothing to add, the episode ends, missing_tool_call
    env, record = _play(inventory, task, ["I moved them."])
    assert record["end_reason"] == "completed" and _labels(record) == ["missing_tool_call"]


class Fragile(Family):
    """A family whose own code fails: its tool raises a plain exception, its verifier raises."""

    name = "fragile"

    def tasks(self):
        return [FamilyTask("f", "c", "go")]

    def tools(self, task):
        return [{"name": "crash", "description": "", "parameters": {"type": "object", "properties": {}}}]

    def start(self, task):
        return {}

    def call(self, state, name, arguments):
        raise ZeroDivisionError("the family's own bug")

    def verify(self, task, state, transcript):
        if any(m["role"] == "assistant" and "boom" in (m["content"] or "") for m in transcript):
            raise RuntimeError("verifier bug")
        return Outcome(0.0)


def test_a_familys_own_failures_are_error_results_and_checker_errors_not_crashes():
    family = Fragile()
    env, record = _play(family, family.tasks()[0], [HERMES.render([ToolCall("crash", {})]), "Done."])
    assert record["trace"][0]["result"] == "Error: ZeroDivisionError: the family's own bug"
    assert _labels(record) == ["recovery_failure"]
    env, record = _play(family, family.tasks()[0], ["boom"])
    assert record["verdict"]["checker_error"] == "RuntimeError: verifier bug" and _labels(record) == ["checker_error"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.text(), st.text().map(lambda t: f"<tool_call>{t}</tool_call>"),
                          st.just("\ud800 lone surrogate"), st.binary().map(lambda b: b.decode("latin-1"))),
                min_size=1, max_size=4))  # fmt: skip
def test_any_model_text_gives_an_observation_a_label_and_a_record_every_writer_takes(inventory, messages):
    env, record = _play(inventory, inventory.tasks()[0], messages)
    assert len(_labels(record)) == 1
    assert json.loads(json.dumps(record, ensure_ascii=False, default=str).encode("utf-8", "replace"))
    assert json.loads(jsonl.dumps(record))["task_id"] == record["task_id"]


# -- seal train on the example family --------------------------------------------------------------


def test_the_example_family_trains_under_seal_train_with_the_closed_loop(monkeypatch, capsys, tmp_path, tiny_model_dir):
    """`seal train` on examples/families/inventory.py: rewards differ in every group (half the episodes
    solve their task), Ψ labels the others, Ω switches components on, A-Patch weighs labelled episodes
    above 1, the advantages are non-zero and the weights move."""
    import torch
    from safetensors.torch import load_file

    from .test_cli import run_cli

    out = tmp_path / "run"
    overrides = {"model.path": str(tiny_model_dir), "family": INVENTORY, "data.task_ids": "[inventory_1,inventory_3]",
                 "grpo.tasks_per_step": 2, "grpo.tasks_per_update": 2, "grpo.per_device_train_batch_size": 2,
                 "grpo.max_steps": 2, "grpo.learning_rate": 1e-3, "budgets.max_completion_tokens": 2048,
                 "budgets.max_new_tokens": 24, "generator": "tests.generators:inventory_mix"}  # fmt: skip
    args = [x for k, v in overrides.items() for x in ("--set", f"{k}={v}")]
    code, stdout, err = run_cli(monkeypatch, capsys, "train", "--config", "smoke-cpu", "--out", str(out), *args)
    assert code == 0, err[-3000:]
    assert "trained 2 rounds" in stdout
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in rows} == {"inventory_1", "inventory_3"}
    assert {r["reward"] for r in rows} == {0.0, 1.0}
    assert {label for r in rows for label in r["labels"]} >= {"pass", "missing_tool_call", "argument_mismatch"}
    assert any(r["advantage_after"] != 0 for r in rows) and any(r["apatch_weight"] > 1 for r in rows)
    assert all(r["verdict"]["evidence"]["kind"] == r["category"] for r in rows)
    changes = json.loads((out / "interface" / "step_1.json").read_text())["changes"]
    assert changes, "the interface did not change after round 1"
    before = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    after = load_file(str(out / "model" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_seal_eval_plays_a_family_through_the_training_episodes_resumes_and_diagnoses(monkeypatch, capsys, tmp_path):
    from .test_cli import run_cli

    out = tmp_path / "eval"
    code, stdout, err = run_cli(monkeypatch, capsys, "eval", "--family", INVENTORY, "--policy", "oracle", "--out", str(out))
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert summary["family"] == "inventory" and summary["protocol"] == "seal"
    assert summary["episodes"] == len(records) == len([t for t in load_family(INVENTORY).tasks() if t.split == "test"])
    assert summary["overall"] == 1.0 and {r["family"] for r in records} == {"inventory"}
    code, _, err = run_cli(monkeypatch, capsys, "eval", "--family", INVENTORY, "--policy", "oracle", "--out", str(out))
    assert code == 0 and f"{len(records)} of {len(records)} episodes already done" in err  # resumed: nothing left to play
    assert (out / "results.jsonl").read_text().count("\n") == len(records)
    code, stdout, _ = run_cli(monkeypatch, capsys, "diagnose", str(out))
    assert code == 0 and "pass" in stdout
    code, _, err = run_cli(monkeypatch, capsys, "eval", "--family", INVENTORY, "--policy", "oracle:faults=0.5", "--out", str(tmp_path / "x"))
    assert code == 2 and "the oracle without faults" in err


def test_a_family_warm_starts_from_its_oracle_a_replay_file_or_an_eval_run(inventory, tiny_model_dir, tmp_path):
    """``warm_start.data`` for a family: ``oracle`` plays Family.oracle; ``replay:FILE`` and ``run:DIR`` (a
    ``seal eval --family`` run) name the family's task ids and give the same transcripts, so the same samples.
    The faulty oracle perturbs BFCL's ground truth: one line."""
    from transformers import AutoTokenizer

    from seal_rl.env import EnvConfig
    from seal_rl.environments import oracle_messages
    from seal_rl.evaluate import evaluate
    from seal_rl.policies import Episode, ScriptedAgent
    from seal_rl.rollout import Budgets
    from seal_rl.sft import SFTSource, build_samples

    tasks = inventory.task_set().select("train")[:3]
    config = EnvConfig()
    evaluate([Episode(i, t, ScriptedAgent(oracle_messages(inventory, t, "hermes"))) for i, t in enumerate(tasks, 1)], config,
             tmp_path / "run", policy="oracle", family=inventory)  # fmt: skip
    replay = tmp_path / "replay.jsonl"
    replay.write_text("".join(json.dumps({"task_id": t.id, "assistant": [str(m) for m in oracle_messages(inventory, t, "hermes")]})
                              + "\n" for t in tasks))  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def samples(source):
        made, summary = build_samples([SFTSource(source)], tasks, inventory.task_set(), tokenizer, config, Budgets(16384, 4096, 256),
                                      family=inventory)  # fmt: skip
        return [s["input_ids"] for s in made], summary

    oracle, summary = samples("oracle")
    assert len(oracle) == 3, summary
    assert samples(f"replay:{replay}")[0] == oracle and samples(f"run:{tmp_path / 'run'}")[0] == oracle
    with pytest.raises(SealError, match="perturbs BFCL's ground truth"):
        samples("oracle:faults=0.5")
