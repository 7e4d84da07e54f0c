import random

import pytest

from seal_rl.differential import official_check, official_failure, perturbed_steps
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.tools import ToolCall
from seal_rl.verify import ground_truth_calls, parse_ground_truth_call, turn_local_passes, verify
from tests.helpers import ground_truth_steps, play_steps

SAMPLE_PER_CATEGORY = 75  # 300 perturbed transcripts here; benchmarks/differential.py runs 5,000+


def test_ground_truth_scores_800_of_800(task_set):
    verdicts = {t.id: verify(t, ground_truth_steps(ground_truth_calls(t))) for t in task_set}
    assert [i for i, v in verdicts.items() if v.reward != 1.0] == []
    assert [i for i, v in verdicts.items() if v.progress != 1.0] == []  # every turn passed: full progress


def test_progress_is_the_share_of_scorable_turns_passed(task_set):
    """Environment Tuning's progress reward on hand-made transcripts of multi_turn_base_0 (4 user
    turns, each with ground-truth calls): where binary gives 0, progress counts the turns passed."""
    task = task_set.get("multi_turn_base_0")
    assert task.num_turns == 4 and all(task.ground_truth)
    truth = ground_truth_steps(ground_truth_calls(task))
    last_in_text = verify(task, [*truth[:3], []])  # the last turn answered in text only
    assert (last_in_text.reward, last_in_text.progress) == (0.0, 0.75)
    cut = verify(task, truth[:2], turns_reached=2)  # ended after two turns
    assert (cut.reward, cut.progress) == (0.0, 0.5)
    first_in_text = verify(task, [[], *truth[1:]])  # without turn 0's mkdir/mv no later state matches again
    assert (first_in_text.reward, first_in_text.progress) == (0.0, 0.0)
    abstain = task_set.get("multi_turn_base_167")  # its last turn's ground truth is to abstain: not scored
    steps = ground_truth_steps(ground_truth_calls(abstain))
    scorable = sum(1 for turn in abstain.ground_truth if turn)
    assert verify(abstain, [*steps[:-2], [], steps[-1]]).progress == (scorable - 1) / scorable


def test_ground_truth_positional_arguments_are_bound_by_signature(task_set):
    task = task_set.get("multi_turn_miss_func_0")
    call = parse_ground_truth_call("sort('final_report.pdf')", task.involved_classes)
    assert call == ToolCall("sort", {"file_name": "final_report.pdf"})


def _first_failure(verdict):
    first = verdict.first_failure
    return None if first is None else (first.turn, first.failure)


@pytest.mark.parametrize("category", ["base", "miss_func", "miss_param", "long_context"])
def test_reward_and_first_failure_equal_the_official_checker_on_perturbed_transcripts(task_set, category):
    rng = random.Random(f"differential:{category}")
    env = BfclEnv(EnvConfig(max_model_calls=200))
    pool = [t for t in task_set if t.category == category]
    outcomes = {True: 0, False: 0}
    for _ in range(SAMPLE_PER_CATEGORY):
        task = rng.choice(pool)
        play_steps(env, task, perturbed_steps(task, ground_truth_calls(task), rng))
        assert env.end_reason == "completed"
        official = official_check(task, env.calls_by_turn)
        assert env.verdict.reward == float(official["valid"]), task.id
        assert _first_failure(env.verdict) == official_failure(official), task.id
        # progress: every scorable turn before the official first failure passed; all of them when valid
        scorable = [t for t in range(task.num_turns) if task.ground_truth[t]]
        first = official_failure(official)
        before = len([t for t in scorable if first is None or t < first[0]])
        assert before / len(scorable) <= env.verdict.progress <= (1.0 if first is None else (len(scorable) - 1) / len(scorable))
        assert (env.verdict.progress == 1.0) == bool(official["valid"]), task.id
        outcomes[bool(official["valid"])] += 1
    assert outcomes[True] > 0 and outcomes[False] > 0, outcomes  # both verdicts were exercised


def test_every_turn_is_checked_after_the_first_failure(task_set):
    task = task_set.get("multi_turn_base_0")
    steps = ground_truth_steps(ground_truth_calls(task))
    steps[0] = []  # turn 0 answered in text only
    verdict = verify(task, steps)
    assert verdict.reward == 0.0 and verdict.first_failure.turn == 0
    assert verdict.turns[0].failure == "empty_turn_model_response"
    assert len(verdict.turns) == task.num_turns
    # Later turns are still checked, on the state the model actually produced: without turn 0's
    # mkdir/mv, the file system never matches the ground truth's again.
    assert [t.has_calls for t in verdict.turns] == [False, True, True, True]
    assert [t.failure for t in verdict.turns[1:]] == ["instance_state_mismatch"] * 3
    assert all(t.state_differences[0].attribute == "root" for t in verdict.turns[1:])


