"""The environment as a verifiers environment (``seal-bfcl``, docs/guides/integrations.md), played by
verifiers' own evaluation: ``vf-eval`` in a real process, and its runner in-process, with its
``null`` harness's chat program on the local runtime, against an OpenAI-compatible chat server on
loopback that plays scripted replies. The same server plays the same replies to ``seal eval``; both
must see the same conversation, score the same reward with the same verdict, label every turn the
same, and measure the same turn pass rate and call share. On the oracle every episode passes; on a
replay of faulty transcripts (wrong values, malformed calls, skipped calls…) some do not, and
``seal eval --policy replay:FILE`` agrees as well."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

if os.environ.get("SEAL_REQUIRE_VERIFIERS"):
    import verifiers  # noqa: F401  (`make test-verifiers`: a missing verifiers fails here)
else:
    pytest.importorskip("verifiers", reason="verifiers has its own venv: `make test-verifiers`")

from seal_rl.diagnose import LABELS  # noqa: E402
from seal_rl.env import EnvConfig  # noqa: E402
from seal_rl.evaluate import ModelSettings, episode_counts, evaluate, turn_measures  # noqa: E402
from seal_rl.faults import oracle_transcript  # noqa: E402
from seal_rl.policies import Episode, ServerPolicy, parse_policy  # noqa: E402
from seal_rl.tools import get_format  # noqa: E402
from seal_rl.verify import ground_truth_calls  # noqa: E402
from tests.scripted_server import ScriptedServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# one task per category, each opening with a question of its own (the server keys scripts by it)
TASKS = ["multi_turn_base_1", "multi_turn_miss_func_2", "multi_turn_miss_param_3", "multi_turn_long_context_4"]
FAST = ModelSettings(timeout=30, max_retries=0, concurrency=4)


def _key(task):
    return task.questions[0][0]["content"]


def _scripts(tasks, faults: float) -> dict[str, list[str]]:
    """Each task's assistant messages: the oracle's, or with faults injected at this rate."""
    return {t.id: oracle_transcript(t, ground_truth_calls(t), get_format("hermes"), fault_rate=faults, seed=3)[0] for t in tasks}


def _seal_eval(server, tasks, scripts, out):
    """The server set to play ``scripts``, and ``seal eval`` against it: its records by task, and the
    conversations the server saw (then forgotten, so that the next client's are its own)."""
    for task in tasks:
        server.scripts[_key(task)] = scripts[task.id]
    episodes = [Episode(i, t, None) for i, t in enumerate(tasks, start=1)]
    evaluate(episodes, EnvConfig(protocol="bfcl"), out, policy=ServerPolicy("scripted", server.url), settings=FAST)
    shown = _conversations(server.requests)
    server.requests.clear()
    return {r["task_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}, shown


def _conversations(requests):
    """What the model was shown, request by request: (first question, assistant messages so far) →
    the messages' roles and contents."""
    shown = {}
    for body in requests:
        messages = [(m["role"], m["content"]) for m in body["messages"]]
        first = next(content for role, content in messages if role == "user")
        shown[(first, sum(role == "assistant" for role, _ in messages))] = messages
    return shown


def _assert_agree(traces, records, scripts):
    """verifiers' traces against seal eval's records, task by task."""
    assert sorted(traces) == sorted(records) == sorted(scripts)
    for task_id, trace in traces.items():
        record = records[task_id]
        assert trace["ok"] and not trace["errors"], trace["errors"]
        assert trace["rewards"]["bfcl"]["score"] == record["reward"], task_id
        info = trace["info"]
        assert info["seal_verdict"] == record["verdict"] and info["seal_end_reason"] == record["end_reason"]
        labels = [t["label"] for t in record["diagnosis"]["labels"]]
        assert [t["label"] for t in info["seal_diagnosis"]["labels"]] == labels
        measures = turn_measures([episode_counts(record)])
        metrics = trace["metrics"]
        assert metrics["turn_pass_rate"] == pytest.approx(measures["turn_pass_rate"])
        assert metrics["call_share"] == pytest.approx(measures["call_share"])
        assert {name: metrics[f"label_{name}"] for name in LABELS} == {name: Counter(labels)[name] for name in LABELS}
        # the model's messages are the script's, in order (nothing lost or added on the way)
        replies = [n["message"]["content"] for n in trace["nodes"] if n["message"]["role"] == "assistant"]
        assert replies == [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        assert replies == scripts[task_id][: len(replies)]


def test_vf_eval_plays_the_oracle_as_seal_eval_does(task_set, tmp_path):
    """``vf-eval seal-bfcl`` in its own process: every oracle episode passes, with seal eval's verdicts."""
    tasks = [task_set.get(t) for t in TASKS]
    scripts = _scripts(tasks, faults=0.0)
    with ScriptedServer() as server:
        records, seal_shown = _seal_eval(server, tasks, scripts, tmp_path / "seal")
        vf_eval = Path(sys.executable).with_name("vf-eval")
        command = [str(vf_eval), "seal-bfcl", "-m", "scripted", "--client.base-url", server.url, "--client.api-key-var",
                   "SEAL_TEST_KEY", "--env.taskset.tasks", json.dumps(TASKS), "--no-push", "--no-rich",
                   "-o", str(tmp_path / "vf"), "--run.name", "oracle"]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                                env={**os.environ, "SEAL_TEST_KEY": "sk-test"})  # fmt: skip
        assert result.returncode == 0, result.stderr[-4000:]
        vf_shown = _conversations(server.requests)
    assert vf_shown == seal_shown  # the same system prompt, questions, tool results and reveals, step by step
    episodes = [json.loads(line) for line in (tmp_path / "vf" / "oracle" / "traces.jsonl").read_text().splitlines()]
    traces = {e["traces"][0]["task"]["data"]["id"]: e["traces"][0] for e in episodes}
    assert all(r["reward"] == 1.0 for r in records.values())
    _assert_agree(traces, records, scripts)
    assert "reward=1.000" in result.stderr  # scored before the exchange closed: verifiers' own log has it


def test_verifiers_runner_on_a_faulty_replay_agrees_with_seal_eval(task_set, tmp_path, monkeypatch):
    """verifiers' runner (what vf-eval and prime-rl's eval call) on faulty transcripts: failures,
    labels and measures as ``seal eval`` finds them over the same server and from a replay file."""
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    from seal_rl.integrations.verifiers import BfclEnvConfig, BfclTasksetConfig

    tasks = [task_set.get(t) for t in TASKS]
    # every other message with the blank lines a model writes around it: played as written, never stripped
    scripts = {t: [f"\n{m}\n\n" if i % 2 else m for i, m in enumerate(ms)] for t, ms in _scripts(tasks, faults=0.6).items()}
    replay = tmp_path / "replay.jsonl"
    replay.write_text("".join(json.dumps({"task_id": t, "assistant": m}) + "\n" for t, m in scripts.items()))
    evaluate(parse_policy(f"replay:{replay}").episodes(tasks, task_set, "hermes"), EnvConfig(protocol="bfcl"),
             tmp_path / "replayed", policy=f"replay:{replay}")  # fmt: skip
    replayed = {r["task_id"]: r for r in map(json.loads, (tmp_path / "replayed" / "results.jsonl").read_text().splitlines())}
    with ScriptedServer() as server:
        records, seal_shown = _seal_eval(server, tasks, scripts, tmp_path / "seal")
        monkeypatch.setenv("SEAL_TEST_KEY", "sk-test")
        config = EvalConfig(env=BfclEnvConfig(taskset=BfclTasksetConfig(tasks=TASKS)), model="scripted",
                            client={"base_url": server.url, "api_key_var": "SEAL_TEST_KEY"}, push=False, rich=None,
                            output_dir=tmp_path / "vf", max_concurrent=4)  # fmt: skip
        episodes = asyncio.run(run_eval(config))
        vf_shown = _conversations(server.requests)
    assert vf_shown == seal_shown
    traces = {e.traces[0].task.data.id: e.traces[0].model_dump(mode="json") for e in episodes}
    _assert_agree(traces, records, scripts)
    for task_id, record in replayed.items():  # the replay file, played in-process, agrees too
        assert (record["reward"], record["verdict"]) == (records[task_id]["reward"], records[task_id]["verdict"])
        assert record["diagnosis"]["labels"] == records[task_id]["diagnosis"]["labels"]
    rewards = [r["reward"] for r in records.values()]
    failing = {t["label"] for r in records.values() for t in r["diagnosis"]["labels"]} - {"pass", "correct_abstention"}
    assert 0.0 in rewards and failing, (rewards, failing)  # the faults reached the verdicts: this test can tell


def test_the_environment_loads_the_way_verifiers_loads_it():
    """By id through verifiers' loader, with the taskset options, the null harness on the local runtime;
    a bad option is refused with a message that names it."""
    import verifiers.v1 as vf

    import seal_bfcl
    from seal_rl.integrations.verifiers import BfclEnvConfig, BfclTasksetConfig, BfclVerifiersEnv, load_environment

    env = vf.load_environment(BfclEnvConfig(taskset=BfclTasksetConfig(split="test", categories=["miss_func"], protocol="seal")))
    assert isinstance(env, BfclVerifiersEnv) and env.config.agent.harness.id == "null"
    tasks = list(env.taskset)
    assert len(tasks) == 100 and all("miss_func" in t.data.id and t.data.protocol == "seal" for t in tasks)
    assert all(t.data.system_prompt.startswith("# Tools") for t in tasks)  # bfcl_qwen_fc: the tools in the system prompt
    assert seal_bfcl.BfclVerifiersEnv is BfclVerifiersEnv
    assert len(list(load_environment(tasks=TASKS).taskset)) == 4
    with pytest.raises(ValueError, match="split"):
        BfclTasksetConfig(split="validation")
    # the environment plays the reply as the model wrote it (verifiers' Segment.last_reply strips it)
    from verifiers.v1.agent import Segment
    from verifiers.v1.types import AssistantMessage, UserMessage

    from seal_rl.integrations.verifiers import _reply

    written = "\n<tool_call>\n{}\n</tool_call>\n\n"
    segment = Segment(messages=[AssistantMessage(content="first"), UserMessage(content="r"), AssistantMessage(content=written)])
    assert _reply(segment) == written != segment.last_reply
    assert _reply(Segment(messages=[AssistantMessage(content=None)])) == "" and _reply(Segment(messages=[])) == ""
    with pytest.raises(ValueError, match="Unknown task id 'multi_turn_base_9999'. Did you mean multi_turn_base_99"):
        list(load_environment(tasks=["multi_turn_base_9999"]).taskset)
    with pytest.raises(ValueError, match="categor"):
        list(load_environment(categories=["miss_everything"]).taskset)
