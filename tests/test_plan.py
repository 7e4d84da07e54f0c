"""seal plan: parameter counts, ZeRO formulas, activations and KV arithmetic against published or
measured numbers (never against the planner's own output), and the command's exit codes."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, GptOssConfig, LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

from seal_rl.errors import SealError
from seal_rl.plan import (
    PRESETS,
    Assumptions,
    Precision,
    backbone_activation_bytes,
    estimate,
    forward_flops_per_token,
    kv_cache_bytes_per_token,
    model_shape,
    model_states,
    shape_from_config,
)
from seal_rl.train import load_recipe

from .test_cli import run_cli

PAPER = "configs/paper-qwen2.5-7b.yaml"
PAPER_SETTINGS = ["model.path=preset:qwen2.5-7b", "grpo.per_device_train_batch_size=1"]


# -- model shapes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "published"),
    [
        ("qwen2.5-7b", 7.62e9),  # model card: 7.61B (7,615,616,512 rounds to 7.62B)
        ("qwen2.5-3b", 3.09e9),
        ("qwen2.5-0.5b", 0.494e9),  # 0.49B
        ("llama3.1-8b", 8.03e9),
        ("qwen3-8b", 8.19e9),  # model card: 8.2B (8,190,735,360)
        ("gpt-oss-20b", 20.91e9),  # model card: 21B total (Table 1: 20.91B)
    ],
)
def test_preset_parameter_counts_match_the_published_sizes(preset, published):
    assert PRESETS[preset].parameters == pytest.approx(published, rel=0.01)


# config.json of openai/gpt-oss-20b (the entries a shape reads, as published)
GPT_OSS_20B_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
    "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088,
    "tie_word_embeddings": False, "attention_bias": True, "max_position_embeddings": 131072, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]},
}  # fmt: skip


def test_gpt_oss_20b_counts_its_published_total_and_active_parameters():
    """Model card (OpenAI 2025, Table 1): 20.91B total, 3.61B active per token, counting the
    unembedding but not the embedding; the hub's total is 20,914,757,184."""
    shape = PRESETS["gpt-oss-20b"]
    assert shape.parameters == 20_914_757_184
    assert shape.matmul_parameters == pytest.approx(3.61e9, rel=0.01)
    assert shape.active_parameters == shape.matmul_parameters + 201088 * 2880
    flops = forward_flops_per_token(shape, 16384)  # compute follows the active parameters, memory the total
    assert 2 * shape.matmul_parameters < flops < 2 * shape.matmul_parameters + 2 * 24 * 16384 * shape.q_dim


@pytest.mark.parametrize("preset", [name for name, shape in PRESETS.items() if shape.num_experts == 1])
def test_a_dense_model_has_every_parameter_active(preset):
    shape = PRESETS[preset]
    assert shape.active_parameters == shape.parameters and shape.sliding_layers == 0


def test_shape_from_a_gpt_oss_config_is_the_preset():
    assert shape_from_config(GPT_OSS_20B_CONFIG) == PRESETS["gpt-oss-20b"]
    without = {k: v for k, v in GPT_OSS_20B_CONFIG.items() if k != "num_experts_per_tok"}
    assert shape_from_config(without).experts_per_token == 4  # the older key, experts_per_token
    with pytest.raises(SealError, match="dense layers"):
        shape_from_config({"model_type": "qwen3_moe", "mlp_only_layers": [0]})


def _family_configs(seed: int) -> list:
    """Tiny Qwen3, Qwen3-MoE and gpt-oss configs (q/k norms; experts with and without biases, routers, sinks)."""
    rng = random.Random(seed)
    common = dict(hidden_size=16, num_hidden_layers=rng.randint(1, 3), num_attention_heads=4, num_key_value_heads=2,
                  head_dim=rng.choice([4, 8]), vocab_size=rng.randint(50, 400), tie_word_embeddings=rng.random() < 0.5)  # fmt: skip
    experts = dict(num_experts_per_tok=rng.randint(1, 3))
    return [
        Qwen3Config(intermediate_size=rng.randint(20, 90), attention_bias=rng.random() < 0.5, **common),
        Qwen3MoeConfig(moe_intermediate_size=rng.randint(8, 40), num_experts=rng.randint(3, 6), **experts, **common),
        GptOssConfig(intermediate_size=rng.randint(8, 40), num_local_experts=rng.randint(3, 6), **experts, **common),
    ]


@pytest.mark.parametrize("seed", range(2))
def test_model_shape_of_a_qwen3_or_moe_directory_counts_what_transformers_builds(tmp_path, seed):
    for i, config in enumerate(_family_configs(seed)):
        config.save_pretrained(tmp_path / str(i))
        built = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        shape = model_shape(str(tmp_path / str(i)))
        assert shape.parameters == built, config.model_type
        assert shape.num_experts == getattr(config, "num_local_experts", getattr(config, "num_experts", 1)), config.model_type


def _random_configs(seed: int) -> list:
    rng = random.Random(seed)
    heads = rng.choice([2, 4, 6])
    kv = rng.choice([d for d in (1, 2, 3, 6) if heads % d == 0])
    common = dict(num_hidden_layers=rng.randint(1, 3), num_attention_heads=heads, num_key_value_heads=kv,
                  intermediate_size=rng.randint(20, 90), vocab_size=rng.randint(50, 400),
                  tie_word_embeddings=rng.random() < 0.5)  # fmt: skip
    hidden = heads * rng.choice([4, 8])
    return [
        Qwen2Config(hidden_size=hidden, **common),
        LlamaConfig(hidden_size=hidden, head_dim=rng.choice([4, 8, 12]), attention_bias=rng.random() < 0.5,
                    mlp_bias=rng.random() < 0.5, **common),  # fmt: skip
    ]


@pytest.mark.parametrize("seed", range(4))
def test_model_shape_of_a_directory_counts_what_transformers_builds(tmp_path, seed):
    for i, config in enumerate(_random_configs(seed)):
        directory = tmp_path / str(i)
        config.save_pretrained(directory)
        model = AutoModelForCausalLM.from_config(config)
        built = sum(p.numel() for p in model.parameters())  # tied weights are one parameter
        assert model_shape(str(directory)).parameters == built, config.model_type


