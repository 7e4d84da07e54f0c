"""`seal preflight`: its verdicts on hand-made rounds (all-equal rewards fail, a spread passes, a format cost
above the threshold warns, ground truths that do not fit fail or warn, a recipe that does not fit fails), and the
whole command on the tiny model (one real round, no update)."""

import json
import sys

import pytest

from seal_rl import cli
from seal_rl.budgets import BudgetCount, CategoryCount
from seal_rl.fit import Machine, check_fit
from seal_rl.preflight import Thresholds, budget_check, fit_check, format_check, group_spreads, spread_check, worst
from seal_rl.train import load_recipe


def episode(task, sample, reward, progress, *, end="finished", turns=(), messages=2, accepted=2):
    """A finished episode's record with what the checks read: rewards, end reason, turn checks, messages, trace."""
    return {
        "task_id": task, "sample": sample, "category": "base", "reward": reward, "progress": progress, "end_reason": end,
        "num_turns": len(turns) or 1,
        "verdict": {"turns": [{"turn": k, "scorable": True, "reached": True, "failure": not ok} for k, ok in enumerate(turns)]},
        "diagnosis": {"labels": [{"turn": 0, "label": "pass" if reward == 1.0 else "state_mismatch", "evidence": {}}]},
        "messages": [{"role": "user", "content": "q"}] + [{"role": "assistant", "content": "a"}] * messages,
        "trace": [{"step": s, "accepted": True} for s in range(accepted)],
    }  # fmt: skip


def group(task, rewards, progress=None):
    progress = progress or rewards
    return [episode(task, s, r, p) for s, (r, p) in enumerate(zip(rewards, progress, strict=True))]


def test_all_equal_binary_rewards_fail_and_name_the_progress_reward_when_it_has_a_spread():
    records = group("t1", [0.0] * 4, [0.0, 0.5, 0.5, 0.0]) + group("t2", [0.0] * 4, [0.25] * 4)
    assert group_spreads(records, "binary") == (0, 2) and group_spreads(records, "progress") == (1, 2)
    check = spread_check(records, "binary")
    assert check.verdict == "fail"
    assert "binary reward: 0 of 2 groups have a spread; progress: 1 of 2" in check.number
    assert "--set reward=progress" in check.advice and "would update nothing" in check.advice


def test_no_spread_under_either_reward_fails_with_other_advice():
    check = spread_check(group("t1", [0.0] * 4) + group("t2", [0.0] * 4), "progress")
    assert check.verdict == "fail" and "reward=" not in check.advice and "warm_start.data" in check.advice
    easy = spread_check(group("t1", [1.0] * 4), "binary")
    assert easy.verdict == "fail" and "too easy" in easy.advice


def test_a_spread_passes_and_a_thin_one_warns():
    varied = group("t1", [1.0, 0.0, 0.0, 0.0]) + group("t2", [1.0, 1.0, 0.0, 0.0])
    assert spread_check(varied, "binary").verdict == "ok"
    thin = group("t1", [1.0, 0.0]) + [e for k in range(2, 6) for e in group(f"t{k}", [0.0, 0.0])]  # 1 of 5 groups
    check = spread_check(thin, "binary", thresholds=Thresholds(spread=0.25))
    assert check.verdict == "warn" and "fewer than 25%" in check.advice
    assert spread_check(thin, "binary", thresholds=Thresholds(spread=0.2)).verdict == "ok"


def test_turn_credit_with_varied_anchors_but_no_group_spread_warns():
    records = [episode("t1", s, 0.0, 0.5, turns=t) for s, t in enumerate([(True, False), (False, False)])]
    assert spread_check(records, "binary").verdict == "fail"  # episode credit: nothing to learn
    check = spread_check(records, "binary", credit="turn")
    assert check.verdict == "warn" and "turn anchors varied: 1 of 2" in check.number
    assert spread_check(records, "binary", credit="turn", credit_weight=0.0).verdict == "fail"


