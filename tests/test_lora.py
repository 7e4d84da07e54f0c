"""LoRA adapters through SEAL training (``model.lora``, seal_rl/train/lora.py) on the tiny model:
exact at step 0, only adapter tensors move, checkpoints hold the adapter, resume, the merged
``model/`` and one-line refusals."""

import json
from pathlib import Path

import pytest
import torch

from seal_rl.errors import SealError
from seal_rl.train import load_recipe, read_metrics, train
from seal_rl.train import lora
from tests.test_servers import _stats, _train_command, fake_process  # noqa: F401  (a fixture)
from tests.test_train import ROOT, _jsonl, _recipe

LORA = {"model.lora.rank": 4, "grpo.beta": 0.01}


def _logps(model, ids):
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]


def _fresh_peft(path, settings):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), lora.peft_config(settings, base)), base


def test_a_fresh_adapter_is_the_base_model_and_the_merged_weights_leave_the_base_alone(tiny_model_dir):
    model, base = _fresh_peft(tiny_model_dir, lora.LoraSettings(rank=4))
    ids = torch.randint(0, 4096, (1, 40), generator=torch.Generator().manual_seed(0))
    assert torch.equal(_logps(model, ids), _logps(base, ids))  # B = 0: exactly the base model
    with model.disable_adapter():  # TRL's reference for a fresh adapter
        assert lora.adapters_off(model) and torch.equal(_logps(model, ids), _logps(base, ids))
    assert not lora.adapters_off(model)
    with torch.no_grad():  # an adapter that has trained
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = dict(lora.merged_tensors(model))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing merged in place
    assert merged.keys() == dict(base.named_parameters()).keys()  # a tied output head once
    assert not torch.allclose(_logps(model, ids), _logps(base, ids), atol=1e-4)
    base.load_state_dict(merged, strict=False)
    assert torch.allclose(_logps(model, ids), _logps(base, ids), atol=1e-5)  # the merged weights are the adapted model


def test_bad_lora_settings_are_one_line(tiny_model_dir):
    smoke = ROOT / "configs" / "smoke-cpu.yaml"
    for overrides, message in [
        (["model.lora.rank=0"], "model.lora.rank must be a whole number >= 1, got 0"),
        (["model.lora.alpha=-1"], "model.lora.alpha must be > 0"),
        (["model.lora.dropout=1.5"], r"model.lora.dropout must be in \[0, 1\)"),
        (["model.lora.target_modules=[]"], "model.lora.target_modules must be all-linear, a list of module names"),
        (["model.lora.rank=8", "grpo.extra.sync_ref_model=true"], "model.lora with grpo.extra.sync_ref_model"),
    ]:
        with pytest.raises(SealError, match=message):
            load_recipe(smoke, overrides)
    assert load_recipe(smoke).model.lora is None  # off by default: full fine-tuning
    assert load_recipe(smoke, ["model.lora={}"]).model.lora == lora.LoraSettings()
    _, base = _fresh_peft(tiny_model_dir, lora.LoraSettings())
    with pytest.raises(SealError, match=r"matches none of the model's linear layers; they are named down_proj, gate_proj, "
                                        r"k_proj, o_proj, q_proj, up_proj, v_proj \(or use all-linear\)"):  # fmt: skip
        lora.peft_config(lora.LoraSettings(target_modules=["query", "value"]), base)
    assert lora.peft_config(lora.LoraSettings(target_modules=["q_proj", "v_proj"]), base).r == 8
    with pytest.raises(SealError, match="model.lora is not supported under FSDP yet"):
        lora.check_launch({"ACCELERATE_USE_FSDP": "true"})
    with pytest.raises(SealError, match="model.lora is not supported under DeepSpeed yet"):
        lora.check_launch({"ACCELERATE_USE_DEEPSPEED": "true"})


