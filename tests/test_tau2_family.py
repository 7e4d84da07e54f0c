"""τ²-bench as a training family (seal_rl.environments.tau2): τ²'s own orchestrator and scorer behind
a training episode, the reward re-scored from the saved simulation, Ψ's evidence, hostile model output,
and one-line refusals of what cannot be played."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tau2")

from seal_rl.environments import load_family  # noqa: E402
from seal_rl.environments import oracle_messages  # noqa: E402
from seal_rl.errors import SealError  # noqa: E402
from seal_rl.tools import ToolCall, get_format  # noqa: E402

from .helpers import play_family  # noqa: E402

HERMES = get_format("hermes")
TELECOM_TASK = "[mobile_data_issue]airplane_mode_on|data_mode_off[PERSONA:None]"


@pytest.fixture(scope="module")
def mock():
    return load_family("tau2-mock", solo=True)


@pytest.fixture(scope="module")
def telecom():
    return load_family("tau2-telecom", solo=True)


_play = play_family


def _rescored(family, record):
    """τ²'s own evaluate_simulation re-run on the SimulationRun the record saved."""
    tau2 = family.tau2
    simulation = tau2.simulation.SimulationRun.model_validate(record["verdict"]["evidence"]["simulation"])
    task = family.task_set().get(record["task_id"]).data
    return tau2.evaluator.evaluate_simulation(simulation=simulation, task=task, evaluation_type=tau2.evaluator.EvaluationType.ALL,
                                              solo_mode=family.solo, domain=family.domain).reward  # fmt: skip


def _labels(record):
    return [t["label"] for t in record["diagnosis"]["labels"]]


def test_the_gold_actions_earn_taus_reward_and_the_saved_simulation_rescores_to_it(mock, telecom):
    for family, task_id in ((mock, "create_task_1"), (mock, "update_task_1"), (telecom, TELECOM_TASK)):
        task = family.task_set().get(task_id)
        _, record = _play(family, task, oracle_messages(family, task, "hermes"))
        assert record["reward"] == 1.0 and _labels(record) == ["pass"] and record["end_reason"] == "completed"
        assert _rescored(family, record) == record["reward"]
        assert json.loads(json.dumps(record))["verdict"]["evidence"]["termination_reason"] == "agent_stop"


def test_a_wrong_write_loses_the_reward_and_psi_says_which_action(mock):
    task = mock.task_set().get("create_task_1")
    gold = task.data.evaluation_criteria.actions[0]
    wrong = {**dict(gold.arguments), "title": "Something else"}
    _, record = _play(mock, task, [HERMES.render([ToolCall(gold.name, wrong)]), HERMES.render([ToolCall("done", {})])])
    assert record["reward"] == 0.0 == _rescored(mock, record)
    evidence = record["verdict"]["evidence"]
    assert evidence["actions"] == [{"name": gold.name, "requestor": "assistant", "status": "other_arguments"}]
    assert evidence["db_match"] is False
    label = record["diagnosis"]["labels"][0]
    assert label["label"] == "state_mismatch"
    assert {"class_name": "action", "attribute": gold.name} in label["evidence"]["differences"]


def test_a_conversation_tau2_ends_early_still_gets_labels(mock, telecom):
    """τ² scores 0 without checks for a conversation that did not stop; Ψ still labels it from the
    checks run as if it had (a small model's most common episode)."""
    task = telecom.task_set().get(TELECOM_TASK)
    # plain text in solo mode: τ²'s agent_error at once
    _, record = _play(telecom, task, ["I think the phone is fine."])
    assert record["reward"] == 0.0 and record["end_reason"] == "agent_error"
    assert _labels(record) == ["missing_tool_call"]
    never = [a for a in record["verdict"]["evidence"]["actions"] if a["status"] == "never_called"]
    assert never and record["diagnosis"]["labels"][0]["evidence"].get("text") == "I think the phone is fine."
    # reads only, until τ²'s max_steps: the conversation ends there, labelled by the actions never made
    small = load_family("tau2-telecom", solo=True, max_steps=6)
    read = HERMES.render([ToolCall("check_status_bar", {})])
    _, record = _play(small, task, [read] * 10)
    assert record["end_reason"] == "max_steps" and record["reward"] == 0.0
    assert record["verdict"]["evidence"]["termination_reason"] == "max_steps"
    assert _labels(record) == ["missing_tool_call"] and record["diagnosis"]["labels"][0]["evidence"]["never_called"]


