import copy
import json
import random
from collections import Counter

import pytest

from seal_rl.diagnose import EXCLUDED_LABELS, LABELS, REFERENCE_LABELS, diagnose, reference_labels
from seal_rl.differential import perturbed_steps
from seal_rl.env import BfclEnv, EnvConfig, episode_record
from seal_rl.evaluate import play
from seal_rl.faults import EXPECTED_LABEL
from seal_rl.policies import OraclePolicy
from seal_rl.tools import ToolCall, get_format
from seal_rl.verify import ground_truth_calls
from tests.helpers import ground_truth_steps, play_steps


def _record(env):
    return json.loads(json.dumps(episode_record(env)))  # exactly what results.jsonl holds


@pytest.fixture(scope="module")
def random_records(task_set):
    """Perturbed transcripts under tight budgets, so some episodes are cut short."""
    rng = random.Random(5)
    tasks = list(task_set)
    records = []
    for i in range(240):
        task = rng.choice(tasks)
        env = BfclEnv(EnvConfig(max_model_calls=rng.choice([3, 6, 10, 20, 100])))
        play_steps(env, task, perturbed_steps(task, ground_truth_calls(task), rng))
        records.append(_record(env))
    return records


def test_exactly_one_known_label_per_ground_truth_turn(random_records):
    for record in random_records:
        labels = diagnose(record).labels
        assert [t.turn for t in labels] == list(range(record["num_turns"]))
        assert all(t.label in LABELS for t in labels)
        assert len(reference_labels(record)) == record["num_turns"]
        assert set(reference_labels(record)) <= set(REFERENCE_LABELS)


def test_labels_never_change_the_reward_and_agree_with_it(random_records):
    for record in random_records:
        before = copy.deepcopy(record)
        diagnosis = diagnose(record)
        assert record == before  # Ψ reads, never writes
        failing = [t for t in diagnosis.labels if t.label not in ("pass", "correct_abstention", "spurious_tool_call")]
        assert (record["reward"] == 1.0) == (not failing)


def test_identical_input_gives_identical_labels(random_records):
    for record in random_records[:60]:
        assert diagnose(record) == diagnose(json.loads(json.dumps(record)))


def test_truncated_episodes_label_unreached_turns_not_reached_never_abstention(random_records):
    truncated = [r for r in random_records if r["turns_reached"] < r["num_turns"]]
    assert len(truncated) > 20
    for record in truncated:
        labels = diagnose(record).labels
        for t in labels[record["turns_reached"]:]:
            assert t.label == "not_reached", (record["task_id"], t)
        assert "correct_abstention" not in [t.label for t in labels[record["turns_reached"]:]]


def test_reference_preset_pads_unreached_abstain_turns_like_the_released_code(task_set):
    task = task_set.get("multi_turn_base_167")  # last turn: abstain
    env = BfclEnv()
    play_steps(env, task, ground_truth_steps(ground_truth_calls(task))[:-1])  # never answers the last turn
    record = _record(env)
    assert record["end_reason"] == "transcript_exhausted" and record["reward"] == 0.0
    assert record["verdict"]["error_type"] == "force_terminated"
    assert diagnose(record).labels[-1].label == "not_reached"
    assert reference_labels(record)[-1] == "correct_abstention"


def _play(task_set, task_id, turn_messages):
    """Play per-turn lists of raw messages, ending every turn with plain text."""
    task = task_set.get(task_id)
    env = BfclEnv(EnvConfig(prompt_mode="chat_template"))
    env.reset(task)
    for messages in turn_messages:
        for message in messages:
            env.step(message)
        if not env.done:
            env.step("Done.")
    if not env.done:
        env.truncate("test")
    return _record(env)


