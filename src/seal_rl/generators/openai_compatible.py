"""A generator for any OpenAI-compatible chat-completions server (vLLM serve, SGLang, hosted APIs).

Every model message is one ``POST {base_url}/chat/completions``; requests of different episodes run
concurrently (``asyncio`` + ``httpx``), at most ``concurrency`` in flight and, if set,
``requests_per_minute``.
Timeouts, connection errors, HTTP 429 and 5xx are retried with exponential backoff and jitter
(``Retry-After`` is honoured); after ``max_retries`` the episode ends with a recorded
``generation_error`` — it is never counted as a failure of the model. Other 4xx answers (a bad
request, a wrong key) are not retried.

Tool calls come back either as text in the configured call format or as structured
``tool_calls``; structured calls are rendered into that format, so the environment parses every
policy the same way. A structured call whose arguments are not a JSON object is rendered so that
the environment rejects it, as it would reject the same mistake written as text. When the server
used structured calls, later requests replay them (with their ids) and send tool results as
``tool`` messages with the matching ``tool_call_id``; otherwise tool results travel as
``<tool_response>`` blocks in user messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from concurrent.futures import Future
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seal_rl.errors import SealError
from seal_rl.generators.event_loop import BackgroundLoop
from seal_rl.rollout import Generation, Request
from seal_rl.tools import ToolCall, get_format

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class ServerSettings:
    """Where and how to call an OpenAI-compatible server."""

    model: str
    base_url: str
    api_key_env: str = "OPENAI_API_KEY"
    """environment variable holding the API key (sent as a bearer token when set)"""
    timeout: float = 120.0
    """seconds per request before it is retried"""
    max_retries: int = 4
    backoff: float = 1.0
    """first retry waits about this long (doubling, with jitter, up to max_backoff)"""
    max_backoff: float = 30.0
    concurrency: int = 32
    """requests in flight at once"""
    requests_per_minute: float = 0.0
    """0: no rate limit"""
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise SealError(f"Server URL {self.base_url!r} must start with http:// or https://.")
        if self.max_retries < 0 or self.timeout <= 0 or self.concurrency < 1:
            raise SealError("Need max_retries >= 0, timeout > 0 and concurrency >= 1.")


class OpenAIGenerator:
    """Chat completions over HTTP: a :class:`~seal_rl.rollout.StreamingGenerator`.

    Requests run on an event loop in a background thread with one connection pool; the driver
    submits the next message of an episode as soon as its previous one is answered.
    """

    def __init__(self, settings: ServerSettings, call_format: str = "hermes") -> None:
        self.settings = settings
        self.format = get_format(call_format)
        self.call_format = call_format
        self._api_messages: dict[int, list[dict[str, Any]]] = {}  # episode -> assistant messages as sent back
        self._last_start = 0.0
        self.attempts = 0  # requests sent, for logs and tests
        self._loop = BackgroundLoop("openai-generator", self._open, self._close_client)

    # -- protocol -----------------------------------------------------------------------------

    def submit(self, request: Request, seed: int) -> Future[Generation | None]:
        """Send one request from the generator's own event loop; the future holds its answer."""
        return self._loop.submit(self._one(request, seed))

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        futures = [self.submit(request, seed) for request in requests]
        return [future.result() for future in futures]

    def close(self) -> None:
        """Cancel requests in flight (an interrupted run), close the connections and stop the event
        loop (a later request starts them again)."""
        self._loop.close()

    def __enter__(self) -> OpenAIGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _open(self) -> None:
        import httpx

        headers = {}
        key = os.environ.get(self.settings.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            base_url=self.settings.base_url, headers=headers, timeout=httpx.Timeout(self.settings.timeout),
            limits=httpx.Limits(max_connections=self.settings.concurrency),
        )  # fmt: skip
        self._semaphore = asyncio.Semaphore(self.settings.concurrency)
        self._pace = asyncio.Lock()

    async def _close_client(self) -> None:
        await self._client.aclose()

    async def _one(self, request: Request, seed: int) -> Generation:
        async with self._semaphore:
            return await self._complete(self._client, request, random.Random(f"{seed}:{request.episode}"))

    # -- one request, with retries ------------------------------------------------------------

    async def _complete(self, client: Any, request: Request, rng: random.Random) -> Generation:
        import httpx

        payload = self._payload(request)
        last_error, last_retry_after = "no attempt made", None
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._delay(attempt, rng, last_retry_after))
            last_retry_after = None
            await self._respect_rate_limit()
            self.attempts += 1
            try:
                response = await client.post("/chat/completions", json=payload)
            except httpx.TimeoutException:
                last_error = f"timed out after {self.settings.timeout:g}s"
                continue
            except httpx.TransportError as exc:
                last_error = f"connection error ({type(exc).__name__}: {exc})"
                continue
            if response.status_code == 200:
                try:
                    return self._parse(request, response.json())
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    return Generation("", error=f"unreadable response from the server ({exc})")
            body = response.text[:300]
            if response.status_code in RETRY_STATUS:
                last_error = f"HTTP {response.status_code}: {body}"
                last_retry_after = _retry_after(response.headers.get("retry-after"))
                continue
            return Generation("", error=f"HTTP {response.status_code}: {body}")
        return Generation("", error=f"gave up after {self.settings.max_retries + 1} attempts: {last_error}")

    def _delay(self, attempt: int, rng: random.Random, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.settings.max_backoff)
        base = min(self.settings.max_backoff, self.settings.backoff * 2 ** (attempt - 1))
        return base * (0.5 + rng.random() / 2)

    async def _respect_rate_limit(self) -> None:
        if self.settings.requests_per_minute <= 0:
            return
        async with self._pace:
            gap = 60.0 / self.settings.requests_per_minute
            wait = self._last_start + gap - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._last_start = time.monotonic()

    # -- messages in and out ------------------------------------------------------------------

    def _payload(self, request: Request) -> dict[str, Any]:
        s = self.settings
        payload: dict[str, Any] = {
            "model": s.model, "messages": self._messages(request), "temperature": s.temperature,
            "top_p": s.top_p, "max_tokens": min(s.max_tokens, request.max_new_tokens),
        }  # fmt: skip
        if s.seed is not None:  # per episode, so repeated samples of a task differ reproducibly
            payload["seed"] = s.seed + request.episode
        if request.tools:
            payload["tools"] = request.tools
        return payload

    def _messages(self, request: Request) -> list[dict[str, Any]]:
        """The conversation as the server should see it (structured calls replayed with their ids)."""
        sent = self._api_messages.get(request.episode, [])
        out: list[dict[str, Any]] = []
        between: list[dict[str, Any]] = []  # environment messages since the last assistant message
        assistant_index = 0
        pending_ids: list[str] = []
        for message in request.messages:
            role = message["role"]
            if role == "assistant":
                out += as_text_turns(between)
                between = []
                api = sent[assistant_index] if assistant_index < len(sent) else {"role": "assistant", "content": message["content"]}
                assistant_index += 1
                out.append(api)
                pending_ids = [c["id"] for c in api.get("tool_calls") or []]
            elif role == "tool" and pending_ids:
                out.append({"role": "tool", "tool_call_id": pending_ids.pop(0), "content": message["content"]})
            else:
                between.append(message)
        return out + as_text_turns(between)

    def _parse(self, request: Request, data: dict[str, Any]) -> Generation:
        message = data["choices"][0]["message"]
        content = message.get("content") or ""
        tool_calls = message.get("tool_calls") or []
        api_message: dict[str, Any] = {"role": "assistant", "content": content}
        if not tool_calls:
            self._api_messages.setdefault(request.episode, []).append(api_message)
            return Generation(content)
        calls, broken = [], None
        for index, call in enumerate(tool_calls):
            function = call.get("function") or {}
            name, raw = str(function.get("name", "")), function.get("arguments", "{}")
            arguments = _arguments(raw)
            if arguments is None:
                broken = (name, raw if isinstance(raw, str) else json.dumps(raw))
            calls.append(ToolCall(name, arguments or {}))
            call.setdefault("id", f"call_{request.episode}_{index}")
        api_message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": c.get("function", {})} for c in tool_calls
        ]
        self._api_messages.setdefault(request.episode, []).append(api_message)
        if broken is not None:
            return Generation(_unparseable(self.call_format, *broken, content))
        return Generation(self.format.render(calls, text=content))


def as_text_turns(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Environment messages as a chat server sees them when calls travel as text: each run of tool
    results becomes one user message of ``<tool_response>`` blocks (the Hermes convention, which
    ``bfcl_qwen_fc`` also uses); other messages keep their role and content."""
    out: list[dict[str, Any]] = []
    folding = False
    for message in messages:
        if message["role"] == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if folding:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            folding = True
        else:
            out.append({"role": message["role"], "content": message["content"]})
            folding = False
    return out


def _arguments(raw: Any) -> dict[str, Any] | None:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _unparseable(call_format: str, name: str, raw: str, content: str) -> str:
    """The call as its format would write it with the raw (non-object) arguments: it will not parse."""
    if call_format == "pythonic":
        return f"[{name}({raw})]"
    if call_format == "json":
        return f'{{"name": {json.dumps(name)}, "parameters": {raw}'
    prefix = f"{content}\n" if content else ""
    return f'{prefix}<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {raw}\n</tool_call>'


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
