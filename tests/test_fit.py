"""seal_rl.fit: `seal train` checks the recipe against this machine's memory before it loads
anything, refuses in one line naming the fix, and --force overrides."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seal_rl import fit
from seal_rl.errors import SealError
from seal_rl.fit import Machine, check_before_training, check_fit, host_available_bytes, recipe_shape
from seal_rl.plan import GiB, model_shape
from seal_rl.train import load_recipe

from .test_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "configs" / "smoke-cpu.yaml")
PAPER = str(ROOT / "configs" / "paper-qwen2.5-7b.yaml")
CHECKPOINTING = "model.gradient_checkpointing=true"

# config.json of HuggingFaceTB/SmolLM2-135M-Instruct (what an OOM-killed real run trained)
SMOLLM2_135M = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "hidden_size": 576,
    "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
    "tie_word_embeddings": True, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
}  # fmt: skip


@pytest.fixture
def smollm2(tmp_path) -> str:
    """A model directory with SmolLM2-135M's config.json and nothing else: the check needs no weights."""
    directory = tmp_path / "smollm2"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(SMOLLM2_135M))
    return str(directory)


def test_smollm2_on_the_smoke_recipe_needs_checkpointing_on_a_24_gib_machine(smollm2):
    """A real round without checkpointing was OOM-killed at 23.6 GB; with it, the round completed."""
    machine = Machine.cpu(24.0)
    without = check_fit(load_recipe(SMOKE, [f"model.path={smollm2}"]), machine, num_tasks=4)
    assert not without.fits and without.remedy == (CHECKPOINTING,)
    # dtype auto: the checkpoint's bfloat16 where this CPU computes it natively, float32 elsewhere (precision.training_dtype)
    from seal_rl.precision import native_bf16

    assert without.plan.precision.weight_bytes == (2 if native_bf16()[0] else 4)
    message = without.refusal()
    assert len(message.splitlines()) == 1
    assert f"--set {CHECKPOINTING} would make it fit" in message and "--force" in message
    with_checkpointing = check_fit(load_recipe(SMOKE, [f"model.path={smollm2}", CHECKPOINTING]), machine, num_tasks=4)
    assert with_checkpointing.fits and with_checkpointing.plan.training_bytes == without.remedy_bytes


def test_vllm_on_a_cpu_takes_its_weights_and_kv_cache_space_not_a_share_of_the_ram(smollm2, monkeypatch):
    """The CPU build sizes its KV cache by VLLM_CPU_KVCACHE_SPACE (seal-rl sets 2 GiB), so the
    check reserves weights + overhead + that, not vllm_gpu_memory_utilization x RAM."""
    recipe = load_recipe(SMOKE, [f"model.path={smollm2}", CHECKPOINTING, "grpo.use_vllm=true", "generator=vllm"])
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    vllm = check_fit(recipe, Machine.cpu(24.0), num_tasks=4).plan.vllm
    assert vllm.kv_cache == 2 * GiB and vllm.budget == vllm.weights + vllm.overhead + 2 * GiB
    assert vllm.budget < recipe.grpo.vllm_gpu_memory_utilization * 24 * GiB
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "5")
    assert check_fit(recipe, Machine.cpu(24.0), num_tasks=4).plan.vllm.kv_cache == 5 * GiB
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "lots")
    with pytest.raises(SealError, match="VLLM_CPU_KVCACHE_SPACE must be a number of GiB"):
        check_fit(recipe, Machine.cpu(24.0), num_tasks=4)
    gpu = check_fit(recipe, Machine("cuda", 1, 80.0, "ddp", "1 GPU"), num_tasks=4).plan.vllm
    assert gpu.budget == int(recipe.grpo.vllm_gpu_memory_utilization * 80 * GiB)  # a GPU: the share, as before


@pytest.mark.parametrize("recipe", ["smoke-cpu", "learn-cpu", "demo-cpu"])
def test_the_shipped_cpu_recipes_on_tiny_models_fit_a_small_machine(recipe):
    assert check_fit(load_recipe(recipe), Machine.cpu(8.0)).fits


