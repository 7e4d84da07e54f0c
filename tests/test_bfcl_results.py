"""BFCL result files: import (`seal eval --policy bfcl-result:`), export (`seal export-bfcl`) and
parity with the official evaluation of the same files."""

from __future__ import annotations

import fnmatch
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from seal_rl.bfcl import import_bfcl
from seal_rl.bfcl_results import fc_step_text
from seal_rl.parity import OFFICIAL_LINES, OFFICIAL_QWEN_FC_LINES, json_line, official_verdict, result_entries
from seal_rl.protocol import decode_fc, decode_hermes
from tests.test_cli import run_cli


def _normalised(source: str) -> str:
    """Source without comments and whitespace, to find restated lines inside the installed file."""
    return re.sub(r"\s+", "", re.sub(r"#[^\n]*", "", source))


def test_restated_official_lines_match_the_installed_bfcl_eval():
    root = Path(import_bfcl("utils").__file__).parent
    runner = (root / "eval_checker" / "eval_runner.py").read_text()
    body = runner[runner.index("def _evaluate_single_multi_turn_entry("):runner.index("def _evaluate_single_relevance_entry(")]
    qwen = (root / "model_handler" / "local_inference" / "qwen_fc.py").read_text()
    for restated, installed in ((OFFICIAL_LINES, body), (OFFICIAL_QWEN_FC_LINES, qwen)):
        at = 0
        for block in restated.split("\n...\n"):  # each block in the installed source, in order
            at = _normalised(installed).index(_normalised(block), at)


def _write(tmp_path: Path, task_set, entries, decoder: str) -> Path:
    folder = tmp_path / f"result-{decoder}" / "model" / "multi_turn"
    folder.mkdir(parents=True)
    by_category: dict[str, list] = {}
    for entry in entries:
        by_category.setdefault(task_set.get(entry["id"]).category, []).append(entry)
    for category, lines in by_category.items():
        (folder / f"BFCL_v4_multi_turn_{category}_result.json").write_text("".join(json_line(e) for e in lines))
    return tmp_path / f"result-{decoder}"


@pytest.mark.parametrize("decoder", ["fc", "hermes", "pythonic"])
def test_seal_eval_of_bfcl_result_files_agrees_with_the_official_evaluation(monkeypatch, capsys, tmp_path, task_set, decoder):
    """Every 3rd task (267 per decoder, 801 in all) as perturbed ground truth, the faulty oracle and
    hostile steps; the benchmark (benchmarks/bfcl_parity.py) runs 5,000+."""
    entries = result_entries(list(task_set)[::3], decoder, seed=11)
    folder = _write(tmp_path, task_set, entries, decoder)
    code, _, err = run_cli(monkeypatch, capsys, "eval", "--policy", f"bfcl-result:{folder}", "--out", str(tmp_path / "run"))
    assert code == 0, err
    ours = {r["task_id"]: r for r in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().split("\n")[:-1])}
    assert set(ours) == {e["id"] for e in entries}
    outcomes = Counter()
    for entry in entries:
        record = ours[entry["id"]]
        if isinstance(entry["result"], str):
            assert record["error"] and record["end_reason"] == "generation_error"  # left out of the rates
            continue
        valid = official_verdict(task_set.get(entry["id"]), entry["result"], decoder)["valid"]
        assert valid == (record["reward"] == 1.0), (entry["id"], json.dumps(entry["result"])[:500])
        outcomes[valid] += 1
    assert outcomes[True] > 30 and outcomes[False] > 100  # both verdicts are exercised
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["protocol"] == "bfcl" and summary["errors"] == sum(isinstance(e["result"], str) for e in entries)


def test_fc_steps_replayed_as_blocks_decode_exactly_as_the_fc_decoder(task_set):
    for entry in result_entries(list(task_set)[::7], "fc", seed=5):
        if isinstance(entry["result"], str):
            continue
        for turn in entry["result"]:
            for step in turn:
                direct, replayed = decode_fc(step), decode_hermes(fc_step_text(step))
                same = [json.dumps(c.to_json()) for c in direct.calls] == [json.dumps(c.to_json()) for c in replayed.calls]
                assert same and direct.ends_turn == replayed.ends_turn  # (json: NaN != NaN)


