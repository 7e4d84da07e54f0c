"""Does training learn? GRPO through SealGRPOTrainer must move probability toward rewarded
completions and away from unrewarded ones — on the real trainer, the tiny model and token-exact
samples, with fixed seeds and a wide margin.

The rollouts are scripted (even episodes play the oracle, reward 1; odd ones answer every turn in
plain text, reward 0), so the test sees real signal in every group without waiting for a model to
generate successes; the on-policy version of this claim is ``configs/learn-cpu.yaml`` and
``benchmarks/bench_learning.py``. Also here: the warm start (SFT) learns its transcripts, and
in-training validation is logged and keeps the best model.
"""

import json
from pathlib import Path

import pytest
import torch

from seal_rl.env import EnvConfig
from seal_rl.rollout import Budgets
from seal_rl.sft import SFTSource, build_samples
from seal_rl.train import load_recipe, read_metrics, train

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["multi_turn_base_100", "multi_turn_base_38"]
PLAIN = "oracle:faults=1,kinds=plain_text"


def _jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _samples(model_dir, task_set):
    from transformers import AutoTokenizer

    tasks = [task_set.get(t) for t in TASKS]
    samples, _ = build_samples([SFTSource("oracle"), SFTSource(PLAIN)], tasks, task_set,
                               AutoTokenizer.from_pretrained(model_dir), EnvConfig(), Budgets(16384, 4096, 128))  # fmt: skip
    return samples


