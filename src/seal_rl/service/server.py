"""``serve(settings)``: the service under uvicorn, with the limits that keep idle or slow
connections from exhausting it.

uvicorn on its own holds a connection that never sends a request forever (its keep-alive timeout
starts only after a first answer), and accepts connections until the process runs out of file
descriptors; then even ``/health`` cannot connect and asyncio logs a traceback per failed accept.
Here every connection must send its request headers within ``header_timeout`` seconds, and
fewer than ``max_connections`` stay open: a connection beyond them first evicts the oldest one
still waiting for request headers (:class:`GuardedH11Protocol`), so idle sockets cannot crowd out
``/health`` or a trainer; uvicorn's ``limit_concurrency`` answers 503 beyond the limit. The
file-descriptor limit is checked to fit them, and the log is rate-limited (:mod:`.logs`).
"""

from __future__ import annotations

import asyncio
import functools
import resource
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from seal_rl.errors import SealError
from seal_rl.service.logs import log_config
from seal_rl.service.settings import ServiceSettings

SPARE_DESCRIPTORS = 64
"""file descriptors kept free beyond the connections: listening socket, log, imports"""
DESCRIPTORS_PER_WORKER = 4
"""a worker's pipe, its process handle and the pipes ``subprocess`` opens while starting it"""


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and a connection cap that evicts idle sockets.

    The header timer starts when the connection opens and again after each answer; if no complete
    request head has arrived when it rings (nothing sent, or headers trickled a byte at a time),
    the connection is closed. A connection that brings the count to ``limit_concurrency`` (where
    uvicorn would answer every request 503) closes the oldest connection still waiting for request
    headers; if every other connection has a request in progress, it is closed itself.
    """

    def __init__(self, *args, header_timeout: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        self._armed_cycle = None
        self._opened_at = 0.0

    @property
    def waiting_for_head(self) -> bool:
        """No request in progress and none arrived since the header timer was armed (a pipelined
        request that started inside ``on_response_complete`` is in progress, not waiting)."""
        in_progress = self.cycle is not None and not self.cycle.response_complete
        return self._header_timer is not None and self.cycle is self._armed_cycle and not in_progress and not self.transport.is_closing()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened_at = self.loop.time()
        if self.limit_concurrency is not None and len(self.connections) >= self.limit_concurrency:
            idle = [c for c in self.connections if c is not self and getattr(c, "waiting_for_head", False)]
            if not idle:
                transport.close()
                return
            min(idle, key=lambda c: c._opened_at).transport.close()
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        # A new request replaces self.cycle: if it is still the same cycle when the timer rings, no
        # request head arrived in time.
        self._armed_cycle = self.cycle
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_timeout)

    def _header_timeout(self) -> None:
        if self.waiting_for_head:
            self.transport.close()


def uvicorn_config(app, settings: ServiceSettings) -> uvicorn.Config:
    """The uvicorn configuration of ``seal serve``: the settings' connection limits, timeouts and log."""
    return uvicorn.Config(
        app, host=settings.host, port=settings.port, lifespan="on",
        http=functools.partial(GuardedH11Protocol, header_timeout=settings.header_timeout),
        limit_concurrency=settings.max_connections, timeout_keep_alive=settings.keep_alive_timeout, backlog=settings.backlog,
        log_config=log_config(settings.log_burst, settings.log_interval), log_level="warning",
    )  # fmt: skip


def ensure_descriptors(settings: ServiceSettings) -> int:
    """Raise this process's open-file limit so ``max_connections``, a ``backlog`` of connections
    being accepted and the workers fit (up to the hard limit); the soft limit now. A hard limit too
    low is a one-line error naming the fix: out of files, asyncio logs a traceback per failed
    accept and keeps retrying (the 56 MB of log in 11 s of ``bench_attacks_service.py``)."""
    needed = settings.max_connections + settings.backlog + settings.workers * DESCRIPTORS_PER_WORKER + SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise SealError(
                f"max_connections={settings.max_connections} with backlog={settings.backlog} and {settings.workers} workers "
                f"needs {needed} open files, "
                f"but this process may open at most {hard}; lower SEAL_MAX_CONNECTIONS or raise `ulimit -n`."
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        soft = needed
    return soft


def serve(settings: ServiceSettings, announce: Callable[[], None] | None = None) -> None:
    """Run the service until interrupted (``seal serve``); ``announce`` once its family has loaded."""
    from seal_rl.service.app import create_app

    ensure_descriptors(settings)
    app = create_app(settings)
    if announce is not None:
        announce()
    uvicorn.Server(uvicorn_config(app, settings)).run()
