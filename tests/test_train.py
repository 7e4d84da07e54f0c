"""SEAL training on TRL with a tiny random model: the closed loop, A-Patch inside GRPOTrainer,
resume, and two processes. The oracle-mix generator makes rewards differ within groups so that
advantages (and A-Patch) are non-zero."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seal_rl.env import EnvConfig

from seal_rl.errors import SealError
from seal_rl.tasks import TaskSet
from seal_rl.train import batch_layout, load_recipe, read_metrics, train

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
TASKS = "[multi_turn_base_105,multi_turn_miss_param_105]"


@pytest.fixture(scope="module")
def tiny_path(tiny_model_dir):
    return tiny_model_dir


def _overrides(tiny_path, **extra):
    settings = {
        "model.path": str(tiny_path), "data.task_ids": TASKS, "grpo.tasks_per_step": 2, "grpo.tasks_per_update": 2,
        "grpo.per_device_train_batch_size": 2, "grpo.max_steps": 2, "grpo.learning_rate": 1e-3,
        "budgets.max_completion_tokens": 2048, "budgets.max_new_tokens": 24,
        "generator": "tests.generators:oracle_mix", **extra,
    }  # fmt: skip
    return [f"{k}={v}" for k, v in settings.items()]


def _recipe(tiny_path, **extra):
    return load_recipe(ROOT / "configs" / "smoke-cpu.yaml", _overrides(tiny_path, **extra))


def _free_port() -> str:
    """A free port, so concurrent or back-to-back multi-process runs cannot collide."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def loss_inputs():
    """Advantages that reach TRL's loss, recorded by wrapping GRPOTrainer._compute_loss."""
    from trl import GRPOTrainer

    seen = []
    original = GRPOTrainer._compute_loss

    def recording(self, model, inputs):
        seen.append(inputs["advantages"].detach().flatten().tolist())
        trained = inputs["completion_mask"] * inputs["tool_mask"]  # the tokens the loss covers
        texts = [self.processing_class.decode(ids[mask.bool()].tolist()) for ids, mask in zip(inputs["completion_ids"], trained)]
        seen_texts.extend(texts)
        return original(self, model, inputs)

    seen_texts: list[str] = []  # decoded loss-masked tokens of every sample that reached TRL's loss
    recording.texts = seen_texts

    GRPOTrainer._compute_loss = recording
    yield seen
    GRPOTrainer._compute_loss = original


@pytest.fixture(scope="module")
def uninterrupted(tiny_path, tmp_path_factory, loss_inputs):
    from trl import GRPOTrainer

    out = tmp_path_factory.mktemp("run") / "a"
    loss_inputs.clear()
    texts = GRPOTrainer._compute_loss.texts
    texts.clear()
    summary = train(_recipe(tiny_path), out)
    return out, summary, list(loss_inputs), list(texts)


# -- recipes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_shipped_recipes_are_valid(config):
    cpu = "-cpu" in config.name  # CPU recipes build their own tiny model and run in one process
    needs_user = "user: ???" in config.read_text()  # a simulated user's server is the launcher's to name
    recipe = load_recipe(config, ([] if cpu else ["model.path=preset:qwen2.5-7b"])
                         + (["family_settings.user=openai:user@http://127.0.0.1:8001/v1"] if needs_user else []))  # fmt: skip
    processes = 1 if cpu else 4
    if not cpu:  # GPU recipes choose their micro-batch for the machine (auto): here, 4 x 80 GiB
        from seal_rl.fit import Machine, resolve_micro_batch

        recipe, _ = resolve_micro_batch(recipe, processes=4, num_tasks=400, machine=Machine("cuda", 4, 80.0, "zero3"))
    batch_layout(recipe, processes)
    assert EnvConfig(**recipe.env).protocol == "seal"  # recipes train under the released SEAL code's loop, as the paper did


def test_paper_recipe_layout():
    recipe = load_recipe(ROOT / "configs" / "paper-qwen2.5-7b.yaml", ["model.path=/m", "grpo.per_device_train_batch_size=1"])
    # Micro-batch 1 (SEAL Table 4; the shipped recipe chooses its own, auto): 256 samples per round over 4 GPUs, 8 tasks x 8 rollouts per update.
    assert batch_layout(recipe, 4) == {"steps_per_generation": 64, "gradient_accumulation_steps": 16, "updates_per_round": 4}
    assert recipe.grpo.num_generations == 8 and recipe.grpo.tasks_per_step == 32 and recipe.grpo.beta == 0.001


GPU_RECIPES = [c for c in CONFIGS if "use_vllm: true" in c.read_text() and "-cpu" not in c.name]  # a CPU recipe may use vLLM's CPU build


@pytest.mark.parametrize("config", GPU_RECIPES, ids=lambda p: p.name)
def test_gpu_recipes_set_trl_defaults_that_differ_from_the_paper_on_purpose(config):
    import yaml

    grpo = yaml.safe_load(config.read_text())["grpo"]
    for key in ("vllm_importance_sampling_correction", "use_bias_correction_kl", "weight_decay", "save_total_limit"):
        assert key in grpo, f"{config.name} leaves {key} to a default"
    assert grpo["per_device_train_batch_size"] == "auto" and grpo["save_total_limit"] >= 1  # the largest group-aligned size that fits


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["grpo.num_generations=1"], "need >= 2 rollouts per task"),
        (["grpo.tasks_per_step=5"], "must be a multiple of tasks_per_update"),
        (["grpo.nonsense=1"], "Bad recipe"),
        (["apatch.w_min=0"], "set enabled=False"),
        (["interface.preset=best"], "Unknown interface preset"),
        (["interface.min_count=0"], "interface.min_count must be an integer >= 1 or auto, got 0"),
        (["reward=dense"], "Unknown reward .dense.; choose one of: binary, progress"),
        (["credit=step"], "credit must be one of episode, turn"),
        (["warm_start.sft.bf16=sometimes"], "warm_start.sft.bf16 must be auto, true or false"),
        (["warm_start.sft.shared_prefix=maybe"], "warm_start.sft.shared_prefix must be auto, true or false"),
        (["generator=magic"], "Unknown generator"),
        (["grpo.use_vllm=true", "grpo.vllm_mode=server"], "server mode gathers every rank"),
        (["grpo.use_vllm=true", "grpo.extra.vllm_enable_sleep_mode=true"], "sleep_mode is not supported"),
        (["layout=turns"], "layout must be one of episode, turn"),
        (["silent_updates=never"], "silent_updates must be one of step, skip, got 'never'"),
        (["silent_updates=skip"], r"silent_updates: skip needs grpo.beta: 0 \(got 0.001\): the KL term"),
        (["layout=turn", "turn_samples=3"], "must be at least 1 and divide grpo.per_device_train_batch_size"),
        (["eval.protocol=official"], r"eval.protocol must be one of \['bfcl', 'seal'\]"),
        (["env.call_format=json", "env.prompt_mode=chat_template", "eval.protocol=bfcl"],
         "eval.protocol 'bfcl' cannot play this recipe's env: The bfcl protocol decodes the hermes and pythonic"),
    ],
)
def test_bad_recipes_fail_clearly(overrides, message):
    with pytest.raises(SealError, match=message):
        load_recipe(ROOT / "configs" / "smoke-cpu.yaml", overrides)
    with pytest.raises(SealError, match="leaves model.path unset; give it with --set model.path="):
        load_recipe(ROOT / "configs" / "paper-qwen2.5-7b.yaml")


