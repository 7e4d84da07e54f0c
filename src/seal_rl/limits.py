"""Bounded resources: what one tool result, one step and one episode may cost (issue 14).

The caps themselves are :class:`~seal_rl.env.EnvConfig` settings; this module holds the pieces the
environment and the verifier share:

* :func:`truncate_result` cuts one tool result to its cap with a visible marker;
* :func:`time_limit` interrupts Python code running past a step's wall-time limit.

What the wall-time limit guarantees. CPU-bound Python cannot be pre-empted by another thread, so
the limit is a ``SIGALRM`` timer (``ITIMER_REAL``) armed around each backend call: when it rings,
:class:`StepTimeout` is raised at the next bytecode. A signal cannot interrupt one C-level operation
(a huge ``pow``, a big-integer conversion), so every such operation is bounded beforehand by
:func:`seal_rl.backends.resource_guard` (operand sizes) and by the message, call and result caps;
the slack past the limit is the longest such operation (measured below 0.2 s). Between calls the
elapsed time is also checked, so a step never starts a call after its limit.

Signals can be handled only on the main thread of a POSIX process. Elsewhere (another thread,
Windows) :func:`time_limit` does not interrupt; only the check between calls applies, so a step
may then overrun its limit by one call (each bounded by the guards, but not by the limit).
On CPython 3.13 the exception can skip the ``except``/``finally`` blocks of the very frame it is
raised in when that frame spins in a tight ``while`` (python/cpython#130279); the blocks that catch
it here (:mod:`seal_rl.env`, :mod:`seal_rl.verify`) are in outer frames, and the stopped step's
backends are not used again.

An outer ``ITIMER_REAL`` timer (the service's step timeout) is kept: when it would ring first it
is left alone, otherwise it is re-armed with its remaining time when the block ends.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

TRUNCATION_MARKER = "\n... [truncated: {count} more characters]"


class StepTimeout(BaseException):
    """A step ran past its wall-time limit (a BaseException, so backend ``except Exception`` code
    cannot swallow it)."""


def truncate_result(text: str, limit: int) -> tuple[str, int]:
    """``text`` cut to its first ``limit`` characters plus a marker, and how many were cut (0: none)."""
    if len(text) <= limit:
        return text, 0
    cut = len(text) - limit
    return text[:limit] + TRUNCATION_MARKER.format(count=cut), cut


def stopped_call_error(step_timeout_s: float) -> str:
    """The error a call stopped by the step time limit gets (in the episode and in the verifier)."""
    return f"the step ran past its time limit of {step_timeout_s:g} s; this call was stopped"


STOPPED_CALL = re.compile(r"the step ran past its time limit of [^ ]+ s; this call was stopped$")
"""Finds a :func:`stopped_call_error` at the end of a trace entry's error (after schema violations, if any)."""


def alarms_available() -> bool:
    """Whether :func:`time_limit` can interrupt here (POSIX, main thread)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _ring(signum, frame) -> None:
    raise StepTimeout


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`StepTimeout` inside the block once ``seconds`` of wall time have passed.

    Raises at once when ``seconds`` is not positive. Does nothing where alarms are not available
    (see the module docstring) or when an outer timer rings first.
    """
    if seconds <= 0:
        raise StepTimeout
    if not alarms_available():
        yield
        return
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    if outer_delay and outer_delay <= seconds:  # the outer timer rings first; its handler decides
        yield
        return
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, _ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer_delay:
            left = outer_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), outer_interval)
