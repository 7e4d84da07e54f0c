"""Episodes of the service live in worker processes: the :class:`EpisodePool`.

BFCL backends are not thread-safe and keep process-wide state, so every episode is pinned to one
of ``workers`` processes (each loads the served environment family: BFCL by default) (``python -m seal_rl.service.workers``, single-threaded) for its whole life — not one process per
episode. The parent talks to each worker over a pipe from one thread per worker; the web
server's event loop awaits the answers.

Failures stay local and are reported, never hidden:

* a step that runs past ``step_timeout`` is interrupted inside the worker (SIGALRM); that
  episode fails, the others on the worker go on;
* a worker that still does not answer ``kill_grace`` seconds later (stuck in C code), or that
  dies, is replaced; the episodes it held fail with a message that says so; the pool keeps serving;
* a replacement that fails to start (killed while importing, out of memory) is tried again after
  ``respawn_backoff`` seconds, doubling up to ``respawn_backoff_max``, for as long as the pool
  runs; meanwhile requests for its slot answer 503 and ``workers_alive`` counts it out;
* failed, released and idle-expired episodes are remembered (bounded), so a later request for one
  is told what happened to it (410) rather than "not found".
"""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from seal_rl.errors import SealError
from seal_rl.service.schemas import EPISODE_CAPS

GONE_MEMORY = 100_000
"""how many ended episodes are remembered for the 410 message"""
READY_TIMEOUT = 120.0
"""seconds a new worker may take to import the backends and load the tasks"""


class EpisodeError(Exception):
    """A request the pool could not carry out; ``kind`` maps to an HTTP status in the app."""

    STATUS = {"not_found": 404, "conflict": 409, "gone": 410, "invalid": 422, "capacity": 429, "unavailable": 503}

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def status(self) -> int:
        return self.STATUS[self.kind]


# -- inside a worker process ------------------------------------------------------------------


class _StepTimeout(BaseException):
    """Raised by SIGALRM in a worker; a BaseException so backend code's ``except Exception`` cannot swallow it."""


@contextmanager
def _alarm(seconds: float):
    def ring(signum, frame):
        raise _StepTimeout

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class _Live:
    env: Any
    spec: dict[str, Any]
    opening: dict[str, Any]
    last_step: tuple[int, dict[str, Any]] | None = None


