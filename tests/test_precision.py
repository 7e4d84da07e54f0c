"""The dtype rule (seal_rl.precision): bfloat16 where the device computes it natively, float32 where
it does not, an explicit dtype always; what a run chose is recorded and a resumed run keeps it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seal_rl.precision import checkpoint_dtype, native_bf16, resolve_bf16, resolve_dtype, training_dtype

AVX2 = {"avx2": True, "avx512_bf16": False, "amx_bf16": False}
"""an AMD EPYC without AVX512-BF16 (torch.cpu.get_capabilities() of issue 57's machine, bf16 keys)"""
AVX512_BF16 = {"avx2": True, "avx512_bf16": True, "amx_bf16": False}
AMX = {"avx2": True, "avx512_bf16": True, "amx_bf16": True}


@pytest.mark.parametrize("checkpoint", ["bfloat16", "float16"])
def test_auto_is_float32_on_a_cpu_without_native_bf16(checkpoint):
    dtype, said = resolve_dtype("auto", checkpoint, cuda=False, capabilities=AVX2)
    assert dtype == "float32"
    assert "neither AMX-BF16 nor AVX512-BF16" in said and f"--dtype {checkpoint} forces it" in said


@pytest.mark.parametrize("capabilities, named", [(AVX512_BF16, "AVX512-BF16"), (AMX, "AMX-BF16 and AVX512-BF16")])
def test_auto_is_the_checkpoints_dtype_where_the_cpu_reports_native_bf16(capabilities, named):
    dtype, said = resolve_dtype("auto", "bfloat16", cuda=False, capabilities=capabilities)
    assert dtype == "bfloat16" and named in said


def test_auto_is_the_checkpoints_dtype_on_a_gpu_and_for_a_float32_checkpoint():
    assert resolve_dtype("auto", "bfloat16", cuda=True)[0] == "bfloat16"
    assert resolve_dtype("auto", "float32", cuda=False, capabilities=AVX2)[0] == "float32"
    assert resolve_dtype("auto", "float32", cuda=False, capabilities=AMX)[0] == "float32"


@pytest.mark.parametrize("explicit", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("capabilities", [AVX2, AMX])
def test_an_explicit_dtype_always_wins(explicit, capabilities):
    assert resolve_dtype(explicit, "bfloat16", cuda=False, capabilities=capabilities)[0] == explicit
    assert resolve_dtype(explicit, "float32", cuda=True)[0] == explicit
    assert training_dtype(explicit, "bfloat16", True, cuda=False, capabilities=capabilities)[0] == explicit


def test_training_follows_the_same_rule_and_autocast_keeps_float32_master_weights():
    assert training_dtype("auto", "bfloat16", False, cuda=False, capabilities=AVX2)[0] == "float32"
    assert training_dtype("auto", "bfloat16", False, cuda=False, capabilities=AMX)[0] == "bfloat16"  # bf16: false, pure bf16
    assert training_dtype("auto", "bfloat16", True, cuda=False, capabilities=AMX)[0] == "float32"  # autocast
    assert training_dtype("auto", "bfloat16", True, cuda=True)[0] == "bfloat16"


def test_bf16_autocast_and_the_dtype_agree_on_what_is_native():
    for capabilities in (AVX2, AVX512_BF16, AMX):
        native, _ = native_bf16(cuda=False, capabilities=capabilities)
        assert resolve_bf16("auto", cuda=False, capabilities=capabilities)[0] is native
        assert (resolve_dtype("auto", "bfloat16", cuda=False, capabilities=capabilities)[0] == "bfloat16") is native


def test_checkpoint_dtype_reads_config_json_of_either_transformers_generation(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert [checkpoint_dtype(tmp_path / n) for n in "abc"] == ["bfloat16", "float16", "float32"]


# -- seal eval: recorded, kept on resume -----------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model saved in bfloat16, as the pulled real models are."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import torch

    out = tmp_path_factory.mktemp("tiny-bf16")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    assert checkpoint_dtype(out) == "bfloat16"
    return out


def _evaluate(monkeypatch, model_dir, out, task_set, *, native: bool, dtype: str = "auto"):
    """Two episodes of `seal eval --policy hf:model_dir` on a CPU that reports native bf16 or not;
    the dtype each load of the weights asked for."""
    import transformers

    import seal_rl.precision
    from seal_rl.env import EnvConfig
    from seal_rl.evaluate import ModelSettings, evaluate
    from seal_rl.policies import ModelPolicy

    monkeypatch.setattr(seal_rl.precision, "native_bf16", lambda **_: (native, "this CPU (test) " + ("has" if native else "lacks") + " it"))
    loads = []
    load = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        model = load(*args, **kwargs)
        loads.append(str(next(model.parameters()).dtype).removeprefix("torch."))
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    policy = ModelPolicy(Path(model_dir))
    episodes = policy.episodes([task_set.get("multi_turn_base_0"), task_set.get("multi_turn_base_1")], task_set, "bfcl")
    evaluate(episodes, EnvConfig(max_model_calls=1), out, policy=policy,
             settings=ModelSettings(max_new_tokens=4, dtype=dtype, concurrency=2))  # fmt: skip
    return loads


def test_seal_eval_records_the_chosen_dtype_and_a_resumed_run_keeps_it(monkeypatch, capsys, bf16_model_dir, tmp_path, task_set):
    out = tmp_path / "run"
    assert _evaluate(monkeypatch, bf16_model_dir, out, task_set, native=False) == ["float32"]
    config = json.loads((out / "config.json").read_text())
    assert config["precision"]["dtype"] == "float32" and "lacks it" in config["precision"]["why"]
    assert config["model_settings"]["dtype"] == "auto"
    assert "--dtype auto: float32" in capsys.readouterr().err
    # killed after one episode, resumed on a machine with native bf16: the run goes on in float32
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2
    (out / "results.jsonl").write_text(lines[0] + "\n")
    assert _evaluate(monkeypatch, bf16_model_dir, out, task_set, native=True) == ["float32"]
    assert "as this run started" in capsys.readouterr().err
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "config.json").read_text())["precision"] == config["precision"]
    # a new run on that machine loads the checkpoint's bfloat16; an explicit dtype wins on either
    assert _evaluate(monkeypatch, bf16_model_dir, tmp_path / "native", task_set, native=True) == ["bfloat16"]
    assert _evaluate(monkeypatch, bf16_model_dir, tmp_path / "forced", task_set, native=False, dtype="bfloat16") == ["bfloat16"]


def test_a_onednn_isa_limit_below_bf16_counts_as_no_native_bf16(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    native, why = native_bf16(cuda=False)
    assert not native and "ONEDNN_MAX_CPU_ISA=AVX2" in why
    assert resolve_dtype("auto", "bfloat16", cuda=False)[0] == "float32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # no limit below bf16: the CPU's own report decides
    assert native_bf16(cuda=False, capabilities=AMX)[0] and not native_bf16(cuda=False, capabilities=AVX2)[0]
