"""The environment as an OpenEnv environment (``seal serve-openenv``, docs/guides/integrations.md), in a
real server process, played by OpenEnv's own clients: our typed ``EnvClient`` and OpenEnv's
``GenericEnvClient`` (plain dicts, no seal-rl code on the client side). Ground-truth episodes get
reward 1 wherever the oracle passes locally, and the final observation carries the verdict and the
diagnosis; hostile messages and misuse get an observation that says why, never a dead session."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

if os.environ.get("SEAL_REQUIRE_OPENENV"):
    import openenv  # noqa: F401  (`make test-openenv`: a missing openenv fails here)
else:
    pytest.importorskip("openenv", reason="openenv has its own venv: `make test-openenv`")

from seal_rl.env import BfclEnv, EnvConfig  # noqa: E402
from seal_rl.faults import oracle_transcript  # noqa: E402
from seal_rl.tools import get_format  # noqa: E402
from seal_rl.verify import ground_truth_calls  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["multi_turn_base_0", "multi_turn_miss_func_0", "multi_turn_miss_param_0", "multi_turn_long_context_0"]


@pytest.fixture(scope="module")
def server():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "seal_rl", "serve-openenv", "--port", str(port)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            pytest.fail(f"seal serve-openenv exited: {process.stdout.read()[-3000:]}")
        time.sleep(0.2)
    yield url
    process.terminate()
    process.wait(timeout=30)


def played_locally(task, messages: list[str]) -> dict:
    """The same messages through seal-rl's environment in this process: the record, diagnosed."""
    from seal_rl.diagnose import add_diagnosis

    env = BfclEnv(EnvConfig(protocol="bfcl"))
    env.reset(task)
    for message in messages:
        if env.done:
            break
        env.step(message)
    record = env.record()
    add_diagnosis(record)
    return json.loads(json.dumps(record))  # as JSON carries it (tuples become lists)


@pytest.mark.parametrize("task_id", TASKS)
def test_openenv_clients_play_ground_truth_episodes_to_the_local_reward(server, task_set, task_id):
    from openenv.core.generic_client import GenericEnvClient

    from seal_rl.integrations.openenv import BfclAction, BfclEnvClient

    task = task_set.get(task_id)
    messages, _ = oracle_transcript(task, ground_truth_calls(task), get_format("hermes"))
    local = played_locally(task, messages)
    expected = local["reward"]
    assert expected == 1.0  # the oracle passes these tasks

    with BfclEnvClient(base_url=server).sync() as env:
        result = env.reset(task_id=task_id, protocol="bfcl")
        assert result.observation.messages[-1]["role"] == "user" and result.observation.tools
        for message in messages:
            result = env.step(BfclAction(message=message))
            if result.done:
                break
        assert result.done and result.reward == expected
        final = result.observation
        assert final.end_reason == "completed" and final.verdict == local["verdict"]
        assert final.diagnosis == local["diagnosis"]  # pass, or correct_abstention on a miss_func turn
        assert {t["label"] for t in final.diagnosis["labels"]} <= {"pass", "correct_abstention"}
        assert env.state().task_id == task_id and env.state().done

    with GenericEnvClient(base_url=server).sync() as env:  # OpenEnv's client for any environment, plain dicts
        env.reset(task_id=task_id, protocol="bfcl")
        for message in messages:
            result = env.step({"message": message})
            if result.done:
                break
        assert result.done and result.reward == expected
        assert result.observation["diagnosis"] == local["diagnosis"]


def test_a_failing_episode_is_diagnosed_and_hostile_messages_are_observations(server):
    from seal_rl.integrations.openenv import BfclAction, BfclEnvClient

    with BfclEnvClient(base_url=server).sync() as env:
        result = env.step(BfclAction(message="hello"))  # before any reset
        assert result.observation.event == "error" and "reset" in result.observation.error

        env.reset(task_id="multi_turn_base_0", protocol="seal")
        hostile = "\ud83d half an emoji, " + "x" * 200_000  # a lone surrogate, and over max_message_chars
        result = env.step(BfclAction(message=hostile))
        assert not result.done and result.observation.event in ("rejected", "next_turn")
        result = env.step(BfclAction(message="<tool_call>{not json</tool_call>"))
        assert result.observation.messages and "[ERROR]" in result.observation.messages[-1]["content"]
        while not result.done:
            result = env.step(BfclAction(message="I cannot help with that."))
        assert result.reward == 0.0 and result.observation.verdict["reward"] == 0.0
        labels = [t["label"] for t in result.observation.diagnosis["labels"]]
        assert labels and "pass" not in labels[:1]
        after = env.step(BfclAction(message="more"))
        assert after.observation.event == "error" and "ended" in after.observation.error

        with pytest.raises(Exception, match="multi_turn_base_99999"):
            env.reset(task_id="multi_turn_base_99999")


def test_the_server_passes_openenvs_own_runtime_validation(server):
    """`openenv validate --url` (OpenEnv's CLI): its runtime standard's criteria — OpenAPI version,
    /health, /metadata, /schema, the MCP endpoint, mode consistency — all pass."""
    openenv_cli = Path(sys.executable).with_name("openenv")
    result = subprocess.run([str(openenv_cli), "validate", "--url", server, "--json"], capture_output=True, text=True, timeout=120)
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert result.returncode == 0 and report["passed"], report
    assert report["summary"]["failed_criteria"] == [] and report["summary"]["required_total_count"] >= 6
