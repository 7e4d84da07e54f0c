"""``seal doctor --gpu``, the GPU check: what a short GPU window has to prove, as one command that ends in under 10 minutes.

Each check runs in a process of its own (a session of its own, killed whole at its timeout), so an
OOM, a hang or an import error in one leaves the others' figures standing; each is reported as ok,
failed, timeout or not_run (the whole run's time was spent), with its seconds, its figures and the
tail of its output.

* ``environment`` — the versions that matter (Python, torch, CUDA, transformers, TRL, accelerate,
  datasets, pyarrow, ...), the GPU's name and memory, and that ``trl``, ``datasets``,
  ``seal_rl.env`` and ``seal_rl.train`` import (on the GPU node: from the carried wheelhouse).
* ``prefix_tree_fp32``, ``prefix_tree_bf16`` — the shared-prefix equivalence tests,
  ``tests/test_prefix_tree.py`` of the checkout, on the device (``SEAL_TEST_DEVICE``) in float32 and
  bfloat16 (``SEAL_TEST_DTYPE``): packed log-probabilities, loss and gradients against each row
  forwarded alone, and the broken trees that must fail. Figures: tests run, passed, failed, skipped.
* ``train_round`` — one ``seal train`` round of the smoke-cpu recipe on the tiny model, bf16,
  ``shared_prefix: true``, transformers generation; even episodes play the oracle's transcript
  (:mod:`seal_rl.doctor.oracle`), so that advantages are non-zero. Passes when ``seal train`` exits
  0, some advantage is non-zero and the update packed shared prefixes.
* ``update`` — one update of a G-sample group at the paper's shapes on Qwen2.5-1.5B's configuration
  with random weights (nothing downloaded): bf16 weights under bf16 autocast, gradient
  checkpointing, a shared prompt and completions of different lengths. Per path, shared-prefix then
  TRL's padded one: the old log-probabilities' no-grad pass and the policy's forward and backward
  (through ``SealGRPOTrainer``'s own ``_get_per_token_logps_and_entropies``), tokens per second,
  peak CUDA memory against ``seal plan``'s estimate of the lines the update holds, and the largest
  |Δ log-prob| between the paths (a sanity bound: the check fails above 0.5; exactness is the
  equivalence tests'). An OOM of TRL's path is its result, not the check's failure.
* ``generate`` — transformers ``generate`` of the same configuration: a batch of G from the shared
  prompt, bf16, greedy, a fixed number of new tokens; tokens per second overall and of the decode
  alone, against the plan's generation estimate (a bandwidth roofline, an H100 SXM by default).
* ``server_round`` — generation on a real ``vllm serve`` beside the trainer
  (:mod:`seal_rl.doctor.server_round`); where ``vllm`` is not installed it reports that it did not run.

The measurements of ``environment``, ``update``, ``generate`` and ``server_round`` are
:mod:`seal_rl.doctor.probes`; how each check's figures are read, :mod:`seal_rl.doctor.check_figures`.

Output in ``out`` (``seal doctor --gpu --out DIR``, default ``runs/gpu-check``): ``gpu_check.json``
(all figures, rewritten after every check) and ``gpu_check.log`` (every check's output), and a table
on stdout. Scratch files go to a temporary folder that is removed at the end.

CPU shapes (``seal doctor --gpu --cpu-shapes``): the same checks at tiny shapes on the CPU (a tiny
Qwen2 configuration, a 64-token prompt, G = 4, float32 weights under bf16 autocast; a few of the
equivalence tests), about two minutes on two cores: CI runs it (``make gpu-check-cpu``,
``tests/test_gpu_check.py``) so that the check cannot rot between GPU windows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import seal_rl
from seal_rl.doctor import check_figures as reading
from seal_rl.doctor.oracle import GENERATOR
from seal_rl.errors import SealError

SOURCE = Path(seal_rl.__file__).resolve().parents[1]
"""the folder seal_rl is imported from: the checks' processes import the same one"""
CHECKOUT = SOURCE.parent
"""the checkout whose ``tests/test_prefix_tree.py`` the equivalence checks run (``src/`` layout)"""
RESULT_FILE = "gpu_check.json"
LOG_FILE = "gpu_check.log"
PREFIX_TREE_CPU_SUBSET = "unequal_suffixes or round_trips or broken_tree"
"""the equivalence tests the CPU shapes run (the GPU runs them all)"""

