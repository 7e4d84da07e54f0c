"""The GPU rollout path on CPU: TRL's real colocated vLLM backend (``VLLMGeneration``) driving a fake
``vllm.LLM`` (tests/fake_vllm.py) through a whole SEAL round, and the fake checked against the
calls TRL 1.16 makes.

What a random tiny model cannot give here is reward (every episode fails), so this file proves the
plumbing: sampled log-probabilities reach TRL aligned with their tokens (the importance-sampling
ratio is 1 where vLLM and the trainer share weights), budgets reach the engine, weights are pushed
into it every step. Learning with signal is tested on the transformers path (test_learning.py).
"""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path

import pytest
import torch

from tests import fake_vllm

ROOT = Path(__file__).resolve().parents[1]
TASKS = "[multi_turn_base_105,multi_turn_miss_param_105]"


def _trl_source() -> ast.Module:
    from trl.generation import vllm_generation

    return ast.parse(Path(vllm_generation.__file__).read_text())


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]


def test_fake_llm_takes_every_argument_trl_passes():
    (call,) = _calls(_trl_source(), "LLM")
    keywords = {k.arg for k in call.keywords}
    assert {"model", "max_model_len", "logprobs_mode", "seed", "tensor_parallel_size"} <= keywords
    inspect.signature(fake_vllm.LLM).bind(**{k: None for k in keywords})  # raises on an unknown keyword


def test_fake_sampling_params_take_every_field_trl_and_seal_set():
    tree = _trl_source()
    dicts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "generation_kwargs"
             and isinstance(n.value, ast.Dict)]  # fmt: skip
    keys = {k.value for d in dicts for k in d.keys}
    assert {"n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "logprobs", "repetition_penalty"} <= keys
    from seal_rl.generators import vllm_engines

    ours = {k.arg for c in _calls(ast.parse(Path(vllm_engines.__file__).read_text()), "SamplingParams") for k in c.keywords if k.arg}
    fields = set(inspect.signature(fake_vllm.SamplingParams).parameters)
    assert keys <= fields and ours <= fields and "seed" in ours


def test_fake_llm_has_every_attribute_trl_reaches(tiny_model_dir):
    import re

    from trl.generation import vllm_generation

    paths = set(re.findall(r"self\.llm\.([A-Za-z_][\w.]*)", Path(vllm_generation.__file__).read_text()))
    assert "llm_engine.model_executor.driver_worker.model_runner.model.load_weights" in paths
    llm = fake_vllm.LLM(model=str(tiny_model_dir))
    for path in paths:
        node = llm
        for part in path.split("."):
            node = getattr(node, part)  # AttributeError names what TRL reaches and the fake lacks


def test_trl_reads_the_fakes_outputs(tiny_model_dir):
    from trl.generation.vllm_generation import extract_logprobs

    llm = fake_vllm.LLM(model=str(tiny_model_dir), max_model_len=64)
    outputs = llm.generate([{"prompt_token_ids": [5, 6, 7]}], fake_vllm.SamplingParams(max_tokens=4, logprobs=0, seed=3))
    logprobs, token_ids = extract_logprobs(outputs)
    assert len(logprobs[0]) == len(outputs[0].outputs[0].token_ids) <= 4
    assert [ids[0] for ids in token_ids[0]] == outputs[0].outputs[0].token_ids
    again = llm.generate([{"prompt_token_ids": [5, 6, 7]}], fake_vllm.SamplingParams(max_tokens=4, logprobs=0, seed=3))
    assert again[0].outputs[0].token_ids == outputs[0].outputs[0].token_ids  # seeded
    with pytest.raises(ValueError, match="maximum model length"):
        llm.generate([{"prompt_token_ids": list(range(64))}], fake_vllm.SamplingParams())


@pytest.fixture(scope="module")
def vllm_round(tiny_model_dir, tmp_path_factory):
    """Two SEAL rounds through TRL's colocated vLLM backend on the fake engine, with TRL's
    importance-sampling correction on (the setting that crashed before log-probs were returned)."""
    from trl import GRPOTrainer

    from seal_rl.train import load_recipe, train

    mp = pytest.MonkeyPatch()
    fake_vllm.install(mp)
    engines: list[fake_vllm.LLM] = []
    original_init = fake_vllm.LLM.__post_init__

    def record(self):
        original_init(self)
        engines.append(self)

    mp.setattr(fake_vllm.LLM, "__post_init__", record)
    seen: list[dict] = []
    original = GRPOTrainer._compute_loss

    def recording(self, model, inputs):
        seen.append({k: inputs[k].detach().clone() for k in ("importance_sampling_ratio", "completion_mask", "tool_mask")})
        return original(self, model, inputs)

    mp.setattr(GRPOTrainer, "_compute_loss", recording)
    environ = dict(os.environ)  # TRL's colocate set-up writes RANK/WORLD_SIZE/MASTER_* into the environment
    out = tmp_path_factory.mktemp("vllm") / "run"
    overrides = {
        "model.path": str(tiny_model_dir), "data.task_ids": TASKS, "grpo.tasks_per_step": 2, "grpo.tasks_per_update": 2,
        "grpo.per_device_train_batch_size": 2, "grpo.max_steps": 2, "grpo.use_vllm": True, "generator": "vllm",
        "grpo.vllm_importance_sampling_correction": True, "budgets.max_completion_tokens": 256, "budgets.max_new_tokens": 16,
    }  # fmt: skip
    try:
        recipe = load_recipe(ROOT / "configs" / "smoke-cpu.yaml", [f"{k}={v}" for k, v in overrides.items()])
        summary = train(recipe, out)
    finally:
        mp.undo()
        os.environ.clear()
        os.environ.update(environ)
    return recipe, summary, engines, seen, out


def test_a_colocated_vllm_round_runs_with_log_probabilities(vllm_round):
    import json

    recipe, summary, engines, seen, out = vllm_round
    assert summary["rounds"] == 2 and summary["apatch_hook_calls"] == 2
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # auto: continuous, through the engine's add_request/step (one engine step per decoding step)
    assert [line["rollout/scheduler"] for line in rounds if line.get("kind") == "rollout"] == ["continuous"] * 2
    assert all(line["rollout/decode_steps"] > 0 for line in rounds if line.get("kind") == "rollout")
    (engine,) = engines
    assert len(seen) == 4  # 2 rounds x 2 micro-batches
    for inputs in seen:
        mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
        ratio = inputs["importance_sampling_ratio"].expand_as(mask)[mask]
        assert mask.sum() > 0
        # vLLM's sampled log-probs equal the trainer's own (same weights, same temperature) only if they
        # are aligned with the right tokens; any shift would put the ratio far from 1.
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-3), ratio


