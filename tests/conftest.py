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
    """A tiny random Qwen2 model with a tokenizer trained on the spot (built once per worker)."""
    from seal_rl.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), vocab_size=4096, task_set=task_set)
