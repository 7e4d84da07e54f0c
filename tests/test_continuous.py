"""Continuous rollouts (issue 43): each episode's next message starts as soon as its environment has
stepped, beside whatever other messages are decoding, and gives the same messages as lockstep ticks."""

import subprocess
import sys

import pytest

from seal_rl.env import BfclEnv
from seal_rl.errors import SealError, SealWarning
from seal_rl.generators import HFGenerator, ScriptedGenerator
from seal_rl.generators.decode_batch import DecodeBatch, Row
from seal_rl.rollout import DriverStats, resolve_scheduler, run_episodes
from tests.schedulers import TASKS, differences, play


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def test_greedy_messages_equal_the_lockstep_messages(tiny, task_set):
    model, tokenizer = tiny
    lockstep_stats, continuous_stats = DriverStats(), DriverStats()
    ticked = play(model, tokenizer, task_set, "lockstep", stats=lockstep_stats)
    continuous = play(model, tokenizer, task_set, "continuous", stats=continuous_stats)
    assert differences(model, ticked, continuous) == []
    assert lockstep_stats.scheduler == "lockstep" and continuous_stats.scheduler == "continuous"
    assert continuous_stats.tokens == lockstep_stats.tokens > 0
    # messages of different lengths: the engine was not always full (otherwise the test shows nothing)
    assert 1 < continuous_stats.occupancy < 4 and 0 < continuous_stats.longest_share <= 1


def test_a_generator_that_hands_one_episode_anothers_message_fails_the_comparison(tiny, task_set):
    """The negative control: the comparison above catches a message given to the wrong episode."""

    class Misrouting(HFGenerator):
        def step(self):
            ended = super().step()
            if len(ended) == 1 and getattr(self, "_previous", None) and self._previous[0] != ended[0][0]:
                (episode, _), (_, given) = ended[0], self._previous
                self._previous, ended = ended[0], [(episode, given)]
            elif ended:
                self._previous = ended[-1]
            return ended

    model, tokenizer = tiny
    ticked = play(model, tokenizer, task_set, "lockstep")
    wrong = play(model, tokenizer, task_set, "continuous", generator=Misrouting(model, tokenizer, temperature=0.0, max_batch=4))
    assert differences(model, ticked, wrong)


def test_both_schedulers_ignore_the_models_own_generation_defaults(tiny, task_set):
    """A hub chat model's generation_config.json may carry sampling options (Qwen2.5-Instruct:
    top_k 20, repetition_penalty 1.05) that ``generate`` would apply where not told otherwise;
    training samples with TRL's settings instead (top_k 0, repetition_penalty 1.0), on both paths."""
    import torch
    from transformers import GenerationConfig

    model, tokenizer = tiny
    own = model.generation_config
    model.generation_config = GenerationConfig(**{**own.to_dict(), "repetition_penalty": 50.0, "top_k": 1, "no_repeat_ngram_size": 0})
    try:
        ticked = play(model, tokenizer, task_set, "lockstep", tasks=TASKS[:3])
        continuous = play(model, tokenizer, task_set, "continuous", tasks=TASKS[:3])
        assert differences(model, ticked, continuous) == []
        # the control: told nothing, generate would have applied the penalty and changed the message
        prompt = torch.tensor([ticked[0].trajectory.prompt_ids])
        with torch.no_grad():
            told = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                                  repetition_penalty=1.0, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            untold = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        assert told.tolist() != untold.tolist()
    finally:
        model.generation_config = own


def test_sampled_runs_are_reproducible_and_an_episode_does_not_depend_on_its_batch_mates(tiny, task_set):
    model, tokenizer = tiny
    first = play(model, tokenizer, task_set, "continuous", temperature=1.0, tasks=TASKS[:4])
    again = play(model, tokenizer, task_set, "continuous", temperature=1.0, tasks=TASKS[:4])
    other_seed = play(model, tokenizer, task_set, "continuous", temperature=1.0, tasks=TASKS[:4], seed=4)
    assert [r.trajectory.ids for r in first] == [r.trajectory.ids for r in again]
    assert [r.trajectory.ids for r in first] != [r.trajectory.ids for r in other_seed]
    # episode 0 played alone: a request's draws come from its own seed, not from the batch's
    (alone,) = play(model, tokenizer, task_set, "continuous", temperature=1.0, tasks=TASKS[:1])
    assert alone.trajectory.ids == first[0].trajectory.ids


def test_the_batch_never_holds_more_than_max_batch_rows(tiny, task_set, monkeypatch):
    model, tokenizer = tiny
    sizes = []
    forward = DecodeBatch.forward

    def counting(self):
        sizes.append(len(self))
        return forward(self)

    monkeypatch.setattr(DecodeBatch, "forward", counting)
    stats = DriverStats()
    play(model, tokenizer, task_set, "continuous", tasks=TASKS[:6], max_batch=2, concurrency=6, stats=stats)
    assert max(sizes) == 2 and stats.decode_steps == len(sizes) and stats.occupancy <= 2