def test_a_format_cost_above_the_threshold_warns_and_pairs_by_task_and_sample():
    base = [episode("t1", s, 0.0, 0.0) for s in range(4)] + [episode("t2", s, 0.0, 0.0) for s in range(4)]
    shown = [episode("t1", s, 0.0, 0.0, end="completion_budget" if s < 2 else "finished") for s in range(4)]
    shown += [episode("t2", s, 0.0, 0.0) for s in range(4)]
    check, details = format_check(base, shown, ["format_note"])
    assert check.verdict == "warn" and "base 0/8, interface 2/8 (+25%" in check.number and "max_completion_tokens" in check.advice
    assert details["completion_budget_paired"]["pairs"] == 8 and details["completion_budget_paired"]["only_interface"] == 2
    assert format_check(base, shown, ["format_note"], thresholds=Thresholds(format_cost=0.3))[0].verdict == "ok"
    fewer_calls = [episode("t1", s, 0.0, 0.0, accepted=1) for s in range(4)] + [episode("t2", s, 0.0, 0.0, accepted=1) for s in range(4)]
    check, details = format_check(base, fewer_calls, ["parse_hints"])
    assert check.verdict == "warn" and "100% → 50% of messages" in check.number
    assert details["interface"]["accepted_share"] == 0.5
    assert format_check(base, base, ["tool_list"])[0].verdict == "ok"


def test_ground_truths_that_do_not_fit_fail_when_none_does_and_warn_when_few_do():
    def count(within):
        return BudgetCount({"base": CategoryCount(tasks=4, within=within, ended_by={"completion_budget": 4 - within})}, 0.1)

    assert budget_check(count(0)).verdict == "fail"
    few = budget_check(count(2))
    assert few.verdict == "warn" and "base" in few.advice and "base 2/4" in few.number
    assert budget_check(count(4)).verdict == "ok"


def test_a_recipe_that_does_not_fit_fails_and_names_the_change():
    recipe = load_recipe("smoke-cpu")
    assert fit_check(check_fit(recipe, Machine.cpu(64.0))).verdict == "ok"
    small = fit_check(check_fit(recipe, Machine.cpu(0.01)))
    assert small.verdict == "fail" and "GiB" in small.number and "--force" in small.advice
    assert fit_check("an unknown architecture").verdict == "warn"
    assert worst([fit_check(check_fit(recipe, Machine.cpu(64.0))), small]) == "fail" and worst([]) == "ok"


def run_cli(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["seal", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_preflight_plays_one_round_of_the_tiny_model_and_fails_a_round_without_spread(monkeypatch, capsys, tmp_path):
    """The smoke recipe's random tiny model solves nothing: every group's rewards are equal, so the
    preflight fails (exit 1); the interface its labels switch on is played on the same episodes."""
    out = tmp_path / "pre"
    code, stdout, stderr = run_cli(monkeypatch, capsys, "preflight", "smoke-cpu", "--out", str(out), "--json")
    report = json.loads(stdout)
    assert code == 1 and report["verdict"] == "fail"
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == {"memory", "ground truths within budgets", "reward spread", "interface format cost"}
    assert checks["reward spread"]["verdict"] == "fail" and "0 of 4 groups" in checks["reward spread"]["number"]
    assert checks["memory"]["verdict"] == "ok"
    first = [json.loads(line) for line in (out / "round_1.jsonl").read_text().splitlines()]
    assert len(first) == 8 and sorted({r["task_id"] for r in first}) == sorted(report["tasks"])
    assert all(r["reward"] == 0.0 for r in first) and sum(report["end_reasons"].values()) == 8
    assert json.loads((out / "preflight.json").read_text()) == report
    # the random model's labels put pressure on: the next round's interface was played on the same episodes, paired
    assert report["interface"]["round_1"] == [] and report["interface"]["round_2"]
    shown = [json.loads(line) for line in (out / "interface.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["sample"]) for r in shown] == [(r["task_id"], r["sample"]) for r in first]
    assert report["format"]["completion_budget_paired"]["pairs"] == 8
    assert all(s["messages"][0]["content"].startswith(f["messages"][0]["content"]) for s, f in zip(shown, first, strict=True))
    code, stdout, _ = run_cli(monkeypatch, capsys, "preflight", "smoke-cpu", "--out", str(out), "--tasks", "1", "--samples", "1",
                              "--set", "interface.preset=vanilla")  # fmt: skip
    assert code == 1 and "reward spread" in stdout and "verdict: fail" in stdout and "nothing to compare" in stdout


@pytest.mark.parametrize("args, message", [
    (["--backend", "tpu"], "Unknown --backend 'tpu'"),
    (["--spread-warn", "2"], "--spread-warn is a share between 0 and 1"),
    (["--tasks", "99"], "--tasks must be 1..4"),
    (["--set", "grpo.colour=red"], "colour"),
])  # fmt: skip
def test_bad_input_is_one_line_and_nothing_starts(monkeypatch, capsys, tmp_path, args, message):
    code, stdout, stderr = run_cli(monkeypatch, capsys, "preflight", "smoke-cpu", "--out", str(tmp_path / "p"), *args)
    assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p" / "preflight.json").exists()