def test_each_rule_with_its_evidence(task_set):
    hermes = get_format("hermes")
    truth = ground_truth_calls(task_set.get("multi_turn_base_0"))
    ok = [hermes.render(list(truth[0]))]
    cases = {
        "invalid_tool_call": [['<tool_call>{"name": "cd"'], ],
        "argument_mismatch": [[hermes.render([ToolCall("cd", {"dir": "document"})])]],
        "missing_tool_call": [[]],
        # every needed tool called, but the move fails and is never retried
        "recovery_failure": [[hermes.render([*truth[0][:2], ToolCall("mv", {"source": "nowhere.pdf", "destination": "temp"})])]],
        "state_mismatch": [[hermes.render([*truth[0], ToolCall("touch", {"file_name": "extra.txt"})])]],
        # every needed tool called; the search asks for the wrong pattern, so its output is missing
        "response_mismatch": [ok, [hermes.render([ToolCall("cd", {"folder": "temp"}),
                                                  ToolCall("grep", {"file_name": "final_report.pdf", "pattern": "x"})])]],
        # a needed tool never called, although other calls were made
        "missing_tool_call ": [ok, [hermes.render([ToolCall("cd", {"folder": "temp"})])]],
    }
    for label, turns in cases.items():
        record = _play(task_set, "multi_turn_base_0", turns)
        turn = len(turns) - 1
        got = diagnose(record).labels[turn]
        assert got.label == label.strip(), (label, got)
        evidence = got.evidence
        {
            "invalid_tool_call": lambda: evidence["kind"] == "parse" and "tag" in evidence["error"],
            "argument_mismatch": lambda: evidence["call"] == "cd" and {v["kind"] for v in evidence["violations"]} == {"missing_required", "unknown_argument"},
            "missing_tool_call": lambda: evidence["text"] == "Done.",
            "missing_tool_call ": lambda: evidence["never_called"] == ["grep"],
            "recovery_failure": lambda: "No such file or directory" in evidence["error"],
            "state_mismatch": lambda: evidence["differences"] == [{"class_name": "GorillaFileSystem", "attribute": "root"}],
            "response_mismatch": lambda: evidence["missing"],
        }[label]() or pytest.fail(f"{label}: {evidence}")  # fmt: skip
        assert diagnose(record).labels[-1].label == "not_reached" or len(turns) == 2


def test_abstain_turns(task_set):
    task = task_set.get("multi_turn_miss_param_3")  # turn 1 lacks the folder name
    truth = ground_truth_calls(task)
    hermes = get_format("hermes")
    good = _play(task_set, task.id, [[hermes.render(list(truth[0]))], [], [hermes.render(list(truth[2]))]])
    assert [t.label for t in diagnose(good).labels] == ["pass", "correct_abstention", "pass"]
    eager = _play(task_set, task.id, [[hermes.render(list(truth[0]))], [hermes.render([ToolCall("mkdir", {"dir_name": "backup"})])]])
    spurious = diagnose(eager).labels[1]
    assert spurious.label == "spurious_tool_call" and spurious.evidence["calls"][0]["call"] == "mkdir"


def test_scorer_problems_come_first():
    base = {"num_turns": 2, "turns_reached": 2, "trace": [], "messages": [], "steps": []}
    checks = [
        {"turn": 0, "scorable": True, "has_calls": False, "reached": True, "state_ok": True, "state_differences": [],
         "instances_ok": True, "response_ok": True, "missing_responses": [], "ground_truth_errors": ["Error during execution: x"],
         "failure": "empty_turn_model_response"},
        {"turn": 1, "scorable": False, "has_calls": False, "reached": True, "state_ok": True, "state_differences": [],
         "instances_ok": True, "response_ok": True, "missing_responses": [], "ground_truth_errors": [], "failure": None},
    ]  # fmt: skip
    record = {**base, "verdict": {"checker_error": None, "turns": checks}}
    assert [t.label for t in diagnose(record).labels] == ["gt_error", "correct_abstention"]
    broken = {**base, "verdict": {"checker_error": "RecursionError: boom", "turns": []}}
    assert [t.label for t in diagnose(broken).labels] == ["checker_error", "checker_error"]
    assert reference_labels(broken) == ["checker_error", "checker_error"]


def test_progress_scalars(task_set):
    task = task_set.get("multi_turn_miss_param_3")
    truth = ground_truth_calls(task)
    hermes = get_format("hermes")
    record = _play(task_set, task.id, [[hermes.render(list(truth[0]))], [], []])  # last turn answered in text
    diagnosis = diagnose(record)
    assert [t.label for t in diagnosis.labels] == ["pass", "correct_abstention", "missing_tool_call"]
    assert diagnosis.progress == 1 / 2 and diagnosis.progress_with_abstentions == 2 / 3