def test_rows_that_join_and_leave_get_the_logits_of_their_own_sequence(tiny):
    """The decoding batch's core claim: padding, positions and masks make every row's logits those of
    its sequence alone, whoever joins or leaves between steps."""
    import torch

    from seal_rl.generators.prefix_cache import PrefixCache

    model, _ = tiny
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 4000, (n,), generator=generator).tolist() for n in (37, 12, 60)]
    cache = PrefixCache(model)
    batch = DecodeBatch(model)

    def admit(*indices):
        rows = [Row(i, prompts[i], 100) for i in indices]
        batch.admit(rows, [cache.prompt_states(prompts[i]) for i in indices])

    def slot(key):
        return next(i for i, row in enumerate(batch.rows) if row.key == key)

    def check_step():
        with torch.no_grad():
            logits = batch.forward()
            for row, got in zip(batch.rows, logits):
                alone = model(input_ids=torch.tensor([row.prompt + row.generated])).logits[0, -1]
                torch.testing.assert_close(got, alone, rtol=0, atol=1e-4)
                row.generated.append(int(got.argmax()))

    with torch.no_grad():
        admit(0, 1)
        check_step(), check_step()
        admit(2)  # wider than the batch: the batch is padded to it
        check_step()
        batch.release({slot(0)})  # the last row moves into the freed slot
        check_step()
        assert sorted(row.key for row in batch.rows) == [1, 2]
        batch.release({slot(1)})  # the widest row stays; the columns only the others used are cut
        assert batch.width == len(prompts[2]) - 1 + 2
        check_step()
        admit(0)  # narrower than the batch
        check_step()


def test_scheduler_choices_and_one_line_errors(tiny, task_set):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model, tokenizer = tiny
    hf = HFGenerator(model, tokenizer)
    assert resolve_scheduler(hf, "auto") == resolve_scheduler(hf, "continuous") == "continuous"
    assert resolve_scheduler(hf, "lockstep") == "lockstep"
    with pytest.raises(SealError, match="Unknown rollout scheduler 'fast'; choose one of: continuous, lockstep, auto"):
        resolve_scheduler(hf, "fast")
    scripted = ScriptedGenerator({})
    assert resolve_scheduler(scripted, "auto") == "lockstep"
    with pytest.raises(SealError, match="ScriptedGenerator answers whole batches only.*rollout_scheduler: lockstep"):
        run_episodes([(0, task_set.get(TASKS[0]), {})], scripted, BfclEnv, scheduler="continuous")
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, use_sliding_window=True, sliding_window=16, max_window_layers=0)  # fmt: skip
    with pytest.warns(SealWarning):
        sliding = HFGenerator(Qwen2ForCausalLM(config), tokenizer)
    assert resolve_scheduler(sliding, "auto") == "lockstep"
    with pytest.raises(SealError, match="sliding-window"):
        resolve_scheduler(sliding, "continuous")


def test_recipes_refuse_unknown_and_impossible_schedulers():
    from seal_rl.train import load_recipe
    from seal_rl.train.recipe import planned_scheduler

    with pytest.raises(SealError, match="Unknown rollout_scheduler 'fifo'; choose one of: continuous, lockstep, auto"):
        load_recipe("smoke-cpu", ["rollout_scheduler=fifo"])
    paper = ["model.path=preset:qwen2.5-7b"]
    with pytest.raises(SealError, match="vllm_tensor_parallel_size > 1"):
        load_recipe("paper-qwen2.5-7b", [*paper, "grpo.vllm_tensor_parallel_size=2", "rollout_scheduler=continuous"])
    # the GPU recipes say auto: continuous on one GPU per engine, lockstep (said so) when TP is raised
    assert planned_scheduler(load_recipe("paper-qwen2.5-7b", paper)).startswith("continuous (vllm")
    assert planned_scheduler(load_recipe("paper-qwen2.5-7b", [*paper, "grpo.vllm_tensor_parallel_size=2"])).startswith("lockstep")
    assert planned_scheduler(load_recipe("gpt-oss-20b", ["model.path=preset:gpt-oss-20b"])).startswith("lockstep")
    assert load_recipe("real-cpu").rollout_scheduler == load_recipe("real-study-cpu").rollout_scheduler == "continuous"


@pytest.mark.parametrize("args, message", [
    (["--policy", "oracle", "--rollout-scheduler", "fifo"], "Unknown --rollout-scheduler 'fifo'; choose one of: continuous, lockstep, auto."),
    (["--policy", "oracle", "--rollout-scheduler", "continuous"], "rollout_scheduler continuous cannot run here"),
])  # fmt: skip
def test_seal_eval_refuses_a_scheduler_in_one_line_before_any_episode(tmp_path, args, message):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "seal_rl", "eval", *args, "--tasks", TASKS[0], "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (out / "results.jsonl").exists()


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_filtering_is_transformers_top_p_warper(top_p):
    """The continuous path's nucleus filter against transformers' own TopPLogitsWarper (what
    ``generate`` applies in the lockstep path), on random scores with ties."""
    import torch
    from transformers import TopPLogitsWarper

    from seal_rl.generators.hf import _top_p

    scores = torch.randn(6, 300, generator=torch.Generator().manual_seed(1)) * 3
    scores[:, 10:20] = scores[:, 10:11]  # a run of equal scores
    expected = TopPLogitsWarper(top_p)(torch.zeros(6, 1, dtype=torch.long), scores.clone())
    got = _top_p(scores.clone(), top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(expected)) and torch.equal(got[~torch.isinf(got)], expected[~torch.isinf(expected)])
    assert (~torch.isinf(got)).sum(dim=1).min() >= 1