Command = Callable[[bool, Path], tuple[list[str], dict[str, str]]]
"""a check's process: (argv, extra environment), given the mode (``cpu``) and the scratch folder"""


@dataclass
class Check:
    """One check: the command of its process and how its figures are read afterwards."""

    name: str
    timeout: tuple[int, int]
    """seconds on the GPU, on the CPU"""
    command: Command
    figures: reading.Reader
    summary: Callable[[dict[str, Any]], str]
    """the table's one-line summary of the figures"""


@dataclass
class Outcome:
    """What one check came to."""

    status: str
    """ok, failed, timeout or not_run"""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def probe_command(name: str) -> Command:
    """The process of a check of :mod:`seal_rl.doctor.probes`."""

    def command(cpu: bool, work: Path) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "seal_rl.doctor.probes", name, str(work)] + (["--cpu"] if cpu else []), {}

    return command


def pytest_command(dtype: str) -> Command:
    """The equivalence tests on the device in ``dtype``, with a JUnit report in the scratch folder."""

    def command(cpu: bool, work: Path) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_prefix_tree.py",
                f"--junitxml={work / f'prefix_tree_{dtype}.xml'}"]  # fmt: skip
        if cpu:
            argv += ["-k", PREFIX_TREE_CPU_SUBSET]
        return argv, {"SEAL_TEST_DEVICE": "cpu" if cpu else "cuda", "SEAL_TEST_DTYPE": dtype}

    return command


def train_command(cpu: bool, work: Path) -> tuple[list[str], dict[str, str]]:
    """One ``seal train`` round of smoke-cpu, bf16, shared prefixes, half the episodes the oracle's."""
    settings = ["grpo.max_steps=1", "grpo.bf16=true", "shared_prefix=true", f"generator={GENERATOR}",
                "budgets.max_completion_tokens=2048"]  # the oracle's transcripts fit (smoke-cpu's 192 cuts them)
    argv = [sys.executable, "-m", "seal_rl", "train", "--config", "smoke-cpu", "--out", str(work / "train")]
    return argv + [a for s in settings for a in ("--set", s)], {}


CHECKS = [
    Check("environment", (60, 120), probe_command("environment"), reading.child_figures("environment"), reading.summary_environment),
    Check("prefix_tree_fp32", (75, 240), pytest_command("float32"), reading.pytest_figures("float32"), reading.summary_prefix),
    Check("prefix_tree_bf16", (75, 240), pytest_command("bfloat16"), reading.pytest_figures("bfloat16"), reading.summary_prefix),
    Check("train_round", (120, 300), train_command, reading.train_figures, reading.summary_train),
    Check("update", (120, 240), probe_command("update"), reading.child_figures("update"), reading.summary_update),
    Check("generate", (60, 180), probe_command("generate"), reading.child_figures("generate"), reading.summary_generate),
    Check("server_round", (200, 420), probe_command("server_round"), reading.child_figures("server_round"), reading.summary_server),
]  # fmt: skip
DEADLINE = (500, 1300)
"""seconds the whole run may take on the GPU (a command may run 10 minutes, the install first), on the CPU"""