def test_model_shape_errors_name_the_fix(tmp_path):
    with pytest.raises(SealError, match="known presets: qwen2.5-7b"):
        model_shape("preset:gpt-5")
    with pytest.raises(SealError, match="config.json does not exist"):
        model_shape(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(SealError, match="not supported"):
        model_shape(str(tmp_path))


# -- ZeRO (Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, N = 64, K = 12) -------------------------


@pytest.mark.parametrize(
    ("strategy", "published_gb"),
    [("ddp", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9), ("fsdp", 1.9)],
)
def test_zero_formulas_reproduce_figure_1_of_the_zero_paper(strategy, published_gb):
    mixed_adam = Precision("mixed", weight_bytes=2, grad_bytes=2, optimizer_bytes=12, activation_bytes=2)
    states = model_states(7_500_000_000, 64, strategy, mixed_adam)
    assert round(states.total / 1e9, 1) == published_gb


def test_a_bf16_recipe_uses_mixed_precision_adam_with_k_12():
    recipe = load_recipe(PAPER, PAPER_SETTINGS)
    plan = estimate(recipe, gpus=4, gpu_memory_gb=80, num_tasks=400)
    assert (plan.precision.weight_bytes, plan.precision.grad_bytes, plan.precision.optimizer_bytes) == (2, 2, 12)


# -- activations: measured on a real model ------------------------------------------------------


def _saved_bytes(run, exclude: set[int]) -> int:
    """Bytes autograd keeps for backward while ``run()`` runs (each storage once)."""
    storages: dict[int, int] = {}

    def pack(tensor):
        storages.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(n for ptr, n in storages.items() if ptr not in exclude)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seed", range(2))
def test_activation_bytes_match_what_autograd_saves(tmp_path, dtype, seed):
    """SDPA on CPU runs a flash-attention kernel: it keeps q, k, v, the output and the log-sum-exp,
    as flash attention does on a GPU."""
    torch.manual_seed(seed)
    for i, config in enumerate(_random_configs(seed)):
        config.save_pretrained(tmp_path / str(i))
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).train()
        sequences, length = 2, 24 + 8 * seed
        ids = torch.randint(0, config.vocab_size, (sequences, length))
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        measured = _saved_bytes(lambda: model.model(input_ids=ids), weights)
        a = torch.finfo(dtype).bits // 8
        estimated = backbone_activation_bytes(model_shape(str(tmp_path / str(i))), sequences, length, a, checkpointing=False)
        assert estimated == pytest.approx(measured, rel=0.01), config.model_type


# -- vLLM KV cache ----------------------------------------------------------------------------


def test_kv_cache_bytes_per_token_follow_vllms_arithmetic():
    assert kv_cache_bytes_per_token(PRESETS["llama3.1-8b"]) == 128 * 1024  # 32 layers x 8 kv heads x 128 x 2 x 2
    assert kv_cache_bytes_per_token(PRESETS["qwen2.5-7b"]) == 56 * 1024  # 28 layers x 4 kv heads x 128 x 2 x 2


def test_vllm_refuses_to_start_without_room_for_one_sequence_and_tensor_parallel_helps():
    """0.2 x 80 GiB = 16 GiB holds the 7.6B weights (14.2 GiB) and little else."""
    settings = [*PAPER_SETTINGS, "grpo.vllm_gpu_memory_utilization=0.2"]
    plan = estimate(load_recipe(PAPER, settings), gpus=4, gpu_memory_gb=80, num_tasks=400)
    assert plan.vllm.max_model_len == 8192 + 4096 and not plan.vllm.starts
    assert not plan.fits and "vLLM will not start" in plan.reason
    plan = estimate(load_recipe(PAPER, [*settings, "grpo.vllm_tensor_parallel_size=2"]), gpus=4, gpu_memory_gb=80, num_tasks=400)
    assert plan.vllm.weights == pytest.approx(2 * PRESETS["qwen2.5-7b"].parameters / 2, abs=2)
    assert plan.vllm.starts and plan.fits, plan.reason


def test_budgets_beyond_the_models_context_are_refused():
    settings = [*PAPER_SETTINGS, "budgets.max_prompt_tokens=30000"]
    plan = estimate(load_recipe(PAPER, settings), gpus=4, gpu_memory_gb=80, num_tasks=400)
    assert not plan.fits and "exceed the model's context length (32,768)" in plan.reason


# -- the whole plan -----------------------------------------------------------------------------


def test_the_paper_run_has_72_rounds_of_4_updates():
    plan = estimate(load_recipe(PAPER, PAPER_SETTINGS), gpus=4, gpu_memory_gb=80)
    assert (plan.num_tasks, plan.rounds, plan.steps) == (400, 72, 288)  # SEAL §6: 6 epochs x 12 steps, 4 updates each
    assert plan.episodes == 256 and plan.trained_tokens == 256 * (8192 + 4096)


def test_sharding_more_never_needs_more_memory_per_gpu():
    recipe = load_recipe(PAPER, PAPER_SETTINGS)
    totals = [estimate(recipe, gpus=4, gpu_memory_gb=80, strategy=s, num_tasks=400).training_bytes
              for s in ("ddp", "zero1", "zero2", "zero3")]  # fmt: skip
    assert totals == sorted(totals, reverse=True) and totals[0] > totals[-1]
    per_gpu = [estimate(recipe, gpus=n, gpu_memory_gb=80, num_tasks=400).training_bytes for n in (1, 2, 4, 8)]
    assert per_gpu == sorted(per_gpu, reverse=True)


def test_checkpointing_and_micro_batch_move_activations_the_right_way():
    def activations(*settings):
        plan = estimate(load_recipe(PAPER, [*PAPER_SETTINGS, *settings]), gpus=4, gpu_memory_gb=80, num_tasks=400)
        return next(line.bytes for line in plan.memory if line.name.startswith("activations"))

    base = activations()
    assert activations("model.gradient_checkpointing=false") > 5 * base
    assert activations("grpo.per_device_train_batch_size=2", "shared_prefix=false") == pytest.approx(2 * base, rel=0.01)
    # sharing the prompt: two samples of a group forward 8192 + 2 x 4096 tokens, not 2 x 12288
    assert activations("grpo.per_device_train_batch_size=2") == pytest.approx(base * 16384 / 12288, rel=0.01)


