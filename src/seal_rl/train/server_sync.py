"""The trainer's side of ``generator: server``: its weights pushed to the generation servers.

:class:`ServerWeights` takes the place of TRL's ``trainer.vllm_generation``. TRL calls its
``sync_weights()`` before every round that follows an update (``_generate``: "keep vLLM weights
in sync for custom rollouts"), and with ``trainer.use_vllm`` set TRL also computes its importance
correction against the sampled log-probabilities the servers return (``old_per_token_logps −
sampling_per_token_logps``, TIS/MIS as ``vllm_importance_sampling_mode`` says). It is TRL's own
``VLLMGeneration`` for its parameter walk (``_iter_named_params``: ZeRO-3 and FSDP gathers, in
which every rank takes part, PEFT merges, the names vLLM expects) with two ways to deliver them:

* ``reload``: the main rank writes the weights as one safetensors file into
  ``weights_dir/v{version}`` and every live server loads it in place
  (:meth:`~seal_rl.generators.vllm_server.ServerPool.reload`: pause keeping requests, reload,
  prefix cache reset, resume). Any device; the servers must read that directory.
* ``nccl``: TRL's ``VLLMClient`` per server (``init_communicator`` once, then
  ``update_named_params`` and ``reset_prefix_cache``), vLLM's NCCL weight transfer. CUDA only; not
  run by this project (no GPU): written against TRL 1.16's client.

Each sync raises the generator's weight version by one; the other ranks wait for the main rank's
upload (a barrier), so no rank asks the servers before they hold the new weights.

:func:`check_served_model` runs once before training: after the first sync a server must give a
probe sequence the trainer's log-probabilities, or the run stops (a server of another model).
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from seal_rl.errors import SealError, SealWarning
from seal_rl.generators.vllm_server import ServerPool, VLLMServerGenerator

PROBE = [{"role": "system", "content": "You are a helpful assistant with tools."},
         {"role": "user", "content": "Book the cheapest flight from Paris to Oslo on 3 May and tell me its number."}]  # fmt: skip
"""the conversation whose log-probabilities a server and the trainer must agree on"""


def make_server_weights(trainer: Any, pool: ServerPool, generator: VLLMServerGenerator, backend: str, weights_dir: Path,
                        timing: Counter[str] | None = None) -> Any:  # fmt: skip
    """A :class:`ServerWeights` (built here: TRL's class is imported only when training runs)."""
    from trl.distributed import DistributedBackend
    from trl.generation.vllm_generation import VLLMGeneration

    class ServerWeights(VLLMGeneration):
        """TRL's ``VLLMGeneration`` without an engine: its parameter walk, our delivery."""

        def __init__(self) -> None:  # TRL's __init__ would start an engine or a TRL server client
            self.model = trainer.model
            self.accelerator = trainer.accelerator
            self._dist = DistributedBackend(trainer.accelerator)
            self.mode = "server"
            self.enable_sleep_mode = False
            self.backend = "nccl" if backend == "nccl" else "reload"
            self._method = "seal_reload_weights"
            self._clients: list[Any] | None = None
            self._weight_metadata = None
            self.tensor_parallel_size = 1

        def sync_weights(self) -> None:
            started, version = time.perf_counter(), generator.version + 1
            if self.backend == "nccl":
                self._sync_nccl()
            else:
                self._sync_reload(version)  # the main rank raises its version while the servers are paused
            self.accelerator.wait_for_everyone()  # no rank asks the servers before they hold the new weights
            generator.version = version
            if timing is not None:
                timing["weight_sync"] += time.perf_counter() - started

        def _sync_reload(self, version: int) -> None:
            named = {name: tensor.detach().to("cpu").contiguous() for name, tensor in self._iter_named_params()}
            if not self.accelerator.is_main_process:
                return
            from safetensors.torch import save_file

            target = weights_dir / f"v{version}"
            partial = weights_dir / f".v{version}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            save_file(named, str(partial / "model.safetensors"), metadata={"format": "pt"})
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
            pool.revive()
            try:
                pool.reload(str(target.resolve()), self._method, loaded=lambda: setattr(generator, "version", version))
            except SealError as exc:
                if self._method != "seal_reload_weights" or "collective_rpc" not in str(exc):
                    raise
                warnings.warn("The generation servers have no seal worker extension (started with plain `vllm serve`): "
                              "they reload through vLLM's reload_weights, which on vLLM's CPU build leaves a tied output "
                              "head stale. `seal rollout-server` starts them with it.", SealWarning, stacklevel=2)  # fmt: skip
                self._method = "reload_weights"
                pool.reload(str(target.resolve()), self._method, loaded=lambda: setattr(generator, "version", version))
            for old in weights_dir.glob("v*"):
                if old != target and old.name[1:].isdigit():
                    shutil.rmtree(old, ignore_errors=True)

        def _sync_nccl(self) -> None:
            if self._weight_metadata is None:
                self._weight_metadata = [(name, str(p.dtype).removeprefix("torch."), list(p.shape)) for name, p in self._iter_named_params()]
            if not self.accelerator.is_main_process:
                for _ in self._iter_named_params():  # take part in the gathers
                    pass
                return
            if self._clients is None:
                from trl.generation.vllm_client import VLLMClient

                self._clients = []
                for server in pool.live:
                    client = VLLMClient(base_url=server.url, connection_timeout=pool.config.timeout)
                    client.init_communicator(device=self.accelerator.device)
                    self._clients.append(client)
            for client in self._clients:  # one walk per server: each gets every tensor
                client.update_named_params(self._weight_metadata, self._iter_named_params())
                client.reset_prefix_cache()

    return ServerWeights()


def check_served_model(trainer: Any, pool: ServerPool, tolerance: float) -> float:
    """The mean |difference| between every live server's and the trainer's log-probabilities of the
    :data:`PROBE` tokens, after a sync (the largest over servers); a :class:`SealError` above
    ``tolerance``. A collective: every rank forwards the probe (FSDP shards the forward)."""
    import torch

    tokenizer = trainer.processing_class
    ids = tokenizer.apply_chat_template(PROBE, tokenize=True, add_generation_prompt=True, return_dict=False)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    model = trainer.model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=trainer.accelerator.device)).logits.float()
    mine = torch.log_softmax(logits[0, :-1], dim=-1).gather(1, torch.tensor(ids[1:], device=logits.device)[:, None])[:, 0].cpu()
    worst = 0.0
    for server in pool.live:
        answer = pool.post(server, "/v1/completions", {"model": server.model, "prompt": ids, "max_tokens": 1, "temperature": 1.0,
                                                       "prompt_logprobs": 0, "return_token_ids": True})  # fmt: skip
        served = answer["choices"][0]["prompt_logprobs"][1:]
        theirs = torch.tensor([entry[str(token)]["logprob"] for entry, token in zip(served, ids[1:], strict=True)])
        gap = float((theirs - mine).abs().mean())
        worst = max(worst, gap)
        if gap > tolerance:
            raise SealError(f"Generation server {server.url} serves another model than the trainer's: after the weight sync its "
                            f"log-probabilities of a probe differ from the trainer's by {gap:.3f} on average (allowed "
                            f"{tolerance:g}, server.check_tolerance). Serve the trained model's architecture "
                            f"(it answers as {server.model!r}).")  # fmt: skip
    return worst


