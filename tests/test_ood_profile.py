"""The failure profile of OOD runs (seal_rl.ood.profile; issue 58), on hand-built episodes, and
`seal diagnose` / `seal compare` on OOD run directories."""

import json

from seal_rl.ood.profile import comparable, memory_label, ood_benchmark, ood_profile, tau2_labels
from tests.test_cli import run_cli


def _action(name, **arguments):
    return {"action_id": name, "name": name, "arguments": arguments, "requestor": "assistant"}


def _tau2_record(task_id="0", trial=0, success=False):
    """A retail conversation: the agent looked the user up, tried a wrong tool, cancelled with the
    wrong reason, never refunded, and did not say the refund amount."""
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "name": "find_user_id_by_email", "arguments": {"email": "a@b.c"}}]},
        {"role": "tool", "id": "1", "content": '"user_1"', "requestor": "assistant", "error": False},
        {"role": "assistant", "content": "<tool_call>{broken", "raw_data": {"provider_specific_fields": {"seal": {"raw": "x", "parse_error": "invalid JSON"}}}},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "2", "name": "delete_everything", "arguments": {}}]},
        {"role": "tool", "id": "2", "content": "Error: Tool 'delete_everything' not found.", "requestor": "assistant", "error": True},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "3", "name": "cancel_pending_order", "arguments": {"order_id": "#W1", "reason": "other"}}]},
        {"role": "tool", "id": "3", "content": "Error: cancel_pending_order() got an unexpected keyword argument 'x'", "requestor": "assistant", "error": True},
        {"role": "tool", "id": "4", "content": "Error: no phone", "requestor": "user", "error": True},  # the user's own tool
    ]
    reward_info = {
        "reward": 1.0 if success else 0.0,
        "action_checks": [
            {"action": _action("find_user_id_by_email", email="a@b.c"), "action_match": True, "action_reward": 1.0},
            {"action": _action("cancel_pending_order", order_id="#W1", reason="no longer needed"), "action_match": False, "action_reward": 0.0},
            {"action": _action("refund", order_id="#W1"), "action_match": False, "action_reward": 0.0},
        ],
        "communicate_checks": [{"info": "54.04", "met": False, "justification": ""}, {"info": "#W1", "met": True, "justification": ""}],
    }
    return {"index": 1, "benchmark": "tau2-retail", "task_id": task_id, "trial": trial, "reward": reward_info["reward"],
            "success": success, "termination_reason": "too_many_errors", "simulation": {"messages": messages, "reward_info": reward_info}}


def test_tau2_labels_follow_taus_own_checks():
    labels = [item["label"] for item in tau2_labels(_tau2_record())]
    assert labels == ["pass", "argument_mismatch", "missing_tool_call", "response_mismatch", "pass"]
    profile = ood_profile([_tau2_record(), {**_tau2_record(task_id="1"), "error": "server down"}], "tau2-retail")
    assert profile["episodes"] == 1  # a generation error is left out
    assert profile["labels"] == {"pass": 2, "argument_mismatch": 1, "missing_tool_call": 1, "response_mismatch": 1}
    assert profile["calls"] == {"unparsable": 1, "unknown_tool": 1, "invalid_arguments": 1, "tool_error": 0}  # the user's tool error is not the agent's
    assert profile["endings"] == {"too_many_errors": 1}
    assert profile["top_evidence"]["response_mismatch"] == [("54.04", 1)]


def _trace(*entries):
    keys = ("turn", "step", "name", "arguments", "accepted", "result", "error_kind", "error")
    return [dict(zip(keys, (0, step, *entry))) for step, entry in enumerate(entries)]


def _memory_record(reward=0.0, trace=(), error_type="agentic:answer_not_found"):
    return {"task_id": "memory_kv_0-customer-0", "category": "memory_kv", "reward": reward, "prereq": False, "end_reason": "completed",
            "trace": _trace(*trace), "verdict": {"answer": "Bob", "error_type": None if reward else error_type}}