def test_a_verifier_crash_becomes_a_checker_error_not_an_exception(task_set, monkeypatch):
    import seal_rl.env as env_module

    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(env_module, "verify", broken)
    env = BfclEnv()
    env.reset(task_set.get("multi_turn_base_0"))
    reward, info = env.truncate("test")
    assert reward == 0.0 and info["verdict"].error_type == "checker_error"
    assert {t.label for t in diagnose(_record(env)).labels} == {"checker_error"}


def test_injected_faults_get_the_label_their_fault_determines(task_set):
    """A sample of the diagnosis benchmark (benchmarks/bench_diagnosis.py runs all 800 tasks)."""
    from seal_rl.faults import determined

    env = BfclEnv()
    hits, totals, untouched = Counter(), Counter(), Counter()
    for episode in OraclePolicy(faults=0.3, seed=2).episodes(list(task_set)[::4], task_set, "hermes"):
        labels = [t["label"] for t in play(env, episode)["diagnosis"]["labels"]]
        faults = determined(episode.extra["faults"])
        for fault in faults:
            if fault["type"] in EXPECTED_LABEL:
                totals[fault["type"]] += 1
                hits[fault["type"]] += labels[fault["turn"]] == EXPECTED_LABEL[fault["type"]]
        first = min((f["turn"] for f in episode.extra["faults"]), default=len(labels))
        untouched.update(labels[:first])
    assert set(totals) == set(EXPECTED_LABEL)
    assert sum(hits.values()) / sum(totals.values()) >= 0.95, (hits, totals)
    assert hits["retry_after_error"] == totals["retry_after_error"] > 0  # a recovered error is never blamed
    assert set(untouched) <= {"pass", "correct_abstention", "invalid_tool_call"}
    assert untouched["pass"] > 0.95 * (untouched["pass"] + untouched["invalid_tool_call"])


def test_precision_and_recall_per_label_on_determined_faults(task_set):
    """Given labels are right as well as expected labels found: per label, over turns whose label
    a fault determines (benchmarks/bench_diagnosis.py reports the full table on all 800 tasks)."""
    from seal_rl.faults import determined, expected_label, precision_recall

    env = BfclEnv()
    pairs = []
    for episode in OraclePolicy(faults=0.3, seed=5).episodes(list(task_set)[1::4], task_set, "hermes"):
        record = play(env, episode)
        labels = [t["label"] for t in record["diagnosis"]["labels"]]
        pairs += [(e, labels[f["turn"]]) for f in determined(episode.extra["faults"]) if (e := expected_label(f, record))]
    scores = precision_recall(pairs)
    assert set(scores) >= {"invalid_tool_call", "argument_mismatch", "missing_tool_call", "spurious_tool_call", "pass"}
    for label, (precision, recall, n) in scores.items():
        assert precision >= 0.95 and recall >= 0.95, (label, precision, recall, n)
    assert precision_recall([("a", "a"), ("a", "b"), ("b", "b")]) == {"a": (1.0, 0.5, 2), "b": (0.5, 1.0, 1)}


def test_scorer_and_reach_problems_count_in_no_progress_and_no_weight(random_records):
    from seal_rl.apatch import ApatchConfig, trajectory_weight
    from seal_rl.diagnose import TurnLabel, _with_progress

    record = next(r for r in random_records if r["turns_reached"] < r["num_turns"] and "pass" in
                  [t.label for t in diagnose(r).labels])  # fmt: skip
    labels = diagnose(record).labels
    unreached = [t for t in labels if t.label == "not_reached"]
    reached = tuple(t for t in labels if t.label != "not_reached")
    assert unreached and _with_progress(labels).progress == _with_progress(reached).progress > 0
    scorer = (*reached, TurnLabel(99, "gt_error"), TurnLabel(98, "checker_error"))
    assert _with_progress(scorer).progress == _with_progress(reached).progress
    config = ApatchConfig(preset="seal")
    weight = lambda names: trajectory_weight(names, config.base_utility, w_min=0.5, w_max=2.0, excluded=config.excluded)  # noqa: E731
    names = [t.label for t in reached]
    assert weight(names + ["not_reached", "gt_error", "checker_error"]) == weight(names)
    assert EXCLUDED_LABELS <= config.excluded


