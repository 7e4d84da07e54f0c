"""One writer per run directory: ``seal eval`` and ``seal train`` hold ``RUN/.seal.lock`` while
they write, so a second process pointed at the same ``--out`` stops with one line instead of
interleaving its results with the first one's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from seal_rl.errors import SealError

LOCK_FILE = ".seal.lock"


@contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """Hold the lock of run directory ``out`` (created if needed) or raise :class:`SealError`.

    An OS-level lock (``flock``): it is released when the process ends, even by SIGKILL, so a
    crashed run never leaves a stale lock behind."""
    if Path(out).exists() and not Path(out).is_dir():
        raise SealError(f"--out {out} is a file; give a directory for the run.")
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SealError(f"Cannot write the run directory {out}: {exc.strerror}.") from None
    lock = FileLock(str(Path(out) / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise SealError(f"Another seal process is writing to {out} (it holds {out / LOCK_FILE}); "
                        "wait for it to finish or choose another --out.") from None  # fmt: skip
    try:
        yield
    finally:
        lock.release()
