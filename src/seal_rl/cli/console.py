"""What every ``seal`` command shares: the two consoles (results on stdout, progress and errors
on stderr) and the ``--category`` and ``--json`` options."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from seal_rl.tasks import CATEGORIES

out = Console()
err = Console(stderr=True)


CategoryOption = Annotated[
    list[str] | None,
    typer.Option("--category", "-c", help=f"Only this category (repeatable): {', '.join(CATEGORIES)}."),
]


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of tables.")]


def _print_json(value) -> None:
    print(json.dumps(value, indent=1, ensure_ascii=False, default=str))