def test_resuming_an_adapter_on_another_base_is_one_line(tiny_model_dir, tmp_path):
    import shutil

    settings = lora.LoraSettings(rank=4)
    lora.record_base(tmp_path, settings, str(tiny_model_dir), resume=False)
    lora.record_base(tmp_path, settings, str(tiny_model_dir), resume=True)  # the same base: fine
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    with pytest.raises(SealError, match="trained its adapter on the base model .* but this resume loads .*other"):
        lora.record_base(tmp_path, settings, str(other), resume=True)
    with pytest.raises(SealError, match="resume with the run's own settings"):
        lora.record_base(tmp_path, lora.LoraSettings(rank=8), str(tiny_model_dir), resume=True)
    with pytest.raises(SealError, match="trains LoRA adapters .* resume it with its model.lora settings"):
        lora.check_resume(tmp_path, None)
    (tmp_path / "full" / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    with pytest.raises(SealError, match="fine-tunes every weight .* resume it without model.lora"):
        lora.check_resume(tmp_path / "full", settings)
    lora.check_resume(tmp_path / "full", None)


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    """Two LoRA rounds with rewards that differ within groups; the trainer's model kept at the save."""
    import seal_rl.train.run as run

    seen = {}
    original = run.save_model

    def keeping(trainer, path):
        model = trainer.accelerator.unwrap_model(trainer.model)
        seen["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        seen["model"] = model
        return original(trainer, path)

    run.save_model = keeping
    try:
        out = tmp_path_factory.mktemp("lora") / "run"
        train(_recipe(tiny_model_dir, **LORA), out)
    finally:
        run.save_model = original
    return out, seen


def test_lora_training_moves_only_the_adapter_and_sees_signal(lora_run, tiny_model_dir):
    from safetensors.torch import load_file

    out, seen = lora_run
    initial = load_file(Path(tiny_model_dir) / "model.safetensors")
    state = seen["state"]
    adapter = {k: v for k, v in state.items() if "lora_" in k}
    assert adapter and any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # the adapters moved
    base = {k.removeprefix("base_model.model.").replace(".base_layer.", "."): v for k, v in state.items() if "lora_" not in k}
    assert base.keys() - initial.keys() <= {"lm_head.weight"}  # tied to the input embeddings: saved once
    assert all(torch.equal(base[k], initial[k]) for k in initial)  # every base weight as it was
    rows = _jsonl(out / "trajectories.jsonl")
    assert len({r["reward"] for r in rows}) > 1 and any(r["advantage_after"] != 0 for r in rows)
    trainer_lines = read_metrics(out, "trainer")
    assert trainer_lines[0]["kl"] == 0  # step 0: the policy is the reference exactly
    assert any(line.get("kl", 0) > 0 for line in trainer_lines[1:])  # then it departs from it
    update = read_metrics(out, "update")[0]
    assert update["update/reference/rows_tokens"] > 0  # the reference pass (adapters off) is booked as one


def test_checkpoints_hold_the_adapter_and_model_is_the_merged_model(lora_run, tiny_model_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out, seen = lora_run
    for checkpoint in (out / "checkpoints").glob("checkpoint-*"):
        saved = load_file(checkpoint / "adapter_model.safetensors")
        assert saved and all("lora_" in k for k in saved)
        assert not list(checkpoint.glob("model*.safetensors")) and (checkpoint / "optimizer.pt").exists()
    recorded = json.loads((out / "lora.json").read_text())
    assert recorded["base_fingerprint"] == lora.base_fingerprint(tiny_model_dir) and recorded["lora"]["rank"] == 4
    assert (out / "model" / "adapter" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out / "model", dtype=torch.float32)  # what hf:RUN/model loads
    ids = torch.randint(0, 4096, (1, 40), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(_logps(merged, ids), _logps(seen["model"], ids), atol=1e-5)
    from seal_rl.policies import parse_policy

    assert parse_policy(f"hf:{out / 'model'}").name == f"hf:{out / 'model'}"  # seal eval --policy hf:RUN/model


def test_seal_merge_writes_a_servable_model_and_refuses_another_base(lora_run, tiny_model_dir, task_set, tmp_path, monkeypatch, capsys):
    """`seal merge RUN --out DIR`: the newest checkpoint's adapter merged into the recorded base is
    the run's final policy (its last checkpoint is its last step); a different base, a directory
    without an adapter and a non-empty --out are one line each."""
    from transformers import AutoModelForCausalLM

    from tests.test_cli import run_cli

    out, seen = lora_run
    code, printed, _ = run_cli(monkeypatch, capsys, "merge", str(out), "--out", str(tmp_path / "merged"))
    assert code == 0 and "checkpoint-" in printed, printed
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    ids = torch.randint(0, 4096, (1, 40), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(_logps(merged, ids), _logps(seen["model"], ids), atol=1e-5)
    assert not torch.allclose(_logps(merged, ids), _logps(AutoModelForCausalLM.from_pretrained(tiny_model_dir), ids), atol=1e-4)
    assert (tmp_path / "merged" / "tokenizer_config.json").exists()

    from seal_rl.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "other", vocab_size=4096, seed=1, task_set=task_set)
    for args, message in [(["--base", str(other)], "is not the base model this adapter was trained on"),
                          ([], "already exists and is not empty")]:  # fmt: skip
        code, _, error = run_cli(monkeypatch, capsys, "merge", str(out), "--out", str(tmp_path / "merged"), *args)
        errors = [line for line in error.splitlines() if line.startswith("error")]
        assert code == 2 and len(errors) == 1 and message in errors[0] and "Traceback" not in error, error
    code, _, error = run_cli(monkeypatch, capsys, "merge", str(tiny_model_dir), "--out", str(tmp_path / "m2"))
    assert code == 2 and "holds no LoRA adapter" in error


def test_a_resumed_lora_run_continues_exactly(lora_run, tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    reference, _ = lora_run
    out = tmp_path / "b"
    train(_recipe(tiny_model_dir, **LORA, **{"grpo.max_steps": 1}), out)
    train(_recipe(tiny_model_dir, **LORA), out, resume=out)
    resumed, straight = (load_file(d / "model" / "adapter" / "adapter_model.safetensors") for d in (out, reference))
    assert resumed.keys() == straight.keys()
    assert all(torch.allclose(resumed[k], straight[k], rtol=0, atol=1e-6) for k in straight)


def test_an_unmatched_target_is_one_line_before_training(tiny_model_dir, tmp_path):
    with pytest.raises(SealError, match="model.lora.target_modules \\['query'\\] matches none of the model's linear layers"):
        train(_recipe(tiny_model_dir, **{"model.lora.target_modules": "[query]"}), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_a_generation_server_gets_the_merged_weights_and_the_base_stays(fake_process, tiny_model_dir, tmp_path):
    """``generator: server`` with LoRA against the fake server (tests/test_servers.py): the served-model
    check passes, and the weights pushed before round 2 are the base with checkpoint-1's adapter merged
    in (the trainer's base weights untouched: every later sync starts from them)."""
    import os
    import subprocess

    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    url = fake_process()
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    command = _train_command(out, url, tiny_model_dir, "model.lora.rank=4", "grpo.learning_rate=1e-2", "grpo.beta=0",
                              "grpo.extra.entropy_coef=0.1")  # all rewards 0 here: the entropy bonus moves the adapter
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "served log-probabilities within" in result.stderr
    assert _stats(url)["reloads"] == ["seal_reload_weights"] * 2
    pushed = load_file(out / "server_weights" / "v2" / "model.safetensors")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    after_1 = dict(lora.merged_tensors(PeftModel.from_pretrained(base, out / "checkpoints" / "checkpoint-1")))
    initial = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert set(initial) <= set(pushed) <= set(after_1)
    assert all(torch.allclose(pushed[k], after_1[k], rtol=0, atol=1e-6) for k in pushed)
    assert any(not torch.equal(pushed[k], initial[k]) for k in initial)  # the update reached the server


def test_a_lora_warm_start_trains_the_adapter_that_rl_goes_on_with(tiny_model_dir, tmp_path):
    """``model.lora`` with a warm start: SFT trains the adapter (``warm_start/model`` merged,
    ``warm_start/model/adapter`` alone), RL loads it on the base model and starts exactly where SFT
    ended (its first KL against the warm-started adapter is 0), and only adapter tensors are saved."""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    sets = {**LORA, "grpo.max_steps": 1, "warm_start.data": "[{source: oracle}]", "warm_start.sft.max_steps": 3,
            "warm_start.sft.learning_rate": 1e-2}  # fmt: skip
    train(_recipe(tiny_model_dir, **sets), out)
    warm = out / "warm_start" / "model"
    sft_adapter = load_file(warm / "adapter" / "adapter_model.safetensors")
    assert sft_adapter and all("lora_" in k for k in sft_adapter)
    assert any(v.abs().sum() > 0 for k, v in sft_adapter.items() if "lora_B" in k)  # SFT moved the adapter
    assert json.loads((out / "lora.json").read_text())["base"] == str(tiny_model_dir)  # RL's base: the base model
    assert read_metrics(out, "trainer")[0]["kl"] == 0  # the reference is the warm-started adapter
    rl_adapter = load_file(out / "model" / "adapter" / "adapter_model.safetensors")
    assert rl_adapter.keys() == sft_adapter.keys()  # the same adapter, trained on (TRL's frozen "ref" copy not saved)
    saved = load_file(out / "checkpoints" / "checkpoint-1" / "adapter_model.safetensors")
    assert saved and all("lora_" in k for k in saved)


@pytest.mark.slow
def test_lora_on_two_data_parallel_processes_trains_and_saves(tiny_model_dir, tmp_path):
    """``torchrun --nproc_per_node 2`` (DDP on gloo): the adapters' gradients are all-reduced, rank 0
    saves the merged model and the adapter, checkpoints hold the adapter."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from tests.test_train import _free_port, _overrides

    out = tmp_path / "ddp"
    sets = _overrides(tiny_model_dir, **{**LORA, "grpo.per_device_train_batch_size": 1})
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", _free_port(),
               "-m", "seal_rl", "train", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"), "--out", str(out), "--set", *sets]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    adapter = load_file(out / "model" / "adapter" / "adapter_model.safetensors")
    assert adapter and any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)
    assert all("lora_" in k for k in load_file(out / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors"))
    assert len(_jsonl(out / "trajectories.jsonl")) == 8  # both ranks' episodes, 2 rounds
