"""The environment service through real HTTP on loopback: contract, limits, faults, schema fuzzing."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings

from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.faults import oracle_transcript
from seal_rl.policies import ScriptedAgent
from seal_rl.generators import ScriptedGenerator
from seal_rl.rollout import run_episodes
from seal_rl.service.app import create_app
from seal_rl.service.client import AsyncClient, Client, RemoteEnv, ServiceError
from seal_rl.service.settings import ServiceSettings
from seal_rl.service.workers import _alarm, _StepTimeout
from seal_rl.tools import get_format
from seal_rl.verify import ground_truth_calls

SAMPLE = ["multi_turn_base_0", "multi_turn_miss_func_1", "multi_turn_miss_param_2", "multi_turn_long_context_3"]


class Server:
    """``create_app(settings)`` under uvicorn in a thread, on a free loopback port."""

    def __init__(self, task_set, **settings):
        self.app = create_app(ServiceSettings(**settings), tasks=task_set)
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the service did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def pool(self):
        return self.app.state.pool


@pytest.fixture(scope="module")
def server(task_set):
    with Server(task_set, workers=2) as running:
        yield running


@pytest.fixture()
def client(server):
    with Client(server.url, backoff=0.01) as c:
        yield c


def transcript(task) -> list[str]:
    return oracle_transcript(task, ground_truth_calls(task), get_format("hermes"), 0.0, 0)[0]


def replay(client: Client, task, **options) -> tuple[str, list[dict]]:
    episode = client.create(task.id, **options)
    replies = [client.step(episode["episode_id"], message, step=i) for i, message in enumerate(transcript(task))]
    return episode["episode_id"], replies


def as_json(value):
    return json.loads(json.dumps(value))


def test_health_and_the_task_list(client):
    health = client.health()
    assert health["status"] == "ok" and health["workers_alive"] == 2
    assert len(client.tasks("train")) == 400 and len(client.tasks("test")) == 400 and len(client.tasks("all")) == 800
    some = client.tasks("all", ["miss_func", "base"])
    assert len(some) == 400 and {t["category"] for t in some} == {"miss_func", "base"}


def test_a_remote_episode_equals_the_in_process_episode(client, task_set):
    for task_id in SAMPLE:
        task = task_set.get(task_id)
        episode_id, replies = replay(client, task)
        evaluation = client.evaluate(episode_id, include_record=True)
        local = BfclEnv(EnvConfig())
        observation, info = local.reset(task)
        for message, reply in zip(transcript(task), replies, strict=True):
            obs, reward, terminated, truncated, _ = local.step(message)
            assert reply["observation"] == obs and (reply["reward"], reply["terminated"], reply["truncated"]) == (reward, terminated, truncated)
        record = evaluation["record"]
        for key in ("messages", "trace", "verdict", "end_reason", "turns_reached", "reward"):
            assert record[key] == as_json(local.record()[key]), key
        assert evaluation["reward"] == 1.0 and replies[-1]["done"]
        assert {t["label"] for t in evaluation["labels"]} <= {"pass", "correct_abstention"}
        assert len(evaluation["labels"]) == task.num_turns
        assert client.release(episode_id) == {"episode_id": episode_id, "released": True}


def test_the_bfcl_protocol_over_http_equals_the_in_process_episode(client, task_set):
    task = task_set.get("multi_turn_miss_func_49")  # the bfcl protocol executes a held-out tool by name
    messages = ["<tool_call>\n{broken\n</tool_call>", *transcript(task)[2:]]
    episode = client.create(task.id, protocol="bfcl")
    local = BfclEnv(EnvConfig(protocol="bfcl"))
    assert episode["observation"] == local.reset(task)[0]
    for i, message in enumerate(messages):
        if local.done:
            break
        reply = client.step(episode["episode_id"], message, step=i)
        observation, reward, *_ = local.step(message)
        assert reply["observation"] == observation and reply["reward"] == reward
    assert "[ERROR]" not in json.dumps(local.messages)  # undecodable: the turn ended silently
    assert client.evaluate(episode["episode_id"])["reward"] == local.verdict.reward
    client.release(episode["episode_id"])


def test_the_episode_driver_plays_remote_environments_transparently(server, client, task_set):
    tasks = [task_set.get(t) for t in SAMPLE * 2]
    items = [(i, task, {}) for i, task in enumerate(tasks, start=1)]

    def generator():
        return ScriptedGenerator({i: ScriptedAgent(transcript(task)) for i, task, _ in items})

    remote = run_episodes(items, generator(), lambda: RemoteEnv(client), concurrency=3)
    local = run_episodes(items, generator(), lambda: BfclEnv(EnvConfig()), concurrency=3)
    for a, b in zip(remote, local, strict=True):
        for key in ("task_id", "reward", "messages", "trace", "verdict", "end_reason", "turns_reached", "model_calls"):
            assert a.record[key] == as_json(b.record[key]), key
    assert server.pool.live_episodes == 0  # the driver released what it opened


def test_a_retried_step_is_answered_once_and_out_of_order_steps_are_refused(client, task_set):
    task = task_set.get("multi_turn_base_0")
    messages = transcript(task)
    episode = client.create(task.id)
    first = client.step(episode["episode_id"], messages[0], step=0)
    assert client.step(episode["episode_id"], messages[0], step=0) == first
    with pytest.raises(ServiceError, match="expects step 1, got step 3") as refused:
        client.step(episode["episode_id"], messages[1], step=3)
    assert refused.value.status == 409
    evaluation = client.evaluate(episode["episode_id"], reason="token_budget")
    assert evaluation["end_reason"] == "token_budget" and evaluation["model_calls"] == 1
    assert client.evaluate(episode["episode_id"]) == evaluation  # idempotent
    with pytest.raises(ServiceError, match="has ended") as ended:
        client.step(episode["episode_id"], messages[1])
    assert ended.value.status == 409


def test_creation_with_a_chosen_id_is_safe_to_repeat(client):
    first = client.create("multi_turn_base_1", episode_id="my-episode-0001")
    assert client.create("multi_turn_base_1", episode_id="my-episode-0001") == first
    with pytest.raises(ServiceError, match="already exists with other settings") as clash:
        client.create("multi_turn_base_2", episode_id="my-episode-0001")
    assert clash.value.status == 409
    client.release("my-episode-0001")
    with pytest.raises(ServiceError, match="was used before"):
        client.create("multi_turn_base_1", episode_id="my-episode-0001")


def test_training_mode_shows_the_interface_state_and_eval_mode_does_not(client):
    state = {"preset": "seal", "schema_tools": ["*"], "format_note": True, "guidelines": ["state_aware"]}
    train = client.create("multi_turn_base_0", interface=state, mode="train")
    evaluation = client.create("multi_turn_base_0", interface=state, mode="eval")
    vanilla = client.create("multi_turn_base_0")
    assert evaluation["observation"] == vanilla["observation"] and evaluation["tools"] == vanilla["tools"]
    assert train["observation"][0]["content"] != vanilla["observation"][0]["content"]
    assert "[required]" in json.dumps(train["tools"]) and "guideline:state_aware" in train["active_components"]
    paper = client.create("multi_turn_base_0", interface="paper", mode="train")
    assert paper["interface"]["schema_tools"] == ["*"] and paper["interface"]["format_note"]


def test_hostile_messages_get_observations_not_errors(client, task_set):
    episode = client.create("multi_turn_base_0", max_model_calls=50)
    hostile = ["<tool_call>{\"name\": \"__import__\", \"arguments\": {\"name\": \"os\"}}</tool_call>",
               "<tool_call>" + "[" * 5000, "\ud800 lone surrogate", "<tool_call>{\"name\": \"ls\", \"arguments\": {\"a\": 1e999}}</tool_call>",
               "x" * 100_001]  # fmt: skip
    for step, message in enumerate(hostile):
        reply = client.step(episode["episode_id"], message, step=step)
        assert reply["info"]["event"] in ("rejected", "tool_results", "next_turn")
    assert client.health()["workers_alive"] == 2


@pytest.mark.parametrize(
    "method, path, body, status, message",
    [
        ("POST", "/episodes", {"task_id": "multi_turn_base_9999"}, 404, "Unknown task id"),
        ("POST", "/episodes", {"task_id": "multi_turn_base_0", "call_format": "pythonic"}, 422, "prompt_mode='chat_template'"),
        ("POST", "/episodes", {"task_id": "multi_turn_base_0", "max_model_calls": 10_000}, 422, "at most 200"),
        ("POST", "/episodes", {"task_id": "multi_turn_base_0", "max_result_chars": 10**7}, 422, "max_result_chars may be at most 1000000"),
        ("POST", "/episodes", {"task_id": "multi_turn_base_0", "max_message_chars": 0}, 422, "greater than or equal to 1"),
        ("POST", "/episodes", {"task_id": "multi_turn_base_0", "interface": {"guidelines": ["nope"]}}, 422, ""),
        ("POST", "/episodes", {"task_id": "multi_turn_base_0", "colour": "red"}, 422, ""),
        ("POST", "/episodes/unknown-episode-id/step", {"message": "hi"}, 404, "create one with POST /episodes"),
        ("POST", "/episodes/bad!/step", {"message": "hi"}, 422, ""),
        ("DELETE", "/episodes/unknown-episode-id", None, 404, "not found"),
        ("GET", "/tasks?split=dev", None, 422, ""),
    ],
)
def test_bad_requests_get_4xx_with_a_message(server, method, path, body, status, message):
    response = httpx.request(method, server.url + path, json=body)
    assert response.status_code == status
    assert message in json.dumps(response.json()["detail"])


def test_per_episode_caps_are_set_per_request_within_the_service_limits(task_set):
    """Model message size, tool output and steps are the requester's choice, up to the server's limits."""
    with Server(task_set, workers=1, max_result_chars_limit=500, max_model_calls_limit=5) as server, Client(server.url, retries=0) as client:
        small = client.create("multi_turn_base_0", max_message_chars=80, max_result_chars=30, max_model_calls=3)
        long_message = client.step(small["episode_id"], "<tool_call>" + " " * 80 + "</tool_call>", step=0)
        assert long_message["info"]["event"] == "rejected" and "exceeds the limit of 80" in json.dumps(long_message["observation"])
        listing = client.step(small["episode_id"], '<tool_call>{"name": "ls", "arguments": {"a": true}}</tool_call>', step=1)
        record = client.evaluate(small["episode_id"], include_record=True)["record"]
        (ls,) = [entry for entry in record["trace"] if entry["name"] == "ls"]
        assert listing["info"]["event"] == "tool_results" and ls["truncated"] > 0 and ls["result"] in listing["observation"][0]["content"]
        default = client.create("multi_turn_base_0")  # a default (20 model calls) above a limit is lowered to it
        for k in range(20):
            reply = client.step(default["episode_id"], '<tool_call>{"name": "ls", "arguments": {}}</tool_call>', step=k)
            if reply["terminated"] or reply["truncated"]:
                break
        assert k + 1 == 5 and reply["truncated"]  # after the service's 5 model calls, not the default 20
        for cap, value, limit in (("max_result_chars", 501, 500), ("max_model_calls", 6, 5)):
            with pytest.raises(ServiceError, match=f"{cap} may be at most {limit} on this service") as refused:
                client.create("multi_turn_base_0", **{cap: value})
            assert refused.value.status == 422


def _answer_to_a_slow_body(address, body: bytes, declared: int, pause: float) -> tuple[bytes, float]:
    """Send a POST whose body arrives a few bytes at a time; what the service answered and when."""
    conn = socket.create_connection(address)
    conn.sendall(f"POST /episodes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n".encode())
    started = time.monotonic()
    conn.settimeout(10)
    try:
        for k in range(0, len(body), 4):
            conn.sendall(body[k : k + 4])
            time.sleep(pause)
    except OSError:  # closed by the service mid-body
        pass
    answer = b""
    while chunk := conn.recv(4096):  # the service closes the connection after a refusal
        answer += chunk
        if answer.startswith(b"HTTP/1.1 201") and answer.endswith(b"}"):
            break
    conn.close()
    return answer, time.monotonic() - started


def test_a_slow_or_trickling_request_body_is_timed_out(task_set):
    body = json.dumps({"task_id": "multi_turn_base_0"}).encode()
    with Server(task_set, workers=1, body_timeout=0.5) as server:
        address = server.socket.getsockname()
        stalled, waited = _answer_to_a_slow_body(address, body[:10], len(body), 0.0)  # declares more than it sends
        assert stalled.startswith(b"HTTP/1.1 408") and b"body_timeout" in stalled and waited < 5
        trickled, waited = _answer_to_a_slow_body(address, body, len(body), 0.1)  # every byte in time, the whole too slow
        assert trickled.startswith(b"HTTP/1.1 408") and waited < 5
        quick, _ = _answer_to_a_slow_body(address, body, len(body), 0.0)
        assert quick.startswith(b"HTTP/1.1 201")


def test_a_released_episode_answers_410_with_what_happened(client):
    episode = client.create("multi_turn_base_0")
    client.release(episode["episode_id"])
    with pytest.raises(ServiceError, match="was released") as gone:
        client.step(episode["episode_id"], "hello")
    assert gone.value.status == 410


def test_limits_token_capacity_body_size_and_idle_release(task_set):
    token = "a-test-token-of-some-length"
    with Server(task_set, workers=1, token=token, max_episodes=2, idle_timeout=1.0, max_request_bytes=4096) as server:
        assert httpx.get(server.url + "/health").status_code == 200  # health needs no token
        assert httpx.get(server.url + "/tasks").status_code == 401
        assert httpx.get(server.url + "/tasks", headers={"Authorization": "Bearer wrong-token-0000000"}).status_code == 401
        with Client(server.url, token=token, retries=0) as client:
            assert client.tasks()
            a = client.create("multi_turn_base_0")
            client.create("multi_turn_base_1")
            with pytest.raises(ServiceError, match="2 episodes are live") as full:
                client.create("multi_turn_base_2")
            assert full.value.status == 429
            with pytest.raises(ServiceError, match="larger than 4096 bytes") as big:
                client.step(a["episode_id"], "x" * 5000)
            assert big.value.status == 413
            deadline = time.monotonic() + 20
            while server.pool.live_episodes and time.monotonic() < deadline:
                time.sleep(0.2)
            with pytest.raises(ServiceError, match="idle timeout") as idle:
                client.step(a["episode_id"], "hello")
            assert idle.value.status == 410
            assert client.create("multi_turn_base_2")["turn"] == 0  # room again


def test_off_loopback_needs_a_token():
    with pytest.raises(ValueError, match="set a bearer token"):
        ServiceSettings(host="0.0.0.0")
    assert ServiceSettings(host="0.0.0.0", token="x" * 16).token


def test_the_step_alarm_interrupts_python_code_even_through_except_exception():
    started = time.monotonic()
    with pytest.raises(_StepTimeout):
        with _alarm(0.05):
            while True:
                try:
                    time.sleep(0.01)
                except Exception:  # backend code often does this; the alarm must get through
                    pass
    assert time.monotonic() - started < 2


def _episodes_on(server, client, task_set, count):
    opened = [(task_set.get(SAMPLE[i % len(SAMPLE)]), client.create(SAMPLE[i % len(SAMPLE)])["episode_id"]) for i in range(count)]
    return [(task, eid, server.pool.slot_of(eid)) for task, eid in opened]


def test_a_killed_worker_fails_only_its_episodes_and_is_replaced(task_set):
    with Server(task_set, workers=2) as server, Client(server.url, backoff=0.01) as client:
        opened = _episodes_on(server, client, task_set, 8)
        for task, eid, _ in opened:
            client.step(eid, transcript(task)[0], step=0)
        victim = 0
        os.kill(server.pool.worker_pids()[victim], signal.SIGKILL)
        for task, eid, slot in opened:
            if slot == victim:
                with pytest.raises(ServiceError, match="worker process died") as failed:
                    client.step(eid, transcript(task)[1], step=1)
                assert failed.value.status == 410
            else:
                for step, message in enumerate(transcript(task)[1:], start=1):
                    client.step(eid, message, step=step)
                assert client.evaluate(eid)["reward"] == 1.0
        assert any(slot == victim for *_, slot in opened) and any(slot != victim for *_, slot in opened)
        _, replies = replay(client, task_set.get("multi_turn_base_0"))  # still serving
        assert replies[-1]["reward"] == 1.0
        health = client.health()
        assert health["workers_alive"] == 2 and health["worker_restarts"] == 1


def test_a_stuck_worker_is_killed_after_the_step_timeout_and_replaced(task_set):
    with Server(task_set, workers=2, step_timeout=0.5, kill_grace=0.5) as server, Client(server.url, retries=0) as client:
        opened = _episodes_on(server, client, task_set, 4)
        task, eid, slot = opened[0]
        os.kill(server.pool.worker_pids()[slot], signal.SIGSTOP)  # stuck, as in a C call that never returns
        with pytest.raises(ServiceError, match="ran 1 s without returning") as stuck:
            client.step(eid, transcript(task)[0], step=0)
        assert stuck.value.status == 410
        for task, eid, other in opened[1:]:
            if other != slot:
                assert client.step(eid, transcript(task)[0], step=0)["info"]["event"] == "tool_results"
        deadline = time.monotonic() + 60
        while client.health()["workers_alive"] < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.health()["workers_alive"] == 2


def test_the_client_retries_transient_failures_and_only_safe_requests():
    calls = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) < 3:
            return httpx.Response(503, json={"detail": "busy"})
        return httpx.Response(200, json={"tasks": []})

    with Client("http://service", backoff=0.001, transport=httpx.MockTransport(flaky)) as client:
        assert client.tasks() == [] and len(calls) == 3

    def timeout(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ReadTimeout("slow", request=request)

    calls.clear()
    with Client("http://service", backoff=0.001, retries=3, transport=httpx.MockTransport(timeout)) as client:
        with pytest.raises(ServiceError, match="after 1 attempt"):
            client.step("some-episode-id", "hi")  # no step index: it may have run, so no retry
        assert len(calls) == 1
        with pytest.raises(ServiceError, match="after 4 attempt"):
            client.step("some-episode-id", "hi", step=0)  # indexed: safe to retry
        assert len(calls) == 5


def test_the_async_client_plays_episodes_concurrently(server, task_set):
    import asyncio

    async def play(client, task):
        episode = await client.create(task.id)
        for step, message in enumerate(transcript(task)):
            reply = await client.step(episode["episode_id"], message, step=step)
        evaluation = await client.evaluate(episode["episode_id"])
        await client.release(episode["episode_id"])
        return reply["reward"], evaluation["reward"]

    async def main():
        async with AsyncClient(server.url) as client:
            return await asyncio.gather(*(play(client, task_set.get(t)) for t in SAMPLE * 4))

    assert asyncio.run(main()) == [(1.0, 1.0)] * 16


def test_no_request_the_schema_allows_gets_a_server_error_or_breaks_the_schema(server):
    """Schemathesis generates requests from the OpenAPI schema (valid and invalid bodies, paths and
    queries) and checks every response: no 5xx, status codes, content types and bodies as declared."""
    from hypothesis import given, strategies as st

    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "GET /health", "GET /tasks", "POST /episodes", "POST /episodes/{episode_id}/step",
        "POST /episodes/{episode_id}/evaluate", "DELETE /episodes/{episode_id}",
    }  # fmt: skip
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            case.call_and_validate()

        check()


def test_the_service_serves_any_environment_family(task_set):
    """``seal serve --family``: the example family's episodes over HTTP, each equal to the in-process episode;
    its own categories in /tasks (one the family lacks answers 422 naming them)."""
    from seal_rl.environments import load_family, oracle_messages

    from .generators import INVENTORY

    family = load_family(INVENTORY)
    with Server(None, workers=1, family=INVENTORY) as running, Client(running.url, backoff=0.01) as c:
        assert c.health()["family"] == INVENTORY
        listed = c.tasks("all")
        assert {t["id"] for t in listed} == {t.id for t in family.tasks()}
        assert {t["category"] for t in listed} == {t.category for t in family.tasks()} and {t["num_turns"] for t in listed} == {1}
        wrong = httpx.get(running.url + "/tasks", params={"category": "base"})
        assert wrong.status_code == 422 and all(c in json.dumps(wrong.json()["detail"]) for c in {t.category for t in family.tasks()})
        hostile = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
        for task, wrong in zip(family.tasks()[:2], (False, True)):
            messages = ([hostile] if wrong else []) + list(oracle_messages(family, task, "hermes"))
            episode = c.create(task.id)
            local = family.make_env()
            assert as_json(local.reset(task)[0]) == episode["observation"]
            for i, message in enumerate(messages):
                reply = c.step(episode["episode_id"], message, step=i)
                assert as_json(local.step(message)[0]) == reply["observation"]
                if reply["done"]:
                    break
            evaluation = c.evaluate(episode["episode_id"], include_record=True)
            if not local.done:
                local.truncate("client_stop")
            assert evaluation["record"]["verdict"] == as_json(local.record()["verdict"]) and evaluation["labels"]
            assert evaluation["reward"] == local.record()["reward"] == 1.0  # the oracle solves it, after the refused call
            assert ("no tool named 'rm_rf'" in json.dumps(evaluation["record"]["messages"])) is wrong