class _Episodes:
    """The episodes of one worker process and the operations on them (runs in the worker)."""

    def __init__(self, family: str = "bfcl", family_settings: Mapping[str, Any] | None = None) -> None:
        from seal_rl.environments import load_family
        from seal_rl.tools import ToolCatalog

        self.family = load_family(family, **dict(family_settings or {}))
        self.tasks = self.family.task_set()
        self.catalog = ToolCatalog()
        self.live: dict[str, _Live] = {}

    def _get(self, episode_id: str) -> _Live:
        live = self.live.get(episode_id)
        if live is None:
            raise EpisodeError("not_found", f"Episode {episode_id} is not held by this worker.")
        return live

    def create(self, episode_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        from seal_rl.env import EnvConfig
        from seal_rl.environments.family import affordances
        from seal_rl.interface import Interface, InterfaceState

        if episode_id in self.live:
            live = self.live[episode_id]
            if live.spec != spec or live.env.model_calls:
                raise EpisodeError("conflict", f"Episode {episode_id} already exists with other settings or has started; choose another episode_id.")
            return live.opening
        try:
            config = EnvConfig(protocol=spec["protocol"], call_format=spec["call_format"], prompt_mode=spec["prompt_mode"],
                               **{cap: spec[cap] for cap in EPISODE_CAPS})  # fmt: skip
            state = InterfaceState.from_json(spec["interface"])
            interface = Interface(config.prompt_mode, state, call_format=config.call_format, training=spec["mode"] == "train",
                                  catalog=self.catalog, protocol=config.protocol, **affordances(self.family))  # fmt: skip
            task = self.tasks.get(spec["task_id"])
            env = self.family.make_env(config, interface, catalog=self.catalog)
        except (SealError, TypeError, ValueError) as exc:
            raise EpisodeError("invalid", str(exc)) from None
        observation, info = env.reset(task)
        opening = {
            "episode_id": episode_id, "task_id": task.id, "observation": observation, "tools": info["tools"],
            "turn": info["turn"], "num_turns": getattr(task, "num_turns", 1), "interface": state.to_json(),
            "active_components": state.active_components,
        }  # fmt: skip
        self.live[episode_id] = _Live(env, spec, opening)
        return opening

    def step(self, episode_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Play one message. A repeated ``step`` index is answered as the first time, unless the episode
        has ended since (``evaluate`` stopped it): then its old ``done: false`` would be untrue, and
        it answers 409 like any step after the end."""
        live = self._get(episode_id)
        env, index = live.env, payload.get("step")
        if index is not None and live.last_step is not None and index == live.last_step[0]:
            if live.last_step[1]["done"] or not env.done:
                return live.last_step[1]  # a retried request: answer as the first time
        elif index is not None and index != env.model_calls and not env.done:
            raise EpisodeError("conflict", f"Episode {episode_id} expects step {env.model_calls}, got step {index}.")
        if env.done:
            raise EpisodeError("conflict", f"Episode {episode_id} has ended ({env.end_reason}); POST .../evaluate for its result.")
        observation, reward, terminated, truncated, info = env.step(payload["message"])
        answer = {
            "observation": observation, "reward": reward, "terminated": terminated, "truncated": truncated,
            "done": env.done,
            "info": {"turn": info["turn"], "step": info["step"], "event": info["event"], "tools": info.get("tools"),
                     "end_reason": info.get("end_reason")},
        }  # fmt: skip
        live.last_step = (info["step"], answer)
        return answer

    def evaluate(self, episode_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        from seal_rl.diagnose import add_diagnosis

        env = self._get(episode_id).env
        if not env.done:
            env.truncate(payload.get("reason", "client_stop"))
        record = env.record()
        add_diagnosis(record)
        return {
            "episode_id": episode_id, "task_id": record["task_id"], "reward": record["reward"],
            "end_reason": record["end_reason"], "turns_reached": record["turns_reached"],
            "num_turns": record["num_turns"], "model_calls": record["model_calls"],
            **record["diagnosis"], "verdict": record["verdict"],
            "record": record if payload.get("include_record") else None,
        }  # fmt: skip

    def release(self, episode_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        return {"released": self.live.pop(episode_id, None) is not None}


def worker_main(conn, step_timeout: float, family: str = "bfcl", family_settings: Mapping[str, Any] | None = None) -> None:
    """A worker process serving ``family``'s episodes: answer ``(op, episode_id, payload)`` messages until ``None`` or EOF.

    Answers are ``("ok", result)``, ``(kind, message)`` for a refused request, or ``("failed",
    message)`` when the episode was lost (timeout, internal error) and has been dropped.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    episodes = _Episodes(family, family_settings)
    handlers = {"create": episodes.create, "step": episodes.step, "evaluate": episodes.evaluate, "release": episodes.release}
    conn.send(("ok", "ready"))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        op, episode_id, payload = message
        try:
            with _alarm(step_timeout):
                answer = ("ok", handlers[op](episode_id, payload))
        except _StepTimeout:
            episodes.live.pop(episode_id, None)
            answer = ("failed", f"its {op} ran longer than the step timeout of {step_timeout:g} s and was stopped")
        except EpisodeError as exc:
            answer = (exc.kind, str(exc))
        except Exception as exc:  # a bug must cost one episode, not the worker
            episodes.live.pop(episode_id, None)
            answer = ("failed", f"internal error in {op}: {type(exc).__name__}: {exc}")
        conn.send(answer)


# -- in the parent ----------------------------------------------------------------------------


@dataclass
class _Entry:
    slot: int
    last_used: float
    busy: bool = False


@dataclass
class _Job:
    op: str
    episode_id: str
    payload: Any
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


@dataclass
class _Worker:
    """One worker process and the parent thread that talks to it."""

    slot: int
    jobs: queue.Queue = field(default_factory=queue.Queue)
    process: subprocess.Popen | None = None
    conn: Connection | None = None
    thread: threading.Thread | None = None
    held: set[str] = field(default_factory=set)
    """episodes the process holds"""
    ready: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    """why the process could not be started (then every job is refused with 503 until a retry succeeds)"""
    restarts: int = 0
    start_failures: int = 0
    failures_in_a_row: int = 0
    retry_at: float = 0.0
    """monotonic time of the next attempt to start a process, while ``error`` is set"""

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class EpisodePool:
    """Live episodes spread over worker processes; every method is called from the event loop."""

    def __init__(self, workers: int, *, max_episodes: int, step_timeout: float, kill_grace: float,
                 respawn_backoff: float = 0.5, respawn_backoff_max: float = 30.0, family: str = "bfcl",
                 family_settings: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        self.family = [family, json.dumps(dict(family_settings or {}))]  # the workers' arguments
        self.max_episodes, self.step_timeout, self.kill_grace = max_episodes, step_timeout, kill_grace
        self.respawn_backoff, self.respawn_backoff_max = respawn_backoff, respawn_backoff_max
        self._workers = [_Worker(slot) for slot in range(workers)]
        self._entries: dict[str, _Entry] = {}
        self._gone: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers and wait until all are ready."""
        for worker in self._workers:
            worker.thread = threading.Thread(target=self._serve, args=(worker,), name=f"seal-worker-{worker.slot}", daemon=True)
            worker.thread.start()
        deadline = time.monotonic() + READY_TIMEOUT
        for worker in self._workers:
            while not worker.ready.wait(0.1) and worker.error is None and time.monotonic() < deadline:
                pass
            if not worker.ready.is_set():
                self.close()
                raise SealError(f"Worker {worker.slot} could not start: {worker.error or 'timed out'}.")

    def close(self) -> None:
        self._closing = True
        for worker in self._workers:
            worker.jobs.put(None)
        for worker in self._workers:
            if worker.thread is not None:
                worker.thread.join(timeout=10)

    # -- state -------------------------------------------------------------------------------

    @property
    def live_episodes(self) -> int:
        return len(self._entries)

    @property
    def workers_alive(self) -> int:
        return sum(1 for w in self._workers if w.ready.is_set() and w.alive)

    @property
    def worker_restarts(self) -> int:
        return sum(w.restarts for w in self._workers)

    @property
    def worker_start_failures(self) -> int:
        return sum(w.start_failures for w in self._workers)

    def worker_pids(self) -> list[int | None]:
        return [w.process.pid if w.process is not None else None for w in self._workers]

    def slot_of(self, episode_id: str) -> int | None:
        entry = self._entries.get(episode_id)
        return entry.slot if entry is not None else None

    def _forget(self, episode_id: str, why: str) -> None:
        self._entries.pop(episode_id, None)
        self._gone[episode_id] = why
        self._gone.move_to_end(episode_id)
        while len(self._gone) > GONE_MEMORY:
            self._gone.popitem(last=False)

    def _checkout(self, episode_id: str) -> _Entry:
        with self._lock:
            entry = self._entries.get(episode_id)
            if entry is None:
                if episode_id in self._gone:
                    raise EpisodeError("gone", f"Episode {episode_id} {self._gone[episode_id]}; create a new episode.")
                raise EpisodeError("not_found", f"Episode {episode_id} not found; create one with POST /episodes.")
            if entry.busy:
                raise EpisodeError("conflict", f"A request for episode {episode_id} is still running; send one request at a time per episode.")
            entry.busy = True
            return entry

    # -- operations --------------------------------------------------------------------------

    async def create(self, episode_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if episode_id in self._gone:
                raise EpisodeError("conflict", f"Episode id {episode_id} was used before; choose another episode_id.")
            entry = self._entries.get(episode_id)
            new = entry is None
            if new:
                if len(self._entries) >= self.max_episodes:
                    raise EpisodeError("capacity", f"{self.max_episodes} episodes are live (the limit); release finished ones with DELETE /episodes/{{id}} or retry later.")
                slot = min(self._workers, key=lambda w: (not w.ready.is_set(), len(w.held) + w.jobs.qsize())).slot
                entry = self._entries[episode_id] = _Entry(slot, time.monotonic(), busy=True)
            elif entry.busy:
                raise EpisodeError("conflict", f"A request for episode {episode_id} is still running.")
            else:
                entry.busy = True
        try:
            return await self._call(entry.slot, "create", episode_id, spec)
        except EpisodeError:
            if new:
                with self._lock:
                    self._entries.pop(episode_id, None)
            raise
        finally:
            entry.busy, entry.last_used = False, time.monotonic()

    async def step(self, episode_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._on_episode("step", episode_id, payload)

    async def evaluate(self, episode_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        return await self._on_episode("evaluate", episode_id, payload)

    async def release(self, episode_id: str, why: str = "was released (DELETE /episodes/{id})") -> bool:
        entry = self._checkout(episode_id)
        with self._lock:
            self._forget(episode_id, why)
        await self._call(entry.slot, "release", episode_id, {})
        return True

    async def release_idle(self, idle_timeout: float) -> list[str]:
        """Release episodes untouched for ``idle_timeout`` seconds; their ids."""
        now = time.monotonic()
        with self._lock:
            idle = [(eid, e) for eid, e in self._entries.items() if not e.busy and now - e.last_used > idle_timeout]
            for eid, _ in idle:
                self._forget(eid, f"was released after {idle_timeout:g} s without a request (idle timeout)")
        for eid, entry in idle:
            try:
                await self._call(entry.slot, "release", eid, {})
            except EpisodeError:
                pass  # its worker died meanwhile: nothing left to release
        return [eid for eid, _ in idle]

    async def _on_episode(self, op: str, episode_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        entry = self._checkout(episode_id)
        try:
            return await self._call(entry.slot, op, episode_id, payload)
        finally:
            entry.busy, entry.last_used = False, time.monotonic()

    async def _call(self, slot: int, op: str, episode_id: str, payload: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._workers[slot].jobs.put(_Job(op, episode_id, payload, loop, future))
        kind, result = await future
        if kind == "ok":
            return result
        if kind == "failed":
            if op == "create":
                raise EpisodeError("unavailable", f"Creating episode {episode_id} failed: {result}. Retry.")
            with self._lock:
                self._forget(episode_id, f"failed: {result}")
            raise EpisodeError("gone", f"Episode {episode_id} failed: {result}; create a new episode.")
        if kind == "not_found":  # its worker was replaced while this request waited
            why = self._gone.get(episode_id, "was lost with its worker")
            raise EpisodeError("gone", f"Episode {episode_id} {why}; create a new episode.")
        raise EpisodeError(kind, result)

    # -- the thread of one worker ------------------------------------------------------------

    def _serve(self, worker: _Worker) -> None:
        self._spawn(worker)
        while True:
            # Checked before every job too: a dead slot still gets jobs (answered 503), and a queue
            # that is never empty must not keep it from being restarted.
            if not self._closing:
                if worker.error is None and not worker.alive:
                    self._replace(worker, f"its worker process died (exit code {worker.process.returncode})")
                elif worker.error is not None and time.monotonic() >= worker.retry_at:
                    self._spawn(worker)
            wait = 0.5 if worker.error is None else min(0.5, max(0.01, worker.retry_at - time.monotonic()))
            try:
                job = worker.jobs.get(timeout=wait)
            except queue.Empty:
                continue
            if job is None:
                self._stop(worker)
                return
            try:
                self._run(worker, job)
            except Exception as exc:  # never leave a request waiting forever
                job.loop.call_soon_threadsafe(_resolve, job.future, ("failed", f"internal error: {type(exc).__name__}: {exc}"))

    def _run(self, worker: _Worker, job: _Job) -> None:
        answer: tuple[str, Any]
        if worker.error is not None:
            job.loop.call_soon_threadsafe(_resolve, job.future, ("unavailable", f"worker {worker.slot} is down: {worker.error}"))
            return
        try:
            worker.conn.send((job.op, job.episode_id, job.payload))
            if worker.conn.poll(self.step_timeout + self.kill_grace):
                answer = worker.conn.recv()
            else:
                worker.process.kill()
                why = f"its worker process was killed: a {job.op} ran {self.step_timeout + self.kill_grace:g} s without returning"
                answer = ("failed", why)
                self._replace(worker, why)
        except (EOFError, OSError):
            _wait(worker.process)
            why = f"its worker process died during a {job.op} (exit code {worker.process.returncode})"
            answer = ("failed", why)
            self._replace(worker, why)
        kind = answer[0]
        if kind == "ok" and job.op == "create":
            worker.held.add(job.episode_id)
        elif (kind == "ok" and job.op == "release") or kind == "failed":
            worker.held.discard(job.episode_id)
        job.loop.call_soon_threadsafe(_resolve, job.future, answer)

    def _spawn(self, worker: _Worker) -> None:
        """Start a worker process in ``worker``'s slot; on failure record why (jobs then get 503) and
        when to try again (exponential backoff: ``respawn_backoff`` × 2^(failures in a row − 1))."""
        try:
            parent, child = socket.socketpair()
        except OSError as exc:  # out of file descriptors
            return self._failed_start(worker, f"cannot make its pipe: {exc}")
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "seal_rl.service.workers", str(child.fileno()), repr(self.step_timeout), *self.family],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except OSError as exc:
            parent.close()
            return self._failed_start(worker, f"cannot start {sys.executable}: {exc}")
        finally:
            child.close()
        if worker.conn is not None:
            worker.conn.close()
        worker.process, worker.conn = process, Connection(parent.detach())
        try:
            if worker.conn.poll(READY_TIMEOUT) and worker.conn.recv() == ("ok", "ready"):
                worker.error, worker.failures_in_a_row = None, 0
                worker.ready.set()
                return
            why = f"the process did not get ready within {READY_TIMEOUT:g} s"
        except (EOFError, OSError):
            why = f"the process exited while starting (exit code {_wait(process)}); run `python -m seal_rl.service.workers` to see why"
        process.kill()
        _wait(process)
        self._failed_start(worker, why)

    def _failed_start(self, worker: _Worker, why: str) -> None:
        worker.error = why
        worker.start_failures += 1
        worker.failures_in_a_row += 1
        delay = min(self.respawn_backoff * 2 ** (worker.failures_in_a_row - 1), self.respawn_backoff_max)
        worker.retry_at = time.monotonic() + delay

    def _replace(self, worker: _Worker, why: str) -> None:
        """Fail the dead worker's episodes with ``why`` and start a fresh process in its slot."""
        worker.ready.clear()
        if worker.alive:
            worker.process.kill()
        _wait(worker.process)
        worker.conn.close()
        with self._lock:
            for episode_id in worker.held:
                if episode_id in self._entries:
                    self._forget(episode_id, f"failed: {why}")
        worker.held.clear()
        worker.restarts += 1
        if not self._closing:
            self._spawn(worker)

    def _stop(self, worker: _Worker) -> None:
        if worker.process is None:
            return
        try:
            worker.conn.send(None)
        except OSError:
            pass
        if _wait(worker.process, 5) is None:
            worker.process.kill()
            _wait(worker.process)
        worker.conn.close()


def _wait(process: subprocess.Popen, timeout: float = 5) -> int | None:
    """The exit code once ``process`` has ended (None if it is still running after ``timeout``)."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _resolve(future: asyncio.Future, answer: tuple[str, Any]) -> None:
    if not future.done():
        future.set_result(answer)



if __name__ == "__main__":
    if len(sys.argv) not in (3, 5):
        sys.exit("usage: python -m seal_rl.service.workers FD STEP_TIMEOUT [FAMILY SETTINGS_JSON] (started by `seal serve`, not by hand)")
    worker_main(Connection(int(sys.argv[1])), float(sys.argv[2]), *([sys.argv[3], json.loads(sys.argv[4])] if len(sys.argv) == 5 else []))