def test_the_tiny_shape_is_the_model_seal_train_builds(tiny_model_dir):
    """tiny_model_dir is built with vocabulary 4096, hidden 64 and 2 layers, as this recipe says."""
    recipe = load_recipe(SMOKE, ["model.tiny_vocab_size=4096", "model.tiny_hidden_size=64", "model.tiny_layers=2"])
    planned, built = recipe_shape(recipe), model_shape(str(tiny_model_dir))
    assert planned.parameters >= built.parameters
    assert planned.parameters == pytest.approx(built.parameters, rel=0.01)
    assert (planned.num_layers, planned.hidden_size, planned.dtype) == (built.num_layers, built.hidden_size, "float32")


def test_on_cpu_the_processes_share_the_hosts_memory_and_its_free_ram_is_read():
    shared = Machine.cpu(24.0, processes=2, strategy="fsdp")
    assert shared.memory_gib == 12.0 and shared.assumptions.overhead_gib == fit.CPU_OVERHEAD_GIB
    import psutil

    assert 0 < host_available_bytes() <= psutil.virtual_memory().total


def test_bf16_on_cpu_is_autocast_not_deepspeed_mixed_precision(smollm2):
    recipe = load_recipe(SMOKE, [f"model.path={smollm2}", "model.dtype=float32", "grpo.bf16=true"])
    precision = check_fit(recipe, Machine.cpu(64.0), num_tasks=4).plan.precision
    assert (precision.weight_bytes, precision.grad_bytes, precision.optimizer_bytes, precision.activation_bytes) == (4, 4, 8, 2)


def test_on_gpus_the_plan_is_printed_and_a_run_that_cannot_fit_is_refused_unless_forced(smollm2):
    from seal_rl.errors import SealWarning

    recipe = load_recipe(SMOKE, [f"model.path={smollm2}"])
    said: list[str] = []
    fitting = check_before_training(recipe, processes=1, num_tasks=4, machine=Machine("cuda", 1, 80.0, "ddp", "1 x H100"), say=said.append)
    assert fitting.fits and len(said) == 1 and "1 GPU(s) x 80 GiB" in said[0] and said[0].splitlines()[-1].startswith("fits (")
    small = Machine("cuda", 1, 24.0, "ddp", "1 x L4 (24.0 GiB)")
    with pytest.raises(SealError, match=r"1 x L4 .* --set model\.gradient_checkpointing=true would make it fit .* --force"):
        check_before_training(recipe, processes=1, num_tasks=4, machine=small, say=said.append)
    with pytest.warns(SealWarning, match=r"Starting anyway \(--force\)"):
        forced = check_before_training(recipe, processes=1, num_tasks=4, machine=small, say=said.append, force=True)
    assert not forced.fits and len(said) == 1  # a refused or forced run prints no plan, only the one line


def _stop(*args, **kwargs):
    raise SealError("stopped here by the test")


def test_seal_train_refuses_in_one_line_before_writing_or_loading_anything(monkeypatch, capsys, tmp_path, smollm2):
    monkeypatch.setattr(fit, "this_machine", lambda processes, environ=None: Machine.cpu(24.0, processes))
    monkeypatch.setattr("seal_rl.train.run._prepare_model", _stop)
    code, out, err = run_cli(monkeypatch, capsys, "train", "--config", SMOKE, "--set", f"model.path={smollm2}", "--out", str(tmp_path / "run"))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "does not fit on this machine" in err and f"--set {CHECKPOINTING} would make it fit" in err and "--force" in err
    assert "stopped here" not in err and not (tmp_path / "run").exists()


