"""Clients of the environment service (httpx), and :class:`RemoteEnv`, a ``BfclEnv`` over HTTP.

Retries are safe by construction: an episode is created under an id the client chooses (so a
repeated create returns the same episode), a step carries its index (so a repeated step is
answered from the first attempt), and evaluation is idempotent. Transient failures — connection
errors, timeouts, 429, 502, 503, 504 — are retried with exponential backoff; everything else is
raised as :class:`ServiceError` with the service's message.

>>> with Client("http://127.0.0.1:8082") as client:                      # doctest: +SKIP
...     episode = client.create("multi_turn_base_0")
...     reply = client.step(episode["episode_id"], '<tool_call>{"name": "ls", "arguments": {}}</tool_call>', step=0)
...     client.evaluate(episode["episode_id"])["labels"]
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from dataclasses import dataclass
from typing import Any

import httpx

from seal_rl.env import EnvConfig
from seal_rl.errors import SealError
from seal_rl.interface import InterfaceState
from seal_rl.service.schemas import EPISODE_CAPS
from seal_rl.tasks import Task

RETRY_STATUS = frozenset({429, 502, 503, 504})


class ServiceError(SealError):
    """The service refused a request (``status`` 4xx/5xx) or could not be reached (``status`` None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    body: dict[str, Any] | None = None
    idempotent: bool = True
    """False: retried only when it certainly did not run (no connection, 429/503)"""
    gone_is_done: bool = False
    """a 410 on a retry means the first attempt succeeded (release)"""
    answers: frozenset[int] = frozenset()
    """error statuses whose body is the answer, returned rather than raised or retried (``/health``'s 503)"""


class _Endpoints:
    """The requests of every endpoint, shared by the sync and async clients."""

    def __init__(self, base_url: str, token: str | None, timeout: float, retries: int, backoff: float) -> None:
        self.base_url, self.retries, self.backoff = base_url.rstrip("/"), retries, backoff
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))

    @staticmethod
    def _create(task_id: str, *, episode_id: str | None = None, **options: Any) -> _Call:
        """``options``: fields of ``POST /episodes`` (the service's defaults apply to those left out);
        ``interface`` may be an :class:`InterfaceState`."""
        if isinstance(options.get("interface"), InterfaceState):
            options["interface"] = options["interface"].to_json()
        return _Call("POST", "/episodes", {"task_id": task_id, "episode_id": episode_id or secrets.token_urlsafe(16), **options})

    @staticmethod
    def _step(episode_id: str, message: str, step: int | None) -> _Call:
        return _Call("POST", f"/episodes/{episode_id}/step", {"message": message, "step": step}, idempotent=step is not None)

    @staticmethod
    def _evaluate(episode_id: str, reason: str, include_record: bool) -> _Call:
        return _Call("POST", f"/episodes/{episode_id}/evaluate", {"reason": reason, "include_record": include_record})

    @staticmethod
    def _release(episode_id: str) -> _Call:
        return _Call("DELETE", f"/episodes/{episode_id}", gone_is_done=True)

    @staticmethod
    def _tasks(split: str, category: list[str] | None) -> _Call:
        query = f"?split={split}" + "".join(f"&category={c}" for c in category or [])
        return _Call("GET", f"/tasks{query}")

    def _retry_after(self, call: _Call, attempt: int, response: httpx.Response | None, error: Exception | None) -> float | None:
        """Seconds to wait before the next attempt, or None to stop."""
        if attempt >= self.retries or (response is not None and response.status_code in call.answers):
            return None
        if error is not None:
            if not (call.idempotent or isinstance(error, httpx.ConnectError)):
                return None
        elif response.status_code not in RETRY_STATUS or (not call.idempotent and response.status_code not in (429, 503)):
            return None
        delay = self.backoff * 2**attempt * (0.5 + random.random())
        if response is not None and response.headers.get("retry-after", "").isdigit():
            delay = max(delay, float(response.headers["retry-after"]))
        return min(delay, 30.0)

    def _result(self, call: _Call, attempt: int, response: httpx.Response | None, error: Exception | None) -> Any:
        if error is not None:
            raise ServiceError(f"{call.method} {self.base_url}{call.path} failed after {attempt + 1} attempt(s): {type(error).__name__}: {error}") from None
        if call.gone_is_done and attempt > 0 and response.status_code == 410:
            return {"released": True}
        if response.status_code >= 400:
            try:
                body = response.json()
                if response.status_code in call.answers and isinstance(body, dict) and "detail" not in body:
                    return body
                detail = body.get("detail") if isinstance(body, dict) else body
            except ValueError:
                detail = response.text[:500]
            raise ServiceError(f"{call.method} {call.path} -> {response.status_code}: {detail}", response.status_code)
        return response.json()