def run_check(check: Check, cpu: bool, work: Path, timeout: float, log: IO[str]) -> Outcome:
    """Run one check's process in a session of its own (killed whole at the timeout); read its figures."""
    argv, extra = check.command(cpu, work)
    env = {**os.environ, **extra, "PYTHONPATH": os.pathsep.join([str(SOURCE), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    log.write(f"\n===== {check.name}: {' '.join(argv)} (timeout {timeout:.0f} s)\n")
    log.flush()
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=CHECKOUT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the check's own process group: pytest's or seal train's children too
        output, _ = process.communicate()
        log.write(output)
        return Outcome("timeout", time.perf_counter() - started, error=f"killed after {timeout:.0f} s\n" + reading.tail(output))
    seconds = time.perf_counter() - started
    log.write(output)
    log.write(f"\n----- {check.name}: exit status {process.returncode} after {seconds:.1f} s\n")
    done = subprocess.CompletedProcess(argv, process.returncode, output, "")
    try:
        passed, found, why = check.figures(cpu, work, done)
    except Exception as exc:  # a malformed result is the check's failure, not the run's
        return Outcome("failed", seconds, error=f"reading its figures: {exc!r}\n" + reading.tail(output))
    return Outcome("ok" if passed else "failed", seconds, found, None if passed else f"{why}\n" + reading.tail(output))


def require_gpu() -> None:
    """Refuse the GPU check, in one line, where torch sees no CUDA device (``--cpu-shapes`` runs it on the CPU)."""
    from seal_rl.doctor.facts import gpus

    found = gpus()
    if not found["devices"]:
        raise SealError(f"No GPU here ({found['why']}): `seal doctor --gpu` checks a CUDA GPU; "
                        "`seal doctor --gpu --cpu-shapes` runs the same checks at tiny shapes on the CPU.")  # fmt: skip


def selected(only: str | None) -> list[Check]:
    """The checks ``--only`` names (comma-separated; all by default); one line for an unknown name."""
    names = [c.name for c in CHECKS]
    wanted = [n for n in (only or ",".join(names)).split(",") if n]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise SealError(f"unknown check(s) {', '.join(unknown)} in --only; choose from {', '.join(names)}.")
    return [c for c in CHECKS if c.name in wanted]


def run(*, cpu: bool, out: Path, only: str | None = None) -> int:
    """Run the checks in order within the deadline; write the JSON and the log; print the table.
    The exit status: 0 when every check is ok, 1 otherwise."""
    checks = selected(only)
    out.mkdir(parents=True, exist_ok=True)
    mode = "cpu" if cpu else "gpu"
    deadline = time.perf_counter() + DEADLINE[cpu]
    outcomes: dict[str, Outcome] = {}
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="seal-gpu-check-") as scratch, open(out / LOG_FILE, "w") as log:
        log.write(f"seal-rl GPU check, {mode} mode, started {started.isoformat(timespec='seconds')}\n")
        for check in checks:
            left = deadline - time.perf_counter()
            if left < 10:
                outcomes[check.name] = Outcome("not_run", error="the run's deadline had passed")
                continue
            print(f"[gpu-check] {check.name} ...", flush=True)
            outcomes[check.name] = run_check(check, cpu, Path(scratch), min(check.timeout[cpu], left), log)
            print(f"[gpu-check] {check.name}: {outcomes[check.name].status} ({outcomes[check.name].seconds:.1f} s)", flush=True)
            write(out, mode, started, outcomes)  # after every check: a killed run keeps what it measured
        write(out, mode, started, outcomes)
        table = render_table(outcomes)
        log.write("\n" + table + "\n")
    print(table)
    print(f"figures: {out / RESULT_FILE}; log: {out / LOG_FILE}")
    return 0 if all(o.status == "ok" for o in outcomes.values()) else 1


def render_table(outcomes: dict[str, Outcome]) -> str:
    """One row per check: its name, status, seconds and the summary of its figures (or its error's first line)."""
    rows = [("check", "status", "seconds", "figures")]
    rows += [(name, o.status, f"{o.seconds:.1f}", _summary(name, o)) for name, o in outcomes.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows)


def _summary(name: str, outcome: Outcome) -> str:
    check = next(c for c in CHECKS if c.name == name)
    try:
        text = check.summary(outcome.figures) if outcome.figures else ""
    except (KeyError, TypeError, ValueError) as exc:
        text = f"(figures incomplete: {exc!r})"
    if outcome.status != "ok" and outcome.error:
        text = (text + " | " if text else "") + outcome.error.splitlines()[0]
    return text


def write(out: Path, mode: str, started: datetime, outcomes: dict[str, Outcome]) -> None:
    """``gpu_check.json``: the mode, when it started, how long it has run and every check's outcome."""
    result = {
        "mode": mode, "started": started.isoformat(timespec="seconds"),
        "seconds": round((datetime.now(timezone.utc) - started).total_seconds(), 1),
        "checks": {n: {"status": o.status, "seconds": round(o.seconds, 1), "figures": o.figures, "error": o.error}
                   for n, o in outcomes.items()},
    }  # fmt: skip
    (out / RESULT_FILE).write_text(json.dumps(result, indent=1, default=str) + "\n")
