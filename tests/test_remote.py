"""seal eval against a real HTTP server on loopback that speaks the OpenAI chat-completions API."""

from __future__ import annotations

import json
import threading

import pytest

from seal_rl.env import EnvConfig
from seal_rl.errors import SealError
from seal_rl.evaluate import ModelSettings, evaluate
from seal_rl.faults import oracle_transcript
from seal_rl.policies import Episode, ServerPolicy, parse_policy, parse_server_spec
from seal_rl.tools import get_format
from seal_rl.verify import ground_truth_calls
from tests.scripted_server import ScriptedServer


def _key(task):
    return task.questions[0][0]["content"]


def _structured(task):
    """The oracle's turns as structured tool_calls replies (and plain text to end each turn)."""
    replies = []
    for turn in ground_truth_calls(task):
        if turn:
            replies.append({"tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for i, c in enumerate(turn)
            ]})  # fmt: skip
        replies.append("Done with this request.")
    return replies


FAST = ModelSettings(timeout=0.5, max_retries=2, retry_backoff=0.01, concurrency=4)


def _run(server, tasks, tmp_path, name, env=EnvConfig(), settings=FAST):
    episodes = [Episode(i, t, None) for i, t in enumerate(tasks, start=1)]
    policy = ServerPolicy("scripted-model", server.url)
    summary = evaluate(episodes, env, tmp_path / name, policy=policy, settings=settings)
    records = [json.loads(line) for line in (tmp_path / name / "results.jsonl").read_text().splitlines()]
    return summary, records