def test_the_banner_and_plan_say_when_the_seal_interface_can_switch_on():
    from seal_rl.train.recipe import planned_interface

    smoke = ROOT / "configs" / "smoke-cpu.yaml"  # 4 tasks x 2 rollouts a round, a window of 2 rounds
    text, never = planned_interface(load_recipe(smoke), max_turns=2)
    assert ">= 1 turns (min_count auto" in text and "2 round(s) x 8 episodes = 16 episodes" in text and never is None
    paper = planned_interface(load_recipe("seal-full", ["model.path=preset:qwen2.5-7b"]))[0]
    assert ">= 8 turns (min_count auto" in paper and "= 256 episodes" in paper  # auto is the paper's count at its scale
    _, never = planned_interface(load_recipe(smoke, ["interface.min_count=33"]), max_turns=2)  # 16 episodes x 2 turns < 33
    assert "the seal interface can never switch on" in never and "interface.min_count=auto" in never
    assert planned_interface(load_recipe(smoke, ["interface.min_count=32"]), max_turns=2)[1] is None
    assert planned_interface(load_recipe(smoke, ["interface.preset=vanilla"]))[0].startswith("vanilla (fixed")


def test_batch_layout_needs_divisible_batches():
    recipe = load_recipe(ROOT / "configs" / "smoke-cpu.yaml", ["grpo.per_device_train_batch_size=3"])
    with pytest.raises(SealError, match="must be a multiple of per_device_train_batch_size"):
        batch_layout(recipe, 1)


# -- the closed loop --------------------------------------------------------------------------


def test_training_writes_the_run_directory(uninterrupted):
    out, summary, _, _ = uninterrupted
    assert summary["rounds"] == 2 and summary["steps"] == 2 and summary["apatch_hook_calls"] == 2
    for name in ("config.yaml", "metrics.jsonl", "trajectories.jsonl", "profile/step_2.json", "interface/step_2.json",
                 "model/config.json", "checkpoints/checkpoint-1/seal_state.json", "checkpoints/checkpoint-2/optimizer.pt"):  # fmt: skip
        assert (out / name).exists(), name
    metrics = read_metrics(out)  # the per-round lines (TRL's own are kind "trainer")
    assert [m["round"] for m in metrics] == [1, 2]
    for key in ("rollout/success_by_category", "labels/share", "apatch/scale_mean", "apatch/label_weights",
                "interface/active", "time/seconds"):  # fmt: skip
        assert key in metrics[-1]
    assert set(metrics[-1]["time/seconds"]) >= {"generation", "environment", "diagnosis", "apatch", "optimisation"}
    rows = _jsonl(out / "trajectories.jsonl")
    assert len(rows) == 8 and {r["reward"] for r in rows} == {0.0, 1.0}
    state = json.loads((out / "checkpoints" / "checkpoint-2" / "seal_state.json").read_text())
    assert state["round"] == 2 and state["profile"]["rounds"][-1]["round"] == 2


def test_apatch_hook_fires_inside_grpo_and_its_advantages_reach_the_loss(uninterrupted):
    out, _, loss_inputs, _ = uninterrupted
    rows = _jsonl(out / "trajectories.jsonl")
    assert any(abs(r["advantage_before"]) > 0.1 for r in rows)
    assert any(abs(r["apatch_weight"] - 1.0) > 0.05 for r in rows)
    for row in rows:  # advantages after = weight x before, per trajectory; signs never flip
        assert row["advantage_after"] == pytest.approx(row["apatch_weight"] * row["advantage_before"], abs=1e-6)
    for round_index in (1, 2):
        after = sorted(r["advantage_after"] for r in rows if r["round"] == round_index)
        reached = sorted(a for batch in loss_inputs[(round_index - 1) * 2 : round_index * 2] for a in batch)
        assert reached == pytest.approx(after, abs=1e-6)  # what TRL's loss saw is what A-Patch produced


def test_the_loss_covers_exactly_the_assistant_messages_handed_to_trl(uninterrupted):
    """Checked where the samples reach TRL's loss (not only where they are built): the loss-masked
    tokens of each sample decode to that episode's assistant messages, nothing more or less."""
    out, _, _, texts = uninterrupted
    rows = _jsonl(out / "trajectories.jsonl")
    expected = ["".join(m["content"] for m in r["messages"] if m["role"] == "assistant") for r in rows]
    assert sorted(texts) == sorted(expected)


def test_group_advantages_are_group_relative(uninterrupted):
    out, _, _, _ = uninterrupted
    rows = _jsonl(out / "trajectories.jsonl")
    for round_index in (1, 2):
        for task in {r["task_id"] for r in rows}:
            group = [r for r in rows if r["round"] == round_index and r["task_id"] == task]
            rewards = torch.tensor([r["reward"] for r in group])
            expected = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
            assert [r["advantage_before"] for r in group] == pytest.approx(expected.tolist(), abs=1e-4)