_HEALTH = _Call("GET", "/health", answers=frozenset({503}))


def _body(call: _Call) -> dict[str, Any]:
    """JSON with non-ASCII escaped, so even a lone surrogate in model output travels (httpx's own
    encoder writes raw UTF-8, which cannot hold one)."""
    if call.body is None:
        return {}
    return {"content": json.dumps(call.body).encode("ascii"), "headers": {"Content-Type": "application/json"}}


class Client(_Endpoints):
    """Synchronous client of ``seal serve`` (one connection pool; use as a context manager)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8082", *, token: str | None = None, timeout: float = 60.0,
                 retries: int = 4, backoff: float = 0.2, transport: httpx.BaseTransport | None = None) -> None:  # fmt: skip
        super().__init__(base_url, token, timeout, retries, backoff)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=self._timeout, transport=transport)

    def _send(self, call: _Call) -> Any:
        attempt = 0
        while True:
            response, error = None, None
            try:
                response = self._http.request(call.method, call.path, **_body(call))
            except httpx.TransportError as exc:
                error = exc
            wait = self._retry_after(call, attempt, response, error)
            if wait is None:
                return self._result(call, attempt, response, error)
            time.sleep(wait)
            attempt += 1

    def health(self) -> dict[str, Any]:
        """The service's state; ``status`` is ``ok``, ``degraded`` or ``unavailable`` (answered with 503)."""
        return self._send(_HEALTH)

    def tasks(self, split: str = "test", category: list[str] | None = None) -> list[dict[str, Any]]:
        return self._send(self._tasks(split, category))["tasks"]

    def create(self, task_id: str, **options: Any) -> dict[str, Any]:
        """Open an episode; options as in ``POST /episodes`` (call_format, prompt_mode, interface, mode, ...)."""
        return self._send(self._create(task_id, **options))

    def step(self, episode_id: str, message: str, step: int | None = None) -> dict[str, Any]:
        return self._send(self._step(episode_id, message, step))

    def evaluate(self, episode_id: str, reason: str = "client_stop", include_record: bool = False) -> dict[str, Any]:
        return self._send(self._evaluate(episode_id, reason, include_record))

    def release(self, episode_id: str) -> dict[str, Any]:
        return self._send(self._release(episode_id))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Endpoints):
    """The same as :class:`Client` for asyncio agent loops (``await client.step(...)``).

    Connections are spread over pools of at most ``POOL_SIZE``: httpx's pool does work linear in
    the requests it holds for each request, so one pool of 256 connections costs the client about
    twice the CPU per request of 16 pools of 16 (``benchmarks/bench_service.py``).
    """

    POOL_SIZE = 16

    def __init__(self, base_url: str = "http://127.0.0.1:8082", *, token: str | None = None, timeout: float = 60.0,
                 retries: int = 4, backoff: float = 0.2, max_connections: int = 64,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:  # fmt: skip
        super().__init__(base_url, token, timeout, retries, backoff)
        size = min(self.POOL_SIZE, max_connections)
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        self._pools = [
            httpx.AsyncClient(base_url=self.base_url, headers=self._headers, timeout=self._timeout, limits=limits, transport=transport)
            for _ in range(-(-max_connections // size))
        ]  # fmt: skip
        self._turn = 0

    async def _send(self, call: _Call) -> Any:
        self._turn = (self._turn + 1) % len(self._pools)
        http, attempt = self._pools[self._turn], 0
        while True:
            response, error = None, None
            try:
                response = await http.request(call.method, call.path, **_body(call))
            except httpx.TransportError as exc:
                error = exc
            wait = self._retry_after(call, attempt, response, error)
            if wait is None:
                return self._result(call, attempt, response, error)
            await asyncio.sleep(wait)
            attempt += 1

    async def health(self) -> dict[str, Any]:
        return await self._send(_HEALTH)

    async def tasks(self, split: str = "test", category: list[str] | None = None) -> list[dict[str, Any]]:
        return (await self._send(self._tasks(split, category)))["tasks"]

    async def create(self, task_id: str, **options: Any) -> dict[str, Any]:
        return await self._send(self._create(task_id, **options))

    async def step(self, episode_id: str, message: str, step: int | None = None) -> dict[str, Any]:
        return await self._send(self._step(episode_id, message, step))

    async def evaluate(self, episode_id: str, reason: str = "client_stop", include_record: bool = False) -> dict[str, Any]:
        return await self._send(self._evaluate(episode_id, reason, include_record))

    async def release(self, episode_id: str) -> dict[str, Any]:
        return await self._send(self._release(episode_id))

    async def aclose(self) -> None:
        for http in self._pools:
            await http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class RemoteEnv:
    """A :class:`~seal_rl.env.BfclEnv` whose episodes run in a ``seal serve`` service.

    It offers what the episode driver uses — ``reset``, ``step``, ``truncate``, ``record``,
    ``messages``, ``tools``, ``done``, ``config`` — so ``run_episodes(..., make_env=lambda:
    RemoteEnv(client))`` plays against the service unchanged. Steps carry their index, so the
    client's retries never play a message twice. The previous episode is released on ``reset``
    and on :meth:`close`.
    """

    def __init__(self, client: Client, config: EnvConfig | None = None, *,
                 interface: str | InterfaceState = "vanilla", training: bool = False) -> None:  # fmt: skip
        self.client = client
        self.config = config if config is not None else EnvConfig()
        self.interface, self.training = interface, training
        self.episode_id: str | None = None
        self.end_reason: str | None = None

    def reset(self, task: Task | str, *, seed: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        self.close()
        opened = self.client.create(
            task if isinstance(task, str) else task.id, protocol=self.config.protocol, call_format=self.config.call_format,
            prompt_mode=self.config.prompt_mode, interface=self.interface, mode="train" if self.training else "eval",
            **{cap: getattr(self.config, cap) for cap in EPISODE_CAPS},
        )  # fmt: skip
        self.episode_id, self.tools = opened["episode_id"], opened["tools"]
        self.messages: list[dict[str, Any]] = list(opened["observation"])
        self.model_calls, self.end_reason, self._evaluation = 0, None, None
        return opened["observation"], {"turn": opened["turn"], "tools": opened["tools"]}

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def step(self, action: str | bytes) -> tuple[list[dict[str, Any]], float, bool, bool, dict[str, Any]]:
        if self.episode_id is None or self.done:
            raise RuntimeError("step() called outside an episode; call env.reset(task) first.")
        text = action.decode("utf-8", errors="replace") if isinstance(action, bytes) else action
        reply = self.client.step(self.episode_id, text, step=self.model_calls)
        self.model_calls += 1
        self.messages += [{"role": "assistant", "content": text}, *reply["observation"]]
        info = {k: v for k, v in reply["info"].items() if v is not None}
        if "tools" in info:
            self.tools = info["tools"]
        if reply["done"]:
            self.end_reason = reply["info"]["end_reason"]
        return reply["observation"], reply["reward"], reply["terminated"], reply["truncated"], info

    def truncate(self, reason: str) -> tuple[float, dict[str, Any]]:
        evaluation = self._evaluate(reason)
        self.end_reason = evaluation["end_reason"]
        return evaluation["reward"], {"end_reason": self.end_reason, "evaluation": evaluation}

    def record(self) -> dict[str, Any]:
        """The finished episode's record (transcript, trace, verdict, diagnosis), as ``BfclEnv.record()``."""
        return self._evaluate("client_stop")["record"]

    def _evaluate(self, reason: str) -> dict[str, Any]:
        if self.episode_id is None:
            raise RuntimeError("truncate() called before reset(); call env.reset(task) first.")
        if self._evaluation is None:
            self._evaluation = self.client.evaluate(self.episode_id, reason=reason, include_record=True)
        return self._evaluation

    def close(self) -> None:
        """Release the current episode on the service (nothing to do if there is none)."""
        if self.episode_id is not None:
            episode_id, self.episode_id = self.episode_id, None
            try:
                self.client.release(episode_id)
            except ServiceError as exc:
                if exc.status not in (404, 410):
                    raise