def test_the_plan_counts_what_shared_prefixes_save():
    """Per micro-batch: a group's prompt once and each episode's path once (turn layout: an episode's
    samples lie on one path); the time estimate follows the forwarded tokens; micro-batch 1 saves nothing."""
    from seal_rl.plan.memory import micro_batch_tokens

    def recipe(*settings):
        return load_recipe(PAPER, [*PAPER_SETTINGS, "grpo.per_device_train_batch_size=8", *settings])

    episode = micro_batch_tokens(recipe())
    assert (episode.held, episode.forwarded, episode.prompts, episode.paths) == (8 * 12288, 8192 + 8 * 4096, 1, 8)
    turn = micro_batch_tokens(recipe("layout=turn", "turn_samples=4"))  # 8 samples = 2 episodes of one group
    assert (turn.held, turn.forwarded, turn.paths) == (8 * 12288, 8192 + 2 * 4096, 2)
    assert micro_batch_tokens(recipe("shared_prefix=false")).forwarded == 8 * 12288
    assert not micro_batch_tokens(load_recipe(PAPER, PAPER_SETTINGS)).shared
    shared, stock = (estimate(recipe(*s), gpus=4, gpu_memory_gb=80, num_tasks=400) for s in ((), ("shared_prefix=false",)))
    assert shared.held_tokens == stock.trained_tokens == 256 * 12288
    assert shared.trained_tokens == 32 * (8192 + 8 * 4096)  # 256 episodes = 32 micro-batches
    assert shared.train_seconds_per_round == pytest.approx(stock.train_seconds_per_round * shared.trained_tokens / stock.trained_tokens)


def test_a_recipe_that_fits_only_with_shared_prefixes_is_not_refused():
    """Between the two totals the fit check follows the setting: with sharing it fits, without it is
    refused before the first rollout."""
    from seal_rl.fit import Machine, check_fit
    from seal_rl.plan import GiB

    def fit(sharing, memory):
        recipe = load_recipe(PAPER, [*PAPER_SETTINGS, "grpo.per_device_train_batch_size=8", f"shared_prefix={sharing}",
                                     "grpo.use_vllm=false", "generator=hf", "prefix_cache_tokens=0"])  # fmt: skip
        return check_fit(recipe, Machine("cuda", 4, memory, "zero3", "4 GPUs"), num_tasks=400)

    shared, stock = fit("auto", 80.0).plan.training_bytes, fit("false", 80.0).plan.training_bytes
    assert shared < stock
    between = (shared + stock) / 2 / GiB + 3  # plus the assumed overhead
    assert fit("auto", between).fits and not fit("false", between).fits


# -- the command --------------------------------------------------------------------------------


def _plan(monkeypatch, capsys, *args):
    sets = [word for setting in PAPER_SETTINGS for word in ("--set", setting)]
    return run_cli(monkeypatch, capsys, "plan", "--config", PAPER, *sets, *args)


def test_the_paper_recipe_fits_on_four_80_gib_gpus_with_zero3(monkeypatch, capsys):
    code, out, err = _plan(monkeypatch, capsys, "--gpus", "4", "--gpu-memory", "80", "--strategy", "zero3")
    assert code == 0, err
    assert out.rstrip().splitlines()[-1].startswith("fits (") and err == ""
    for text in ("steps_per_generation 64", "gradient_accumulation_steps 16", "57,344 bytes/token", "72 rounds",
                 "interface: paper (fixed: the interface never changes during the run)"):  # fmt: skip
        assert text in out, text


def test_the_plan_says_from_how_many_turns_the_seal_interface_switches_on(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--config", "configs/seal-full.yaml", "--set", "model.path=preset:qwen2.5-7b",
                             "--set", "grpo.tasks_per_step=8", "--gpus", "4", "--gpu-memory", "80")  # fmt: skip
    assert code == 0, err
    flat = " ".join(out.split())  # the console wraps long notes
    assert "label has >= 2 turns (min_count auto: the paper's 8 per 256 episodes, scaled)" in flat  # 8 tasks x 8 = 64 episodes
    assert "(1 round(s) x 64 episodes = 64 episodes)" in flat


def test_the_qwen3_recipe_fits_on_four_80_gib_gpus_and_says_its_kv_cache(monkeypatch, capsys):
    """configs/qwen3-8b.yaml with the qwen3-8b preset: Qwen3-8B's 8 kv heads x 128 x 36 layers."""
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--config", "configs/qwen3-8b.yaml", "--set", "model.path=preset:qwen3-8b",
                             "--gpus", "4", "--gpu-memory", "80")  # fmt: skip
    assert code == 0, err
    assert out.rstrip().splitlines()[-1].startswith("fits (") and "147,456 bytes/token" in out