def test_text_tool_calls(task_set, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
    tasks = [task_set.get("multi_turn_base_0"), task_set.get("multi_turn_miss_param_3")]
    with ScriptedServer() as server:
        for task in tasks:
            server.scripts[_key(task)] = oracle_transcript(task, ground_truth_calls(task), get_format("hermes"))[0]
        summary, records = _run(server, tasks, tmp_path, "text")
    assert [r["reward"] for r in records] == [1.0, 1.0] and summary["errors"] == 0
    assert all(h.get("Authorization") == "Bearer sk-test-123" for h in server.headers)
    assert server.requests[0]["model"] == "scripted-model" and server.requests[0]["temperature"] == 0.0
    assert server.requests[0]["messages"][0]["role"] == "system"  # bfcl_qwen_fc: tools in the system block


def test_structured_tool_calls_are_rendered_and_replayed_with_their_ids(task_set, tmp_path):
    task = task_set.get("multi_turn_base_0")
    env = EnvConfig(prompt_mode="chat_template")
    with ScriptedServer() as server:
        server.scripts[_key(task)] = _structured(task)
        summary, records = _run(server, [task], tmp_path, "structured", env)
    assert records[0]["reward"] == 1.0
    assert server.requests[0]["tools"][0]["type"] == "function"
    later = server.requests[1]["messages"]
    assistant = next(m for m in later if m["role"] == "assistant")
    tools = [m for m in later if m["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == [c["id"] for c in assistant["tool_calls"]]


def test_server_errors_and_timeouts_are_retried(task_set, tmp_path):
    task = task_set.get("multi_turn_base_0")
    with ScriptedServer() as server:
        server.scripts[_key(task)] = oracle_transcript(task, ground_truth_calls(task), get_format("hermes"))[0]
        server.directives[(_key(task), 0)] = {"status": 503, "times": 2}
        server.directives[(_key(task), 1)] = {"sleep": 1.0, "times": 1}
        summary, records = _run(server, [task], tmp_path, "retried")
    assert records[0]["reward"] == 1.0 and "error" not in records[0]
    assert server.attempts[(_key(task), 0)] == 3 and server.attempts[(_key(task), 1)] == 2


def test_exhausted_retries_are_recorded_as_errors_not_failures(task_set, tmp_path):
    good, bad = task_set.get("multi_turn_base_0"), task_set.get("multi_turn_base_1")
    with ScriptedServer() as server:
        server.scripts[_key(good)] = oracle_transcript(good, ground_truth_calls(good), get_format("hermes"))[0]
        server.scripts[_key(bad)] = ["hello"]
        server.directives[(_key(bad), 0)] = {"status": 500}
        summary, records = _run(server, [good, bad], tmp_path, "errors")
    assert records[1]["end_reason"] == "generation_error" and "HTTP 500" in records[1]["error"]
    assert server.attempts[(_key(bad), 0)] == 3  # 1 + max_retries
    assert summary["errors"] == 1 and summary["episodes"] == 1 and summary["categories"]["base"]["success_rate"] == 1.0


def test_client_errors_are_not_retried(task_set, tmp_path):
    task = task_set.get("multi_turn_base_0")
    with ScriptedServer() as server:
        server.scripts[_key(task)] = ["hi"]
        server.directives[(_key(task), 0)] = {"status": 401}
        _, records = _run(server, [task], tmp_path, "unauthorised")
    assert server.attempts[(_key(task), 0)] == 1 and "HTTP 401" in records[0]["error"]


def test_malformed_structured_arguments_are_rejected_by_the_environment(task_set, tmp_path):
    task = task_set.get("multi_turn_base_0")
    bad = {"tool_calls": [{"id": "c0", "type": "function", "function": {"name": "cd", "arguments": "{not json"}}]}
    with ScriptedServer() as server:
        server.scripts[_key(task)] = [bad, "I give up."]
        _, records = _run(server, [task], tmp_path, "malformed", EnvConfig(prompt_mode="chat_template"))
    trace = records[0]["trace"]
    assert trace[0]["error_kind"] == "parse" and not trace[0]["accepted"]
    assert records[0]["diagnosis"]["labels"][0]["label"] == "invalid_tool_call"


def test_policy_specs():
    assert parse_server_spec("Qwen2.5-7B@http://localhost:8000/v1/") == ("Qwen2.5-7B", "http://localhost:8000/v1")
    assert parse_policy("openai:gpt@https://api.example.com/v1").name == "openai:gpt@https://api.example.com/v1"
    for bad in ("openai:nourl", "openai:@http://x"):
        with pytest.raises(SealError, match="MODEL@URL"):
            parse_policy(bad)
    with pytest.raises(SealError, match="must start with http"):
        from seal_rl.generators.openai_compatible import ServerSettings

        ServerSettings("m", "ftp://x")


def _generator_threads():
    return [t for t in threading.enumerate() if t.name == "openai-generator"]


def test_an_interrupted_run_closes_its_connections_and_resumes(task_set, tmp_path):
    """Ctrl-C while requests are in flight: nothing is left running; re-running finishes the run."""
    fast, slow = task_set.get("multi_turn_base_0"), task_set.get("multi_turn_base_1")
    before = len(_generator_threads())

    def interrupt(record):
        raise KeyboardInterrupt

    episodes = [Episode(1, fast, None), Episode(2, slow, None)]
    with ScriptedServer() as server:
        policy = ServerPolicy("scripted-model", server.url)
        for task in (fast, slow):
            server.scripts[_key(task)] = oracle_transcript(task, ground_truth_calls(task), get_format("hermes"))[0]
        server.directives[(_key(slow), 0)] = {"sleep": 0.3, "times": 1}  # still in flight at the interrupt
        with pytest.raises(KeyboardInterrupt):
            evaluate(episodes, EnvConfig(), tmp_path / "run", policy=policy, settings=FAST, on_episode=interrupt)
        assert len(_generator_threads()) == before
        assert len((tmp_path / "run" / "results.jsonl").read_text().splitlines()) == 1
        summary = evaluate(episodes, EnvConfig(), tmp_path / "run", policy=policy, settings=FAST)
    assert summary["episodes"] == 2 and summary["successes"] == 2


def test_resuming_plays_generation_errors_again(task_set, tmp_path):
    good, flaky = task_set.get("multi_turn_base_0"), task_set.get("multi_turn_base_1")
    tasks = [flaky, good]
    with ScriptedServer() as server:
        for task in tasks:
            server.scripts[_key(task)] = oracle_transcript(task, ground_truth_calls(task), get_format("hermes"))[0]
        server.directives[(_key(flaky), 0)] = {"status": 503, "times": 3}  # down for the whole first run
        first, _ = _run(server, tasks, tmp_path, "run")
        second, records = _run(server, tasks, tmp_path, "run")
    assert first["errors"] == 1 and first["episodes"] == 1
    assert second["errors"] == 0 and second["successes"] == 2
    assert [(r["index"], r["task_id"]) for r in records] == [(1, flaky.id), (2, good.id)]  # in input order, once each
