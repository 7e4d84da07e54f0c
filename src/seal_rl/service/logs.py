"""The service's log, rate-limited so that a flood of bad connections cannot fill the disk.

An attacker controls how often the server logs (every malformed request, every connection the
server has to refuse is a line, some with a traceback). :class:`RateLimit` lets ``burst`` lines of
one kind through per ``interval`` seconds and drops the rest; the next line of that kind written
after the interval says how many were dropped. :func:`log_config` installs it on every handler of
uvicorn's logging configuration, and routes the root logger (asyncio's accept errors) through it too.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

MAX_KINDS = 1024
"""kinds of line tracked at once; beyond it, kinds whose window has ended are forgotten, then all further kinds share one"""


class RateLimit(logging.Filter):
    """A logging filter: at most ``burst`` records of one kind per ``interval`` seconds.

    A record's kind is its logger, level and message template (``record.msg`` before ``%``
    formatting), so "Invalid HTTP request received." from a thousand clients is one kind. The first
    record of a kind let through after a window with drops carries the count:
    ``… [1234 more like this dropped in 60 s]``.
    """

    def __init__(self, burst: int = 20, interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.interval, self.clock = burst, interval, clock
        self._windows: dict[tuple[str, int, str], list] = {}  # kind -> [window start, passed, dropped]
        self._lock = threading.Lock()
        self.dropped = 0
        """records dropped since this filter was made"""

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is None:
                kind = self._make_room(kind, now)
                window = self._windows.setdefault(kind, [now, 0, 0])
            start, passed, dropped = window
            if now - start >= self.interval:
                window[:] = [now, 0, 0]
                if dropped:
                    record.msg = f"{record.msg} [{dropped} more like this dropped in {now - start:.0f} s]"
            if window[1] >= self.burst:
                window[2] += 1
                self.dropped += 1
                return False
            window[1] += 1
            return True

    def _make_room(self, kind: tuple[str, int, str], now: float) -> tuple[str, int, str]:
        if len(self._windows) < MAX_KINDS:
            return kind
        for old in [k for k, (start, _, dropped) in self._windows.items() if now - start >= self.interval and not dropped]:
            del self._windows[old]
        return kind if len(self._windows) < MAX_KINDS else ("", 0, "(other kinds of line)")


def log_config(burst: int, interval: float, level: str = "WARNING") -> dict[str, Any]:
    """uvicorn's ``LOGGING_CONFIG`` with :class:`RateLimit` on every handler and the root logger
    (where asyncio reports accept errors with a traceback) sent to stderr through it."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"rate_limit": {"()": f"{__name__}.RateLimit", "burst": burst, "interval": interval}}
    for handler in config["handlers"].values():
        handler["filters"] = ["rate_limit"]
    config["root"] = {"handlers": ["default"], "level": level}
    for logger in config["loggers"].values():
        logger["level"] = level
    return config
