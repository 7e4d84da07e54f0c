"""``create_app(settings)``: the BFCL multi-turn environment over HTTP (FastAPI).

The same environment, verifier, diagnosis and interface code as ``seal eval`` and ``seal train``,
run in worker processes by :class:`~seal_rl.service.workers.EpisodePool`. The OpenAPI schema
(``/docs``, ``/openapi.json``) documents every body; ``docs/guides/service.md`` the protocol.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import secrets
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError

from seal_rl import __version__
from seal_rl.bfcl import BFCL_VERSION
from seal_rl.interface import InterfaceState
from seal_rl.service.schemas import (
    EPISODE_CAPS, EPISODE_ID, EpisodeCreate, EpisodePublic, Evaluation, EvaluateRequest, Health, Problem, Released, Split,
    StepRequest, StepResponse, TaskList, TaskPublic,
)  # fmt: skip
from seal_rl.service.settings import ServiceSettings
from seal_rl.service.workers import EpisodeError, EpisodePool
from seal_rl.tasks import TaskSet

EpisodeId = Annotated[str, Path(pattern=EPISODE_ID, description="the id returned by POST /episodes")]

_bearer = HTTPBearer(auto_error=False, description="required when the service was started with a token")


def _problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": Problem} for code in codes}


class EscapingJSONResponse(JSONResponse):
    """JSON that any string a model can produce fits in, lone surrogates included.

    Model text reaches answers (observations, transcripts, error messages echoing a bad field), and
    a lone surrogate such as ``\\ud83d`` (half an emoji, legal in a JSON string escape) cannot be
    written as UTF-8: the plain ``JSONResponse`` then fails with a 500, and a trainer never reads
    the episode's reward. Such answers are written with ``\\uXXXX`` escapes instead (RFC 8259
    §7), which a JSON parser turns back into the same string; non-finite floats become ``null``, as
    pydantic already writes them inside free-form fields. Other answers stay compact UTF-8.
    """

    def render(self, content: Any) -> bytes:
        try:
            return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
        except (UnicodeEncodeError, ValueError):
            return json.dumps(_finite(content), ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _answer(model: type[BaseModel], content: dict[str, Any], status_code: int = 200) -> Response:
    """``content`` validated as ``model`` and written by pydantic's fast JSON path, or, when it holds a
    lone surrogate that path cannot write, by :class:`EscapingJSONResponse`."""
    adapter = _adapter(model)
    value = adapter.validate_python(content)
    try:
        return Response(adapter.dump_json(value), status_code, media_type="application/json")
    except PydanticSerializationError:
        return EscapingJSONResponse(adapter.dump_python(value, mode="json"), status_code)


@functools.cache
def _adapter(model: type[BaseModel]) -> TypeAdapter:
    return TypeAdapter(model)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


# BaseException, not Exception: FastAPI reads the body inside ``except Exception`` and would answer 400
class _BodyTooLarge(BaseException):
    pass


class _BodyTooSlow(BaseException):
    pass


class BodyLimit:
    """ASGI middleware: request bodies over ``limit`` bytes answer 413 (declared or streamed); a body
    that has not arrived in full ``timeout`` seconds after it is first read answers 408."""

    def __init__(self, app, limit: int, timeout: float = 30.0) -> None:
        self.app, self.limit, self.timeout = app, limit, timeout
        self._too_large = f"Request body larger than {limit} bytes (the service's max_request_bytes)."

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send, 413, self._too_large)
        seen, deadline, complete = 0, None, False

        async def counted():
            nonlocal seen, deadline, complete
            if complete:  # the body is in; what comes next (a disconnect) may take any time
                return await receive()
            loop = asyncio.get_running_loop()
            deadline = deadline or loop.time() + self.timeout
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise _BodyTooSlow from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge
                complete = not message.get("more_body", False)
            return message

        try:
            await self.app(scope, counted, send)
        except _BodyTooLarge:
            await self._refuse(send, 413, self._too_large)
        except _BodyTooSlow:
            await self._refuse(send, 408, f"Request body not received within {self.timeout:g} s (the service's body_timeout).")

    async def _refuse(self, send, status_code: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status_code,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})


def create_app(settings: ServiceSettings | None = None, *, tasks: TaskSet | None = None) -> FastAPI:
    """The service app for ``settings.family`` (BFCL by default); worker processes start with the app's
    lifespan and stop with it. ``tasks``: BFCL's task set, already loaded (tests)."""
    settings = settings if settings is not None else ServiceSettings()
    if tasks is None:
        from seal_rl.environments import load_family

        tasks = load_family(settings.family, **settings.family_settings).task_set()  # a bad family: one line, nothing started
    categories = sorted({t.category for t in tasks})
    pool = EpisodePool(settings.workers, max_episodes=settings.max_episodes, step_timeout=settings.step_timeout,
                       kill_grace=settings.kill_grace, respawn_backoff=settings.respawn_backoff,
                       respawn_backoff_max=settings.respawn_backoff_max, family=settings.family,
                       family_settings=settings.family_settings)  # fmt: skip

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(pool.start)
        reaper = asyncio.create_task(_release_idle(pool, settings.idle_timeout))
        try:
            yield
        finally:
            reaper.cancel()
            await asyncio.to_thread(pool.close)

    def authorize(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), settings.token.encode()):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail="Missing or wrong bearer token (Authorization: Bearer <token>).",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip

    app = FastAPI(
        title="seal-rl environment service", version=__version__, lifespan=lifespan,
        description=f"Executable episodes of the {settings.family} environment family (BFCL multi-turn by default) with "
                    "its verifier, SEAL's diagnosis and interface.",
        generate_unique_id_function=lambda route: route.name, default_response_class=EscapingJSONResponse,
    )  # fmt: skip
    app.state.pool, app.state.settings = pool, settings
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes, timeout=settings.body_timeout)

    @app.exception_handler(EpisodeError)
    async def episode_error(request: Request, exc: EpisodeError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        return EscapingJSONResponse({"detail": str(exc)}, status_code=exc.status, headers=headers)

    # FastAPI's own handlers answer with the plain JSONResponse; a 422 echoes the offending input.
    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return EscapingJSONResponse({"detail": jsonable_encoder(exc.errors())}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return EscapingJSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/health", response_model=Health, tags=["service"], responses={503: {"model": Health}})
    def health() -> JSONResponse:
        """``ok`` (200) with every worker alive; ``degraded`` or, with none, ``unavailable`` (503)
        while workers are missing: the pool keeps restarting them (``respawn_backoff``)."""
        alive = pool.workers_alive
        state = "ok" if alive == settings.workers else "unavailable" if alive == 0 else "degraded"
        body = Health(status=state, version=__version__, family=settings.family, bfcl_eval=BFCL_VERSION, workers=settings.workers,
                      workers_alive=alive, worker_restarts=pool.worker_restarts,
                      worker_start_failures=pool.worker_start_failures, live_episodes=pool.live_episodes,
                      max_episodes=settings.max_episodes)  # fmt: skip
        return EscapingJSONResponse(body.model_dump(), status_code=200 if state == "ok" else 503,
                                    headers=None if state == "ok" else {"Retry-After": "1"})  # fmt: skip

    # The bearer scheme is declared (and checked) only when there is a token to check.
    guarded = {"dependencies": [Depends(authorize)], "responses": _problems(401)} if settings.token else {}
    router = APIRouter(**guarded)

    def list_tasks(split: Split = "test", category: list[str] | None = None) -> TaskList:
        """Tasks of the family's split (BFCL: the paper's 400/400; ``all``: both), optionally of some categories."""
        chosen = [t for t in tasks if (split == "all" or tasks.split_of(t.id) == split) and (not category or t.category in category)]
        return TaskList(tasks=[TaskPublic(id=t.id, category=t.category, split=tasks.split_of(t.id),
                                           num_turns=getattr(t, "num_turns", 1)) for t in chosen])

    # the served family's categories are known only now: they are the parameter's type (an enum in the schema;
    # FastAPI answers 422 naming them, as it did for BFCL's four)
    list_tasks.__annotations__["category"] = Annotated[list[Literal[tuple(categories)]] | None, Query()]  # type: ignore[valid-type]
    router.get("/tasks", response_model=TaskList, tags=["tasks"])(list_tasks)

    episodes = APIRouter(prefix="/episodes", tags=["episodes"], **guarded)

    @episodes.post("", response_model=EpisodePublic, status_code=201, responses=_problems(404, 409, 429, 503))
    async def create_episode(body: EpisodeCreate) -> Response:
        """Open an episode: the first observation and the tool specs."""
        if body.task_id not in tasks:
            raise EpisodeError("not_found", f"Unknown task id {body.task_id!r}; GET /tasks lists them.")
        caps = {}
        for cap in EPISODE_CAPS:  # each per-episode cap within this service's limit on it; a default above it is lowered
            limit, asked = getattr(settings, f"{cap}_limit"), getattr(body, cap)
            if asked > limit and cap in body.model_fields_set:
                raise EpisodeError("invalid", f"{cap} may be at most {limit} on this service (its {cap}_limit); asked for {asked}.")
            caps[cap] = min(asked, limit)
        state = (InterfaceState.initial(body.interface).to_json() if isinstance(body.interface, str)
                 else body.interface.model_dump())  # fmt: skip
        spec = {**body.model_dump(exclude={"episode_id"}), **caps, "interface": state}
        return _answer(EpisodePublic, await pool.create(body.episode_id or secrets.token_urlsafe(16), spec), 201)

    @episodes.post("/{episode_id}/step", response_model=StepResponse, responses=_problems(404, 409, 410))
    async def step_episode(episode_id: EpisodeId, body: StepRequest) -> Response:
        """Feed one assistant message; the observation, reward and end flags (Gymnasium's step)."""
        return _answer(StepResponse, await pool.step(episode_id, body.model_dump()))

    @episodes.post("/{episode_id}/evaluate", response_model=Evaluation, responses=_problems(404, 409, 410))
    async def evaluate_episode(episode_id: EpisodeId, body: EvaluateRequest | None = None) -> Response:
        """The verifier's reward and per-turn labels with evidence; ends a running episode first."""
        return _answer(Evaluation, await pool.evaluate(episode_id, (body or EvaluateRequest()).model_dump()))

    @episodes.delete("/{episode_id}", response_model=Released, responses=_problems(404, 409, 410))
    async def release_episode(episode_id: EpisodeId) -> Released:
        """Free the episode's backends; later requests for it answer 410."""
        await pool.release(episode_id)
        return Released(episode_id=episode_id, released=True)

    app.include_router(router)
    app.include_router(episodes)
    return app


async def _release_idle(pool: EpisodePool, idle_timeout: float) -> None:
    while True:
        await asyncio.sleep(min(5.0, idle_timeout / 4))
        await pool.release_idle(idle_timeout)

