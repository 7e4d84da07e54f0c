"""What every ``seal`` command shares: the two consoles (results on stdout, progress and errors
on stderr), the ``--category`` and ``--json`` options, and loading a model's tokenizer."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from seal_rl.errors import SealError
from seal_rl.tasks import CATEGORIES

out = Console()
err = Console(stderr=True)


CategoryOption = Annotated[
    list[str] | None,
    typer.Option("--category", "-c", help=f"Only this category (repeatable): {', '.join(CATEGORIES)}."),
]


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of tables.")]


def load_tokenizer(model: str) -> Any:
    """The tokenizer of a model directory or a pulled model's name; a one-line error otherwise."""
    from transformers import AutoTokenizer

    from seal_rl.models import resolve_model

    try:
        return AutoTokenizer.from_pretrained(resolve_model(str(model)))
    except (OSError, ValueError) as exc:
        raise SealError(f"No tokenizer could be loaded from {str(model)!r} ({exc}); give a model directory or a pulled model's name.") from None


def _print_json(value) -> None:
    print(json.dumps(value, indent=1, ensure_ascii=False, default=str))