def test_budgets_reach_the_engine(vllm_round):
    recipe, _, engines, _, _ = vllm_round
    (engine,) = engines
    budgets = recipe.budgets
    assert engine.max_model_len == budgets["max_prompt_tokens"] + budgets["max_completion_tokens"]
    assert engine.calls and all(1 <= c["max_tokens"] <= budgets["max_new_tokens"] for c in engine.calls)
    assert all(c["logprobs"] == 0 and c["seed"] is not None for c in engine.calls)


def test_trained_weights_are_pushed_into_the_engine(vllm_round):
    from safetensors.torch import load_file

    _, _, engines, _, out = vllm_round
    (engine,) = engines
    loaded = engine.llm_engine.model_executor.driver_worker.model_runner.model.loaded
    names = {n for n, _ in engine.hf_model.named_parameters()}
    assert set(loaded) == names and len(loaded) == 2 * len(names)  # synced before each of the 2 rounds
    # The engine holds the weights of the last sync: those of the round-1 checkpoint.
    synced = load_file(out / "checkpoints" / "checkpoint-1" / "model.safetensors")
    engine_weights = {k: v.detach() for k, v in engine.hf_model.named_parameters()}
    assert all(torch.equal(synced[k], engine_weights[k]) for k in synced if k in engine_weights)


