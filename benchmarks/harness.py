"""What every benchmark repeats, written once: where the repository is, what machine and commit a
measurement was taken on, timers, memory, a fresh process per measurement, ratios against the
baseline measured in the same run, the pulled models, and the summary file a run leaves.

Benchmarks run as scripts (``python benchmarks/bench_X.py``, so ``benchmarks/`` is on ``sys.path``)
and import it as ``harness``. Every benchmark prints :func:`provenance_line` before its tables (most
through :func:`provenance_console`), so a table copied into the Results pages carries its date,
machine, command and commit.
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
"""the repository's root"""

T = TypeVar("T")


# -- where and when -------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name, as ``seal doctor`` reports it (:func:`seal_rl.doctor.facts.cpu_model`)."""
    from seal_rl.doctor.facts import cpu_model as doctor_cpu_model

    return doctor_cpu_model()


def gpus() -> list[str]:
    """The NVIDIA GPUs ``nvidia-smi`` lists (name and memory), none where it is absent or fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def commit() -> str:
    """The checkout's short commit, with ``+changes`` when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True,
                               timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """When, where and how a measurement is taken: UTC date, CPU, cores, GPUs, command and commit."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0])
    shown = str(script.resolve().relative_to(ROOT)) if script.resolve().is_relative_to(ROOT) else argv[0]
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_model(),
            "cores": os.cpu_count(), "gpus": gpus(), "command": " ".join(["python", shown, *argv[1:]]), "commit": commit()}  # fmt: skip


def provenance_line(facts: Mapping[str, Any] | None = None) -> str:
    """:func:`provenance` in one line, the first a benchmark prints."""
    facts = provenance() if facts is None else facts
    where = f"{facts['cpu']}, {facts['cores']} cores" + "".join(f"; GPU {gpu}" for gpu in facts["gpus"])
    return f"measured {facts['date']} on {where}; commit {facts['commit']}; {facts['command']}"


def provenance_console(width: int | None = None, **options: Any) -> Console:
    """A rich console for a benchmark's tables, :func:`provenance_line` printed on it first."""
    console = Console(width=width, **options)
    console.print(provenance_line(), highlight=False, soft_wrap=True)
    return console


def write_summary(path: Path, data: Mapping[str, Any]) -> None:
    """``data`` as indented JSON at ``path``, with the :func:`provenance` of the measurement."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provenance": provenance(), **data}, indent=1) + "\n")


# -- time and memory ------------------------------------------------------------------------------


def timed(function: Callable[[], T]) -> tuple[float, T]:
    """Seconds ``function()`` took, and what it returned."""
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile (1..99) of ``values``, inclusive method; the value itself when alone."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def rss_mib() -> float:
    """This process's resident memory now, in MiB (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def in_fresh_process(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a freshly spawned interpreter, so its peak memory is its own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def run_child(command: list[str], **popen: Any) -> tuple[int, float, int]:
    """Run ``command`` to its end: its exit code, wall seconds and peak resident memory in bytes."""
    began = time.perf_counter()
    child = subprocess.Popen(command, **popen)
    _, status, usage = os.wait4(child.pid, 0)
    return os.waitstatus_to_exitcode(status), time.perf_counter() - began, usage.ru_maxrss * 1024


def parse_jsonl_seconds(paths: Iterable[Path]) -> float:
    """Seconds to parse every line of the JSONL files ``paths`` that exist: the floor any reader of a run pays."""
    started = time.perf_counter()
    for path in paths:
        if path.exists():
            with open(path, encoding="utf-8") as lines:
                for line in lines:
                    json.loads(line)
    return time.perf_counter() - started


def resumed_seconds(timing: Path, spent: float, floor: float) -> float:
    """A resumable run's seconds, kept in ``timing`` across resumes: ``spent`` is added when above
    ``floor`` (a resume that found everything done keeps the first measurement)."""
    previous = json.loads(timing.read_text())["seconds"] if timing.exists() else 0.0
    if spent > floor:
        timing.parent.mkdir(parents=True, exist_ok=True)
        timing.write_text(json.dumps({"seconds": previous + spent}) + "\n")
        return previous + spent
    return previous if timing.exists() else spent


# -- ratios against the same run's baseline -------------------------------------------------------


def times(value: float, baseline: float, digits: int = 2) -> str:
    """``value / baseline`` as ``1.23x``; ``-`` when the baseline is zero."""
    return f"{value / baseline:,.{digits}f}x" if baseline else "-"


def ratio_line(name: str, ratios: Mapping[str, float], digits: int = 2) -> str:
    """One line of named ratios: ``turn / episode: wall 1.20x, round 0.95x``."""
    return f"{name}: " + ", ".join(f"{key} {value:.{digits}f}x" for key, value in ratios.items())


# -- models ---------------------------------------------------------------------------------------


def pulled_model(name: str) -> Path | None:
    """The directory of the pulled model ``name`` (``seal models pull``), None when it is not there."""
    from seal_rl.models import pulled_path

    path = pulled_path(name)
    return path if path is not None and (path / "config.json").exists() else None


def require_model(name: str) -> Path:
    """The directory of the pulled model ``name``; exits with the command that pulls it when it is not there."""
    path = pulled_model(name)
    if path is None:
        sys.exit(f"{name} is not pulled: run `make models` (or `seal models pull {name}`) first.")
    return path