def test_the_progress_reward_gives_advantages_where_the_binary_reward_gives_none(tiny_path, tmp_path, loss_inputs):
    """Every episode fails (binary 0), half of them after passing the first of their turns: binary
    GRPO has nothing to learn from; with ``reward: progress`` the groups carry advantages computed
    from the share of turns passed, and those reach TRL's loss."""
    runs = {}
    for reward in ("binary", "progress"):
        loss_inputs.clear()
        out = tmp_path / reward
        train(_recipe(tiny_path, **{"grpo.max_steps": 1, "reward": reward, "generator": "tests.generators:first_turn_or_nothing"}), out)
        runs[reward] = (_jsonl(out / "trajectories.jsonl"), read_metrics(out)[0], [a for batch in loss_inputs for a in batch])
    for reward, (rows, metrics, reached) in runs.items():
        assert [r["reward"] for r in rows] == [0.0] * len(rows) and metrics["rollout/reward"] == reward
        assert metrics["rollout/progress_mean"] == pytest.approx(sum(r["progress"] for r in rows) / len(rows))
        assert metrics["rollout/progress_mean"] > 0
    rows, metrics, reached = runs["binary"]
    assert all(r["advantage_before"] == 0 for r in rows) and metrics["rollout/groups_zero_variance"] == 1.0
    rows, metrics, reached = runs["progress"]
    task_set = TaskSet.load()
    for row in rows:  # even episodes passed the first of the task's scorable turns, odd ones none
        scorable = sum(1 for turn in task_set.get(row["task_id"]).ground_truth if turn)
        assert row["progress"] in (0.0, 1 / scorable)
    assert metrics["rollout/groups_zero_variance"] == 0.0
    for task in {r["task_id"] for r in rows}:
        group = [r for r in rows if r["task_id"] == task]
        progress = torch.tensor([r["progress"] for r in group])
        expected = (progress - progress.mean()) / (progress.std() + 1e-4)
        assert [r["advantage_before"] for r in group] == pytest.approx(expected.tolist(), abs=1e-4)
        assert min(r["advantage_before"] for r in group) < 0 < max(r["advantage_before"] for r in group)
    assert sorted(reached) == pytest.approx(sorted(r["advantage_after"] for r in rows), abs=1e-6)  # what the loss saw


def test_a_round_with_nothing_to_learn_moves_the_weights_under_step_and_leaves_them_under_skip(tiny_path, tmp_path, capsys):
    """Round 1 has signal (the oracle mix: rewards 1 and 0 in every group), round 2 none (every episode
    answers in text: reward 0 everywhere). ``grpo.beta`` 0, so round 2's gradient is exactly 0. Under
    ``silent_updates: step`` (TRL's) AdamW's momentum still moves the weights in round 2; under
    ``skip`` round 1 trains bit for bit as under ``step``, and round 2 leaves the weights and Adam's
    moments as they were."""
    from safetensors.torch import load_file

    runs = {}
    for mode in ("step", "skip"):
        out = tmp_path / mode
        train(_recipe(tiny_path, **{"grpo.beta": 0.0, "silent_updates": mode, "generator": "tests.generators:signal_then_silence"}), out)
        checkpoints = [out / "checkpoints" / f"checkpoint-{n}" for n in (1, 2)]
        runs[mode] = {"weights": [load_file(c / "model.safetensors") for c in checkpoints],
                      "adam": [torch.load(c / "optimizer.pt", weights_only=True)["state"] for c in checkpoints],
                      "metrics": _jsonl(out / "metrics.jsonl"), "said": "".join(capsys.readouterr())}  # fmt: skip
    step, skip = runs["step"], runs["skip"]
    for run in (step, skip):
        rollout = [m for m in run["metrics"] if m["kind"] == "rollout"]
        assert [m["rollout/groups_zero_variance"] for m in rollout] == [0.0, 1.0]  # signal, then none

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)

    assert same(step["weights"][0], skip["weights"][0])  # the round with signal trains alike
    assert not same(step["weights"][0], step["weights"][1])  # step: momentum moves a zero-gradient round
    assert [m["grad_norm"] for m in step["metrics"] if m["kind"] == "trainer" and "grad_norm" in m][-1] == 0.0
    assert same(skip["weights"][0], skip["weights"][1])  # skip: nothing moves
    first, second = skip["adam"]
    assert all(torch.equal(first[i][n], second[i][n]) for i in first for n in ("exp_avg", "exp_avg_sq"))
    assert [m["update/skipped"] for m in skip["metrics"] if m["kind"] == "update"] == [False, True]
    assert [m["update/skipped"] for m in step["metrics"] if m["kind"] == "update"] == [False, False]
    assert "round 2 update: skipped, nothing to learn" in skip["said"] and "skipped" not in step["said"]
    assert "silent_updates skip: a round with nothing to learn" in skip["said"]


def test_skip_refuses_a_loss_term_with_a_gradient_of_its_own(tiny_path, tmp_path):
    with pytest.raises(SealError, match=r"cannot skip .* an entropy bonus is on \(entropy_coef\) has a gradient in every round"):
        train(_recipe(tiny_path, **{"grpo.beta": 0.0, "silent_updates": "skip", "grpo.extra.entropy_coef": 0.01}), tmp_path / "e")
    assert not (tmp_path / "e" / "trajectories.jsonl").exists()  # refused before round 1


def test_nothing_to_learn_reads_the_training_reward_and_under_turn_credit_the_turn_outcomes():
    from seal_rl.train.loop import nothing_to_learn

    def row(group, reward, progress, outcomes):
        return {"group": group, "reward": reward, "progress": progress, "turn_outcomes": outcomes}

    equal = [row("1:a", 0.0, 0.5, [1.0, 0.0]), row("1:a", 0.0, 0.5, [0.0, 1.0]), row("1:b", 1.0, 1.0, [1.0]), row("1:b", 1.0, 1.0, [1.0])]
    assert nothing_to_learn(equal, "binary") and nothing_to_learn(equal, "progress")
    assert not nothing_to_learn(equal, "binary", "turn")  # group a's turn outcomes differ at both turns
    assert nothing_to_learn(equal, "binary", "turn", credit_weight=0.0)
    spread = [*equal, row("1:c", 0.0, 0.0, [0.0]), row("1:c", 0.0, 0.5, [1.0])]
    assert nothing_to_learn(spread, "binary") and not nothing_to_learn(spread, "progress")


