"""The run directory: file names, the metrics file, checkpoints to resume from, and TensorBoard.

A run directory holds ``config.yaml`` (with the resolved task ids), ``metrics.jsonl`` (a
``rollout`` line per round, a ``validation`` line per validation, ``trainer`` lines of TRL's
logs), ``trajectories.jsonl``, ``profile/``, ``interface/``, ``validation/`` (each validation's
episodes, ``round_N.jsonl``, with their diagnosis), ``time.json``, ``checkpoints/``
(each with ``seal_state.json``), ``tensorboard/`` and ``model/``; with a recipe's ``warm_start``
also ``warm_start/``, with ``eval.keep_best`` also ``best/``. Resuming keeps only the log lines of
rounds the checkpoint has seen (:func:`_drop_logs_after`). :func:`save_model` writes ``model/`` and
``best/`` as plain model directories, also from FSDP or ZeRO-3 shards.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from seal_rl import jsonl
from seal_rl.errors import SealError
from seal_rl.train.lora import ADAPTER_DIR, is_peft, save_merged

SEAL_STATE_FILE = "seal_state.json"
METRICS_FILE = "metrics.jsonl"
TIME_FILE = "time.json"
"""the run's seconds per phase when training ended, the last round's optimisation included; each
checkpoint holds one too (the seconds up to its save), so a resumed run's figures cover every round
the model went through (not the replay of a round a kill interrupted)"""
VALIDATION_DIR = "validation"


def read_metrics(run_dir: Path, kind: str = "rollout") -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` lines of one kind: ``rollout`` (one per round) or ``validation``."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    lines = jsonl.read(path)  # a torn last line (a kill mid-write) is left out
    return [line for line in lines.values if isinstance(line, dict) and line.get("kind", "rollout") == kind]


def _best_validation(run_dir: Path) -> float | None:
    """The best validation average logged so far (a resumed run keeps choosing against it)."""
    values = [line["validation/average"] for line in read_metrics(run_dir, "validation")]
    return max(values) if values else None


def _drop_logs_after(out: Path, round_index: int) -> None:
    """Keep only log lines of rounds up to ``round_index`` (those the checkpoint has seen); a torn
    or corrupt line (a kill mid-write) goes too. Each file is replaced atomically."""
    for name in (METRICS_FILE, "trajectories.jsonl"):
        path = out / name
        if path.exists():
            lines = jsonl.read(path)
            jsonl.rewrite(path, [v for v in lines.values if isinstance(v, dict) and v.get("round", 0) <= round_index])
    for folder in ("profile", "interface"):  # per-round state files of rounds the checkpoint has not seen
        for path in (out / folder).glob("step_*.json"):
            if int(path.stem.split("_", 1)[1]) > round_index:
                path.unlink()


def latest_checkpoint(run_dir: Path, *, required: bool = True) -> Path | None:
    """The newest ``checkpoints/checkpoint-N`` of a run directory that has SEAL state (written
    last, so a checkpoint a kill cut short is never chosen); None if there is none and not
    ``required``."""
    candidates = sorted(
        (p for p in (Path(run_dir) / "checkpoints").glob("checkpoint-*") if (p / SEAL_STATE_FILE).exists()),
        key=lambda p: int(p.name.rsplit("-", 1)[1]),
    )
    if not candidates:
        if not required:
            return None
        raise SealError(f"No checkpoint with SEAL state under {run_dir}/checkpoints; nothing to resume.")
    return candidates[-1]


@contextmanager
def _tensorboard_dir(path: Path):
    """Point transformers' TensorBoard logs at ``RUN/tensorboard`` (it reads TENSORBOARD_LOGGING_DIR
    when its callback is built) unless the user chose a directory; the variable is restored after."""
    chosen = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if chosen is None:
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(path)
    try:
        yield
    finally:
        if chosen is None:
            os.environ.pop("TENSORBOARD_LOGGING_DIR", None)


def save_model(trainer: Any, path: Path) -> None:
    """Save the policy as a plain transformers model directory (weights, config, tokenizer); a LoRA
    policy merged (:func:`~seal_rl.train.lora.save_merged`), with its adapter alone in ``adapter/``.

    A collective: every rank must call it. ZeRO-3 gathers its 16-bit weights across ranks (on rank 0
    alone it hangs); FSDP gathers a full state dict, which rank 0 writes itself — transformers'
    ``save_pretrained`` would touch the still-sharded parameters on rank 0 alone and hang, and a
    sharded state dict would write shards, not a model.
    """
    model = trainer.accelerator.unwrap_model(trainer.model)
    if is_peft(model):  # LoRA (one process or plain data parallel): merged weights, the adapter in path/adapter
        if trainer.accelerator.is_main_process:
            save_merged(model, trainer.processing_class, path, Path(path) / ADAPTER_DIR)
        trainer.accelerator.wait_for_everyone()
        return
    if not trainer.is_fsdp_enabled:
        trainer.save_model(str(path))
        if trainer.accelerator.is_main_process:
            trainer.processing_class.save_pretrained(str(path))
        return
    from safetensors.torch import save_file

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # Collective; FSDP2 and FSDP1 alike: full tensors on rank 0, an empty dict elsewhere.
    state_dict = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if trainer.accelerator.is_main_process:
        model = trainer.accelerator.unwrap_model(trainer.model)
        if getattr(model.config, "tie_word_embeddings", False):
            state_dict.pop("lm_head.weight", None)  # tied to the input embeddings; safetensors refuses shared tensors
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(str(path))
        if model.generation_config is not None:
            model.generation_config.save_pretrained(str(path))
        trainer.processing_class.save_pretrained(str(path))
    trainer.accelerator.wait_for_everyone()


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """A round's ``metrics.jsonl`` line as flat scalars under stable ``seal/...`` names (nested
    dicts become path segments; the interface as the number of components on), for
    TensorBoard, W&B and any other ``report_to`` backend."""
    flat: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}/{key}", item)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[prefix] = float(value)

    for key, value in metrics.items():
        if key == "interface/active":
            flat["seal/interface/components_on"] = float(len(value))
        elif key not in ("round", "step", "kind"):
            walk(f"seal/{key}", value)
    flat["seal/round"] = float(metrics["round"])
    return flat