def _token_logprob(model_dir, samples) -> dict[tuple[str, str], float]:
    """Mean log-probability per assistant token of each (task, source) sample."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = {}
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([sample["input_ids"]])
            logits = model(ids).logits[0, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
            mask = torch.tensor(sample["assistant_masks"][1:], dtype=torch.bool)
            out[(sample["task_id"], sample["source"])] = logp[mask].mean().item()
    return out


def _margin(logps: dict[tuple[str, str], float]) -> float:
    """Mean over tasks of log p(rewarded token) − log p(unrewarded token)."""
    return sum(logps[(t, "oracle")] - logps[(t, PLAIN)] for t in TASKS) / len(TASKS)


def _train(tiny_model_dir, out, **extra):
    overrides = {
        "model.path": str(tiny_model_dir), "data.task_ids": "[" + ",".join(TASKS) + "]", "grpo.num_generations": 2,
        "grpo.tasks_per_step": 2, "grpo.tasks_per_update": 2, "grpo.per_device_train_batch_size": 2,
        "grpo.max_steps": 6, "grpo.learning_rate": 3e-3, "grpo.seed": 0, "budgets.max_completion_tokens": 2048,
        "generator": "tests.generators:oracle_or_plain", **extra,
    }  # fmt: skip
    train(load_recipe(ROOT / "configs" / "smoke-cpu.yaml", [f"{k}={v}" for k, v in overrides.items()]), out)
    return out


@pytest.fixture(scope="module")
def learned(tiny_model_dir, tmp_path_factory, task_set):
    """The same GRPO run with A-Patch (our labels: plain-text failures weigh ρ(missing_tool_call) = 1.5)
    and without it; log-probabilities of the rewarded and unrewarded transcripts before and after."""
    root = tmp_path_factory.mktemp("learn")
    validation = {"eval.every_rounds": 3, "eval.tasks": "[" + ",".join(TASKS) + "]", "eval.keep_best": True, "eval.protocol": "bfcl"}
    with_apatch = _train(tiny_model_dir, root / "apatch", **validation)
    without = _train(tiny_model_dir, root / "plain", **{"apatch.enabled": False})
    samples = _samples(tiny_model_dir, task_set)
    before = _token_logprob(tiny_model_dir, samples)
    return with_apatch, before, _token_logprob(with_apatch / "model", samples), _token_logprob(without / "model", samples)


def test_grpo_moves_probability_toward_rewarded_completions(learned):
    out, before, after, _ = learned
    rows = _jsonl(out / "trajectories.jsonl")
    assert {r["reward"] for r in rows} == {0.0, 1.0}  # real signal: every group has a success and a failure
    assert all(abs(r["advantage_after"]) > 0.5 for r in rows)
    # Measured at these seeds: the margin grows by ~3 nats per token; with the advantages' sign
    # flipped it shrinks by as much (see docs/results/learning.md).
    assert _margin(after) - _margin(before) > 1.0, (before, after)
    for task in TASKS:  # and on each task, both ways: rewarded up, unrewarded down
        assert after[(task, "oracle")] > before[(task, "oracle")] + 0.3
        assert after[(task, PLAIN)] < before[(task, PLAIN)] - 0.3


def test_grpo_learns_under_bf16_autocast_with_shared_prefixes(tiny_model_dir, tmp_path, task_set):
    """The same run with CPU bfloat16 autocast (float32 master weights) and shared-prefix updates:
    the margin still grows by the same wide bar."""
    out = _train(tiny_model_dir, tmp_path / "bf16", **{"grpo.bf16": True, "shared_prefix": True})
    samples = _samples(tiny_model_dir, task_set)
    before, after = _token_logprob(tiny_model_dir, samples), _token_logprob(out / "model", samples)
    assert _margin(after) - _margin(before) > 1.0, (before, after)
    updates = [m for m in _jsonl(out / "metrics.jsonl") if m["kind"] == "update"]
    assert updates and all(u["update/policy/forwarded_tokens"] < u["update/policy/rows_tokens"] for u in updates)


def test_apatch_weights_shift_the_update_toward_the_failures_they_weigh_up(learned):
    """A-Patch weighs the failed trajectories 1.5x here: relative to plain GRPO, the update must push
    the failures down more than it pulls the successes up (inverted weights do the opposite)."""
    _, before, with_apatch, without = learned

    def push_down_per_pull_up(after):
        down = sum(before[(t, PLAIN)] - after[(t, PLAIN)] for t in TASKS)
        up = sum(after[(t, "oracle")] - before[(t, "oracle")] for t in TASKS)
        return down / up

    assert push_down_per_pull_up(with_apatch) > push_down_per_pull_up(without) + 0.1, (before, with_apatch, without)


def test_validation_is_logged_greedy_and_keeps_the_best(learned):
    out = learned[0]
    lines = read_metrics(out, "validation")
    assert [v["round"] for v in lines] == [0, 3, 6]  # before training, then every 3 rounds (6 rounds of one step)
    assert [m["round"] for m in read_metrics(out, "rollout")] == [1, 2, 3, 4, 5, 6]
    for line in lines:
        assert line["validation/episodes"] == len(TASKS) and set(line["validation/tasks"]) == set(TASKS)
        low, high = line["validation/average_ci95"]
        assert 0.0 <= low <= line["validation/average"] <= high <= 1.0
        # played under eval.protocol (bfcl), not the training protocol (seal), and kept with Ψ's labels
        assert line["validation/protocol"] == "bfcl"
        records = _jsonl(out / "validation" / f"round_{line['round']}.jsonl")
        assert [r["task_id"] for r in records] == TASKS
        assert {r["reward"] for r in records} <= {0.0, 1.0}
        assert {r["task_id"]: r["reward"] for r in records} == line["validation/tasks"]
        labels = [t["label"] for r in records for t in r["diagnosis"]["labels"]]
        assert line["validation/turns"] == len(labels) == sum(r["num_turns"] for r in records)
        failed = [z for z in labels if z not in ("pass", "correct_abstention")]
        assert sum(line["validation/labels"].values()) == len(failed)
        assert line["validation/turn_pass_rate"] == 1 - len(failed) / len(labels)
        assert 0.0 <= line["validation/call_share"] <= 1.0
        assert line["validation/messages"] == sum(m["role"] == "assistant" for r in records for m in r["messages"])
    best = json.loads((out / "best" / "validation.json").read_text())
    assert best["validation/average"] == max(v["validation/average"] for v in lines)
    assert (out / "best" / "config.json").exists() and (out / "best" / "tokenizer.json").exists()
    config = (out / "config.yaml").read_text()
    assert "multi_turn_base_100" in config and "holdout" in config
    from seal_rl.report import write_report

    page = write_report(out).read_text()
    assert "No validation points" not in page and page.count('src="data:image/png;base64,') >= 6


def test_sft_learns_its_transcripts_and_masks_only_assistant_tokens(tiny_model_dir, task_set, tmp_path):
    from transformers import AutoTokenizer

    from seal_rl.sft import SFTSettings, run_sft

    samples = [s for s in _samples(tiny_model_dir, task_set) if s["source"] == "oracle"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for sample in samples:  # the mask covers exactly the assistant messages and their end-of-message token
        masked = [t for t, m in zip(sample["input_ids"], sample["assistant_masks"], strict=True) if m]
        text = tokenizer.decode(masked)
        assert "<tool_call>" in text and "<|im_end|>" in text and "<tool_response>" not in text and "user" not in text
    settings = SFTSettings(learning_rate=3e-3, max_steps=30, warmup_steps=5, per_device_train_batch_size=2, logging_steps=5)
    model = run_sft(tiny_model_dir, samples, settings, tmp_path / "sft")
    before, after = _token_logprob(tiny_model_dir, samples), _token_logprob(model, samples)
    for key in after:
        assert after[key] > before[key] + 2.0, (before, after)
    log = _jsonl(tmp_path / "sft" / "sft_log.jsonl")
    losses = [line["loss"] for line in log if "loss" in line]
    assert losses[-1] < losses[0] / 3


def test_seal_sft_on_an_eval_run_keeps_only_successful_episodes(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Rejection-sampling fine-tuning through the command line: `seal eval` a faulty oracle, then
    `seal sft --data run:DIR --only-successful`; the output model loads and evaluates."""
    from tests.test_cli import run_cli

    tasks = "multi_turn_base_100,multi_turn_base_38,multi_turn_miss_param_105,multi_turn_long_context_3"
    code, _, err = run_cli(monkeypatch, capsys, "eval", "-p", "oracle:faults=0.5,seed=4", "--tasks", tasks, "--out", str(tmp_path / "run"))
    assert code == 0, err
    rewards = [r["reward"] for r in _jsonl(tmp_path / "run" / "results.jsonl")]
    assert 0 < sum(rewards) < len(rewards)
    code, out, err = run_cli(
        monkeypatch, capsys, "sft", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"), "--set", f"model.path={tiny_model_dir}",
        "--set", "warm_start.sft.max_steps=2", "--set", "budgets.max_completion_tokens=4096", "--data", f"run:{tmp_path / 'run'}", "--only-successful", "--out", str(tmp_path / "sft"),
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads((tmp_path / "sft" / "samples.json").read_text())
    assert summary["samples"] == sum(rewards) and summary["dropped"] == {"unsuccessful": len(rewards) - sum(rewards)}
    assert summary["success_rate"] == 1.0 and "model:" in out
    code, _, err = run_cli(monkeypatch, capsys, "eval", "-p", f"hf:{tmp_path / 'sft' / 'model'}", "--tasks", "multi_turn_base_100",
                           "--max-new-tokens", "8", "--out", str(tmp_path / "eval"))  # fmt: skip
    assert code == 0, err


def test_the_shared_prefix_warm_start_trains_as_trls_own_sft_forwarding_fewer_tokens(tiny_model_dir, task_set, tmp_path):
    """``warm_start.sft.shared_prefix``: one SGD step on micro-batches of 4 transcripts (two sources of
    the same tasks share their prompts) gives TRL's own loss, token accuracy and weight update, up to
    float order, while forwarding fewer tokens; ``false`` forwards every sample whole."""
    from safetensors.torch import load_file

    from seal_rl.sft import SFTSettings, run_sft

    samples = _samples(tiny_model_dir, task_set)
    runs = {}
    for setting in (False, True):
        settings = SFTSettings(learning_rate=0.05, max_steps=2, per_device_train_batch_size=4, logging_steps=1,
                               shared_prefix=setting, extra={"optim": "sgd"})  # fmt: skip
        out = tmp_path / str(setting)
        model = run_sft(tiny_model_dir, samples, settings, out)
        log = [line for line in _jsonl(out / "sft_log.jsonl") if "loss" in line]
        runs[setting] = (load_file(model / "model.safetensors"), log, json.loads((out / "sft.json").read_text()))
    before = load_file(Path(tiny_model_dir) / "model.safetensors")
    (plain, plain_log, plain_summary), (packed, packed_log, packed_summary) = runs[False], runs[True]
    assert plain_summary["tokens"]["forwarded"] >= plain_summary["tokens"]["rows"]  # padded rows, every token
    assert packed_summary["tokens"]["rows"] == plain_summary["tokens"]["rows"]
    assert packed_summary["tokens"]["forwarded"] < 0.8 * packed_summary["tokens"]["rows"]
    for a, b in zip(plain_log, packed_log, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4) and b["mean_token_accuracy"] == pytest.approx(a["mean_token_accuracy"], abs=1e-6)
        assert b["entropy"] == pytest.approx(a["entropy"], rel=1e-4)
    moved = 0.0
    for key in before:
        update_plain, update_packed = plain[key] - before[key], packed[key] - before[key]
        torch.testing.assert_close(update_packed, update_plain, rtol=1e-3, atol=1e-6)
        moved = max(moved, update_plain.abs().max().item())
    assert moved > 1e-3  # the step moved the weights