def test_memory_labels_take_the_first_match_in_psis_order():
    ok = ("core_memory_retrieve", {"key": "name"}, True, '{"value": "Michael"}', None, None)
    unknown = ("rm", {}, True, "Error during execution: name 'rm' is not defined", "execution", "name 'rm' is not defined")
    schema = ("core_memory_add", {"key": 1}, True, "{}", "schema", "key: expected a string")
    failed = ("core_memory_retrieve", {"key": "x"}, True, '{"error": "Key not found."}', "execution", "Key not found.")
    parse = (None, None, False, None, "parse", "unclosed <tool_call>")
    cases = [
        (_memory_record(1.0, [failed]), "pass"),
        (_memory_record(0.0, [ok, unknown, schema]), "invalid_tool_call"),
        (_memory_record(0.0, [parse]), "invalid_tool_call"),
        (_memory_record(0.0, [ok, schema, failed]), "argument_mismatch"),
        (_memory_record(0.0, []), "missing_tool_call"),
        (_memory_record(0.0, [ok, failed]), "recovery_failure"),
        (_memory_record(0.0, [ok]), "response_mismatch"),
        (_memory_record(0.0, [ok], error_type="agentic:no_last_message"), "response_mismatch"),
    ]
    for record, label in cases:
        assert memory_label(record)["label"] == label, (record["trace"], label)
    profile = ood_profile([record for record, _ in cases] + [{"prereq": True, "trace": []}], "bfcl-memory")
    assert profile["episodes"] == len(cases)  # the prerequisite is not a question
    assert profile["calls"] == {"unparsable": 1, "unknown_tool": 1, "invalid_arguments": 2, "tool_error": 3}


def test_seal_diagnose_and_compare_read_ood_runs(monkeypatch, capsys, tmp_path):
    for name, successes in (("a", (True, False, False)), ("b", (True, True, True))):
        run = tmp_path / name
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"benchmark": "tau2-retail"}))
        records = [_tau2_record(task_id=str(i), success=s) for i, s in enumerate(successes)]
        (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert ood_benchmark(tmp_path / "a") == "tau2-retail" and ood_benchmark(tmp_path) is None
    code, out, err = run_cli(monkeypatch, capsys, "diagnose", str(tmp_path / "a"), "--json")
    assert code == 0, err
    profile = json.loads(out)
    assert profile["episodes"] == 3 and profile["labels"]["missing_tool_call"] == 3
    code, out, err = run_cli(monkeypatch, capsys, "diagnose", str(tmp_path / "a"))
    assert code == 0 and "argument_mismatch" in out and "too_many_errors 3" in out, err
    code, out, err = run_cli(monkeypatch, capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert code == 0, err
    overall = json.loads(out)["overall"]
    assert (overall["pairs"], overall["rate_a"], overall["rate_b"], overall["only_b"]) == (3, 1 / 3, 1.0, 2)
    assert [r["sample"] for r in comparable([_tau2_record(trial=2)], "tau2-retail")] == [2]  # paired by task and trial
    code, _, err = run_cli(monkeypatch, capsys, "diagnose", str(tmp_path / "a"), "--round", "1")
    assert code == 2 and "not to OOD runs" in err


def test_seal_report_writes_an_ood_page_with_hostile_text_escaped(monkeypatch, capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"benchmark": "tau2-retail"}))
    record = _tau2_record()
    record["simulation"]["messages"].append({"role": "assistant", "content": "<script>alert(1)</script>\ud800"})
    (run / "results.jsonl").write_text(json.dumps(record) + "\n")
    (run / "summary.json").write_text(json.dumps({"policy": "hf:x", "avg_reward": 0.0, "success_rate": 0.0, "conversations": 1}))
    code, out, err = run_cli(monkeypatch, capsys, "report", str(run))
    assert code == 0, err
    html = (run / "report.html").read_text(errors="backslashreplace")
    assert "&lt;script&gt;alert(1)" in html and "<script>alert(1)" not in html
    assert "missing_tool_call" in html and "too_many_errors" in html and "cancel_pending_order" in html