def test_a_single_turn_task_answered_in_text_is_reached(task_set):
    task = next(t for t in task_set if t.num_turns == 1)
    record = _play(task_set, task.id, [[]])
    assert record["end_reason"] == "completed" and record["turns_reached"] == 1
    assert [t.label for t in diagnose(record).labels] == ["missing_tool_call"]



def test_a_failure_carried_over_from_an_earlier_turn_is_inherited_not_blamed_again(task_set):
    """multi_turn_base_0: turn 0 forgets to move the report into temp/; turn 1's own calls (cd temp,
    grep the report) are exactly the ground truth's, but they fail on the state turn 0 left."""
    from seal_rl.profile import EpisodeLabels, RoundCounts

    hermes = get_format("hermes")
    truth = ground_truth_calls(task_set.get("multi_turn_base_0"))
    record = _play(task_set, "multi_turn_base_0", [[hermes.render(list(truth[0][:2]))], [hermes.render(list(truth[1]))]])
    checks = record["verdict"]["turns"]
    assert checks[0]["failure"] and not checks[0]["inherited"]
    assert checks[1]["failure"] and checks[1]["inherited"]
    first, second = diagnose(record).labels[:2]
    assert first.label == "missing_tool_call" and first.evidence["never_called"] == ["mv"] and "inherited" not in first.evidence
    assert second.label in ("state_mismatch", "response_mismatch") and second.evidence["inherited"] is True
    counts = RoundCounts.of(1, [EpisodeLabels(record["task_id"], record["category"], record["reward"], diagnose(record))])
    assert counts.inherited == {second.label: 1} and counts.labels.get(second.label, 0) == 0
    # The same turn 1 after a correct turn 0 passes: the counterfactual is what the turn does on a right state.
    right = _play(task_set, "multi_turn_base_0", [[hermes.render(list(truth[0]))], [hermes.render(list(truth[1]))]])
    assert [t.label for t in diagnose(right).labels[:2]] == ["pass", "pass"]
    # A turn 1 that is wrong in itself is not inherited even after a failed turn 0.
    own = _play(task_set, "multi_turn_base_0", [[hermes.render(list(truth[0][:2]))], [hermes.render([truth[1][0]])]])
    assert own["verdict"]["turns"][1]["inherited"] is False and diagnose(own).labels[1].label == "missing_tool_call"


def test_instance_mismatch_is_acting_on_a_class_the_turn_does_not_use(task_set):
    """multi_turn_base_11's second turn only posts a tweet; the model also creates a file."""
    hermes = get_format("hermes")
    truth = ground_truth_calls(task_set.get("multi_turn_base_11"))
    assert [c.name for c in truth[1]] == ["post_tweet"]
    stray = ToolCall("touch", {"file_name": "stray.txt"})
    record = _play(task_set, "multi_turn_base_11", [[hermes.render(list(truth[0]))], [hermes.render([*truth[1], stray])]])
    check = record["verdict"]["turns"][1]
    assert check["failure"] and {d["class_name"] for d in check["state_differences"]} == {"GorillaFileSystem"}
    for priority in ("seal", "paper"):
        label = diagnose(record, priority).labels[1]
        assert label.label == "instance_mismatch" and label.evidence["classes"] == ["GorillaFileSystem"]
    # The same stray file on a turn whose ground truth works in the file system is in scope: state_mismatch.
    in_scope = _play(task_set, "multi_turn_base_11", [[hermes.render([*truth[0], stray])]])
    assert diagnose(in_scope).labels[0].label == "state_mismatch"


def test_priority_presets_order_the_candidates(task_set):
    hermes = get_format("hermes")
    truth = ground_truth_calls(task_set.get("multi_turn_base_0"))
    # skips mv (a needed tool never called) and so leaves the file system different as well
    record = _play(task_set, "multi_turn_base_0", [[hermes.render(list(truth[0][:2]))]])
    assert diagnose(record, "seal").labels[0].label == "missing_tool_call"
    assert diagnose(record, "paper").labels[0].label == "state_mismatch"
    with pytest.raises(ValueError, match="Unknown diagnosis priority"):
        diagnose(record, "best")


