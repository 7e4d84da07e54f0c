import json
import re
import shutil
import subprocess
import sys

import pytest

from seal_rl.errors import SealError
from seal_rl.report import write_report

EIGHT = ("multi_turn_base_1,multi_turn_base_4,multi_turn_miss_func_1,multi_turn_miss_func_2,"
         "multi_turn_miss_param_1,multi_turn_miss_param_2,multi_turn_long_context_1,multi_turn_long_context_4")  # fmt: skip


def _seal(*args, timeout=600):
    result = subprocess.run([sys.executable, "-m", "seal_rl", *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def hf_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "eval"
    _seal("eval", "--policy", f"hf:{tiny_model_dir}", "--tasks", EIGHT, "--max-new-tokens", "16", "--concurrency", "8", "--out", str(out))
    return out


def test_a_tiny_hf_model_is_evaluated_on_eight_tasks(hf_run):
    records = [json.loads(line) for line in (hf_run / "results.jsonl").read_text().splitlines()]
    assert len(records) == 8 and {r["category"] for r in records} == {"base", "miss_func", "miss_param", "long_context"}
    assert all(r["model_calls"] >= 1 and r["diagnosis"]["labels"] for r in records)
    summary = json.loads((hf_run / "summary.json").read_text())
    assert summary["episodes"] == 8 and all(len(c["ci95"]) == 2 for c in summary["categories"].values())
    config = json.loads((hf_run / "config.json").read_text())
    assert config["model_settings"]["temperature"] == 0.0  # greedy by default


def test_the_eval_report_is_self_contained(hf_run):
    page = write_report(hf_run).read_text()
    for section in ("<h2>Success</h2>", "<h2>Failure labels</h2>", "<h2>Trajectories</h2>"):
        assert section in page
    assert page.count('class="episode"') == 8 and page.count('src="data:image/png;base64,') == 2
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<link" not in page  # nothing fetched


def test_model_text_is_escaped_in_the_report(tmp_path, task_set):
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"task_id": "multi_turn_base_0", "assistant": [hostile]}) + "\n")
    _seal("eval", "--policy", f"replay:{replay}", "--out", str(tmp_path / "run"))
    page = write_report(tmp_path / "run").read_text()
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1 and "onerror=alert" not in page.replace("onerror=alert(1)&gt;", "")


def test_report_needs_a_run_directory(tmp_path):
    with pytest.raises(SealError, match="neither an evaluation run"):
        write_report(tmp_path)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium is not installed (apt-get install chromium)")
def test_headless_chromium_renders_the_report(hf_run, tmp_path):
    page = write_report(hf_run)
    shot = tmp_path / "report.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 20_000


def test_compare_two_runs(tmp_path):
    tasks = ",".join(f"multi_turn_base_{i}" for i in range(40))
    _seal("eval", "-p", "oracle", "--tasks", tasks, "--out", str(tmp_path / "a"))
    _seal("eval", "-p", "oracle:faults=0.5,seed=1", "--tasks", tasks, "--out", str(tmp_path / "b"))
    result = _seal("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert "McNemar" in result.stdout and "paired bootstrap" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ base"))
    cells = [c.strip() for c in row.split("│")[1:-1]]
    _, pairs, rate_a, rate_b, _, only_a, only_b, p_value = cells
    assert pairs == "40" and rate_a == "100.0%" and int(only_b) == 0 and int(only_a) > 10
    assert float(p_value) < 0.01  # the faulty oracle is significantly worse, pair by pair
