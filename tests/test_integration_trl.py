"""TRL's own GRPOTrainer on BFCL multi-turn through :class:`seal_rl.integrations.trl.BfclRollout`
(docs/guides/integrations.md): the example script trains a warm-started model for a round with TRL's
unmodified trainer and sees reward spread, non-zero advantages and moving weights; the samples
it hands TRL are the episode, token-exact; a prompt that names no task is refused clearly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seal_rl.errors import SealError
from tests.test_templates import family_model

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["multi_turn_base_100", "multi_turn_base_38"]


def warm_started(model: Path, out: Path, env: dict[str, str]) -> Path:
    """`make demo`'s warm start (``seal sft --config demo-cpu``) of ``model``: on task 100 two thirds
    of the transcripts send a wrong value in the last turn, so sampling succeeds on some episodes."""
    settings = [f"model.path={model}", *(f"env.{key}={value}" for key, value in env.items())]
    done = subprocess.run([sys.executable, "-m", "seal_rl", "sft", "--config", "demo-cpu", "--out", str(out / "warm"),
                           *(a for s in settings for a in ("--set", s))], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "warm" / "model"


@pytest.fixture(scope="module")
def demo_tiny(tmp_path_factory, task_set) -> Path:
    """The tiny model at `make demo`'s size (demo-cpu.yaml: hidden 128, 2 layers, vocabulary 4096)."""
    from seal_rl.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("demo-tiny"), vocab_size=4096, hidden_size=128, layers=2, task_set=task_set)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["tiny", "qwen2_5"])
def test_the_example_trains_a_round_with_trls_own_grpo_trainer(family, demo_tiny, tmp_path):
    """``examples/trl_grpo_bfcl.py``: plain GRPOTrainer, one round of 8 episodes of each of two tasks, on the
    tiny model (BFCL's Qwen prompt, hermes calls) and on the tiny model with TRL's Qwen2.5 template
    (the template's own prompt and its own tool calls), with the demo's interface (the paper preset) and
    A-Patch. Rewards differ within a group, so TRL's
    advantages are non-zero; the weights move; every episode is logged with its turn labels."""
    import torch
    from safetensors.torch import load_file

    if family == "tiny":
        env = {"prompt_mode": "bfcl_qwen_fc", "call_format": "hermes"}
        base = demo_tiny
    else:
        env = {"prompt_mode": "chat_template", "call_format": "native"}
        base = family_model(demo_tiny, family, tmp_path / family)
    model = warm_started(base, tmp_path, env)
    out = tmp_path / "trl"
    settings = [a for key, value in env.items() for a in ("--set", f"env.{key}={value}")]
    done = subprocess.run([sys.executable, "examples/trl_grpo_bfcl.py", "--model", str(model), "--recipe", "demo-cpu",
                           *settings, "--tasks", ",".join(TASKS), "--num-generations", "8", "--per-device-batch", "4",
                           "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (log,) = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (out / "rollouts" / "trajectories.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows]
    assert len(rows) == 16 and 0 < sum(rewards) < 16, rewards  # signal
    assert log["reward_std"] > 0 and log["frac_reward_zero_std"] < 1 and log["grad_norm"] > 0  # a group's rewards differ
    assert log["reward"] == pytest.approx(sum(rewards) / 16)  # TRL's reward is the verifier's
    assert all(r["labels"] and r["verdict"] and r["apatch_weight"] > 0 for r in rows)
    assert any(label != "pass" for r in rows for label in r["labels"])  # the failures are diagnosed
    before, after = load_file(model / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert "round 1: success" in done.stderr


def test_samples_are_the_episode_token_exact_and_fields_reach_the_reward_functions(tiny_model_dir, tmp_path):
    """One call of the rollout_func, with a stand-in for the trainer that carries the attributes of
    TRL's GRPOTrainer it reads: one sample per prompt; each sample decodes to the chat template's
    rendering of its episode's messages, with the mask 1 on the generated tokens only; the extra
    fields line up with the logged episodes and feed the reward functions."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal_rl.integrations.trl import BfclRollout, bfcl_reward, progress_reward, turn_pass_reward
    from seal_rl.trajectory import ChatTokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    accelerator = SimpleNamespace(is_main_process=True, num_processes=1, process_index=0, unwrap_model=lambda m: m)
    trainer = SimpleNamespace(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), processing_class=tokenizer,
                              accelerator=accelerator, use_vllm=False, args=SimpleNamespace(temperature=1.0, top_p=1.0),
                              state=SimpleNamespace(global_step=0))  # fmt: skip
    trainer.model.train()  # as TRL's training loop has it
    rollout = BfclRollout("vanilla-grpo", overrides=["budgets.max_new_tokens=16"], out=tmp_path)
    tasks = [TASKS[0], TASKS[0], "multi_turn_base_105"]
    output = rollout([[{"role": "user", "content": t}] for t in tasks], trainer)
    assert {key: len(value) for key, value in output.items()} == dict.fromkeys(output, 3)
    assert output["task_id"] == tasks
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    chat = ChatTokens(tokenizer)
    for i, row in enumerate(rows):
        completion, mask = output["completion_ids"][i], output["env_mask"][i]
        assert len(mask) == len(completion) == len(output["logprobs"][i]) and 0 < sum(mask) < len(mask)
        decoded = tokenizer.decode(output["prompt_ids"][i] + completion)
        rendered = chat.render(row["messages"], generation_prompt=False)
        assert rendered.startswith(decoded[: len(decoded) - 40])  # the end may be cut by the budget mid-message
        assert output["turn_labels"][i] == row["labels"] and output["apatch_weight"][i] == row["apatch_weight"] == 1.0
    assert bfcl_reward([], [], seal_reward=output["seal_reward"]) == [r["reward"] for r in rows]
    assert progress_reward([], [], seal_progress=output["seal_progress"]) == [r["progress"] for r in rows]
    shares = turn_pass_reward([], [], turn_labels=output["turn_labels"])
    assert shares == [sum(z == "pass" for z in r["labels"]) / len(r["labels"]) for r in rows]

    # TRL's evaluation (model in eval mode): the same fields, the interface removed, the loop unmoved
    state = rollout.loop.state.to_json()
    trainer.model.eval()
    evaluated = rollout([[{"role": "user", "content": t}] for t in tasks], trainer)
    assert {key: len(value) for key, value in evaluated.items()} == {key: 3 for key in output}
    assert rollout.loop.state.to_json() == state and len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 3
    trainer.model.train()

    with pytest.raises(SealError, match="bfcl_dataset"):
        rollout([[{"role": "user", "content": "What is 2+2?"}]], trainer)
