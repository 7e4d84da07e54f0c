"""benchmarks/harness.py, the code every benchmark shares, and the house rules of benchmarks/: each
benchmark has its ``make bench-NAME`` target and prints where and when it ran (issue 73)."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
TARGETS = {"bench_real_study.py": "bench-real-study-smoke", "differential.py": "bench-differential",
           "bfcl_parity.py": "bench-bfcl-parity"}  # fmt: skip
"""benchmarks whose target is not ``bench-`` + their name (``make bench-real-study`` runs the whole study)"""


@pytest.fixture
def harness(monkeypatch):
    """benchmarks/harness.py as the benchmarks import it (``benchmarks/`` on ``sys.path``)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("harness")


def _benchmarks() -> list[Path]:
    return sorted([*BENCHMARKS.glob("bench_*.py"), BENCHMARKS / "differential.py", BENCHMARKS / "bfcl_parity.py"])


def _recipes() -> dict[str, str]:
    """The Makefile's targets and their recipes."""
    recipes, target = {}, None
    for line in (REPO / "Makefile").read_text().splitlines():
        if match := re.match(r"^([\w-]+):", line):
            target = match.group(1)
            recipes[target] = ""
        elif line.startswith("\t") and target:
            recipes[target] += line
        elif not line.startswith("\t"):
            target = None
    return recipes


@pytest.mark.parametrize("script", _benchmarks(), ids=lambda p: p.name)
def test_every_benchmark_runs_as_its_make_target(script):
    recipes = _recipes()
    target = TARGETS.get(script.name, "bench-" + script.stem.removeprefix("bench_").replace("_", "-"))
    assert target in recipes, f"the Makefile has no `{target}` for {script.name}"
    assert f"benchmarks/{script.name}" in recipes[target], recipes[target]


def test_make_bench_runs_targets_that_exist():
    recipes = _recipes()
    makefile = (REPO / "Makefile").read_text()
    quick = re.search(r"^BENCH_QUICK := (.*?)(?<!\\)$", makefile, re.M | re.S).group(1).replace("\\\n", " ").split()
    assert quick and all(target in recipes for target in quick), quick
    assert "$(BENCH_QUICK)" in recipes["bench"]


@pytest.mark.parametrize("script", [p for p in _benchmarks() if p.name not in ("bench_real_study.py", "bench_interface_format.py")],
                         ids=lambda p: p.name)  # fmt: skip
def test_every_benchmark_prints_where_and_when_it_ran(script):
    """A measured table is quoted with its date, machine, command and commit: the benchmark prints them
    (bench_real_study is a smoke with no table; bench_interface_format is imported by its test as
    ``benchmarks.bench_interface_format``, where ``harness`` is not importable)."""
    text = script.read_text()
    printed = "provenance_console(" in text or "print(provenance_line())" in text
    assert printed or "from learn_cpu import" in text and "report(" in text, script.name


def test_times_and_ratio_lines(harness):
    assert harness.times(3.0, 2.0) == "1.50x"
    assert harness.times(1.0, 3.0, 4) == "0.3333x"
    assert harness.times(5_000.0, 2.0, 0) == "2,500x"
    assert harness.times(1.0, 0.0) == "-"
    assert harness.ratio_line("turn / episode", {"wall": 1.2, "round": 0.954}) == "turn / episode: wall 1.20x, round 0.95x"


def test_percentile_is_inclusive_and_takes_a_lone_value(harness):
    values = [float(v) for v in range(1, 102)]  # 1..101: the k-th inclusive percentile is 1 + k
    assert harness.percentile(values, 50) == 51.0
    assert harness.percentile(values, 99) == 100.0
    assert harness.percentile([0.25], 99) == 0.25


def test_timed_returns_the_seconds_and_the_result(harness):
    import time

    seconds, result = harness.timed(lambda: time.sleep(0.05) or "done")
    assert result == "done" and 0.05 <= seconds < 5


def test_in_fresh_process_runs_elsewhere(harness):
    assert harness.in_fresh_process(os.getpid) != os.getpid()


