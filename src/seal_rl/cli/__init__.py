"""The ``seal`` command line: thin entry points that parse options and call one function each.

This module assembles the application from the command groups: ``catalogue`` (``seal tasks``,
``seal models``, ``seal templates``), ``evaluation`` (``eval``, ``export-bfcl``, ``report``, ``compare``,
``diagnose``), ``training`` (``train``, ``plan``, ``preflight``, ``sft``), ``study`` (``seal study``), ``serve`` and ``doctor`` (``seal doctor``); ``console`` holds what
they share. :func:`entry` is the console script.
"""

from __future__ import annotations

import sys
import warnings
from typing import Annotated

import typer
from rich.markup import escape

from seal_rl import __version__
from seal_rl.bfcl import BFCL_VERSION
from seal_rl.cli import catalogue, doctor, evaluation, serve, study, training
from seal_rl.cli.console import err, out
from seal_rl.errors import SealError, SealWarning
from seal_rl.extras import missing_extra_message

app = typer.Typer(
    help="seal-rl: SEAL for multi-turn tool-use agents on BFCL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"seal-rl {__version__} (bfcl-eval {BFCL_VERSION})")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print versions and exit.")] = False,
) -> None:
    """seal-rl: SEAL for multi-turn tool-use agents on BFCL."""


app.add_typer(catalogue.tasks_app, name="tasks")
app.add_typer(catalogue.models_app, name="models")
app.add_typer(catalogue.templates_app, name="templates")
app.command("eval")(evaluation.eval_command)
app.command("export-bfcl")(evaluation.export_bfcl_command)
app.command("report")(evaluation.report_command)
app.command("compare")(evaluation.compare_command)
app.command("train")(training.train_command)
app.command("plan")(training.plan_command)
app.command("preflight")(training.preflight_command)
app.command("study")(study.study_command)
app.command("sft")(training.sft_command)
app.command("merge")(training.merge_command)
app.command("diagnose")(evaluation.diagnose_command)
app.command("serve")(serve.serve_command)
app.command("serve-openenv")(serve.serve_openenv_command)
app.command("rollout-server")(serve.rollout_server_command)
app.command("doctor")(doctor.doctor_command)


def entry() -> None:
    """The ``seal`` command (console script and ``python -m seal_rl``).

    BFCL's backends format Python sets into some tool outputs (e.g. "Must be one of {'economy',
    'business', 'first'}"), and string hashing is randomised per process, so the same call could
    answer differently in a resumed, parallel or repeated run — and the model would see it. The
    hash seed is fixed once, before anything runs, unless the caller set one.
    """
    import os

    if "PYTHONHASHSEED" not in os.environ:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "seal_rl", *sys.argv[1:]])
    main()


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings of seal-rl's own (:class:`SealWarning`) as one line; others as Python prints them."""
    if issubclass(category, SealWarning):
        err.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


def main() -> None:
    """Entry point of the ``seal`` command: user errors, and a module of an extra that is not
    installed (:mod:`seal_rl.extras`), become one line on stderr and exit code 2."""
    warnings.showwarning = _show_warning
    try:
        app(prog_name="seal")  # also after entry() re-runs itself as `python -m seal_rl`
    except SealError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc)
        if message is None:
            raise
        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
