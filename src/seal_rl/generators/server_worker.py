"""The generation server's side of a weight sync: a vLLM worker extension.

``seal rollout-server`` starts ``vllm serve`` with ``--worker-extension-cls`` naming
:class:`WeightReload`, whose methods every worker of the server gains and ``POST /collective_rpc``
calls by name. :meth:`WeightReload.seal_reload_weights` loads a checkpoint directory in place with
vLLM's own ``reload_weights`` and then repacks the output head of a model with tied embeddings,
which vLLM's CPU build computes through a packed copy that ``reload_weights`` leaves stale
(:func:`seal_rl.generators.vllm_cpu.repack_tied_heads`). A server started without it still reloads
through vLLM's plain ``reload_weights`` route; the trainer then checks the served log-probabilities
against its own after the first sync (:mod:`seal_rl.train.server_sync`).

This module is imported inside the server's worker processes, never by the trainer.
"""

from __future__ import annotations

from typing import Any


class WeightReload:
    """Mixed into vLLM's ``Worker``: ``self.model_runner`` is the worker's model runner."""

    model_runner: Any

    def seal_reload_weights(self, weights_path: str) -> list[str]:
        """Load the checkpoint-format weights in ``weights_path`` in place; the heads repacked."""
        from vllm.config import set_current_vllm_config

        from seal_rl.generators.vllm_cpu import repack_tied_heads

        with set_current_vllm_config(self.model_runner.vllm_config):
            self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        if self.model_runner.device.type != "cpu":
            return []
        return repack_tied_heads(self.model_runner.get_model())