def test_run_child_gives_the_exit_code_and_the_childs_peak_memory(harness):
    code, seconds, peak = harness.run_child([sys.executable, "-c", "import sys; block = bytearray(300 * 2**20); sys.exit(3)"])
    assert code == 3 and seconds > 0
    assert peak >= 300 * 2**20, peak  # the child's own peak, not this process's


def test_resumed_seconds_adds_a_resume_only_when_it_worked(harness, tmp_path):
    timing = tmp_path / "run" / "seconds.json"
    assert harness.resumed_seconds(timing, 2.0, floor=5) == 2.0 and not timing.exists()
    assert harness.resumed_seconds(timing, 10.0, floor=5) == 10.0
    assert harness.resumed_seconds(timing, 3.0, floor=5) == 10.0  # a resume that found everything done
    assert harness.resumed_seconds(timing, 7.0, floor=5) == 17.0
    assert json.loads(timing.read_text()) == {"seconds": 17.0}


def test_parse_jsonl_seconds_reads_every_line_of_the_files_there_are(harness, tmp_path):
    good = tmp_path / "results.jsonl"
    good.write_text('{"a": 1}\n{"b": 2}\n')
    assert harness.parse_jsonl_seconds([good, tmp_path / "missing.jsonl"]) >= 0
    bad = tmp_path / "metrics.jsonl"
    bad.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(json.JSONDecodeError):
        harness.parse_jsonl_seconds([good, bad])


def test_provenance_names_the_command_the_commit_and_the_machine(harness):
    facts = harness.provenance([str(BENCHMARKS / "bench_env.py"), "--soak", "10"])
    assert facts["command"] == "python benchmarks/bench_env.py --soak 10"
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+changes)?|unknown", facts["commit"]), facts["commit"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", facts["date"]) and facts["cores"] == os.cpu_count()
    assert facts["cpu"] and isinstance(facts["gpus"], list)
    line = harness.provenance_line({"date": "2026-12-06 22:00 UTC", "cpu": "Some CPU", "cores": 2, "gpus": ["H100, 81559 MiB"],
                                    "command": "python benchmarks/bench_env.py", "commit": "abc1234"})  # fmt: skip
    assert line == ("measured 2026-12-06 22:00 UTC on Some CPU, 2 cores; GPU H100, 81559 MiB; commit abc1234; "
                    "python benchmarks/bench_env.py")  # fmt: skip


def test_provenance_console_prints_the_line_first(harness, capsys):
    harness.provenance_console(width=300).print("table")
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith("measured ") and "; commit " in first and second == "table"


def test_write_summary_keeps_the_data_beside_its_provenance(harness, tmp_path):
    harness.write_summary(tmp_path / "out" / "summary.json", {"arms": [1, 2]})
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written["arms"] == [1, 2] and set(written["provenance"]) == {"date", "cpu", "cores", "gpus", "command", "commit"}


def test_require_model_names_the_pull_command(harness, monkeypatch, tmp_path):
    monkeypatch.setenv("SEAL_CACHE_DIR", str(tmp_path))
    assert harness.pulled_model("smollm2-135m-instruct") is None
    with pytest.raises(SystemExit, match=r"seal models pull smollm2-135m-instruct"):
        harness.require_model("smollm2-135m-instruct")


def test_learn_cpu_report_divides_the_named_arms(harness, tmp_path, capsys):
    learn_cpu = importlib.import_module("learn_cpu")
    arm = {"curve": [0.25, 0.5], "wall": 100.0, "start": 20.0, "round": 40.0, "generation": 10.0, "update": 30.0,
           "weight_sync": 0.0, "tokens": 1000.0, "forwarded": 500.0}  # fmt: skip
    results = [{**arm, "arm": "episode"}, {**arm, "arm": "turn", "wall": 150.0, "forwarded": 250.0}]
    ratios = learn_cpu.report(results, "layout", ["wall", "forwarded"], "t", ["wall", "forwarded", "weight_sync"], ("turn", "episode"), tmp_path)
    assert ratios == {"wall": 1.5, "forwarded": 0.5}  # weight_sync: the baseline's is 0, no ratio
    assert "turn / episode: wall 1.50x, forwarded 0.50x" in capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["turn_over_episode"] == ratios and [a["arm"] for a in summary["arms"]] == ["episode", "turn"]
