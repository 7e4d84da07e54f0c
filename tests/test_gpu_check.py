"""The GPU check at CPU shapes (``seal doctor --gpu --cpu-shapes``) runs every check to a real result, so
the check a GPU window depends on cannot rot between windows. Figures are checked for being real
(non-zero advantages, finite log-probability differences, positive throughputs, the plan's
estimates present), never for their size: timings are the GPU's business."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from seal_rl.doctor import check_figures, gpu_check

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ["environment", "prefix_tree_fp32", "prefix_tree_bf16", "train_round", "update", "generate", "server_round"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    done = subprocess.run([sys.executable, "-m", "seal_rl", "doctor", "--gpu", "--cpu-shapes", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert (out / "gpu_check.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "gpu_check.log").stat().st_size > 0
    return done, json.loads((out / "gpu_check.json").read_text())


@pytest.mark.slow
def test_cpu_mode_runs_every_check_and_says_so(result):
    done, found = result
    statuses = {name: check["status"] for name, check in found["checks"].items()}
    errors = {name: check["error"] for name, check in found["checks"].items() if check["status"] != "ok"}
    assert statuses == dict.fromkeys(CHECKS, "ok"), errors
    assert done.returncode == 0 and found["mode"] == "cpu"
    for name in CHECKS:  # the closing table names every check with its status
        assert any(line.startswith(name) and " ok " in line for line in done.stdout.splitlines()), done.stdout[-2000:]


@pytest.mark.slow
def test_environment_records_versions_and_where_trl_comes_from(result):
    figures = result[1]["checks"]["environment"]["figures"]
    assert all(figures["versions"][name] for name in ("torch", "transformers", "trl", "accelerate", "datasets"))
    assert figures["gpu"] is None and Path(figures["imported_from"]["trl"]).name == "trl"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_equivalence_tests_ran_in_both_dtypes(result, dtype):
    figures = result[1]["checks"][f"prefix_tree_{dtype}"]["figures"]
    assert figures["passed"] >= 5 and figures["failed"] == 0, figures


@pytest.mark.slow
def test_the_training_round_has_non_zero_advantages_and_packs_prefixes(result):
    figures = result[1]["checks"]["train_round"]["figures"]
    assert figures["exit_status"] == 0 and figures["nonzero_advantages"] > 0, figures
    assert 0 < figures["update"]["update/policy/forwarded_tokens"] < figures["update"]["update/policy/rows_tokens"]
    assert figures["rollout"]["rollout/episodes"] == len(figures["advantages_after"]) == 8
    assert math.isfinite(figures["trainer"]["loss"])


@pytest.mark.slow
def test_the_update_measures_both_paths_against_the_plan(result):
    figures = result[1]["checks"]["update"]["figures"]
    assert math.isfinite(figures["max_abs_logp_delta"]) and figures["max_abs_logp_delta"] >= 0
    for path in ("shared", "trl"):
        measured = figures[path]
        assert measured["status"] == "ok" and measured["policy_tokens_per_s"] > 0 and measured["no_grad_tokens_per_s"] > 0
        assert "peak_gib" in measured and measured["plan_update_gib"] > 0 and measured["plan_lines_gib"]
    assert figures["shared"]["forwarded_tokens"] < figures["trl"]["forwarded_tokens"] == figures["padded_tokens"]


@pytest.mark.slow
def test_generation_is_timed_against_the_plan(result):
    figures = result[1]["checks"]["generate"]["figures"]
    assert figures["decode_tokens_per_s"] > 0 and figures["tokens_per_s"] > 0 and figures["plan_tokens_per_s"] > 0


def _runner_check(code: str) -> gpu_check.Check:
    """A check whose process runs ``code``, its figures read as the child checks' are."""
    command = lambda cpu, work: ([sys.executable, "-c", code], {})  # noqa: E731
    return gpu_check.Check("probe", (5, 5), command, check_figures.child_figures("probe"), lambda f: "")


def test_a_failing_check_is_reported_with_its_output(tmp_path):
    check = _runner_check("print('CUDA out of memory, say'); raise SystemExit(3)")
    with open(tmp_path / "log", "w") as log:
        outcome = gpu_check.run_check(check, True, tmp_path, timeout=60, log=log)
    assert outcome.status == "failed" and "exit status 3" in outcome.error and "CUDA out of memory" in outcome.error
    assert "CUDA out of memory" in (tmp_path / "log").read_text()


def test_a_hanging_check_is_killed_at_its_timeout(tmp_path):
    check = _runner_check("import time; print('started', flush=True); time.sleep(60)")
    with open(tmp_path / "log", "w") as log:
        outcome = gpu_check.run_check(check, True, tmp_path, timeout=2, log=log)
    assert outcome.status == "timeout" and outcome.seconds < 30, outcome
    assert "started" in outcome.error