def test_turns_end_where_recorded_even_on_an_undecodable_step(monkeypatch, capsys, tmp_path, task_set):
    task = task_set.get("multi_turn_base_0")
    turns = [["<tool_call>\n{broken\n</tool_call>", '<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>', "Done."]]
    turns += [["bad"] for _ in range(task.num_turns - 1)]
    path = tmp_path / "BFCL_v3_multi_turn_base_result.json"
    path.write_text(json.dumps({"id": task.id, "result": turns}) + "\n")
    code, _, err = run_cli(monkeypatch, capsys, "eval", "--policy", f"bfcl-result:{path}", "--out", str(tmp_path / "run"))
    assert code == 0, err
    (record,) = map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().split("\n")[:-1])
    assert [s["turn"] for s in record["steps"]] == [0, 0, 0] + list(range(1, task.num_turns))
    assert [e["name"] for e in record["trace"] if e["accepted"]] == ["pwd"]  # executed after the undecodable step
    assert record["bfcl_result"] == {"file": str(path), "line": 1, "decoder": "hermes"}


def test_unknown_task_ids_are_reported_not_dropped_silently(monkeypatch, capsys, tmp_path, task_set):
    path = tmp_path / "BFCL_v4_multi_turn_base_result.json"
    lines = [{"id": "multi_turn_base_0", "result": [[[]]] * task_set.get("multi_turn_base_0").num_turns},
             {"id": "multi_turn_base_99999", "result": [[[]]]}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, _, err = run_cli(monkeypatch, capsys, "eval", "--policy", f"bfcl-result:{path}", "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert "multi_turn_base_99999" in err and "no such task" in err
    assert (tmp_path / "run" / "results.jsonl").read_text().count("\n") == 1


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"id": "multi_turn_base_0", "result": [[]]}\nnot json\n', ":2: not a JSON line"),
        ('[1, 2]\n', ':1: expected an object with "id"'),
        ('{"id": "multi_turn_base_0", "result": 5}\n', ':1: "result" must be a list of turns'),
        ('{"id": "multi_turn_base_0", "result": [[5]]}\n', ":1: turn 0 step 0 must be text"),
        ('{"id": "multi_turn_composite_0", "result": [[]]}\n', ":1: 'multi_turn_composite_0' is not a BFCL multi-turn task of a known category"),
        ('{"id": "multi_turn_base_0", "result": [[], [], [], [], [], [], [], [], [], []]}\n', ":1: 10 turns recorded but multi_turn_base_0 has"),
    ],
)
def test_bad_result_files_are_one_line_errors_with_file_and_line(monkeypatch, capsys, tmp_path, content, problem):
    path = tmp_path / "BFCL_v4_multi_turn_base_result.json"
    path.write_text(content)
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "eval", "--policy", f"bfcl-result:{path}", "--out", str(out))
    assert code == 2 and f"{path}{problem}" in " ".join(err.split()) and "Traceback" not in err
    assert not out.exists()  # nothing half-written


def test_export_is_what_the_official_loader_reads_and_scores_the_same(monkeypatch, capsys, tmp_path, task_set):
    ids = "multi_turn_base_3,multi_turn_miss_func_49,multi_turn_miss_param_2,multi_turn_long_context_5"
    code, _, err = run_cli(monkeypatch, capsys, "eval", "--policy", "oracle:faults=0.6,seed=2", "--tasks", ids, "--out", str(tmp_path / "run"))
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "export-bfcl", str(tmp_path / "run"), "--out", str(tmp_path / "export"))
    assert code == 0, err
    utils, config = import_bfcl("utils"), import_bfcl("constants.eval_config")
    model_dir = tmp_path / "export" / "Qwen_Qwen3-8B-FC"  # what `bfcl evaluate` turns back into Qwen/Qwen3-8B-FC
    files = sorted(model_dir.rglob(config.RESULT_FILE_PATTERN))  # how the official runner finds them
    assert [utils.extract_test_category(f) for f in files] == ["multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param"]
    records = {r["task_id"]: r for r in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().split("\n")[:-1])}
    for path in files:
        for entry in utils.load_file(path, sort_by_id=True):  # the official reader
            task = task_set.get(entry["id"])
            assert all(isinstance(step, str) for turn in entry["result"] for step in turn)
            assert official_verdict(task, entry["result"], "hermes")["valid"] == (records[entry["id"]]["reward"] == 1.0)
    supported = import_bfcl("constants.supported_models").SUPPORTED_MODELS
    assert "Qwen/Qwen3-8B-FC" in supported and "Qwen/Qwen3-8B" in supported
    assert not list((tmp_path / "export").rglob("*.partial"))


def test_export_names_bfcls_file_pattern():
    pattern = import_bfcl("constants.eval_config").RESULT_FILE_PATTERN
    assert fnmatch.fnmatch("BFCL_v4_multi_turn_base_result.json", pattern)