def test_the_gpt_oss_recipe_fits_on_eight_80_gib_gpus_but_not_four(monkeypatch, capsys):
    """configs/gpt-oss-20b.yaml with the gpt-oss-20b preset: model states of all 20.9B parameters need
    8-way sharding; vLLM's engines span 4 GPUs (2 of gpt-oss's 8 kv heads x 64 x 24 layers each)."""
    args = ["plan", "--config", "configs/gpt-oss-20b.yaml", "--set", "model.path=preset:gpt-oss-20b", "--gpu-memory", "80"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--gpus", "8")
    assert code == 0, err
    assert out.rstrip().splitlines()[-1].startswith("fits (") and "12,288 per GPU" in out and "3.61 B active" in out
    code, out, err = run_cli(monkeypatch, capsys, *args, "--gpus", "4")
    assert code == 1 and out.rstrip().splitlines()[-1].startswith("does not fit: training needs")


def test_the_paper_recipe_does_not_fit_on_four_24_gib_gpus(monkeypatch, capsys):
    code, out, err = _plan(monkeypatch, capsys, "--gpus", "4", "--gpu-memory", "24")
    assert code == 1 and err == ""
    assert out.rstrip().splitlines()[-1].startswith("does not fit: training needs")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "0", "--gpu-memory", "80"], "--gpus must be at least 1"),
        (["--gpus", "4", "--gpu-memory", "-1"], "--gpu-memory must be positive"),
        (["--gpus", "3", "--gpu-memory", "80"], "must be a multiple of per_device_train_batch_size"),
        (["--gpus", "4", "--gpu-memory", "80", "--strategy", "zero4"], "Unknown strategy"),
        (["--gpus", "4", "--gpu-memory", "80", "--mfu", "0"], "--mfu and --decode-efficiency in (0, 1]"),
        (["--gpus", "4", "--gpu-memory", "80", "--set", "model.path=preset:gpt-5"], "Unknown model preset 'gpt-5'"),
        (["--gpus", "4", "--gpu-memory", "80", "--set", "model.path=/nonexistent"], "config.json does not exist"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_code_2(monkeypatch, capsys, args, message):
    code, _, err = _plan(monkeypatch, capsys, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err.replace("\n", " ")


def test_the_launch_strategy_is_read_from_accelerates_environment():
    from seal_rl.plan import launch_strategy

    assert launch_strategy({"ACCELERATE_USE_FSDP": "true"}) == "fsdp"
    assert launch_strategy({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_USE_FSDP": "false"}) == "zero3"
    assert launch_strategy({}) == "ddp"


@pytest.mark.parametrize("memory", ["80", "24"])
def test_the_verdict_is_printed_once(monkeypatch, capsys, memory):
    code, out, err = _plan(monkeypatch, capsys, "--gpus", "4", "--gpu-memory", memory)
    assert code == (0 if memory == "80" else 1)
    printed = out + err
    assert printed.count("fits (") + printed.count("does not fit") == 1, printed
    assert out.rstrip().splitlines()[-1].startswith("fits (" if code == 0 else "does not fit: training needs")


def test_the_plan_counts_ground_truths_within_budgets_with_the_models_tokenizer(monkeypatch, capsys, tiny_model_dir):
    code, out, _ = _plan(monkeypatch, capsys, "--gpus", "4", "--gpu-memory", "80")
    assert code == 0 and "ground truths within budgets: not counted (a preset has no tokenizer" in out
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--config", PAPER, "--set", f"model.path={tiny_model_dir}", "--gpus", "4",
                           "--gpu-memory", "80")  # fmt: skip
    line = next(line for line in out.splitlines() if line.startswith("ground truths within budgets:"))
    assert line.startswith("ground truths within budgets: base 100/100, miss_func 100/100, miss_param 100/100, long_context ")
    assert "end with completion_budget" in line and "400 tasks played" in line


def test_the_hf_generators_prefix_cache_is_planned_unless_the_weights_are_sharded_over_processes():
    hf = [*PAPER_SETTINGS, "generator=hf", "grpo.use_vllm=false", "prefix_cache_tokens=10000"]
    recipe = load_recipe(PAPER, hf)
    plan = estimate(recipe, gpus=1, gpu_memory_gb=80, strategy="ddp", num_tasks=400)
    (line,) = [m for m in plan.memory if m.name.startswith("hf prefix cache")]
    assert line.bytes == 10000 * 28 * 2 * 4 * 128 * 2  # Qwen2.5-7B: 28 layers, 4 KV heads of 128, K and V, bf16
    sharded = estimate(recipe, gpus=4, gpu_memory_gb=80, strategy="zero3", num_tasks=400)
    assert not [m for m in sharded.memory if m.name.startswith("hf prefix cache")]  # off under lockstep
    off = estimate(load_recipe(PAPER, [*hf, "prefix_cache_tokens=0"]), gpus=1, gpu_memory_gb=80, strategy="ddp", num_tasks=400)
    assert not [m for m in off.memory if m.name.startswith("hf prefix cache")]
    with pytest.raises(SealError, match="prefix_cache_tokens must be >= 0"):
        load_recipe(PAPER, [*hf, "prefix_cache_tokens=-1"])


# -- grpo.per_device_train_batch_size: auto ------------------------------------------------------


def _auto(memory_gib: float, gpus: int = 4, strategy: str = "zero3", extra: tuple[str, ...] = ()):
    from seal_rl.plan.micro_batch import choose_micro_batch

    recipe = load_recipe(PAPER, ["model.path=preset:qwen2.5-7b", "grpo.per_device_train_batch_size=auto", *extra])
    return recipe, choose_micro_batch(recipe, gpus, lambda r: estimate(r, gpus=gpus, gpu_memory_gb=memory_gib, strategy=strategy))


def test_auto_takes_the_largest_group_aligned_micro_batch_that_fits():
    """On the paper's 4 x 80 GiB a whole group (8) fits; the next size up (16) would hold two groups."""
    from seal_rl.plan.micro_batch import group_aligned_sizes, with_micro_batch
    from seal_rl.train.recipe import batch_layout

    recipe, choice = _auto(80.0)
    assert group_aligned_sizes(recipe, 4) == [16, 8, 4, 2, 1]  # 8 tasks x 8 rollouts per update over 4 GPUs
    sizes = group_aligned_sizes(recipe, 4)
    fits = {b: estimate(with_micro_batch(recipe, b), gpus=4, gpu_memory_gb=80.0).fits for b in sizes}
    assert choice.size == max(b for b, ok in fits.items() if ok) and choice.plan.fits
    assert [b for b, _ in choice.too_large] == [b for b in sizes if b > choice.size]
    batch_layout(with_micro_batch(recipe, choice.size), 4)  # TRL's arithmetic accepts it
    assert choice.smallest.micro_batch == 1 and choice.plan.trained_tokens < choice.smallest.trained_tokens


@pytest.mark.parametrize("memory", [16.0, 24.0, 40.0, 80.0, 141.0])
def test_auto_never_takes_a_smaller_micro_batch_on_a_larger_gpu(memory):
    _, smaller = _auto(memory * 0.75)
    _, larger = _auto(memory)
    assert larger.size >= smaller.size


def test_auto_keeps_a_turn_layouts_episodes_whole():
    from seal_rl.plan.micro_batch import group_aligned_sizes

    recipe, choice = _auto(80.0, extra=("layout=turn", "turn_samples=4"))
    assert all(b % 4 == 0 for b in group_aligned_sizes(recipe, 4)) and choice.size % 4 == 0


def test_seal_plan_says_what_auto_chose_and_what_it_saves(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "plan", "--config", PAPER, "--set", "model.path=preset:qwen2.5-7b",
                             "--set", "grpo.per_device_train_batch_size=auto", "--gpus", "8", "--gpu-memory", "80")  # fmt: skip
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("micro-batch: auto -> "))
    _, choice = _auto(80.0, gpus=8)
    assert line.startswith(f"micro-batch: auto -> {choice.size} ") and "x fewer" in line
    assert f"micro-batch {choice.size};" in out  # the plan below is the chosen size's


@pytest.mark.parametrize("value", ["0", "-2", "big", "1.5"])
def test_a_bad_micro_batch_is_one_error_line(monkeypatch, capsys, value):
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--config", PAPER, "--set", "model.path=preset:qwen2.5-7b",
                           "--set", f"grpo.per_device_train_batch_size={value}", "--gpus", "4", "--gpu-memory", "80")  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "grpo.per_device_train_batch_size must be a positive number of samples or auto" in err


# -- seal plan --server-gpus: generation servers on their own GPUs --------------------------------

QWEN7B = 7_615_616_512  # Qwen2.5-7B-Instruct's parameters (the model card's 7.61B; the count checked above)
QWEN7B_MATMUL = QWEN7B - 152064 * 3584  # without the embedding lookup (untied: the LM head stays)
QWEN7B_KV = 2 * 28 * 4 * 128 * 2  # bytes per token: K and V x 28 layers x 4 kv heads x 128 x bf16
H100 = {"hbm": 3.35e12, "efficiency": 0.5, "peak": 989e12, "mfu": 0.35}  # Assumptions' defaults


def _golden(name: str) -> str:
    from pathlib import Path

    return (Path(__file__).parent / "plan-golden" / f"{name}.txt").read_text()


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("paper-4x80", [*[w for s in PAPER_SETTINGS for w in ("--set", s)], "--gpus", "4", "--gpu-memory", "80"]),
        ("paper-auto-8x80", ["--set", "model.path=preset:qwen2.5-7b", "--gpus", "8", "--gpu-memory", "80"]),
        ("paper-4x24", [*[w for s in PAPER_SETTINGS for w in ("--set", s)], "--gpus", "4", "--gpu-memory", "24"]),
    ],
)
def test_no_server_gpus_leaves_the_output_byte_identical(monkeypatch, capsys, name, args):
    """tests/plan-golden holds seal plan's output from before --server-gpus existed (main at fd2f87c)."""
    for extra in ([], ["--server-gpus", "0"]):
        code, out, err = run_cli(monkeypatch, capsys, "plan", "--config", PAPER, *args, *extra)
        assert code == (1 if name == "paper-4x24" else 0) and err == ""
        assert out == _golden(name)


