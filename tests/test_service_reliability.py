"""The service under hostile output and crashes (issue 14): lone surrogates, workers killed while
starting, idle and slow connections, log floods, late repeated steps."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import threading
import time

import pytest
import uvicorn
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.errors import SealError
from seal_rl.service import server as server_module
from seal_rl.service.app import create_app
from seal_rl.service.logs import RateLimit, log_config
from seal_rl.service.server import GuardedH11Protocol, ensure_descriptors, uvicorn_config
from seal_rl.service.settings import ServiceSettings

# Model text: any code point, lone surrogates included, with the ones that break naive writers
# (half an emoji, JSON-legal line separators that JavaScript and some loggers treat as newlines, NUL).
SPECIAL = ["\ud83d", "\ude00", "\udfff", "\u2028", "\u2029", "\x85", "\x00", "\ufeff", "\U0001f600"]
model_text = st.lists(st.one_of(st.text(st.characters(exclude_categories=()), max_size=20), st.sampled_from(SPECIAL)),
                      max_size=6).map("".join)  # fmt: skip


def post(client: TestClient, path: str, body: dict):
    """POST with JSON escapes, the only way a lone surrogate can travel (raw UTF-8 cannot hold one)."""
    return client.post(path, content=json.dumps(body).encode("ascii"), headers={"content-type": "application/json"})


def strict_json(response) -> dict:
    """The body as strict JSON: valid UTF-8, no NaN/Infinity."""
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(response.content.decode("utf-8"), parse_constant=refuse)


@pytest.fixture(scope="module")
def app_client(task_set):
    with TestClient(create_app(ServiceSettings(workers=1), tasks=task_set)) as client:
        yield client


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture], database=None)
@given(text=model_text)
@example(text="\ud83d")  # the half emoji
@example(text="\ud800\udc00")  # a pair as two code units: JSON reads it back as U+10000
@example(text="a\u2028b\x85c\x00d")
def test_any_model_text_gets_200s_and_valid_json_through_every_endpoint(app_client, task_set, text):
    created = post(app_client, "/episodes", {"task_id": "multi_turn_base_0"})
    assert created.status_code == 201
    episode_id = strict_json(created)["episode_id"]
    messages = [
        text,
        '<tool_call>{"name": "cd", "arguments": {"folder": %s}}</tool_call>' % json.dumps(text),
        '<tool_call>{"name": "mkdir", "arguments": {"dir_name": %s}}</tool_call>' % json.dumps(text),
    ]
    for step, message in enumerate(messages):
        reply = post(app_client, f"/episodes/{episode_id}/step", {"message": message, "step": step})
        assert reply.status_code == 200, reply.content[:300]
        strict_json(reply)
    evaluation = post(app_client, f"/episodes/{episode_id}/evaluate", {"include_record": True})
    assert evaluation.status_code == 200, evaluation.content[:300]
    record = strict_json(evaluation)["record"]
    # The round trip keeps what the environment kept: the same transcript as in process, and the
    # tool arguments exactly as the model wrote them (lone surrogates included). JSON itself reads a
    # surrogate pair written as two escapes as one astral character, so "as written" is what
    # json.loads makes of the escaped text.
    sent = json.loads(json.dumps(text))
    local = BfclEnv(EnvConfig())
    local.reset(task_set.get("multi_turn_base_0"))
    for message in messages:
        if not local.done:
            local.step(json.loads(json.dumps(message)))
    if not local.done:
        local.truncate("client_stop")
    assert record["messages"] == json.loads(json.dumps(local.record()["messages"]))
    assert [(call["name"], call["arguments"]) for call in record["trace"]] == [("cd", {"folder": sent}), ("mkdir", {"dir_name": sent})]
    assert app_client.delete(f"/episodes/{episode_id}").status_code == 200
    # Errors that echo the input (unknown task id, an invalid field) are valid JSON too.
    for body in ({"task_id": text[:100]}, {"task_id": text * 200}, {"task_id": "multi_turn_base_0", "call_format": text}):
        refused = post(app_client, "/episodes", body)
        assert refused.status_code in (404, 422) and "detail" in strict_json(refused)


def test_a_repeated_step_after_evaluate_answers_409_not_the_old_running_answer(app_client):
    episode_id = strict_json(post(app_client, "/episodes", {"task_id": "multi_turn_base_0"}))["episode_id"]
    message = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    first = post(app_client, f"/episodes/{episode_id}/step", {"message": message, "step": 0})
    assert first.status_code == 200 and first.json()["done"] is False
    assert post(app_client, f"/episodes/{episode_id}/step", {"message": message, "step": 0}).json() == first.json()
    assert post(app_client, f"/episodes/{episode_id}/evaluate", {}).json()["end_reason"] == "client_stop"
    for step in (0, 1, 7):  # the last index again, the next one, a wild one
        late = post(app_client, f"/episodes/{episode_id}/step", {"message": message, "step": step})
        assert late.status_code == 409 and "has ended (client_stop)" in late.json()["detail"]


def test_a_repeated_final_step_is_still_answered_as_the_first_time(app_client):
    episode_id = strict_json(post(app_client, "/episodes", {"task_id": "multi_turn_base_0", "max_model_calls": 1}))["episode_id"]
    message = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    last = post(app_client, f"/episodes/{episode_id}/step", {"message": message, "step": 0}).json()
    assert last["done"] is True
    assert post(app_client, f"/episodes/{episode_id}/step", {"message": message, "step": 0}).json() == last
    post(app_client, f"/episodes/{episode_id}/evaluate", {})
    assert post(app_client, f"/episodes/{episode_id}/step", {"message": message, "step": 0}).json() == last


# -- workers killed while starting --------------------------------------------------------------


def _kill_during_start(pool, slot: int, timeout: float = 60) -> None:
    """Kill ``slot``'s worker, then its replacement as soon as it exists (still importing)."""
    old = pool.worker_pids()[slot]
    failures = pool.worker_start_failures
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pool.worker_pids()[slot] == old:
        assert time.monotonic() < deadline, "the dead worker was not replaced"
        time.sleep(0.002)
    os.kill(pool.worker_pids()[slot], signal.SIGKILL)
    while pool.worker_start_failures == failures:
        assert time.monotonic() < deadline, "the replacement was not seen failing"
        time.sleep(0.01)