def test_resume_continues_exactly(uninterrupted, tiny_path, tmp_path):
    reference, _, _, _ = uninterrupted
    out = tmp_path / "b"
    train(_recipe(tiny_path, **{"grpo.max_steps": 1}), out)
    assert [m["round"] for m in read_metrics(out)] == [1]
    # the checkpoint keeps the seconds so far, and the resumed run counts on from them
    (saved,) = (out / "checkpoints").glob("checkpoint-*/time.json")
    seconds = json.loads(saved.read_text())["time/seconds"]
    assert seconds["generation"] == read_metrics(out)[0]["time/seconds"]["generation"] > 0 and seconds["optimisation"] > 0
    saved.write_text(json.dumps({"time/seconds": {**seconds, "generation": seconds["generation"] + 1e6,  # unmistakable
                                                  "update/policy": seconds["update/policy"] + 1e6}}))
    summary = train(_recipe(tiny_path), out, resume=out)
    assert summary["rounds"] == 2
    assert read_metrics(out)[1]["time/seconds"]["generation"] > 1e6
    assert json.loads((out / "time.json").read_text())["time/seconds"]["generation"] > 1e6
    strip = lambda m: {k: v for k, v in m.items() if k not in ("time/seconds", "rollout/longest_share")}  # noqa: E731  (wall-clock shares)
    assert [strip(m) for m in read_metrics(out)] == [strip(m) for m in read_metrics(reference)]
    # one update line a round: the resumed process books no update for the round its checkpoint ended
    assert [m["round"] for m in read_metrics(out, "update")] == [m["round"] for m in read_metrics(reference, "update")] == [1, 2]
    assert read_metrics(out)[1]["time/seconds"]["update/policy"] > 1e6  # the run's total counts on,
    assert 0 < read_metrics(out, "update")[1]["update/policy/seconds"] < 1e6  # the round's update line books its own
    key = lambda r: (r["round"], r["task_id"], r["advantage_before"], r["reward"])  # noqa: E731
    assert sorted(map(key, _jsonl(out / "trajectories.jsonl"))) == sorted(map(key, _jsonl(reference / "trajectories.jsonl")))
    from safetensors.torch import load_file

    resumed, straight = load_file(out / "model" / "model.safetensors"), load_file(reference / "model" / "model.safetensors")
    assert resumed.keys() == straight.keys()
    # Equal up to float32 rounding (seen: 8e-9); one optimizer step moves weights by ~1e-3.
    assert all(torch.allclose(resumed[k], straight[k], rtol=0, atol=1e-6) for k in resumed)
    initial = load_file(Path(tiny_path) / "model.safetensors")
    assert any(not torch.equal(initial[k], straight[k]) for k in initial)  # training did change the weights


FOUR_TASKS = "[multi_turn_base_105,multi_turn_miss_param_105,multi_turn_base_38,multi_turn_miss_param_38]"


def test_resume_inside_the_second_epoch_replays_it_exactly(tiny_path, tmp_path):
    """4 tasks, 2 per round: rounds 1-2 are epoch 1, rounds 3-4 epoch 2. Stop after round 3, resume."""
    settings = {"data.task_ids": FOUR_TASKS, "grpo.max_steps": 4, "grpo.seed": 0}
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    train(_recipe(tiny_path, **settings), straight)
    train(_recipe(tiny_path, **{**settings, "grpo.max_steps": 3}), broken)
    train(_recipe(tiny_path, **settings), broken, resume=broken)
    record = lambda r: (r["round"], r["task_id"], r["reward"], r["advantage_before"], r["advantage_after"], r["messages"])  # noqa: E731
    expected = [record(r) for r in _jsonl(straight / "trajectories.jsonl")]
    assert [record(r) for r in _jsonl(broken / "trajectories.jsonl")] == expected  # in order, not sorted
    tasks_of = lambda n: {r[1] for r in expected if r[0] == n}  # noqa: E731
    # The resumed round (4) must draw different tasks than epoch 1's second round, or a sampler that
    # replays epoch 1 would go unseen (checked: with seed 0 this test fails on TRL's own sampler).
    assert tasks_of(4) != tasks_of(2)
    from safetensors.torch import load_file

    a, b = load_file(straight / "model" / "model.safetensors"), load_file(broken / "model" / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)


