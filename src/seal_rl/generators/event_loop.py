"""An asyncio event loop in a thread of its own, for generators that answer in the background.

:class:`~seal_rl.generators.openai_compatible.OpenAIGenerator` and
:class:`~seal_rl.generators.vllm_server.VLLMServerGenerator` send their HTTP requests from such a
loop: the episode driver submits a request and gets a ``concurrent.futures.Future``, and steps
the episode when it resolves (:class:`~seal_rl.rollout.StreamingGenerator`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """Starts at the first :meth:`submit` (running ``opened()`` in the loop first, where clients that
    belong to the loop are made) and stops at :meth:`close`, which cancels what is still in flight
    (their futures raise) and runs ``closing()``; a later :meth:`submit` starts it again."""

    def __init__(self, name: str, opened: Callable[[], Awaitable[None]], closing: Callable[[], Awaitable[None]]) -> None:
        self.name, self.opened, self.closing = name, opened, closing
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        with self._lock:  # never onto a loop that close() is stopping: the coroutine would never run
            return asyncio.run_coroutine_threadsafe(coroutine, self._running())

    def close(self) -> None:
        # Under the lock to the end: a request sent meanwhile (a producer's group still playing)
        # waits, then starts a new loop, instead of replacing the thread joined here (which then
        # never returned) or the clients ``closing()`` closes.
        with self._lock:
            loop, thread, self._loop = self._loop, self._thread, None
            if loop is None:
                return
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                self._thread.start()
                asyncio.run_coroutine_threadsafe(self.opened(), loop).result()
                self._loop = loop
            return self._loop

    async def _shutdown(self) -> None:
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.closing()