def test_hostile_model_output_is_an_error_observation_and_a_label_never_a_crash(mock):
    task = mock.task_set().get("create_task_1")
    messages = [
        "<tool_call>{not json</tool_call>",                                        # unparsable
        HERMES.render([ToolCall("rm_rf", {"path": "/"})]),                          # unknown tool
        HERMES.render([ToolCall("create_task", {"user_id": ["x"], "title": 7})]),   # wrong types: τ²'s own error
        "\ud800" * 3 + "x" * 200_000,                                               # lone surrogates, too long
    ]  # fmt: skip
    env, record = _play(mock, task, messages)
    assistant = [m for m in record["messages"] if m["role"] == "user"][1:]
    assert assistant[0]["content"].startswith("[ERROR] Invalid tool call format")
    assert "no tool named 'rm_rf'" in assistant[1]["content"]
    kinds = [e["error_kind"] for e in record["trace"]]
    assert kinds[:3] == ["parse", "unknown_tool", "schema"] and record["trace"][2]["result"].startswith("Error: ")
    assert len(_labels(record)) == 1 and record["reward"] == 0.0
    json.dumps(record)  # every writer takes it


@pytest.mark.parametrize("spec, settings, expected", [
    ("tau2-bank", {}, "Unknown τ² domain 'bank'"),
    ("tau2-airline", {"solo": True}, "has no task τ²'s solo agent can play"),
    ("tau2-airline", {"solo": False}, "needs one: family_settings.user=openai:MODEL@URL"),
    ("tau2-mock", {"solo": True, "user": "oracle"}, "solo mode has no user"),
    ("tau2-retail", {"user": "hf:some/model"}, "family_settings.user 'hf:some/model'"),
])  # fmt: skip
def test_what_cannot_be_played_is_one_line(spec, settings, expected):
    with pytest.raises(SealError) as raised:
        load_family(spec, **settings)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_a_task_solo_mode_cannot_play_is_one_line(mock):
    with pytest.raises(SealError, match="cannot be played solo"):
        mock.task_set().get("create_task_1_nl_eval")
    assert "create_task_1_nl_eval" not in {t.id for t in mock.tasks()}


def test_in_solo_mode_the_interface_never_tells_the_agent_to_write_to_a_user(mock, telecom):
    """Ω's φ_err hints offer asking the user; in τ²'s solo mode a text message ends the episode, so the
    family's affordances turn those into looking the value up (and say which tools read state)."""
    from seal_rl.environments.family import affordances
    from seal_rl.interface import Interface, InterfaceState

    state = InterfaceState(preset="seal", parse_hints=True, tool_hints=True)
    task = mock.task_set().get("create_task_1")
    gold = task.data.evaluation_criteria.actions[0]
    missing = HERMES.render([ToolCall(gold.name, {"title": "x"})])  # user_id left out: τ² refuses the call
    for family, expect_user in ((mock, False), (load_family("tau2-mock", user="oracle"), True)):
        env = family.make_env(None, Interface("bfcl_qwen_fc", state, **affordances(family)))
        env.reset(family.task_set().get("create_task_1"))
        rejected = env.step("<tool_call>{broken</tool_call>")[0][0]["content"]
        hinted = env.step(missing)[0][0]["content"]
        assert ("answer in plain text" in rejected) is expect_user
        assert ("ask the user" in hinted) is expect_user and ("look it up with the tools" in hinted) is (not expect_user)
    assert affordances(telecom)["inspect_tools"] and "get_customer_by_phone" in affordances(telecom)["inspect_tools"]


def test_seal_train_refuses_a_user_server_that_does_not_answer_before_anything_starts(monkeypatch, capsys, tmp_path):
    import socket

    from .test_cli import run_cli

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", "tau2-airline-user", "--out", str(out), "--set", "model.path=preset:qwen2.5-7b",
                           "--set", f"family_settings.user=openai:user@http://127.0.0.1:{port}/v1")  # fmt: skip
    assert code == 2 and f"The user simulator's server http://127.0.0.1:{port}/v1 cannot be reached" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_local_model_plays_taus_user_in_a_training_episode(tiny_model_dir):
    """``family_settings.user: hf:MODEL``: τ²'s UserSimulator (its own prompt) with a model loaded in this
    process; ``check_user`` loads it before anything starts, and its messages are the episode's observations."""
    family = load_family("tau2-mock", user=f"hf:{tiny_model_dir}", max_steps=8, user_temperature=1.0,
                         user_max_new_tokens=16)  # sampled: greedy, the random model only ends its message
    try:
        family.check_user()
        assert family.user_player().llm.startswith("seal-rl/")  # served to τ² through litellm's seal-rl provider
        task = family.task_set().get("create_task_1")
        env, record = _play(family, task, ["Could you tell me more?", "Thanks, anything else?"])
        simulation = record["verdict"]["evidence"]["simulation"]
        users = [m for m in simulation["messages"] if m["role"] == "user"]
        assert users and users[0]["content"] == env.messages[1]["content"]  # the model's first message opened the chat
        assert 0.0 <= record["reward"] <= 1.0 and _labels(record)
        assert _rescored(family, record) == record["reward"]
    finally:
        family.close()


def test_a_user_model_that_cannot_load_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a directory that looks like a model and is not one
    family = load_family("tau2-mock", user=f"hf:{tmp_path}")
    with pytest.raises(SealError) as raised:
        family.check_user()
    assert str(raised.value).startswith(f"family_settings.user 'hf:{tmp_path}' cannot load") and "\n" not in str(raised.value)