def _tp_rank(rank: int, init_file: str, model_dir: str, results: str) -> None:
    """One rank of a 2-rank tensor-parallel group sharing one (fake) engine: rank 0 has three ticks
    of work, rank 1 one; both then close() and must leave together."""
    import json
    from types import SimpleNamespace

    import torch.distributed as dist
    from transformers import AutoTokenizer
    from trl.generation import vllm_generation

    from seal_rl.generators import VLLMGenerator
    from seal_rl.rollout import Request, resolve_scheduler

    vllm_generation.SamplingParams = fake_vllm.SamplingParams  # what fake_vllm.install does, without pytest
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    llm = fake_vllm.LLM(model=model_dir, max_model_len=256)
    engine = SimpleNamespace(mode="colocate", enable_sleep_mode=False, tensor_parallel_size=2, tp_group=None, llm=llm,
                             repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, logprobs=0, generation_kwargs={})  # fmt: skip
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=engine, processing_class=AutoTokenizer.from_pretrained(model_dir))
    generator = VLLMGenerator(trainer)
    ticks = 3 if rank == 0 else 1
    answers = []
    for tick in range(ticks):
        requests = [Request(10 * rank + k, None, [], [], {}, [5 + rank, 6 + k, 7 + tick], 4 + k) for k in range(1 + rank)]
        answers.append([(g.token_ids, g.logprobs) for g in generator.generate(requests, seed=tick)])
    generator.close()
    scheduler = resolve_scheduler(generator)  # a TP group calls its engine together: lockstep only
    Path(results, f"{rank}.json").write_text(json.dumps({"answers": answers, "calls": len(llm.calls), "scheduler": scheduler}))
    dist.destroy_process_group()