def _decode_rate(weights: int, running: int, context: int, kv_per_token: int) -> float:
    """tokens/s of one engine at the bandwidth roofline (Pope et al. 2022, §2), written out here."""
    step_seconds = (weights + running * context * kv_per_token) / (H100["hbm"] * H100["efficiency"])
    return running / step_seconds


def test_the_split_adds_up_from_pieces_computed_here():
    """Paper recipe, micro-batch 1, 8 x 80 GiB, 4 server GPUs: every number rebuilt from the model's
    published shape, vLLM's memory rule and the two rooflines, not from the planner's functions."""
    from seal_rl.plan import GiB, estimate_split

    recipe = load_recipe(PAPER, PAPER_SETTINGS)
    split = estimate_split(recipe, gpus=8, server_gpus=4, gpu_memory_gb=80, num_tasks=400)
    # servers: 7.6B bf16 weights fit one 80 GiB GPU at vLLM's 0.92, so 4 servers of one GPU each
    budget, weights, overhead = int(0.92 * 80 * GiB), 2 * QWEN7B, int(1.5 * GiB)
    kv_tokens = (budget - weights - overhead) // QWEN7B_KV
    assert (split.servers.count, split.servers.engine.tensor_parallel) == (4, 1)
    assert (split.servers.engine.weights, split.servers.engine.kv_tokens) == (weights, kv_tokens)
    in_flight = min(32 * 8, 4 * 64) // 4  # 256 episodes, 4 trainers x concurrency 64, over 4 servers
    context = 8192 + 4096 // 2
    running = min(in_flight, kv_tokens // context)
    fleet = 4 * _decode_rate(weights, running, context, QWEN7B_KV)
    assert split.servers.tokens_per_s == pytest.approx(fleet, rel=1e-9)
    generation = 256 * 4096 / fleet  # 256 episodes at their 4,096-token completion budget
    # training: 4 GPUs, the whole 80 GiB less the 3 GiB allowance (no engine), micro-batch 1 forwards 256 x 12,288 tokens
    flops_per_token = 2 * QWEN7B_MATMUL + 2 * 28 * (8192 + 4096) * 28 * 128
    forwards = 3 + 1 + 1 + 1  # forward and backward, recompute, old log-probs (4 updates a round), reference (beta > 0)
    update = 256 * 12288 * forwards * flops_per_token / (4 * H100["peak"] * H100["mfu"])
    sync = 2 * QWEN7B / 50e9
    assert split.training.gpus == 4 and split.training.vllm is None
    assert split.training.training_budget == int(80 * GiB) - int(3 * GiB)
    assert not [line for line in split.training.memory if line.name.startswith("hf ")]
    states = {line.name.split(" (")[0]: line.bytes for line in split.training.memory[:4]}
    shard = -(-QWEN7B // 4)  # ZeRO-3 over the 4 training GPUs, mixed bf16: 2 + 2 + 12 bytes, and the bf16 reference
    assert states == {"weights": 2 * shard, "gradients": 2 * shard, "optimizer state": 12 * shard, "reference model": 2 * shard}
    assert (split.generation_seconds, split.update_seconds, split.sync_seconds) == pytest.approx((generation, update, sync), rel=1e-9)
    assert split.staleness == 0 and split.seconds_per_round == pytest.approx(generation + update + sync, rel=1e-9)
    # the training GPUs hold what 4 colocated GPUs' training side holds, without the engine's 0.4 share
    four = estimate(recipe, gpus=4, gpu_memory_gb=80, num_tasks=400)
    assert split.training.training_bytes == four.training_bytes and four.training_budget == split.training.training_budget - int(32 * GiB)
    # colocated on all 8: its update on 8 GPUs, its generation on 8 colocated engines, in series
    eight = split.colocated
    assert eight.gpus == 8 and eight.vllm is not None
    colocated_update = 256 * 12288 * forwards * flops_per_token / (8 * H100["peak"] * H100["mfu"])
    engine_kv = (int(0.4 * 80 * GiB) - weights - overhead) // QWEN7B_KV
    colocated_rate = 8 * _decode_rate(weights, min(32, engine_kv // context), context, QWEN7B_KV)  # 32 episodes per GPU
    assert eight.seconds_per_round == pytest.approx(colocated_update + 256 * 4096 / colocated_rate, rel=1e-9)


SERVER_SETTINGS = ["generator=server", "grpo.use_vllm=false", "grpo.vllm_importance_sampling_correction=true",
                   "server.urls=[http://nodeA:8000,http://nodeA:8001]"]  # fmt: skip


def test_staleness_one_costs_the_longer_phase_not_both():
    from seal_rl.plan import estimate_split, render_split

    recipe = load_recipe(PAPER, [*PAPER_SETTINGS, *SERVER_SETTINGS, "staleness=1"])
    split = estimate_split(recipe, gpus=8, server_gpus=4, gpu_memory_gb=80, num_tasks=400)
    generation, update, sync = split.generation_seconds, split.update_seconds, split.sync_seconds
    assert min(generation, update) > 10 * sync > 0
    assert split.seconds_per_round == pytest.approx(max(generation, update) + sync, rel=1e-12)
    assert split.seconds_per_round < generation + update
    assert split.synchronous_seconds == pytest.approx(generation + update + sync, rel=1e-12)
    text = render_split(split)
    (line,) = [line for line in text.splitlines() if "<- the recipe's" in line]
    assert line.startswith("  split, staleness >= 1: max(") and "(staleness 1)" in line
    assert text.splitlines()[-1].startswith("fits (") and "staleness  1 (asynchronous" in text
    on_policy = estimate_split(load_recipe(PAPER, [*PAPER_SETTINGS, *SERVER_SETTINGS]), gpus=8, server_gpus=4, gpu_memory_gb=80,
                               num_tasks=400)  # fmt: skip
    assert on_policy.staleness == 0 and on_policy.seconds_per_round == pytest.approx(generation + update + sync, rel=1e-12)


def test_a_server_recipe_is_compared_with_its_colocated_vllm_run():
    """generator: server sets grpo.use_vllm: false; the comparison plans the same recipe with TRL's
    colocated engine (not transformers' generate), as the recipe without a server section runs today."""
    from seal_rl.plan import estimate_split

    split = estimate_split(load_recipe(PAPER, [*PAPER_SETTINGS, *SERVER_SETTINGS, "staleness=1"]), gpus=8, server_gpus=4,
                           gpu_memory_gb=80, num_tasks=400)  # fmt: skip
    today = estimate(load_recipe(PAPER, [*PAPER_SETTINGS, "grpo.vllm_importance_sampling_correction=true"]), gpus=8,
                     gpu_memory_gb=80, num_tasks=400)  # fmt: skip
    assert split.colocated.vllm is not None and not [line for line in split.colocated.memory if line.name.startswith("hf ")]
    assert split.colocated.seconds_per_round == today.seconds_per_round
    assert split.colocated.training_bytes == today.training_bytes


def test_servers_take_the_fewest_gpus_that_hold_the_weights_and_one_sequence():
    """16 GiB GPUs: 0.92 x 16 = 14.7 GiB cannot hold Qwen2.5-7B's 14.2 GiB of weights and 1.5 GiB of
    overhead on one GPU; two GPUs of tensor parallelism can (7.1 GiB each)."""
    from seal_rl.plan import GiB, size_servers

    recipe, shape = load_recipe(PAPER, PAPER_SETTINGS), PRESETS["qwen2.5-7b"]
    servers = size_servers(recipe, shape, 2, 16 * GiB, 6, Assumptions())
    assert (servers.count, servers.engine.tensor_parallel, servers.gpus) == (1, 2, 2)
    assert servers.engine.weights == QWEN7B  # 2 bytes x Ψ / 2
    assert size_servers(recipe, shape, 4, 16 * GiB, 4, Assumptions()).count == 2
    with pytest.raises(SealError, match="cannot hold one vLLM server even as one tensor-parallel group of 1"):
        size_servers(recipe, shape, 1, 16 * GiB, 7, Assumptions())
    with pytest.raises(SealError, match="divides both --server-gpus 3 and the model's 28 attention heads"):
        size_servers(recipe, shape, 3, 16 * GiB, 5, Assumptions())  # 3 does not divide 28; one GPU is too small


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "8", "--server-gpus", "-1"], "--server-gpus must be between 1 and --gpus - 1 = 7"),
        (["--gpus", "8", "--server-gpus", "8"], "--server-gpus must be between 1 and --gpus - 1 = 7"),
        (["--gpus", "8", "--server-gpus", "9"], "--server-gpus must be between 1 and --gpus - 1 = 7"),
        (["--gpus", "1", "--server-gpus", "1"], "--server-gpus must be between 1 and --gpus - 1 = 0"),
        (["--gpus", "8", "--server-gpus", "1", "--gpu-memory", "16"], "cannot hold one vLLM server even as one tensor-parallel group of 1"),
        (["--gpus", "8", "--server-gpus", "4", "--sync-gb-s", "0"], "--sync-gb-s positive"),
        (["--gpus", "8", "--server-gpus", "4", "--server-memory-utilization", "1.5"], "--server-memory-utilization must be in (0, 1]"),
    ],
)
def test_a_bad_server_split_is_one_error_line_and_exit_code_2(monkeypatch, capsys, args, message):
    memory = [] if "--gpu-memory" in args else ["--gpu-memory", "80"]
    code, _, err = _plan(monkeypatch, capsys, *args, *memory)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err.replace("\n", " ")