@pytest.mark.parametrize("episode_format", ["hermes", "json", "pythonic"])
def test_a_call_in_the_wrong_syntax_is_an_invalid_tool_call_not_a_missing_one(task_set, episode_format):
    """SEAL Table 5: invalid_tool_call is a call that cannot be parsed; missing_tool_call a skipped
    call. A first turn written as the ground-truth calls in another format (whole, or in a code fence
    after some prose, as Qwen2.5-Coder writes them under hermes) is plain text to the episode's
    parser, and is labelled invalid_tool_call with the syntax it was written in; prose that names
    a tool but makes no call stays missing_tool_call."""
    task = task_set.get("multi_turn_base_0")
    first = list(ground_truth_calls(task)[0])
    for written in sorted(set(("hermes", "json", "pythonic")) - {episode_format}):
        text = get_format(written).render(first)
        for message in (text, f"I will do that now.\n```{written}\n{text}\n```\nDone."):
            env = BfclEnv(EnvConfig(call_format=episode_format, prompt_mode="chat_template"))
            env.reset(task)
            env.step(message)
            env.truncate("transcript_exhausted")
            record = _record(env)
            assert not any(entry["accepted"] for entry in record["trace"]), (written, message)
            label = diagnose(record).labels[0]
            assert label.label == "invalid_tool_call", (episode_format, written, label)
            if label.evidence.get("kind") == "wrong_syntax":  # else the episode's parser rejected it itself
                assert label.evidence["syntax"] == written and label.evidence["call"] == first[0].name
    for prose in ("I would use cd and then mv (move) the file.", "```bash\ncd document && mv final_report.pdf temp\n```"):
        env = BfclEnv(EnvConfig(call_format=episode_format, prompt_mode="chat_template"))
        env.reset(task)
        env.step(prose)
        env.truncate("transcript_exhausted")
        assert diagnose(_record(env)).labels[0].label == "missing_tool_call", prose


def test_an_unclosed_tool_call_block_under_the_bfcl_protocol_is_an_invalid_tool_call(task_set):
    """Under the bfcl protocol a <tool_call> block that never closes (cut by the token budget, as
    SmolLM2's are) is plain text to the episode, as to BFCL's decoder; it is still a call attempt."""
    task = task_set.get("multi_turn_base_0")
    env = BfclEnv(EnvConfig(protocol="bfcl"))
    env.reset(task)
    env.step('<tool_call>\n{"name": "cd", "arguments": {"folder": "docu')
    env.truncate("transcript_exhausted")
    record = _record(env)
    assert record["trace"] == []
    label = diagnose(record).labels[0]
    assert label.label == "invalid_tool_call" and label.evidence["syntax"] == "hermes" and "</tool_call>" in label.evidence["error"]


def test_turn_measures_count_passed_turns_and_accepted_call_messages(task_set):
    """The study's per-turn measures (seal_rl.study.records): the oracle passes every turn and
    every message that writes a ``<tool_call>`` block was an accepted call; a turn answered in plain text is
    the one turn that fails, with its label, and its message is not a call."""
    from seal_rl.evaluate import episode_counts, turn_measures

    env = BfclEnv()
    tasks = [task_set.get("multi_turn_base_100"), task_set.get("multi_turn_base_115")]
    oracle = [play(env, e) for e in OraclePolicy().episodes(tasks, task_set, "hermes")]
    plain = [play(env, e) for e in OraclePolicy(faults=1.0, kinds=("plain_text",), turn=-1, seed=0).episodes(tasks, task_set, "hermes")]
    turns = sum(r["num_turns"] for r in oracle)
    assistant = [m for r in oracle for m in r["messages"] if m["role"] == "assistant"]
    measured = turn_measures(episode_counts(r) for r in oracle)
    assert measured["turn_pass_rate"] == 1.0 and measured["turns"] == turns and measured["labels"] == {}
    assert measured["messages"] == len(assistant)
    assert measured["call_share"] == sum("<tool_call>" in m["content"] for m in assistant) / len(assistant) < 1.0
    faulted = turn_measures(episode_counts(r) for r in plain)
    assert faulted["turn_pass_rate"] == (turns - len(tasks)) / turns
    assert faulted["labels"] == {"missing_tool_call": len(tasks)}
    assert faulted["call_share"] < measured["call_share"]
    assert turn_measures([]) == {"turn_pass_rate": 0.0, "call_share": 0.0, "turns": 0, "messages": 0, "labels": {}}