def test_episodes_without_tokens_are_dropped_with_a_reason_not_a_crash(tiny_path, tmp_path):
    from tests.generators import FAILING_TASK

    out = tmp_path / "dropped"
    train(_recipe(tiny_path, **{"grpo.max_steps": 1, "generator": "tests.generators:first_call_fails"}), out)
    rows = _jsonl(out / "trajectories.jsonl")
    dropped = [r for r in rows if r["task_id"] == FAILING_TASK]
    kept = [r for r in rows if r["task_id"] != FAILING_TASK]
    assert dropped and all(r["dropped"] == "generation_error" and r["advantage_after"] == 0 for r in dropped)
    assert kept and all(r["dropped"] is None for r in kept)
    assert sorted(r["reward"] for r in kept) == [0, 1] and all(r["advantage_after"] != 0 for r in kept)  # signal
    (metrics,) = read_metrics(out)
    assert metrics["rollout/dropped"] == {"generation_error": len(dropped)}
    from safetensors.torch import load_file

    before, after = load_file(Path(tiny_path) / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_an_episode_over_the_prompt_budget_becomes_one_masked_token(tiny_path, task_set):
    from transformers import AutoTokenizer

    from seal_rl.env import BfclEnv, EnvConfig
    from seal_rl.generators import SimulatedGenerator
    from seal_rl.rollout import Budgets, run_episodes
    from seal_rl.train import trl_sample
    from seal_rl.trajectory import ChatTokens

    chat = ChatTokens(AutoTokenizer.from_pretrained(tiny_path))
    (rollout,) = run_episodes([(0, task_set.get("multi_turn_base_105"), {})], SimulatedGenerator(0.0), lambda: BfclEnv(EnvConfig()),
                              chat=chat, budgets=Budgets(max_prompt_tokens=16))  # fmt: skip
    sample = trl_sample(rollout, 7)
    assert rollout.record["end_reason"] == "prompt_budget" and rollout.record["dropped"] == "prompt_budget"
    assert sample == {"completion_ids": [7], "env_mask": [0], "logprobs": [0.0], "reward": None, "turns": [-1]}


def test_an_existing_run_is_not_overwritten(uninterrupted, tiny_path):
    out, _, _, _ = uninterrupted
    with pytest.raises(SealError, match="already holds a training run"):
        train(_recipe(tiny_path), out)


def test_the_smoke_recipe_trains_the_tiny_model_on_its_own_generations(tmp_path):
    out = tmp_path / "smoke"
    result = subprocess.run(
        [sys.executable, "-m", "seal_rl", "train", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"),
         "--set", "grpo.max_steps=1", "--set", "interface.min_count=1000", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained 1 rounds" in result.stdout
    assert "interface seal: a component switches on when its label has >= 1000 turns (min_count as set)" in result.stderr  # the banner
    assert "the seal interface can never switch on in this run" in result.stderr  # said at start, not found out later
    rows = _jsonl(out / "trajectories.jsonl")
    assert len(rows) == 8 and all(len(r["labels"]) > 0 for r in rows)


def test_two_processes_split_groups_and_agree(tiny_path, tmp_path):
    out = tmp_path / "ddp"
    port = _free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port,
               "-m", "seal_rl", "train", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"),
               "--out", str(out), "--set", *_overrides(tiny_path, **{"grpo.max_steps": 1, "grpo.per_device_train_batch_size": 1})]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = _jsonl(out / "trajectories.jsonl")
    assert len(rows) == 4  # both ranks' episodes, gathered
    for task in {r["task_id"] for r in rows}:
        group = [r for r in rows if r["task_id"] == task]
        rewards = torch.tensor([r["reward"] for r in group])
        expected = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
        assert [r["advantage_before"] for r in group] == pytest.approx(expected.tolist(), abs=1e-4)
    state = json.loads((out / "checkpoints" / "checkpoint-1" / "seal_state.json").read_text())
    assert sum(r["episodes"] for r in state["profile"]["rounds"]) == 4  # the profile saw every rank


def test_two_processes_skip_a_round_with_nothing_to_learn_together(tiny_path, tmp_path):
    """``silent_updates: skip`` under DDP: every rank decides from the gathered rows, so all skip round 2
    together (no rank left waiting in a gradient all-reduce) and its weights stay as round 1 left them."""
    from safetensors.torch import load_file

    out = tmp_path / "ddp-skip"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", _free_port(),
               "-m", "seal_rl", "train", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"), "--out", str(out),
               "--set", *_overrides(tiny_path, **{"grpo.per_device_train_batch_size": 1, "grpo.beta": 0.0, "silent_updates": "skip",
                                                  "generator": "tests.generators:signal_then_silence"})]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "round 2 update: skipped, nothing to learn" in result.stdout + result.stderr
    first, second, start = (load_file(p / "model.safetensors") for p in
                            (out / "checkpoints" / "checkpoint-1", out / "checkpoints" / "checkpoint-2", tiny_path))  # fmt: skip
    assert all(torch.equal(first[k], second[k]) for k in first) and not all(torch.equal(first[k], start[k]) for k in first)


def _assert_packed(out):
    """Every update of the run forwarded its micro-batches as prefix trees (fewer tokens than its samples hold)."""
    updates = [m for m in _jsonl(out / "metrics.jsonl") if m["kind"] == "update"]
    assert updates and all(0 < u["update/policy/forwarded_tokens"] < u["update/policy/rows_tokens"] for u in updates), updates


def test_fsdp2_on_two_cpu_processes_matches_one_process_and_saves_a_model(uninterrupted, tiny_path, tmp_path):
    """accelerate launch with the shipped FSDP2 CPU config (gloo): same A-Patch advantages and the
    same weights as the single-process run on the same data; the final model/ reloads."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    reference, _, _, _ = uninterrupted
    out = tmp_path / "fsdp"
    port = _free_port()
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "accelerate" / "fsdp-cpu.yaml"),
               "--main_process_port", port, "-m", "seal_rl", "train", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"),
               "--out", str(out), "--set", *_overrides(tiny_path, **{"grpo.per_device_train_batch_size": 2})]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "find_unused_parameters" not in result.stderr  # sharded by FSDP, not replicated by DDP
    _assert_packed(out)
    key = lambda r: (r["round"], r["task_id"], r["reward"], round(r["advantage_before"], 5), round(r["advantage_after"], 5))  # noqa: E731
    assert sorted(map(key, _jsonl(out / "trajectories.jsonl"))) == sorted(map(key, _jsonl(reference / "trajectories.jsonl")))
    assert any(r["advantage_after"] != r["advantage_before"] for r in _jsonl(out / "trajectories.jsonl"))  # A-Patch acted
    sharded, single = load_file(out / "model" / "model.safetensors"), load_file(reference / "model" / "model.safetensors")
    assert sharded.keys() == single.keys()
    assert all(torch.allclose(sharded[k], single[k], rtol=0, atol=1e-5) for k in single)
    initial = load_file(Path(tiny_path) / "model.safetensors")
    assert any(not torch.equal(initial[k], sharded[k]) for k in initial)
    AutoModelForCausalLM.from_pretrained(out / "model")


@pytest.mark.parametrize("scheduler", ["continuous", "lockstep"])
def test_fsdp2_ranks_generate_in_lockstep_with_the_model_itself(tmp_path, scheduler):
    """The transformers generator on sharded weights: every forward pass is a collective, and ranks
    finish their episodes at different times (3 validation tasks over 2 ranks). Without the
    lockstep protocol this run crashes on mismatched collectives (seen: gloo "connection reset");
    under the continuous scheduler the ranks match forward passes, not ``generate`` calls (a
    mismatch hangs)."""
    out = tmp_path / "fsdp-hf"
    port = _free_port()
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "accelerate" / "fsdp-cpu.yaml"),
               "--main_process_port", port, "-m", "seal_rl", "train", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"),
               "--out", str(out), "--set", "grpo.max_steps=1", "grpo.per_device_train_batch_size=2", "eval.every_rounds=1",
               "eval.holdout=3", f"rollout_scheduler={scheduler}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    (rollout,) = [m for m in _jsonl(out / "metrics.jsonl") if m["kind"] == "rollout"]
    assert rollout["rollout/scheduler"] == scheduler and rollout["rollout/tokens"] > 0 and rollout["rollout/occupancy"] > 0
    validations = [m for m in _jsonl(out / "metrics.jsonl") if m["kind"] == "validation"]
    assert [v["round"] for v in validations] == [0, 1] and all(v["validation/episodes"] == 3 for v in validations)
    rows = _jsonl(out / "trajectories.jsonl")
    assert len(rows) == 8 and all(r["messages"] for r in rows)  # both ranks' episodes, generated by the model


def test_a_killed_deepspeed_build_leaves_no_lock_that_hangs_the_next_run(tmp_path, monkeypatch):
    """torch's cpp_extension waits forever on a build directory's ``lock``; a killed build leaves one.
    seal train removes locks older than STALE_BUILD_LOCK_S and leaves a running build's own."""
    import time

    from torch.utils.cpp_extension import _get_build_directory

    from seal_rl.train.run import STALE_BUILD_LOCK_S, clear_stale_build_locks

    for chosen in (True, False):  # $TORCH_EXTENSIONS_DIR/NAME, or the default root's per-Python folder
        if chosen:
            monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
        else:
            monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
            monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # torch's default root follows it
        build = Path(_get_build_directory("deepspeed_shm_comm", verbose=False))  # where torch builds DeepSpeed's op
        assert build.is_relative_to(tmp_path)
        build.mkdir(parents=True, exist_ok=True)
        (build / "lock").touch()
        now = time.time()
        assert clear_stale_build_locks(now=now + STALE_BUILD_LOCK_S / 2) == []  # a build running now
        assert (build / "lock").exists()
        assert clear_stale_build_locks(now=now + STALE_BUILD_LOCK_S + 1) == [build / "lock"]
        assert not (build / "lock").exists()
        other = build.parent / "someone_elses_op"
        other.mkdir(exist_ok=True)
        (other / "lock").touch()
        assert clear_stale_build_locks(now=now + 10 * STALE_BUILD_LOCK_S) == [] and (other / "lock").exists()


def test_deepspeed_zero3_on_two_cpu_processes_matches_one_process_and_saves_a_model(uninterrupted, tiny_path, tmp_path):
    """DeepSpeed ZeRO-3 over gloo (its CPU accelerator) with the shipped CPU config: the same
    advantages and weights as one process, validation generated by the partitioned model itself on
    uneven shards (3 tasks, 2 ranks: lockstep), and a final model/ gathered from every rank that reloads."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    reference, _, _, _ = uninterrupted
    out = tmp_path / "zero3"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "accelerate" / "deepspeed_zero3-cpu.yaml"),
               "--main_process_port", _free_port(), "-m", "seal_rl", "train", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"),
               "--out", str(out), "--set", *_overrides(tiny_path, **{"grpo.per_device_train_batch_size": 2, "eval.every_rounds": 2,
                                                                    "eval.holdout": 3})]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    key = lambda r: (r["round"], r["task_id"], r["reward"], round(r["advantage_before"], 5), round(r["advantage_after"], 5))  # noqa: E731
    assert sorted(map(key, _jsonl(out / "trajectories.jsonl"))) == sorted(map(key, _jsonl(reference / "trajectories.jsonl")))
    validations = [m for m in _jsonl(out / "metrics.jsonl") if m["kind"] == "validation"]
    assert [v["round"] for v in validations] == [0, 2] and all(v["validation/episodes"] == 3 for v in validations)
    _assert_packed(out)
    sharded, single = load_file(out / "model" / "model.safetensors"), load_file(reference / "model" / "model.safetensors")
    assert sharded.keys() == single.keys() and all(sharded[k].shape == single[k].shape for k in single)
    assert all(torch.allclose(sharded[k], single[k], rtol=0, atol=1e-5) for k in single)
    AutoModelForCausalLM.from_pretrained(out / "model")


def test_report_of_a_training_run(uninterrupted):
    from seal_rl.report import write_report

    out, _, _, _ = uninterrupted
    page = write_report(out).read_text()
    for section in ("Success over training", "Failure labels over training", "Interface evolution", "A-Patch weights",
                    "Rewards and scales", "Where the time went", "No validation points"):  # fmt: skip
        assert section in page
    assert page.count('src="data:image/png;base64,') >= 5



def test_default_validation_is_held_out_training_split_never_test(task_set):
    from seal_rl.train import scenario, select_tasks

    test_ids = {t.id for t in task_set.select("test", None, None)}
    # explicit training tasks: validation comes from other scenarios of the training split
    recipe = load_recipe(ROOT / "configs" / "learn-cpu.yaml", ["eval.tasks=[]", "eval.holdout=8"])
    tasks, validation = select_tasks(recipe, task_set)
    assert len(validation) == 8 and not {t.id for t in validation} & test_ids
    assert {t.category for t in validation} == {"base", "miss_func", "miss_param", "long_context"}
    assert not {scenario(t.id) for t in validation} & {scenario(t.id) for t in tasks}
    # training on the whole split: the validation scenarios are taken out of training
    recipe = load_recipe(ROOT / "configs" / "vanilla-grpo.yaml", ["model.path=/m", "eval.every_rounds=1"])
    tasks, validation = select_tasks(recipe, task_set)
    assert len(validation) == 16 and not {t.id for t in validation} & test_ids
    assert not {scenario(t.id) for t in validation} & {scenario(t.id) for t in tasks}
    assert len(tasks) + len({scenario(t.id) for t in validation}) * 4 == 400
    # no validation asked for: nothing held out
    assert select_tasks(load_recipe(ROOT / "configs" / "vanilla-grpo.yaml", ["model.path=/m"]), task_set) == (
        task_set.select("train", None, None), [])


def test_seal_metrics_reach_tensorboard_and_trl_metrics_reach_metrics_jsonl(tiny_path, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    train(_recipe(tiny_path, **{"grpo.report_to": "[tensorboard]"}), out)
    events = EventAccumulator(str(out / "tensorboard"))  # where docs/guides/train.md says, not checkpoints/runs/
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in ("seal/rollout/reward_mean", "seal/rollout/groups_zero_variance", "seal/apatch/scale_mean",
                 "seal/labels/share/pass", "seal/interface/components_on", "loss", "kl"):  # fmt: skip
        assert f"train/{name}" in tags or name.startswith("seal/labels") and any(t.startswith("train/seal/labels/share/") for t in tags), name
    assert [e.value for e in events.Scalars("train/seal/round")] == [1.0, 2.0]
    trainer_lines = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().split("\n")[:-1]) if m["kind"] == "trainer"]
    assert [m["round"] for m in trainer_lines if "loss" in m] == [1, 2]
    assert {"loss", "kl", "entropy", "grad_norm", "frac_reward_zero_std", "completions/mean_length"} <= set(trainer_lines[0])
    err = capsys.readouterr().err
    assert "seal train: recipe" in err and "per round 2 tasks x 2 rollouts = 4 episodes" in err
    assert "round 1: success" in err and "round 2: success" in err and "A-Patch scale" in err
    assert "round 1 update:" in err and "round 2 update:" in err and "policy forward+backward" in err
    spent = json.loads((out / "time.json").read_text())["time/seconds"]
    assert spent["update/policy"] > 0 and spent["update/reference"] > 0  # beta > 0: the reference model runs
    assert "update/old_logprobs" not in spent  # one update per generation: TRL skips them, and so does the line


def test_a_missing_or_unknown_report_to_backend_fails_before_any_model_loads(tiny_path):
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(SealError, match=r"wandb, which is not installed: pip install 'seal-rl\[wandb\]'"):
            _recipe(tiny_path, **{"grpo.report_to": "[wandb]"})
    with pytest.raises(SealError, match="Did you mean tensorboard"):
        _recipe(tiny_path, **{"grpo.report_to": "[tensorbord]"})


def test_update_summary_names_what_was_not_computed_and_why():
    from seal_rl.train import SealRecipe, update_summary

    recipe = SealRecipe()
    recipe.grpo.beta = 0.0
    line = update_summary(3, {"update/policy": 12.4, "update/reference": 0.0, "update/old_logprobs": 2.0}, recipe)
    assert line.startswith("round 3 update: 14 s")
    assert "policy forward+backward 12 s" in line and "old log-probs 2 s" in line
    assert "reference model not computed (grpo.beta 0.0)" in line


def test_tiny_heads_set_the_tiny_models_head_dim_and_vllms_cpu_attention_refuses_16(tmp_path, task_set):
    import json

    from seal_rl.errors import SealError
    from seal_rl.tiny import build_tiny_model
    from seal_rl.train import load_recipe

    smoke = ROOT / "configs" / "smoke-cpu.yaml"
    assert load_recipe(smoke).model.tiny_heads == 4  # the default tiny model keeps head_dim 16
    with pytest.raises(SealError, match=r"head_dim is 16 .* model.tiny_heads=1 model.tiny_kv_heads=1"):
        load_recipe(smoke, ["grpo.use_vllm=true", "generator=vllm"])
    load_recipe(smoke, ["grpo.use_vllm=true", "generator=vllm", "model.tiny_heads=1", "model.tiny_kv_heads=1"])
    with pytest.raises(SealError, match="must divide tiny_hidden_size"):
        load_recipe(smoke, ["model.tiny_heads=3"])
    config = json.loads((build_tiny_model(tmp_path, vocab_size=512, heads=1, kv_heads=1, task_set=task_set) / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 64


# -- the turn layout: one sample per model message ---------------------------------------------


def test_turn_samples_draw_messages_pad_with_masked_copies_and_carry_the_episode_reward(tiny_path):
    from seal_rl.rollout import Rollout
    from seal_rl.train.samples import turn_samples
    from seal_rl.trajectory import Trajectory

    def rollout(messages, reward=1.0, end_reason="completed", checker_error=None):
        trajectory = Trajectory([1, 2, 3])
        trajectory.turns = [([1, 2, 3] + [9] * i, [10 + i, 11 + i], [-0.5, None]) for i in range(messages)]
        trajectory.message_turns = [(2 * i, i // 2) for i in range(messages)]  # two messages per user turn
        record = {"reward": reward, "end_reason": end_reason, "verdict": {"checker_error": checker_error}}
        return Rollout(0, record, trajectory)

    five = turn_samples(rollout(5), 3, 0, seed=7)
    assert five == turn_samples(rollout(5), 3, 0, seed=7) and len(five) == 3  # seeded, reproducible
    drawn = [s["completion_ids"][0] - 10 for s in five]
    assert drawn == sorted(set(drawn)) and all(0 <= i < 5 for i in drawn)  # without replacement, in message order
    assert all(s["prompt_ids"] == [1, 2, 3] + [9] * (s["completion_ids"][0] - 10) for s in five)  # each with its own prompt
    assert all(s["env_mask"] == [1, 1] and s["reward"] == 1.0 and s["logprobs"] == [-0.5, None] for s in five)
    assert all(s["turns"] == [(s["completion_ids"][0] - 10) // 2] * 2 for s in five)  # the user turn each message answers
    two = turn_samples(rollout(2, reward=0.0), 4, 0, seed=7)
    assert [s["env_mask"] for s in two] == [[1, 1], [1, 1], [0, 0], [0, 0]]  # masked copies: no loss, same reward
    assert {s["reward"] for s in two} == {0.0} and two[3]["completion_ids"] == two[1]["completion_ids"]
    none = turn_samples(rollout(0, end_reason="prompt_budget"), 2, 5, seed=7)
    assert [(s["completion_ids"], s["env_mask"], s["reward"]) for s in none] == [([5], [0], None)] * 2
    assert {s["reward"] for s in turn_samples(rollout(3, checker_error="boom"), 2, 0, seed=1)} == {None}


def test_the_turn_layout_trains_each_message_with_its_episodes_advantage(tiny_path, tmp_path, loss_inputs):
    """layout: turn, two samples per episode: every episode's advantage (group-relative, A-Patch
    weighted) reaches TRL's loss once per sample; each sample's loss covers one of the episode's
    messages, prompted by the conversation before it; the round has signal."""
    from trl import GRPOTrainer

    loss_inputs.clear()
    texts = GRPOTrainer._compute_loss.texts
    texts.clear()
    out = tmp_path / "turn"
    train(_recipe(tiny_path, layout="turn", turn_samples=2), out)
    rows = _jsonl(out / "trajectories.jsonl")
    assert len(rows) == 2 * 2 * 2  # 2 rounds x 2 tasks x 2 rollouts: episodes, not samples
    assert any(r["reward"] == 1.0 for r in rows) and any(r["reward"] == 0.0 for r in rows)
    assert any(abs(r["advantage_before"]) > 0.1 for r in rows)
    for round_index in (1, 2):
        after = sorted(a for r in rows if r["round"] == round_index for a in [r["advantage_after"]] * 2)
        reached = sorted(a for batch in loss_inputs[(round_index - 1) * 4 : round_index * 4] for a in batch)
        assert reached == pytest.approx(after, abs=1e-6)
        for task in {r["task_id"] for r in rows}:  # TRL's group: the 2 x 2 samples of a task, each with its episode's reward
            group = [r for r in rows if r["round"] == round_index and r["task_id"] == task]
            rewards = torch.tensor([r["reward"] for r in group for _ in range(2)])
            expected = ((rewards - rewards.mean()) / (rewards.std() + 1e-4))[::2]
            assert [r["advantage_before"] for r in group] == pytest.approx(expected.tolist(), abs=1e-4)
    messages = [m["content"] for r in rows for m in r["messages"] if m["role"] == "assistant"]
    trained = [t for t in texts if t]
    assert trained and all(t in messages for t in trained)  # one whole message each
    expected = sum(min(2, sum(m["role"] == "assistant" for m in r["messages"])) for r in rows)
    assert len(trained) == expected  # messages drawn, masked copies carry no loss


@pytest.mark.parametrize("layout", ["episode", "turn"])
def test_a_shared_prefix_update_equals_trls_own(tiny_path, tmp_path, layout):
    """One optimizer step from the same seed and data through TRL's own log-probability path
    (``shared_prefix: false``) and through the packed prefix tree (``true``): the same advantages, the
    same updated weights; the packed update forwarded fewer tokens than its samples hold."""
    from safetensors.torch import load_file

    extra = {"grpo.max_steps": 1, "grpo.beta": 0.01, **({"layout": "turn", "turn_samples": 2} if layout == "turn" else {})}
    runs = {}
    for sharing in (False, True):
        out = tmp_path / f"shared-{sharing}"
        train(_recipe(tiny_path, shared_prefix=sharing, **extra), out)
        runs[sharing] = out
    key = lambda r: (r["task_id"], r["reward"], round(r["advantage_after"], 6))  # noqa: E731
    assert sorted(map(key, _jsonl(runs[True] / "trajectories.jsonl"))) == sorted(map(key, _jsonl(runs[False] / "trajectories.jsonl")))
    assert any(r["advantage_after"] != 0 for r in _jsonl(runs[True] / "trajectories.jsonl"))
    packed, stock = load_file(runs[True] / "model" / "model.safetensors"), load_file(runs[False] / "model" / "model.safetensors")
    initial = load_file(Path(tiny_path) / "model.safetensors")
    assert any(not torch.equal(initial[k], packed[k]) for k in initial)  # the step moved the weights
    assert all(torch.allclose(packed[k], stock[k], rtol=0, atol=1e-5) for k in stock)
    updates = {s: next(m for m in _jsonl(runs[s] / "metrics.jsonl") if m["kind"] == "update") for s in runs}
    for kind in ("policy", "reference"):
        assert updates[True][f"update/{kind}/forwarded_tokens"] < updates[True][f"update/{kind}/rows_tokens"]
        assert updates[False][f"update/{kind}/forwarded_tokens"] >= updates[False][f"update/{kind}/rows_tokens"]


def test_under_bf16_the_first_steps_importance_ratio_is_1(tiny_path, tmp_path, monkeypatch):
    """bf16 autocast on (float32 master weights), two optimizer steps per round, so TRL computes old
    log-probabilities before the update: on the first step the policy's pass equals them (ratio 1),
    because both passes run in the same precision and pack the same groups."""
    import seal_rl.train.run as run_module
    from seal_rl.train.trainer import make_trainer_class

    calls = []

    def recording_class():
        base = make_trainer_class()

        class Recording(base):
            def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
                out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
                mask = attention_mask[:, -logits_to_keep:].bool()
                rows = [tuple(r[m].tolist()) for r, m in zip(input_ids[:, -logits_to_keep:], mask)]
                calls.append((torch.is_grad_enabled(), self.accelerator.mixed_precision, rows,
                              [x[m].detach().float() for x, m in zip(out[0], mask)]))  # fmt: skip
                return out

        return Recording

    monkeypatch.setattr(run_module, "make_trainer_class", recording_class)
    out = tmp_path / "bf16"
    train(_recipe(tiny_path, **{"grpo.bf16": True, "grpo.tasks_per_update": 1, "grpo.max_steps": 2, "grpo.beta": 0.0}), out)
    old = {row: logps for grad, _, rows, values in calls if not grad for row, logps in zip(rows, values)}
    first_update = next(c for c in calls if c[0])
    assert all(c[1] == "bf16" for c in calls)
    assert len(old) >= 4 and all(row in old for row in first_update[2])
    ratio_error = max((torch.exp(p - old[row]) - 1).abs().max().item() for row, p in zip(first_update[2], first_update[3]))
    assert ratio_error < 1e-6, ratio_error
    second_update = [c for c in calls if c[0]][1]
    assert any(not torch.equal(p, old[row]) for row, p in zip(second_update[2], second_update[3]) if row in old)  # the policy moved
    _assert_packed(out)  # both passes went through the prefix tree
    assert all(u["update/old_logprobs/forwarded_tokens"] < u["update/old_logprobs/rows_tokens"]
               for u in _jsonl(out / "metrics.jsonl") if u["kind"] == "update")


def test_bf16_auto_follows_the_cpus_bfloat16_features():
    from seal_rl.train.recipe import resolve_bf16

    on, said = resolve_bf16("auto", cuda=False, capabilities={"amx_bf16": True, "avx512_bf16": True})
    assert on and "AMX-BF16 and AVX512-BF16" in said and "float32 master weights" in said
    off, said = resolve_bf16("auto", cuda=False, capabilities={"avx2": True})
    assert not off and "neither AMX-BF16 nor AVX512-BF16" in said
    assert resolve_bf16("auto", cuda=True) == (True, "grpo.bf16 auto: on (the GPU supports bfloat16)")
    assert resolve_bf16(False, cuda=False)[0] is False and resolve_bf16(True, cuda=False)[0] is True
    with pytest.raises(SealError, match="grpo.bf16 must be auto, true or false"):
        load_recipe(ROOT / "configs" / "smoke-cpu.yaml", ["grpo.bf16=maybe"])
    with pytest.raises(SealError, match="shared_prefix must be auto, true or false"):
        load_recipe(ROOT / "configs" / "smoke-cpu.yaml", ["shared_prefix=sometimes"])