def test_the_turn_local_check_scores_later_turns_where_the_model_stood(task_set):
    """The case above: turn 0 answered in text, turns 1-3 the ground truth's calls. Officially every
    later turn inherits the missing mkdir/mv; turn-locally each made the right calls on its own state."""
    task = task_set.get("multi_turn_base_0")
    steps = ground_truth_steps(ground_truth_calls(task))
    steps[0] = []
    assert [t.passed for t in verify(task, steps).turns] == [False] * 4
    assert turn_local_passes(task, steps) == (False, True, True, True)
    steps[2] = [[ToolCall("mkdir", {"dir_name": "surprise"}), *steps[2][0]]]  # a wrong call of turn 2's own
    assert turn_local_passes(task, steps) == (False, True, False, True)


def _flat(turn_steps) -> list:
    return [call for step in turn_steps for call in step]


def test_the_turn_local_check_is_the_official_one_after_a_ground_truth_history(task_set):
    """Differential against verify() on perturbed transcripts: wherever the turns before k executed
    exactly the ground truth's calls, both checks see the same state and give turn k the same verdict;
    a turn that makes the ground truth's calls passes turn-locally whatever came before (the backends
    are deterministic), though officially it may fail."""
    rng = random.Random("turn-local")
    pool = [t for t in task_set if t.category != "long_context"]
    agreed, inherited = {True: 0, False: 0}, 0
    for _ in range(150):
        task = rng.choice(pool)
        truth = ground_truth_calls(task)
        steps = perturbed_steps(task, truth, rng)
        k = rng.randrange(task.num_turns)
        steps[k] = [list(truth[k])] if truth[k] else steps[k]  # turn k: the ground truth's calls
        official, local = verify(task, steps).turns, turn_local_passes(task, steps)
        assert len(local) == task.num_turns
        for turn, check in enumerate(official):
            if not check.scorable:
                assert local[turn] is None
            elif all(_flat(steps[t]) == list(truth[t]) for t in range(turn)):
                assert local[turn] == check.passed, (task.id, turn)
                agreed[check.passed] += 1
        if truth[k]:
            assert local[k] is True, (task.id, k)
            inherited += not official[k].passed
    assert min(agreed.values()) > 20 and inherited > 10, (agreed, inherited)  # both verdicts, and inherited failures, occurred


def test_state_differences_name_class_and_attribute(task_set):
    task = task_set.get("multi_turn_base_0")
    steps = ground_truth_steps(ground_truth_calls(task))
    first_call = steps[0][0][0]
    steps[0][0] = [ToolCall("mkdir", {"dir_name": "surprise"})] + steps[0][0]
    verdict = verify(task, steps)
    difference = verdict.turns[0].state_differences[0]
    assert (difference.class_name, difference.attribute) == ("GorillaFileSystem", "root")
    assert verdict.turns[0].failure == "instance_state_mismatch", first_call


def test_unreached_turns_fail_even_when_the_checker_would_skip_them(task_set):
    task = task_set.get("multi_turn_base_167")  # its last turn's ground truth is to abstain
    steps = ground_truth_steps(ground_truth_calls(task))[:-1]
    assert task.ground_truth[-1] == ()
    complete = verify(task, steps)
    cut = verify(task, steps, turns_reached=task.num_turns - 1)
    assert complete.reward == 1.0
    assert cut.reward == 0.0 and cut.error_type == "force_terminated" and not cut.turns[-1].reached


def test_verification_is_deterministic_and_leaves_nothing_behind(task_set):
    rng = random.Random(7)
    picked = [t for t in task_set if t.long_context][:20]
    transcripts = [(t, perturbed_steps(t, ground_truth_calls(t), rng)) for t in picked]
    first = [verify(t, s).to_json() for t, s in transcripts]
    second = [verify(t, s).to_json() for t, s in reversed(transcripts)][::-1]
    assert first == second


def test_episode_order_does_not_change_any_result(task_set):
    # Backends are private per episode: playing tasks in another order changes nothing.
    rng = random.Random(3)
    picked = rng.sample([t for t in task_set if t.category in ("long_context", "base")], 24)
    transcripts = [(t, perturbed_steps(t, ground_truth_calls(t), rng)) for t in picked]

    def run(order):
        env = BfclEnv(EnvConfig(max_model_calls=200))
        out = {}
        for i in order:
            task, steps = transcripts[i]
            play_steps(env, task, steps)
            out[i] = (env.messages, env.verdict.to_json())
        return out

    assert run(range(len(transcripts))) == run(reversed(range(len(transcripts))))
