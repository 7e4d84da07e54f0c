"""Asynchronous rounds (``staleness: k`` ≥ 1): generation runs ahead of the update, within a bound.

With ``staleness: 0`` a round's episodes are played when TRL asks for them, under the weights of
the update just finished (on-policy: today's algorithm). With k ≥ 1 a producer thread keeps
playing groups (one task, ``num_generations`` episodes) on the generation servers while the
trainer updates, and each round takes the groups that are ready:

* **admission** (AReaL, Fu et al. 2025, §5.1): a new group starts only while
  ``started − dropped < (k + u + 1) · B`` — ``u`` the weight updates the servers have received
  since the producer started, ``B`` the groups a round takes — so nothing is generated more than k
  updates ahead of the one that will train on it;
* **dropping**: each model message records the weight versions it ran under
  (:attr:`~seal_rl.rollout.Generation.weight_versions`); a ready group whose oldest message was
  sent more than k versions before the servers' current one is dropped and counted, never trained on;
* **the behaviour policy**: every token keeps the log-probability it was sampled with, so TRL's
  importance correction (``old_per_token_logps − sampling_per_token_logps``, truncated or masked:
  ``vllm_importance_sampling_mode``) reweights each token from the policy that sampled it to the
  one being updated — valid when an episode's turns ran under different weights (decoupled PPO,
  AReaL §4).

A group is played under the interface Ω of the round in which it *started*; the capability
profile, A-Patch and the next interface count it in the round that *takes* it (docs/guides/train.md,
"Asynchronous rounds"). Tasks come from the producer's own order — each epoch the training tasks
shuffled by (seed, epoch), ranks taking every world-th group — not from TRL's sampler, whose
prompts then only say how many groups a round takes.
"""

from __future__ import annotations

import copy
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from seal_rl.errors import SealError
from seal_rl.rollout import Rollout, derived_seed
from seal_rl.tasks import Task


@dataclass
class Group:
    """One task's episodes, played together, and the weight versions they ran under."""

    index: int
    rollouts: list[Rollout]

    @property
    def oldest(self) -> int | None:
        """The weight version its oldest model message was sent under (None: no message was sent)."""
        sent = [v[0] for r in self.rollouts for v in r.record.get("weight_versions", [])]
        return min(sent, default=None)


@dataclass
class TakeStats:
    """What one round's :meth:`AsyncRounds.take` saw."""

    waited: float = 0.0
    """seconds the trainer waited for ready groups"""
    dropped: int = 0
    staleness: Counter[int] = field(default_factory=Counter)
    """taken groups by versions behind the servers' current weights (oldest message)"""
    ahead: int = 0
    """groups started or ready, beyond those taken, when the round took its own"""


def task_order(tasks: Sequence[Task], seed: int, group: int, rank: int, world: int) -> Task:
    """The task of this rank's ``group``-th group: the ``group · world + rank``-th of the training
    tasks, each epoch shuffled by (seed, epoch)."""
    position = group * world + rank
    epoch, at = divmod(position, len(tasks))
    order = list(tasks)
    random.Random(derived_seed(seed, "async-order", epoch)).shuffle(order)
    return order[at]


