"""The shared-prefix KV cache of HFGenerator: the same tokens as without it, bounded, invalidated by weight changes."""

import copy
from pathlib import Path

import pytest

from seal_rl.env import BfclEnv
from seal_rl.errors import SealWarning
from seal_rl.generators import HFGenerator
from seal_rl.rollout import Budgets, Request, run_episodes
from seal_rl.trajectory import ChatTokens


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(tiny, task_set):
    """Opening prompts of tasks with shared and different tool prompts, and continuations of them."""
    _, tokenizer = tiny
    chat = ChatTokens(tokenizer)
    opening = {}
    for task_id in ("multi_turn_base_1", "multi_turn_base_6", "multi_turn_miss_param_105", "multi_turn_base_0"):
        env = BfclEnv()
        env.reset(task_set.get(task_id))
        opening[task_id] = chat.start(env.messages).prompt_ids
    said = chat.encode('<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call><|im_end|>\n<|im_start|>user\nok')
    return opening, said


def _request(index: int, ids: list[int], max_new_tokens: int = 12) -> Request:
    return Request(index, None, [], [], {}, list(ids), max_new_tokens)


def _calls(generator: HFGenerator, batches: list[list[list[int]]], seed: int = 3) -> list[list[list[int]]]:
    return [[g.token_ids for g in generator.generate([_request(i, ids) for i, ids in enumerate(batch)], seed)] for batch in batches]