def _wait_for_health(client: TestClient, status: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        response = client.get("/health")
        body = response.json()
        if body["status"] == status:
            assert response.status_code == (200 if status == "ok" else 503)
            return body
        assert time.monotonic() < deadline, f"health never said {status}: {body}"
        time.sleep(0.05)


def test_workers_killed_while_starting_are_retried_and_health_says_so(task_set):
    # respawn_backoff=3: a slot whose replacement died stays down long enough to be seen down.
    app = create_app(ServiceSettings(workers=2, respawn_backoff=3.0, respawn_backoff_max=3.0), tasks=task_set)
    with TestClient(app) as client:
        pool = app.state.pool
        assert client.get("/health").json()["status"] == "ok"
        _kill_during_start(pool, 0)
        degraded = _wait_for_health(client, "degraded")
        assert degraded["workers_alive"] == 1 and degraded["worker_start_failures"] >= 1
        _kill_during_start(pool, 1)
        assert _wait_for_health(client, "unavailable")["workers_alive"] == 0
        refused = post(client, "/episodes", {"task_id": "multi_turn_base_0"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        healed = _wait_for_health(client, "ok")
        assert healed["workers_alive"] == 2 and healed["worker_restarts"] == 2 and healed["worker_start_failures"] >= 2
        created = post(client, "/episodes", {"task_id": "multi_turn_base_0"})
        assert created.status_code == 201
        step = post(client, f"/episodes/{created.json()['episode_id']}/step",
                    {"message": '<tool_call>{"name": "ls", "arguments": {}}</tool_call>', "step": 0})  # fmt: skip
        assert step.json()["info"]["event"] == "tool_results"


def test_the_python_client_returns_a_503_health_instead_of_raising():
    import httpx

    from seal_rl.service.client import Client

    body = {"status": "unavailable", "workers_alive": 0}
    with Client("http://service", transport=httpx.MockTransport(lambda r: httpx.Response(503, json=body))) as client:
        assert client.health() == body


# -- the log rate limit -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(message: str, *args) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, message, args, None)


@given(burst=st.integers(1, 5), interval=st.floats(0.5, 10),
       events=st.lists(st.tuples(st.integers(0, 3), st.floats(0, 3)), max_size=200))  # fmt: skip
def test_the_rate_limit_lets_burst_lines_per_kind_and_window_through_and_counts_the_rest(burst, interval, events):
    clock = Clock()
    limit = RateLimit(burst, interval, clock=clock)
    window_start: dict[int, float] = {}
    passed_in_window: dict[int, int] = {}
    dropped_in_window: dict[int, int] = {}
    total_dropped = 0
    for kind, gap in events:
        clock.now += gap
        record = _record(f"line of kind {kind} (%s)", "an argument")
        # The model of the rule, written independently of the filter.
        reported, previous_start = 0, window_start.get(kind)
        if kind not in window_start or clock.now - window_start[kind] >= interval:
            reported = dropped_in_window.get(kind, 0)
            window_start[kind], passed_in_window[kind], dropped_in_window[kind] = clock.now, 0, 0
        expect_pass = passed_in_window[kind] < burst
        passed_in_window[kind] += expect_pass
        dropped_in_window[kind] += not expect_pass
        total_dropped += not expect_pass
        assert limit.filter(record) is expect_pass
        if expect_pass and reported:
            assert record.getMessage() == f"line of kind {kind} (an argument) [{reported} more like this dropped in {clock.now - previous_start:.0f} s]"
        else:
            assert "more like this dropped" not in record.getMessage()
    assert limit.dropped == total_dropped


def test_a_flood_of_one_line_is_cut_to_the_burst_and_the_count_reported():
    clock = Clock()
    limit = RateLimit(burst=3, interval=60, clock=clock)
    # One kind: the same template, whatever its arguments (a thousand clients' addresses).
    let_through = [limit.filter(_record("%s:%d - Invalid HTTP request received.", "10.0.0.1", port)) for port in range(10_000)]
    assert sum(let_through) == 3 and limit.dropped == 9_997
    assert limit.filter(_record("another line")) is True  # another kind has its own allowance
    clock.now = 61
    record = _record("%s:%d - Invalid HTTP request received.", "10.0.0.2", 1)
    assert limit.filter(record)
    assert record.getMessage() == "10.0.0.2:1 - Invalid HTTP request received. [9997 more like this dropped in 61 s]"


def test_the_rate_limit_forgets_old_kinds_and_bounds_its_memory():
    from seal_rl.service import logs

    clock = Clock()
    limit = RateLimit(burst=1, interval=1, clock=clock)
    for i in range(logs.MAX_KINDS * 3):
        clock.now += 0.001
        limit.filter(_record(f"unique line {i}"))
    assert len(limit._windows) <= logs.MAX_KINDS + 1


# -- connection limits reach uvicorn -------------------------------------------------------------


def test_the_settings_reach_uvicorn():
    settings = ServiceSettings(workers=1, max_connections=77, backlog=33, header_timeout=3.5, keep_alive_timeout=2.5,
                               log_burst=9, log_interval=7)  # fmt: skip
    config = uvicorn_config(object(), settings)
    assert config.limit_concurrency == 77 and config.timeout_keep_alive == 2.5 and config.backlog == 33
    assert config.http.func is GuardedH11Protocol and config.http.keywords == {"header_timeout": 3.5}
    logging_config = config.log_config
    assert logging_config["filters"]["rate_limit"] == {"()": "seal_rl.service.logs.RateLimit", "burst": 9, "interval": 7}
    assert all(handler["filters"] == ["rate_limit"] for handler in logging_config["handlers"].values())
    assert logging_config["root"]["handlers"] == ["default"]  # asyncio's accept errors go through it too
    assert log_config(9, 7) == logging_config


async def _hello(scope, receive, send):
    """``/slow`` answers after 1 s, everything else at once."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(1)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture()
def guarded_server():
    settings = ServiceSettings(workers=1, max_connections=4, header_timeout=0.5, keep_alive_timeout=30)
    config = uvicorn_config(_hello, settings)
    config.log_config = None
    server = uvicorn.Server(config)
    sock = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()
    server.should_exit = True
    thread.join(10)


def _closed_within(conn: socket.socket, seconds: float) -> bool:
    conn.settimeout(seconds)
    try:
        while data := conn.recv(4096):
            if b"\r\n\r\n" in data:  # an answer; the connection is open until it is closed
                continue
        return True
    except TimeoutError:
        return False


def test_idle_and_trickling_connections_are_closed_after_the_header_timeout(guarded_server):
    idle = socket.create_connection(guarded_server)
    trickling = socket.create_connection(guarded_server)
    started = time.monotonic()
    for byte in b"GET / HT":
        trickling.sendall(bytes([byte]))
        time.sleep(0.05)
    assert _closed_within(idle, 3) and _closed_within(trickling, 3)
    assert time.monotonic() - started < 3
    served = socket.create_connection(guarded_server)
    served.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    served.settimeout(3)
    assert served.recv(4096).startswith(b"HTTP/1.1 200")
    # After an answer the same timer runs again (keep_alive_timeout=30 would otherwise keep it).
    assert _closed_within(served, 3)


def test_a_pipelined_slow_request_is_not_cut_by_the_header_timeout(guarded_server):
    # header_timeout=0.5, /slow takes 1 s; the second request starts as the first answer completes.
    conn = socket.create_connection(guarded_server)
    conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.settimeout(3)
    received = b""
    while received.count(b"HTTP/1.1 200") < 2 and (chunk := conn.recv(4096)):
        received += chunk
    assert received.count(b"HTTP/1.1 200") == 2
    conn.close()


def _get(conn: socket.socket, path: str = "/") -> None:
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def test_at_max_connections_the_oldest_idle_connection_makes_room(guarded_server):
    # max_connections=4: three may be open; a fourth evicts the oldest still waiting for headers.
    idle = []
    for _ in range(3):
        idle.append(socket.create_connection(guarded_server))
        time.sleep(0.05)
    health = socket.create_connection(guarded_server)
    _get(health)
    health.settimeout(3)
    assert health.recv(4096).startswith(b"HTTP/1.1 200")
    assert _closed_within(idle[0], 0.3)  # the oldest, well before the header timeout
    assert not _closed_within(idle[2], 0.05)
    for conn in [*idle, health]:
        conn.close()


def test_at_max_connections_busy_connections_are_kept_and_the_newcomer_is_closed(guarded_server):
    busy = [socket.create_connection(guarded_server) for _ in range(3)]
    for conn in busy:
        _get(conn, "/slow")
    time.sleep(0.2)
    extra = socket.create_connection(guarded_server)
    assert _closed_within(extra, 0.3)
    for conn in busy:
        conn.settimeout(3)
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        conn.close()


def test_too_few_file_descriptors_for_max_connections_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(server_module.resource, "getrlimit", lambda which: (256, 512))
    with pytest.raises(SealError, match="needs 1328 open files, but this process may open at most 512; lower SEAL_MAX_CONNECTIONS"):
        ensure_descriptors(ServiceSettings(workers=2, max_connections=1000))  # 1000 + backlog 256 + 2 × 4 + 64
    raised = []
    monkeypatch.setattr(server_module.resource, "setrlimit", lambda which, limits: raised.append(limits))
    assert ensure_descriptors(ServiceSettings(workers=2, max_connections=300, backlog=100)) == 472 and raised == [(472, 512)]


def test_every_setting_is_documented_with_its_default():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "service.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[2].strip() for line in doc.splitlines() if line.startswith("| `")}
    for name, field in ServiceSettings.model_fields.items():
        if name in ("host", "port", "workers", "token"):
            continue  # documented with their flags, defaults in words
        documented = rows.get(f"SEAL_{name.upper()}") or rows.get(f"--{name.replace('_', '-')}")
        if name == "family_settings":  # a dict: documented by its flag, --family-set
            documented = rows.get("--family-set")
        assert documented is not None, f"SEAL_{name.upper()} is not in docs/guides/service.md"
        if not isinstance(field.default, (int, float)) or field.default is None:
            assert documented.strip("`") == (field.default if isinstance(field.default, str) else "none"), name
            continue
        assert float(documented.replace(" MiB", "").replace(",", "")) * (2**20 if "MiB" in documented else 1) == field.default, name


def test_seal_serve_with_too_few_files_is_one_error_line_and_exit_code_2(monkeypatch, capsys):
    import sys

    from seal_rl import cli

    monkeypatch.setattr(server_module.resource, "getrlimit", lambda which: (256, 512))
    monkeypatch.setenv("SEAL_MAX_CONNECTIONS", "1000")
    monkeypatch.setattr(sys, "argv", ["seal", "serve", "--port", "0"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "lower SEAL_MAX_CONNECTIONS or raise `ulimit -n`" in err
    assert len(err.strip().splitlines()) == 1