class AsyncRounds:
    """The producer of groups and the admission and drop rules (module docstring).

    ``play(g)`` plays this rank's group ``g`` to its end (episodes of one task, on the servers) and
    returns its rollouts; ``version()`` the weight version the servers hold now. ``workers``:
    groups played at once. :meth:`take` blocks until ``n`` groups that are not too stale are ready.
    """

    def __init__(self, play: Callable[[int], list[Rollout]], version: Callable[[], int], *, staleness: int,
                 groups_per_round: int, workers: int, first_group: int = 0, poll: float = 0.05) -> None:  # fmt: skip
        if staleness < 1:
            raise SealError(f"AsyncRounds needs staleness >= 1 (0 plays rounds on-policy, without a producer), got {staleness}.")
        self.play, self.version = play, version
        self.staleness, self.per_round, self.workers = staleness, groups_per_round, max(1, workers)
        self.next_group = first_group
        self.first_version = version()
        self.poll = poll
        """seconds between looks at the servers' weight version while admission is closed"""
        self.started = self.dropped = 0
        self.running = 0
        self.ready: list[Group] = []
        self.error: BaseException | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="seal-group")
        self._thread = threading.Thread(target=self._produce, name="seal-producer", daemon=True)
        self._thread.start()

    def capacity(self) -> int:
        """Groups that may still start (AReaL's rule); called under the lock."""
        updates = self.version() - self.first_version
        return (self.staleness + updates + 1) * self.per_round - (self.started - self.dropped)

    def _produce(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or (self.capacity() > 0 and self.running < self.workers)):
                    self._cond.wait(self.poll)  # a sync raises the version without telling: look again
                if self._stop:
                    return
                index = self.next_group
                self.next_group += 1
                self.started += 1
                self.running += 1
            self._pool.submit(self._run, index)

    def _run(self, index: int) -> None:
        try:
            rollouts = self.play(index)
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread by take()
            with self._cond:
                self.running -= 1
                if not self._stop:
                    self.error = exc
                self._cond.notify_all()
            return
        with self._cond:
            self.running -= 1
            self.ready.append(Group(index, rollouts))
            self._cond.notify_all()

    def take(self, n: int) -> tuple[list[Group], TakeStats]:
        """The next ``n`` groups to train on (oldest first), dropping the too stale; blocks till they are ready."""
        stats = TakeStats()
        began = time.perf_counter()
        taken: list[Group] = []
        with self._cond:
            while len(taken) < n:
                self._cond.wait_for(lambda: self.ready or self.error is not None)
                if self.error is not None:
                    raise SealError(f"A group's rollouts failed in the producer: {type(self.error).__name__}: {self.error}") from self.error
                self.ready.sort(key=lambda g: g.index)
                current = self.version()
                group = self.ready.pop(0)
                oldest = group.oldest
                behind = 0 if oldest is None else current - oldest
                if behind > self.staleness:
                    self.dropped += 1
                    stats.dropped += 1
                    self._cond.notify_all()  # a drop frees a place
                    continue
                stats.staleness[behind] += 1
                taken.append(group)
            stats.ahead = len(self.ready) + self.running
            self._cond.notify_all()
        stats.waited = time.perf_counter() - began
        return taken, stats

    def take_rollouts(self, n: int, round_index: int) -> tuple[list[Rollout], TakeStats]:
        """:meth:`take`'s groups as one round's rollouts, numbered in order, each record with the
        round that trains on it and its group."""
        groups, stats = self.take(n)
        rollouts: list[Rollout] = []
        for group in groups:
            for r in group.rollouts:
                record = {**r.record, "index": len(rollouts), "round": round_index, "group": group.index}
                rollouts.append(Rollout(len(rollouts), record, r.trajectory, r.seconds_env))
        return rollouts, stats

    def close(self) -> None:
        """Stop starting groups; groups in flight are abandoned: their episodes end once the generator
        is stopped (:meth:`~seal_rl.generators.vllm_server.VLLMServerGenerator.stop`)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)


def group_player(loop: Any, chat: Any, size: int, rank: int, world: int) -> Callable[[int], list[Rollout]]:
    """``play(g)`` for a :class:`~seal_rl.train.loop.SealLoop`: this rank's group ``g`` — ``size``
    episodes of its task (:func:`task_order`) on the loop's generation servers, under the interface
    of the round in which it starts (recorded as ``interface_round``), seeded by (seed, g, rank)."""
    from seal_rl.rollout import run_episodes

    seed = loop.recipe.grpo.seed

    def play(group: int) -> list[Rollout]:
        task = task_order(loop.train_tasks, seed, group, rank, world)
        interface, started_in = loop._interface(), loop.state.round
        episodes = [(i, task, {"interface_round": started_in}) for i in range(size)]
        return run_episodes(episodes, loop.server, lambda: loop.family.make_env(loop.env_config, interface, catalog=loop.catalog),
                            chat=copy.copy(chat), budgets=loop.budgets, concurrency=size,  # chat.tools is set per episode
                            seed=derived_seed(seed, "group", group, rank), scheduler="continuous")  # fmt: skip

    return play


def staleness_summary(stats: TakeStats) -> dict[str, Any]:
    """The round log's fields for one take."""
    return {"async/staleness": {str(k): v for k, v in sorted(stats.staleness.items())}, "async/dropped": stats.dropped,
            "async/wait_seconds": round(stats.waited, 3), "async/ahead": stats.ahead}  # fmt: skip
