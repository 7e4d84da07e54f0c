"""Keeping ranks' generation calls in step when the engine is a collective.

Under FSDP or DeepSpeed ZeRO-3 every forward pass gathers sharded weights from all ranks, and a
tensor-parallel vLLM engine is one engine spread over a group of ranks. Either way every rank must
make the same number of calls. The episode driver cannot promise that: each rank ticks until its
own episodes end, and they end at different times.

The protocol: before each call every rank announces what it brings (``exchange``: an
``all_gather_object`` over the group) — its requests, or ``None`` when its episodes are all done.
Ranks that are done keep answering from :meth:`Lockstep.drain` with empty contributions until
every rank in the group has announced ``None``; then all leave together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Lockstep:
    """One process group whose members must call the generation engine together."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def exchange(self, payload: Any) -> list[Any]:
        """Every member's payload, in group order (a collective)."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, payload, group=self.group)
        return gathered

    def drain(self, serve: Callable[[list[Any]], None]) -> None:
        """Take part in the group's calls until no member has anything left (``serve`` gets the
        gathered payloads and must make the same calls the active members make)."""
        while True:
            gathered = self.exchange(None)
            if all(payload is None for payload in gathered):
                return
            serve(gathered)


def trainer_lockstep(trainer: Any) -> Lockstep | None:
    """The lockstep group for generating with the trainer's own model: all ranks when the weights
    are sharded (FSDP, ZeRO-3) over more than one process, else ``None`` (calls are local)."""
    from trl.distributed import DistributedBackend

    if trainer.accelerator.num_processes == 1:
        return None
    backend = DistributedBackend(trainer.accelerator)  # read now: the accelerator's state may change after init
    return Lockstep() if backend.is_fsdp or backend.is_zero3 else None