def attach_servers(trainer: Any, loop: Any, config: Any, out: Path, say: Any) -> None:
    """Connect ``generator: server`` training to its servers: check each answers (``/v1/models``;
    one line and nothing starts when one does not), build the generator the rounds use and put
    :class:`ServerWeights` where TRL syncs its engine (with ``use_vllm`` on, so TRL also computes its
    importance correction). TRL pushes the weights before the first round (once the model is wrapped
    for ZeRO-3/FSDP); the loop then runs ``loop.server_check`` (:func:`check_served_model`) before it
    plays anything, so a server of another model stops the run before any update."""
    import torch

    from seal_rl.trajectory import ChatTokens

    pool = ServerPool(config, log=say)
    pool.connect()
    args = trainer.args
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k or -1,
                "min_p": args.min_p or 0.0, "repetition_penalty": args.repetition_penalty, **(args.generation_kwargs or {})}  # fmt: skip
    generator = VLLMServerGenerator(pool, ChatTokens(trainer.processing_class), sampling)
    backend = config.weight_sync if config.weight_sync != "auto" else ("nccl" if torch.cuda.is_available() else "reload")
    weights = make_server_weights(trainer, pool, generator, backend, Path(config.weights_dir or out / "server_weights"), loop.timing)
    trainer.vllm_generation, trainer.use_vllm = weights, True
    trainer._last_loaded_step = -1  # TRL pushes the weights before the first round, after the model is wrapped

    def check() -> None:  # at the first round: every rank forwards the probe (FSDP shards it)
        gap = check_served_model(trainer, pool, config.check_tolerance)
        if loop.is_main:
            say(f"generation servers: {', '.join(s.url for s in pool.servers)} ({pool.servers[0].model}); weights by {backend} "
                f"({loop.timing['weight_sync']:.1f}s); served log-probabilities within {gap:.2g} of the trainer's")  # fmt: skip

    loop.server, loop.server_check = generator, check


def detach_servers(loop: Any) -> None:
    """At the end of a run (or a failure): stop the producer of asynchronous rounds, close the client."""
    if loop.producer is not None:
        loop.producer.close()
        loop.producer = None
    if loop.server is not None:
        loop.server.stop()
