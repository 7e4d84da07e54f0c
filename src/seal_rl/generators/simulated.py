"""Stand-ins for model servers (canned text after a fixed or random latency): driver benchmarks."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from seal_rl.rollout import Generation, Request


class SimulatedGenerator:
    """A stand-in for a model server: fixed latency per batched call, the same text for everyone."""

    def __init__(self, latency: float, text: str = "I cannot help with that.") -> None:
        self.latency = latency
        self.text = text

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        time.sleep(self.latency)
        return [Generation(self.text) for _ in requests]


class SimulatedServer:
    """A stand-in for a model server whose answers take a random time (exponential, mean
    ``latency`` seconds), as replies of different lengths do; the same text for everyone.

    It streams (``submit``); its batched ``generate`` returns when the slowest answer is in.
    """

    def __init__(self, latency: float, text: str = "I cannot help with that.", workers: int = 256) -> None:
        self.latency = latency
        self.text = text
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="simulated-server")

    def _delay(self, request: Request, seed: int) -> float:
        return random.Random(f"{seed}:{request.episode}").expovariate(1.0 / self.latency) if self.latency > 0 else 0.0

    def _answer(self, delay: float) -> Generation:
        time.sleep(delay)
        return Generation(self.text)

    def submit(self, request: Request, seed: int) -> Future[Generation | None]:
        return self._pool.submit(self._answer, self._delay(request, seed))

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        time.sleep(max((self._delay(r, seed) for r in requests), default=0.0))
        return [Generation(self.text) for _ in requests]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