def _batches(prompts) -> list[list[list[int]]]:
    """Calls as an evaluation makes them: single prompts, batches of different lengths (left-padded),
    prompts that share the tool prompt, an episode's growing conversation, an exact repeat."""
    opening, said = prompts
    a, b, c, d = opening.values()
    return [
        [a],
        [a + said, b, c],  # a's next call, a task with a's backends, one with others
        [b + said, a + said + said[:5], d, c + said],
        [a + said],  # a repeat: nothing left to read but the last token
        [d + said + said, b[:40], a[: len(a) // 2]],  # a cut inside a kept prompt
    ]


def test_greedy_tokens_are_the_same_with_and_without_the_cache(tiny, prompts):
    model, tokenizer = tiny
    batches = _batches(prompts)
    plain = _calls(HFGenerator(model, tokenizer, temperature=0.0, prefix_cache_tokens=0), batches)
    generator = HFGenerator(model, tokenizer, temperature=0.0, max_batch=2)  # batches are split, the cache is shared
    assert _calls(generator, batches) == plain
    cache = generator.prefix_cache
    assert cache.reused > cache.prefilled  # most prompt tokens came from the cache
    assert all(len(tokens) for batch in plain for tokens in batch)


def test_samples_with_the_same_seed_are_the_same_with_and_without_the_cache(tiny, prompts):
    model, tokenizer = tiny
    batches = _batches(prompts)
    plain = _calls(HFGenerator(model, tokenizer, temperature=1.0, prefix_cache_tokens=0), batches)
    cached = _calls(HFGenerator(model, tokenizer, temperature=1.0), batches)
    assert cached == plain
    assert _calls(HFGenerator(model, tokenizer, temperature=1.0), batches) == cached  # reproducible
    assert _calls(HFGenerator(model, tokenizer, temperature=1.0), batches, seed=4) != cached


def test_whole_episodes_are_the_same_with_and_without_the_cache(tiny, task_set):
    model, tokenizer = tiny
    tasks = [task_set.get(t) for t in ("multi_turn_base_1", "multi_turn_base_6", "multi_turn_miss_param_105")]
    budgets = Budgets(max_prompt_tokens=20000, max_completion_tokens=200, max_new_tokens=16)
    runs = []
    for tokens in (0, 65536):
        generator = HFGenerator(model, tokenizer, temperature=1.0, max_batch=2, prefix_cache_tokens=tokens)
        rollouts = run_episodes([(i, t, {}) for i, t in enumerate(tasks)], generator, BfclEnv, chat=ChatTokens(tokenizer),
                                budgets=budgets, concurrency=3, seed=11)  # fmt: skip
        runs.append([(r.trajectory.completion_ids, r.record["messages"]) for r in rollouts])
        if tokens:
            assert generator.prefix_cache.reused > generator.prefix_cache.prefilled
            assert len(generator.prefix_cache) <= len(tasks)  # one entry per episode: its latest prompt
    assert runs[0] == runs[1]


def test_the_cache_keeps_at_most_its_budget(tiny, prompts):
    model, tokenizer = tiny
    batches = _batches(prompts)
    plain = _calls(HFGenerator(model, tokenizer, temperature=0.0, prefix_cache_tokens=0), batches)
    longest = max(len(ids) for batch in batches for ids in batch)
    budget = longest + 100  # room for one long prompt at a time
    generator = HFGenerator(model, tokenizer, temperature=0.0, prefix_cache_tokens=budget)
    for batch, expected in zip(batches, plain):
        assert _calls(generator, [batch]) == [expected]
        assert 0 < generator.prefix_cache.tokens <= budget
    small = HFGenerator(model, tokenizer, temperature=0.0, prefix_cache_tokens=10)  # no prompt fits: nothing kept
    assert _calls(small, batches) == plain and small.prefix_cache.tokens == 0


def test_changed_weights_empty_the_cache(tiny, prompts):
    import torch

    model, tokenizer = tiny
    model = copy.deepcopy(model)
    batches = _batches(prompts)[:3]
    generator = HFGenerator(model, tokenizer, temperature=0.0)
    before = _calls(generator, batches)
    with torch.no_grad():  # an in-place update, as an optimizer step makes on the same model object
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    fresh = _calls(HFGenerator(model, tokenizer, temperature=0.0, prefix_cache_tokens=0), batches)
    assert fresh != before
    assert _calls(generator, batches) == fresh
    for parameter in model.parameters():  # a dense write through .data, which autograd's version counters do not see
        parameter.data.mul_(0.9)
    fresh = _calls(HFGenerator(model, tokenizer, temperature=0.0, prefix_cache_tokens=0), batches)
    assert _calls(generator, batches) == fresh
    generator.prefix_cache.clear()
    assert len(generator.prefix_cache) == 0


def test_the_cache_can_be_off_and_is_off_under_lockstep(tiny):
    model, tokenizer = tiny
    assert HFGenerator(model, tokenizer).prefix_cache is not None  # on by default
    assert HFGenerator(model, tokenizer, prefix_cache_tokens=0).prefix_cache is None
    assert HFGenerator(model, tokenizer, lockstep=object()).prefix_cache is None  # type: ignore[arg-type]


def test_models_with_sliding_window_layers_generate_without_the_cache(tiny):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _, tokenizer = tiny
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True, sliding_window=16,
                         max_window_layers=0)  # fmt: skip
    with pytest.warns(SealWarning, match="sliding-window"):
        generator = HFGenerator(Qwen2ForCausalLM(config), tokenizer, temperature=0.0)
    assert generator.prefix_cache is None


def test_seal_eval_builds_the_hf_generator_with_the_setting(tiny_model_dir):
    from seal_rl.env import EnvConfig
    from seal_rl.errors import SealError
    from seal_rl.evaluate import ModelSettings, make_generator
    from seal_rl.policies import ModelPolicy

    policy = ModelPolicy(tiny_model_dir)
    generator, _, _ = make_generator(policy, ModelSettings(), EnvConfig(), [])
    assert generator.prefix_cache.max_tokens == ModelSettings().prefix_cache_tokens == 65536  # on by default
    generator, _, _ = make_generator(policy, ModelSettings(prefix_cache_tokens=0), EnvConfig(), [])
    assert generator.prefix_cache is None
    with pytest.raises(SealError, match="--prefix-cache-tokens must be >= 0"):
        make_generator(policy, ModelSettings(prefix_cache_tokens=-1), EnvConfig(), [])


def test_seal_eval_loads_the_hf_weights_in_the_dtype_asked_for(tiny_model_dir):
    import json

    import torch

    from seal_rl.env import EnvConfig
    from seal_rl.evaluate import ModelSettings, make_generator
    from seal_rl.policies import ModelPolicy

    policy = ModelPolicy(tiny_model_dir)
    saved = json.loads((Path(tiny_model_dir) / "config.json").read_text())["dtype"]
    for dtype, expected in [("auto", getattr(torch, saved)), ("bfloat16", torch.bfloat16), ("float32", torch.float32)]:
        generator, _, _ = make_generator(policy, ModelSettings(dtype=dtype), EnvConfig(), [])
        assert next(generator.model.parameters()).dtype == expected, dtype
    # a run recorded in one dtype is not resumed in another; one from before --dtype resumes at auto
    from dataclasses import asdict

    from seal_rl.evaluate import config_differences

    auto = {"model_settings": asdict(ModelSettings())}
    (changed,) = config_differences(auto, {"model_settings": asdict(ModelSettings(dtype="float32"))})
    assert changed.path == "model_settings.dtype" and not changed.added_default
    before = {"model_settings": {k: v for k, v in auto["model_settings"].items() if k != "dtype"}}
    (added,) = config_differences(before, auto)
    assert added.added_default