def test_tensor_parallel_ranks_share_an_engine_in_lockstep(tiny_model_dir, tmp_path):
    import json

    import torch.multiprocessing as mp

    from seal_rl.generators import VLLMGenerator
    from seal_rl.rollout import Request

    mp.spawn(_tp_rank, args=(str(tmp_path / "init"), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert [len(r["answers"]) for r in ranks] == [3, 1]
    assert [r["scheduler"] for r in ranks] == ["lockstep", "lockstep"]
    # Every rank ran the group's union: tick 0 has 1 + 2 requests, ticks 1-2 only rank 0's one.
    assert ranks[0]["calls"] == ranks[1]["calls"] == 3 + 1 + 1
    # Each rank got its own answers, the same a lone engine gives for the same requests and seeds.
    mp_patch = pytest.MonkeyPatch()
    fake_vllm.install(mp_patch)
    try:
        from types import SimpleNamespace

        from transformers import AutoTokenizer

        engine = SimpleNamespace(mode="colocate", enable_sleep_mode=False, tensor_parallel_size=1, llm=fake_vllm.LLM(model=str(tiny_model_dir), max_model_len=256),
                                 repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, logprobs=0, generation_kwargs={})  # fmt: skip
        alone = VLLMGenerator(SimpleNamespace(use_vllm=True, vllm_generation=engine, processing_class=AutoTokenizer.from_pretrained(tiny_model_dir)))
        for rank, result in enumerate(ranks):
            for tick, answers in enumerate(result["answers"]):
                requests = [Request(10 * rank + k, None, [], [], {}, [5 + rank, 6 + k, 7 + tick], 4 + k) for k in range(1 + rank)]
                assert answers == [[g.token_ids, g.logprobs] for g in alone.generate(requests, seed=tick)]
    finally:
        mp_patch.undo()


def _colocated(llm, model_dir, temperature: float = 0.0):
    """A VLLMGenerator over ``llm`` with the settings of TRL's colocated engine (one rank)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from seal_rl.generators import VLLMGenerator

    engine = SimpleNamespace(mode="colocate", enable_sleep_mode=False, tensor_parallel_size=1, llm=llm, repetition_penalty=1.0,
                             temperature=temperature, top_p=1.0, top_k=0, min_p=0.0, logprobs=0, generation_kwargs={})  # fmt: skip
    return VLLMGenerator(SimpleNamespace(use_vllm=True, vllm_generation=engine, processing_class=AutoTokenizer.from_pretrained(model_dir)))


def test_continuous_rollouts_through_the_engine_equal_lockstep(tiny_model_dir, task_set):
    """Greedy episodes through the colocated engine's add_request/step (the fake, at most 2 requests
    running, so one waits) equal those of LLM.generate ticks: records, tokens, log-probabilities.
    A generator that hands one episode's message to another makes the comparison fail."""
    from seal_rl.env import BfclEnv
    from seal_rl.rollout import Budgets, DriverStats, Request, resolve_scheduler, run_episodes
    from seal_rl.trajectory import ChatTokens
    from tests.helpers import SwappedMessages, same_episodes

    mp = pytest.MonkeyPatch()
    fake_vllm.install(mp)
    try:
        llm = fake_vllm.LLM(model=str(tiny_model_dir), max_num_seqs=2)
        noise = torch.Generator().manual_seed(0)
        with torch.no_grad():  # the tiny model's greedy messages are all newlines; perturbed, they differ
            for p in llm.hf_model.parameters():
                p.add_(torch.randn(p.shape, generator=noise) * 0.3)
        generator = _colocated(llm, tiny_model_dir)
        assert resolve_scheduler(generator) == "continuous"
        tasks = [task_set.get(t) for t in ("multi_turn_base_105", "multi_turn_base_38", "multi_turn_base_100")]
        chat = ChatTokens(generator.chat.tokenizer)
        budgets = Budgets(max_prompt_tokens=20000, max_completion_tokens=120, max_new_tokens=12)

        def play(gen, scheduler):
            stats = DriverStats()
            rollouts = run_episodes([(i, t, {}) for i, t in enumerate(tasks)], gen, BfclEnv, chat=chat, budgets=budgets,
                                    concurrency=3, seed=4, scheduler=scheduler, stats=stats)  # fmt: skip
            return rollouts, stats

        ticked, _ = play(generator, "lockstep")
        streamed, stats = play(generator, "continuous")
        assert stats.scheduler == "continuous"
        assert same_episodes(streamed, ticked)
        assert max(r.record["model_calls"] for r in ticked) >= 2  # episodes asked again after their first message
        assert all(r.trajectory.logprobs and None not in r.trajectory.logprobs for r in streamed)
        assert 1 < stats.occupancy <= 2  # decode_steps counts engine steps (two requests share most), not tokens
        assert not llm.llm_engine.has_unfinished_requests()

        firsts = [next(m["content"] for m in r.record["messages"] if m["role"] == "assistant") for r in ticked]
        assert len(set(firsts)) == len(firsts)  # so that handing a message to another episode shows
        control = SwappedMessages(generator)
        swapped, _ = play(control, "continuous")
        assert control.swapped is not None and not same_episodes(swapped, ticked)

        generator.add(Request(0, None, [], [], {}, [5, 6, 7], 8), seed=0)  # a run that stops half-way ...
        generator.step()
        generator.close()  # ... leaves nothing in the engine
        assert not llm.llm_engine.has_unfinished_requests()
    finally:
        mp.undo()


@pytest.mark.parametrize("scheduler", ["continuous", "lockstep"])
def test_episodes_end_at_the_engines_context_window_instead_of_overrunning_it(tiny_model_dir, task_set, scheduler):
    """vLLM refuses a prompt at or past ``max_model_len`` (the fake raises, as vLLM 0.30 does).
    ``seal eval``'s budgets (no prompt cap, 8192 tokens after it) can outgrow the engine's window:
    the driver must end such an episode with ``context_window``, never send the engine a prompt
    that does not fit, and never ask for a message that runs past the window. An opening prompt
    longer than the window ends its episode before any call."""
    from transformers import AutoTokenizer

    from seal_rl.env import BfclEnv
    from seal_rl.rollout import Budgets, run_episodes
    from seal_rl.trajectory import ChatTokens

    tasks = [task_set.get("multi_turn_base_105"), task_set.get("multi_turn_base_198")]
    chat = ChatTokens(AutoTokenizer.from_pretrained(tiny_model_dir))
    env = BfclEnv()
    opening = []
    for task in tasks:
        env.reset(task)
        opening.append(len(chat.start(env.messages).prompt_ids))
    window = opening[0] + 40
    assert opening[1] > window  # task 198's first question alone does not fit
    mp = pytest.MonkeyPatch()
    fake_vllm.install(mp)
    try:
        llm = fake_vllm.LLM(model=str(tiny_model_dir), max_model_len=window)
        generator = _colocated(llm, tiny_model_dir)
        budgets = Budgets(max_prompt_tokens=10**9, max_completion_tokens=8192, max_new_tokens=16)
        rollouts = run_episodes([(i, t, {}) for i, t in enumerate(tasks)], generator, BfclEnv, chat=chat, budgets=budgets,
                                seed=3, scheduler=scheduler)  # fmt: skip
    finally:
        mp.undo()
    assert [r.record["end_reason"] for r in rollouts] == ["context_window", "context_window"]
    assert rollouts[0].record["model_calls"] >= 1 and rollouts[1].record["model_calls"] == 0
    assert llm.calls and all(c["prompt_tokens"] + c["max_tokens"] <= window for c in llm.calls)
    assert len(rollouts[0].trajectory.ids) >= window  # it ended because the next prompt filled the window
