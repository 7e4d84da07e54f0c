from collections import Counter

import pytest

from seal_rl.env import BfclEnv
from seal_rl.evaluate import play
from seal_rl.faults import FAULT_TYPES, UNKNOWN_ARGUMENT, oracle_transcript
from seal_rl.policies import OraclePolicy
from seal_rl.tools import get_format
from seal_rl.verify import ground_truth_calls


@pytest.fixture(scope="module")
def faulted_runs(task_set):
    """Every turn faulted, on 240 tasks of all categories: (task, episode record, faults)."""
    tasks = list(task_set)[::10] + list(task_set)[5::10][:160]
    env = BfclEnv()
    runs = []
    for episode in OraclePolicy(faults=1.0, seed=11).episodes(tasks, task_set, "hermes"):
        record = play(env, episode)
        runs.append((episode.task, record, episode.extra["faults"]))
    return runs


def _turn(record, turn):
    return [e for e in record["trace"] if e["turn"] == turn]


def test_every_fault_type_is_injected(faulted_runs):
    seen = Counter(f["type"] for _, _, faults in faulted_runs for f in faults)
    assert set(seen) == set(FAULT_TYPES), seen


def test_each_fault_shows_up_where_it_was_injected(faulted_runs):
    for task, record, faults in faulted_runs:
        truth = ground_truth_calls(task)
        for fault in faults:
            turn, kind, detail = fault["turn"], fault["type"], fault["detail"]
            entries = _turn(record, turn)
            accepted = [e for e in entries if e["accepted"]]
            check = record["verdict"]["turns"][turn]
            where = f"{task.id} turn {turn} {kind}"
            if kind in ("malformed_call", "unknown_tool", "plain_text"):
                assert not accepted and check["failure"] == "empty_turn_model_response", where
                expected = {"malformed_call": {"parse"}, "unknown_tool": {"unknown_tool", None}, "plain_text": set()}[kind]
                assert {e["error_kind"] for e in entries} <= expected, where
                if kind == "unknown_tool":
                    assert detail["replaced_by"] in {e["name"] for e in entries}, where
            elif kind in ("missing_required", "unknown_argument"):
                call = accepted[detail["index"]]
                violation = {"missing_required": (detail.get("argument"), "missing_required"),
                             "unknown_argument": (UNKNOWN_ARGUMENT, "unknown_argument")}[kind]  # fmt: skip
                assert (violation[0], violation[1]) in {(v["argument"], v["kind"]) for v in call["schema_violations"]}, where
                assert call["result"].startswith("Error during execution"), where
            elif kind == "wrong_value":
                assert accepted[detail["index"]]["arguments"][detail["argument"]] == detail["value"], where
            elif kind == "skipped_call":
                if not any(e["error_kind"] == "unknown_tool" for e in entries):  # miss_func_49's early `tail`
                    assert len(accepted) == len(truth[turn]) - 1, where
            elif kind == "call_on_abstain":
                assert truth[turn] == () and accepted and not check["scorable"], where


def test_faults_that_remove_every_call_fail_their_turn_and_the_episode(faulted_runs):
    for task, record, faults in faulted_runs:
        if any(f["type"] in ("malformed_call", "unknown_tool", "plain_text") for f in faults):
            assert record["reward"] == 0.0, task.id


def test_no_faults_is_the_plain_oracle_and_rate_is_respected(task_set):
    fmt = get_format("hermes")
    tasks = list(task_set)
    for task in tasks[::50]:
        messages, faults = oracle_transcript(task, ground_truth_calls(task), fmt, 0.0, seed=3)
        assert faults == [] and len(messages) == sum(2 if turn else 1 for turn in task.ground_truth)
    turns = faulted = 0
    for task in tasks[::4]:
        _, faults = oracle_transcript(task, ground_truth_calls(task), fmt, 0.3, seed=5)
        turns += task.num_turns
        faulted += len(faults)
    assert 0.25 < faulted / turns < 0.35, faulted / turns


def test_a_tasks_faults_do_not_depend_on_other_tasks(task_set):
    fmt = get_format("pythonic")
    a, b = task_set.get("multi_turn_base_3"), task_set.get("multi_turn_long_context_9")
    first = [oracle_transcript(t, ground_truth_calls(t), fmt, 0.5, seed=1) for t in (a, b)]
    second = [oracle_transcript(t, ground_truth_calls(t), fmt, 0.5, seed=1) for t in (b, a)][::-1]
    assert first == second
    by_seed = {
        seed: [oracle_transcript(t, ground_truth_calls(t), fmt, 0.5, seed=seed)[1] for t in list(task_set)[::40]]
        for seed in (1, 2)
    }
    assert by_seed[1] != by_seed[2]


def test_kinds_and_turn_restrict_where_and_which_faults_are_injected(task_set):
    from seal_rl.policies import OraclePolicy, parse_policy

    fmt = get_format("hermes")
    for task in list(task_set)[::25]:
        calls = ground_truth_calls(task)
        _, faults = oracle_transcript(task, calls, fmt, 1.0, seed=2, kinds=("plain_text", "wrong_value"))
        assert {f.type for f in faults} <= {"plain_text", "wrong_value"}
        assert [f.turn for f in faults] == [t for t, c in enumerate(calls) if c]  # abstain turns admit neither kind
        messages, faults = oracle_transcript(task, calls, fmt, 1.0, seed=2, turn=-1)
        assert [f.turn for f in faults] == [len(calls) - 1]
        untouched, _ = oracle_transcript(task, calls, fmt, 0.0)
        prefix = sum(2 if c else 1 for c in calls[:-1])  # the oracle's messages before the last turn
        assert messages[:prefix] == untouched[:prefix]
    policy = parse_policy("oracle:faults=1,seed=3,kinds=plain_text+wrong_value,turn=-1")
    assert policy == OraclePolicy(1.0, 3, ("plain_text", "wrong_value"), -1)
    assert parse_policy(policy.name) == policy