def test_the_paper_recipe_on_eight_gpus_splits_four_and_four_but_not_two_and_six(monkeypatch, capsys):
    """The shipped recipe (micro-batch auto). 2 server GPUs leave 6 trainers, over which an update's
    8 tasks x 8 rollouts = 64 samples do not divide (TRL's batch arithmetic): one line, exit 2. With 4
    server GPUs, 4 servers of one GPU each serve and 4 GPUs train; it fits."""
    args = ["plan", "--config", PAPER, "--set", "model.path=preset:qwen2.5-7b", "--gpus", "8", "--gpu-memory", "80"]
    code, _, err = run_cli(monkeypatch, capsys, *args, "--server-gpus", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "With --server-gpus 2, 6 of the 8 GPUs train: tasks_per_update x num_generations = 64 samples" in err
    code, out, err = run_cli(monkeypatch, capsys, *args, "--server-gpus", "4")
    assert code == 0, err
    lines = out.rstrip().splitlines()
    assert lines[-1].startswith("fits (") and lines[-1].endswith("GiB to spare per training GPU)")
    assert out.count("fits (") == 1 and out.count("does not fit") == 0
    assert "generation servers (4 of 8 GPUs): 4 x vLLM, tensor parallel 1" in out
    assert "training GPUs (4 of 8), memory per GPU" in out and "available: 80 GiB - 3 GiB overhead" in out
    assert "colocated on 8 GPUs (micro-batch 8)" in out and "  -> at the recipe's staleness 0: " in out and "     with staleness >= 1: " in out
    assert out.startswith("seal plan: ") and "training GPUs: micro-batch: auto -> " in out


def test_the_split_does_not_fit_when_too_few_gpus_train(monkeypatch, capsys):
    code, out, err = _plan(monkeypatch, capsys, "--gpus", "8", "--server-gpus", "7", "--gpu-memory", "80")
    assert code == 1 and err == ""
    assert out.rstrip().splitlines()[-1].startswith("does not fit: on the 1 training GPUs, training needs")


def test_a_server_recipe_holds_no_generation_engine_on_its_training_gpus():
    """``generator: server`` generates elsewhere: its plan counts neither transformers' generation
    cache nor a colocated vLLM share on the training GPUs, so it needs less memory per GPU than the
    same recipe generating with transformers."""
    served = [*PAPER_SETTINGS, "generator=server", "server.urls=[http://127.0.0.1:8000]", "grpo.use_vllm=false"]
    plan = estimate(load_recipe(PAPER, served), gpus=8, gpu_memory_gb=80, num_tasks=400)
    local = estimate(load_recipe(PAPER, [*PAPER_SETTINGS, "grpo.use_vllm=false", "generator=hf"]), gpus=8, gpu_memory_gb=80, num_tasks=400)
    assert plan.vllm is None and not [line for line in plan.memory if "generate" in line.name or "prefix cache" in line.name]
    assert [line for line in local.memory if "generate" in line.name]
    assert plan.training_bytes < local.training_bytes


def test_a_user_simulator_in_the_training_processes_is_counted_in_their_memory(qwen_dir):
    """``family_settings.user: hf:MODEL`` loads τ²'s user model in every training process: the plan adds its
    bf16 weights (2 bytes x its parameters, from its config.json) to each GPU; a user on a server adds none."""
    from seal_rl.plan.shapes import model_shape

    base = ["model.path=preset:qwen2.5-7b"]
    served = load_recipe("tau2-airline-user", [*base, "family_settings.user=openai:u@http://localhost:1/v1"])
    local = load_recipe("tau2-airline-user", [*base, f"family_settings.user=hf:{qwen_dir}", "grpo.per_device_train_batch_size=1"])
    served.grpo.per_device_train_batch_size = 1
    a, b = (estimate(r, gpus=8, gpu_memory_gb=80, num_tasks=30) for r in (served, local))
    extra = [line for line in b.memory if line.name.startswith("user simulator weights")]
    assert len(extra) == 1 and extra[0].bytes == 2 * model_shape(qwen_dir).parameters
    assert sum(line.bytes for line in b.memory) - sum(line.bytes for line in a.memory) == extra[0].bytes


# -- LoRA (model.lora) ---------------------------------------------------------------------------

LORA = [*PAPER_SETTINGS, "model.lora.rank=16"]


@pytest.mark.parametrize(
    ("config_class", "settings", "targets"),
    [
        (Qwen2Config, {}, "all-linear"),  # Qwen2: q/k/v biases, which bias="none" leaves untrained
        (LlamaConfig, {"attention_bias": True, "mlp_bias": True}, "all-linear"),
        (LlamaConfig, {}, ["q_proj", "v_proj", "down_proj"]),
        (Qwen3Config, {"head_dim": 24}, ["k_proj", "o_proj", "gate_proj", "up_proj"]),  # head_dim != hidden / heads
    ],
)
def test_lora_trainable_parameters_are_what_peft_trains(config_class, settings, targets):
    """The shape-based count rank x (in + out) per adapted layer equals PEFT's own count on a model
    built here from the same config, and PEFT keeps the adapters in float32 on a bfloat16 base."""
    from peft import LoraConfig, get_peft_model

    from seal_rl.plan.lora import lora_plan
    from seal_rl.train.lora import LoraSettings

    config = config_class(hidden_size=64, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=320, tie_word_embeddings=False, **settings)  # fmt: skip
    config_dict = {**config.to_dict(), "model_type": config.model_type}
    shape = shape_from_config(config_dict)
    for rank in (1, 8):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        peft = get_peft_model(model, LoraConfig(r=rank, target_modules=targets, bias="none", task_type="CAUSAL_LM"))
        trainable, total = peft.get_nb_trainable_parameters()
        assert total - trainable == shape.parameters
        planned = lora_plan(LoraSettings(rank=rank, target_modules=targets), shape, "ddp")
        assert planned.trainable == trainable
        assert {p.dtype for p in peft.parameters() if p.requires_grad} == {torch.float32}


def test_a_lora_plan_trains_the_adapters_only_and_keeps_no_reference_copy():
    recipe = load_recipe(PAPER, LORA)
    full = estimate(load_recipe(PAPER, PAPER_SETTINGS), gpus=1, gpu_memory_gb=80, strategy="ddp", num_tasks=400)
    lora = estimate(recipe, gpus=1, gpu_memory_gb=80, strategy="ddp", num_tasks=400)
    phi = 28 * 16 * (2 * 3584 + 2 * (3584 + 512) + 2 * 3584 + 3 * (3584 + 18944))
    assert lora.lora.trainable == phi == 40_370_176  # PEFT's count for Qwen2.5-7B, r=16, all-linear
    lines = {line.name: line.bytes for line in lora.memory}
    assert not any(name.startswith(("reference", "gradients", "weights", "optimizer state (")) for name in lines)
    assert lines["frozen base weights (2 bytes/param)"] == 2 * QWEN7B
    assert lines["LoRA adapters (rank 16, float32)"] == lines["adapter gradients (float32)"] == 4 * phi
    assert lines["optimizer state on the adapters (Adam)"] == 8 * phi
    by_name = {line.name: line.bytes for line in full.memory}
    activations = [name for name in lines if name.startswith("activations")]
    assert lines[activations[0]] == by_name[activations[0]]  # the backward still runs through every layer
    head = "LM-head log-probs (TRL fused kernel)"
    assert by_name[head] - lines[head] == 152064 * 3584 * (4 + 2)  # a frozen head: no fp32 weight gradient to cast
    assert lora.forwards == full.forwards  # the time keeps full fine-tuning's as an upper bound (a note says so)
    assert any("upper bound" in note for note in lora.notes)
    # the adapter's lines scale with its rank; the rest does not move
    lora32 = estimate(load_recipe(PAPER, [*PAPER_SETTINGS, "model.lora.rank=32"]), gpus=1, gpu_memory_gb=80,
                      strategy="ddp", num_tasks=400)  # fmt: skip
    assert lora32.lora.trainable == 2 * phi
    assert lora32.training_bytes - lora.training_bytes == 16 * phi
    # a list of names adapts only those; a regular expression is counted as all-linear (an upper bound)
    qv = estimate(load_recipe(PAPER, [*PAPER_SETTINGS, "model.lora.target_modules=[q_proj,v_proj]"]), gpus=1,
                  gpu_memory_gb=80, strategy="ddp", num_tasks=400)  # fmt: skip
    assert qv.lora.trainable == 28 * 8 * (2 * 3584 + 3584 + 512)
    regex = estimate(load_recipe(PAPER, [*PAPER_SETTINGS, r"model.lora.target_modules=.*\.(q|v)_proj"]), gpus=1,
                     gpu_memory_gb=80, strategy="ddp", num_tasks=400)  # fmt: skip
    assert regex.lora.trainable == 28 * 8 * (2 * 3584 + 2 * (3584 + 512) + 2 * 3584 + 3 * (3584 + 18944))
    assert any("upper bound" in note and "regular expression" in note for note in regex.notes)


def test_lora_is_planned_under_plain_data_parallel_only_and_not_on_moe_models():
    for strategy in ("zero1", "zero2", "zero3", "fsdp"):
        with pytest.raises(SealError, match="--strategy ddp"):
            estimate(load_recipe(PAPER, LORA), gpus=2, gpu_memory_gb=80, strategy=strategy, num_tasks=400)
    with pytest.raises(SealError, match="Mixture-of-Experts"):
        estimate(load_recipe(PAPER, [*LORA, "model.path=preset:gpt-oss-20b"]), gpus=1, gpu_memory_gb=80, strategy="ddp",
                 num_tasks=400)  # fmt: skip
    with pytest.raises(SealError, match="embed_tokens"):
        estimate(load_recipe(PAPER, [*PAPER_SETTINGS, "model.lora.target_modules=[q_proj,embed_tokens]"]), gpus=1,
                 gpu_memory_gb=80, strategy="ddp", num_tasks=400)  # fmt: skip


def test_the_paper_recipe_with_lora_fits_one_80_gib_gpu_and_full_fine_tuning_does_not(monkeypatch, capsys):
    """seal plan takes --strategy ddp for a LoRA recipe by default and says what it trains."""
    code, out, err = _plan(monkeypatch, capsys, "--set", "model.lora.rank=16", "--gpus", "1", "--gpu-memory", "80")
    assert code == 0 and err == "", err
    for text in ("strategy ddp", "lora       rank 16 on all-linear: Φ = 40.4 M trainable parameters (0.53% of Ψ); the KL "
                 "reference is the same model with the adapters off (no copy of the weights)", "  frozen base weights"):  # fmt: skip
        assert text in out, text
    assert "reference model" not in out and out.rstrip().splitlines()[-1].startswith("fits (")
    code, out, _ = _plan(monkeypatch, capsys, "--gpus", "1", "--gpu-memory", "80", "--strategy", "ddp")
    assert code == 1 and "lora " not in out and "reference model (beta=0.001)" in out


def test_seal_train_chooses_a_lora_micro_batch_under_ddp_and_falls_back_to_a_group_otherwise():
    """resolve_micro_batch (seal train, before the launch checks): adapters the plan cannot count, or a
    DeepSpeed launch that seal train then refuses, take one group with no estimate instead of an error."""
    from seal_rl.fit import Machine, resolve_micro_batch

    recipe = load_recipe(PAPER, ["model.path=preset:qwen2.5-7b", "model.lora.rank=16"])
    chosen, said = resolve_micro_batch(recipe, processes=1, num_tasks=400, machine=Machine("cuda", 1, 80.0))
    assert chosen.grpo.per_device_train_batch_size == 8 and "no memory estimate" not in said
    for machine, settings in ((Machine("cuda", 1, 80.0, strategy="zero3"), []),
                              (Machine("cuda", 1, 80.0), ["model.lora.target_modules=[embed_tokens]"])):  # fmt: skip
        chosen, said = resolve_micro_batch(load_recipe(PAPER, ["model.path=preset:qwen2.5-7b", "model.lora.rank=16", *settings]),
                                           processes=1, num_tasks=400, machine=machine)  # fmt: skip
        assert chosen.grpo.per_device_train_batch_size == 8 and "(one group; no memory estimate: " in said
