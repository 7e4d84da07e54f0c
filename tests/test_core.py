"""The core of seal-rl needs no torch (issue 41): the environment, verifier, diagnosis, interface,
evaluation with the oracle, reports and the HTTP service import and play without it.

Here the checks run in a fresh interpreter and assert that torch (and the rest of the ``train``
extra) never gets imported; ``make test-core`` runs this file in venvs that have no torch at all,
on Python 3.11, 3.12 and 3.13, where a stray import would fail outright."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from seal_rl.extras import TRAIN_MODULES

ROOT = Path(__file__).resolve().parents[1]

PLAY = """
import json, sys
from seal_rl.diagnose import add_diagnosis
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.faults import oracle_transcript
from seal_rl.interface import Interface
from seal_rl.service.app import create_app
from seal_rl.tasks import TaskSet
from seal_rl.tools import get_format
from seal_rl.verify import ground_truth_calls
import seal_rl.evaluate, seal_rl.report

task = TaskSet.load().get("multi_turn_miss_param_0")
env = BfclEnv(EnvConfig())
messages, _ = oracle_transcript(task, ground_truth_calls(task), get_format(env.config.call_format))
env.reset(task)
reward = None
for message in messages:
    _, reward, terminated, truncated, _ = env.step(message)
    if terminated or truncated:
        break
record = env.record()
add_diagnosis(record)
create_app()
loaded = sorted({name.partition(".")[0] for name in sys.modules} & set(json.loads(sys.argv[1])))
print(json.dumps({"reward": reward, "turns": record["turns_reached"], "labels": record["diagnosis"]["labels"], "loaded": loaded}))
"""


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def test_an_oracle_episode_plays_and_is_diagnosed_without_torch(tmp_path):
    played = json.loads(_run([sys.executable, "-c", PLAY, json.dumps(sorted(TRAIN_MODULES))], tmp_path).stdout)
    assert played["reward"] == 1.0 and played["turns"] >= 2
    assert played["labels"], "the diagnosis labels every turn"
    assert played["loaded"] == [], f"the core imported {played['loaded']}"


def test_seal_eval_with_the_oracle_writes_results_and_a_report_without_torch(tmp_path):
    seal = [sys.executable, "-X", "importtime", "-m", "seal_rl"]
    tasks = "multi_turn_base_0,multi_turn_miss_func_0"
    done = _run([*seal, "eval", "--policy", "oracle", "--tasks", tasks, "--out", "eval"], tmp_path)
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["successes"] == 2
    report = _run([*seal, "report", "eval"], tmp_path)
    assert (tmp_path / "eval" / "report.html").stat().st_size > 10_000
    # `-X importtime` lists every module the process imported, one per line, on stderr.
    imported = {line.split("|")[-1].strip().partition(".")[0] for line in (done.stderr + report.stderr).splitlines()
                if line.startswith("import time:")}  # fmt: skip
    assert "seal_rl" in imported and not imported & TRAIN_MODULES, sorted(imported & TRAIN_MODULES)


HIDE_TRAIN = """
import sys
for name in ("torch", "transformers", "trl", "accelerate", "datasets"):
    sys.modules[name] = None  # as if the train extra were not installed: importing them fails
sys.argv = ["seal", *sys.argv[1:]]
from seal_rl.cli import main
main()
"""


def test_a_command_that_needs_the_train_extra_says_so_in_one_line(tmp_path):
    """Without torch and transformers, each command that needs them exits 2 with one line naming the
    extra, before it downloads or writes anything; the core's commands still run."""
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "SEAL_CACHE_DIR": str(tmp_path / "cache")}
    commands = [
        ["train", "--config", "smoke-cpu", "--out", "train"],
        ["sft", "--config", "demo-cpu", "--out", "sft"],
        ["eval", "--policy", "hf:smollm2-135m-instruct", "--tasks", "multi_turn_base_0", "--out", "eval-hf"],
        ["models", "pull", "smollm2-135m-instruct"],
    ]
    for command in commands:
        done = subprocess.run([sys.executable, "-c", HIDE_TRAIN, *command], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (command, done.stderr[-2000:])
        assert lines[0].startswith("error: ") and "pip install 'seal-rl[train]'" in lines[0], (command, lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"] and not any((tmp_path / "cache").rglob("*.whl"))
    oracle = subprocess.run([sys.executable, "-c", HIDE_TRAIN, "eval", "--policy", "oracle", "--tasks", "multi_turn_base_0",
                             "--out", "eval"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert oracle.returncode == 0, oracle.stderr[-2000:]