def test_seal_train_force_and_a_fitting_recipe_go_on_to_the_model(monkeypatch, capsys, tmp_path, smollm2):
    monkeypatch.setattr(fit, "this_machine", lambda processes, environ=None: Machine.cpu(24.0, processes))
    monkeypatch.setattr("seal_rl.train.run._prepare_model", _stop)
    base = ["train", "--config", SMOKE, "--set", f"model.path={smollm2}"]
    code, _, err = run_cli(monkeypatch, capsys, *base, "--force", "--out", str(tmp_path / "forced"))
    assert code == 2 and "Starting anyway (--force)" in err and "stopped here by the test" in err
    code, _, err = run_cli(monkeypatch, capsys, *base, "--set", CHECKPOINTING, "--out", str(tmp_path / "checkpointed"))
    assert code == 2 and "stopped here by the test" in err
    assert re.search(r"memory \(seal plan's estimate\): \d+\.\d GiB needed per process", err) and ": fits" in err


def test_seal_train_prints_the_fit_and_the_budget_count_at_start(monkeypatch, capsys, tmp_path):
    """The smoke recipe on its tiny model: the check passes, the model is built, and the count says
    that no ground truth fits its 24-token messages and 192-token completions (it is not meant to learn)."""
    monkeypatch.setattr("seal_rl.train.run.make_trainer_class", _stop)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", SMOKE, "--out", str(tmp_path / "run"))
    assert code == 2 and "stopped here" in err
    fits = err.index("memory (seal plan's estimate)")
    counted = err.index("ground truths within budgets: base 0/1, miss_func 0/1, miss_param 0/1, long_context 0/1 — ")
    assert fits < counted


def test_the_real_smollm2_by_name_is_refused_without_checkpointing(monkeypatch, capsys, tmp_path, smollm2_dir):
    """The issue's command with the pulled model's name (not a directory): refused before any rollout."""
    monkeypatch.setattr(fit, "this_machine", lambda processes, environ=None: Machine.cpu(24.0, processes))
    monkeypatch.setattr("seal_rl.train.run._prepare_model", _stop)
    code, out, err = run_cli(monkeypatch, capsys, "train", "--config", SMOKE, "--set", "model.path=smollm2-135m-instruct",
                             "--set", "grpo.max_steps=1", "--out", str(tmp_path / "run"))  # fmt: skip
    assert code == 2 and "does not fit on this machine" in err and "stopped here" not in err
    assert recipe_shape(load_recipe(SMOKE, ["model.path=smollm2-135m-instruct"])) == model_shape(smollm2_dir)


def test_auto_micro_batch_is_chosen_for_the_machine_and_an_explicit_one_is_kept():
    from seal_rl.fit import resolve_micro_batch
    from seal_rl.plan.micro_batch import group_aligned_sizes

    recipe = load_recipe("smoke-cpu", ["grpo.per_device_train_batch_size=auto"])
    roomy, said = resolve_micro_batch(recipe, processes=1, num_tasks=2, machine=Machine.cpu(24.0))
    assert roomy.grpo.per_device_train_batch_size == group_aligned_sizes(recipe, 1)[0]  # the tiny model fits any size
    assert said.startswith(f"micro-batch: auto -> {roomy.grpo.per_device_train_batch_size} ") and "CPU, 24.0 GiB" in said
    cramped, said = resolve_micro_batch(recipe, processes=1, num_tasks=2, machine=Machine.cpu(0.5))
    assert cramped.grpo.per_device_train_batch_size == group_aligned_sizes(recipe, 1)[-1] and "none fits" in said
    explicit = load_recipe("smoke-cpu", ["grpo.per_device_train_batch_size=2"])
    assert resolve_micro_batch(explicit, processes=1, num_tasks=2, machine=Machine.cpu(24.0)) == (explicit, "")


def test_auto_without_an_estimate_takes_one_group(tmp_path):
    from seal_rl.fit import resolve_micro_batch

    recipe = load_recipe("smoke-cpu", ["grpo.per_device_train_batch_size=auto", f"model.path={tmp_path}"])  # no config.json
    chosen, said = resolve_micro_batch(recipe, processes=1, num_tasks=2, machine=Machine.cpu(24.0))
    assert chosen.grpo.per_device_train_batch_size == recipe.grpo.num_generations and "no memory estimate" in said
