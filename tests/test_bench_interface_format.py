"""benchmarks/bench_interface_format.py end to end on the tiny model (hf backend, 2 tasks x 2 samples): both arms
play the same episodes with the same seed, and only the interface arm's system prompt shows the interface."""

import json

import pytest

from benchmarks.bench_interface_format import alone, main, measures
from seal_rl.errors import SealError
from seal_rl.interface import GUIDELINES, InterfaceState, format_note

USED = {"preset": "seal", "schema_tools": [], "schema_types": False, "format_note": True, "parse_hints": True,
        "tool_hints": False, "guidelines": ["active_respond", "cautious_call"], "tool_list": True,
        "pressure": ["invalid_tool_call", "missing_tool_call"], "round": 1}  # fmt: skip
"""the `used` interface of the study's seal-dense seed 2, round 2 (its interface/step_2.json)"""


def step_file(tmp_path, used=USED):
    path = tmp_path / "step_2.json"
    path.write_text(json.dumps({"used": used, "next": {**USED, "round": 2}, "changes": {"round": [1, 2]}}))
    return path


def test_both_arms_play_the_same_episodes_and_only_the_interface_arm_shows_it(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    summary = main(["--model", str(tiny_model_dir), "--interface", str(step_file(tmp_path)), "--policy-backend", "hf",
                    "--tasks", "2", "--samples", "2", "--out", str(out)])  # fmt: skip
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    vanilla, interface = summary["arms"]["vanilla"], summary["arms"]["interface"]
    assert len(summary["tasks"]) == 2 and vanilla["played"] == interface["played"]
    assert [e[1:] for e in vanilla["played"]] == [[t, s] for t in summary["tasks"] for s in (0, 1)]
    assert vanilla["seed"] == interface["seed"] and vanilla["components"] == [] and "tool_list" in interface["components"]
    records = {arm: [json.loads(line) for line in (out / f"{arm}.jsonl").read_text().splitlines()] for arm in ("vanilla", "interface")}
    assert [r["task_id"] for r in records["vanilla"]] == [r["task_id"] for r in records["interface"]] == [e[1] for e in vanilla["played"]]
    for arm in ("vanilla", "interface"):
        assert summary["arms"][arm]["episodes"] == len(records[arm]) == 4
        assert summary["arms"][arm]["messages"] == sum(m["role"] == "assistant" for r in records[arm] for m in r["messages"])
    notes = (format_note("hermes", marked=False), GUIDELINES["active_respond"], GUIDELINES["cautious_call"], "Available tools: ")
    for plain, shown in zip(records["vanilla"], records["interface"], strict=True):
        base, system = plain["messages"][0]["content"], shown["messages"][0]["content"]
        assert plain["messages"][0]["role"] == shown["messages"][0]["role"] == "system"
        assert system.startswith(base) and all(note in system and note not in base for note in notes)
    printed = capsys.readouterr().out
    assert "unclosed <tool_call>" in printed and printed.rstrip().splitlines()[-1].startswith("ended on the completion budget")


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{not json", "not readable JSON"),
    (json.dumps({"used": {**USED, "colour": "red"}}), "holds no interface state"),
    (json.dumps([1, 2]), "holds no interface state"),
    (json.dumps({"used": {"preset": "seal"}, "next": USED}), "no component on"),
])  # fmt: skip
def test_a_bad_interface_file_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "step_1.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SealError, match=message):
        main(["--model", str(tmp_path), "--interface", str(path), "--policy-backend", "hf"])


def test_a_missing_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(SealError, match="needs a local model directory"):
        main(["--model", str(tmp_path / "nowhere"), "--interface", str(step_file(tmp_path)), "--policy-backend", "hf"])


def test_each_component_alone_is_that_component_and_nothing_else():
    state = InterfaceState.from_json({**USED, "schema_tools": ["*"], "schema_types": True, "tool_hints": True})
    for component in state.active_components:
        assert alone(state, component).active_components == [component]


def test_each_component_plays_its_own_arm_with_only_its_note(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    summary = main(["--model", str(tiny_model_dir), "--interface", str(step_file(tmp_path)), "--policy-backend", "hf",
                    "--tasks", "1", "--samples", "1", "--each-component", "--out", str(out)])  # fmt: skip
    components = InterfaceState.from_json(USED).active_components
    assert list(summary["arms"]) == ["vanilla", "interface", *components]
    assert set(summary["components_paired"]) == set(components)
    notes = {"format_note": format_note("hermes", marked=False), "tool_list": "Available tools: ",
             **{f"guideline:{g}": GUIDELINES[g] for g in USED["guidelines"]}}  # fmt: skip
    for arm in components:
        assert summary["arms"][arm]["components"] == [arm]
        system = json.loads((out / f"{arm}.jsonl").read_text().splitlines()[0])["messages"][0]["content"]
        assert [name for name, note in notes.items() if note in system] == ([arm] if arm in notes else [])
    printed = capsys.readouterr().out.rstrip().splitlines()
    assert printed[-1].startswith("ended on the completion budget, interface - vanilla")


def _record(end_reason, answers, accepted_steps, labels):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    messages += [{"role": "assistant", "content": text} for text in answers]
    trace = [{"step": step, "accepted": accepted} for step, accepted in accepted_steps]
    return {"end_reason": end_reason, "messages": messages, "trace": trace,
            "diagnosis": {"labels": [{"turn": i, "label": label} for i, label in enumerate(labels)]}}  # fmt: skip


def test_measures_counts_what_hand_built_episodes_did():
    records = [
        _record("completion_budget",
                ['<tool_call>{"name": "a"}</tool_call>', '<tool_call>{"name": "a"}', "<think><tool_call></think>done"],
                [(0, True), (0, True), (1, False)], ["pass", "invalid_tool_call"]),
        _record("done", ['<tool_call>x</tool_call><tool_call>y', "ok"], [(0, False)],
                ["correct_abstention", "not_reached", "not_reached"]),
    ]  # fmt: skip
    m = measures(records)
    assert (m["episodes"], m["completion_budget"], m["messages"], m["accepted_calls"]) == (2, 1, 5, 1)
    assert m["unclosed_tool_call"] == 2  # a tag opened in the reasoning only does not count
    assert (m["turns"], m["turns_passed"]) == (5, 2)
    assert m["labels"]["not_reached"]["turns"] == 2 and m["labels"]["not_reached"]["share"] == pytest.approx(0.4)
    assert m["labels"]["invalid_tool_call"]["turns"] == 1 and m["labels"]["missing_tool_call"]["turns"] == 0
    low, high = m["completion_budget_ci95"]
    assert 0 < low < 0.5 < high < 1
