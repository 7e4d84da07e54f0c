"""What every ``seal`` command shares: the two consoles (results on stdout, progress and errors
on stderr), the ``--category`` and ``--json`` options, an evaluation's progress bar, and loading a
model's tokenizer."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from seal_rl.errors import SealError
from seal_rl.tasks import CATEGORIES

out = Console()
err = Console(stderr=True)


CategoryOption = Annotated[
    list[str] | None,
    typer.Option("--category", "-c", help=f"Only this category (repeatable): {', '.join(CATEGORIES)}."),
]


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts) instead of tables.")]
FamilySetOption = Annotated[list[str] | None, typer.Option("--family-set", help="A setting of --family, KEY=VALUE (YAML values; repeatable), e.g. solo=true or user=openai:MODEL@URL.")]


def family_settings(given: list[str] | None) -> dict[str, Any]:
    """``--family-set KEY=VALUE`` options as a family's settings (YAML values); one line for a malformed one."""
    import yaml

    settings = {}
    for item in given or []:
        key, eq, value = item.partition("=")
        if not key or not eq:
            raise SealError(f"--family-set takes KEY=VALUE, got {item!r}.")
        settings[key] = yaml.safe_load(value)
    return settings


@contextmanager
def run_progress(label: str, metric: str, total: int | None) -> Iterator[Callable[..., None]]:
    """An evaluation's progress bar on stderr: done of ``total``, the running ``metric``, errors in
    red, elapsed time and eta. Yields ``update(rate=..., errors=N, advance=1, total=None)``; on a
    :class:`SealError` the bar is hidden, so the error is the one line the user sees."""
    columns = (TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn(f"{metric} {{task.fields[rate]}}"),
               TextColumn("{task.fields[errors]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=err) as progress:
        bar = progress.add_task(label, total=total, rate="-", errors="")

        def update(*, rate: str = "-", errors: int = 0, advance: int = 1, total: int | None = None) -> None:
            progress.update(bar, advance=advance, rate=rate, errors=f"[red]{errors} errors" if errors else "",
                            **({"total": total} if total is not None else {}))  # fmt: skip

        try:
            yield update
        except SealError:
            progress.update(bar, visible=False)
            raise


def print_shipped(kind: str, what: str, names: list[str], describe: Callable[[str], str]) -> None:
    """The ``--list`` table of shipped files (recipes, studies): each name and its opening sentence."""
    from rich.table import Table

    table = Table(kind, what, box=None)
    for name in names:
        table.add_row(name, describe(name))
    out.print(table)


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
