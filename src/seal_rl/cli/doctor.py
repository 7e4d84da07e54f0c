"""``seal doctor``: the machine facts a bug report or a GPU run needs (:mod:`seal_rl.doctor.facts`), and
with ``--gpu`` the GPU check (:mod:`seal_rl.doctor.gpu_check`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from seal_rl.cli.console import JsonOption, _print_json
from seal_rl.errors import SealError


def doctor_command(
    as_json: JsonOption = False,
    gpu: Annotated[bool, typer.Option("--gpu", help="Run the GPU check instead: each check in a process of its own with a timeout (docs/guides/doctor.md).")] = False,
    cpu_shapes: Annotated[bool, typer.Option("--cpu-shapes", help="With --gpu: the same checks at tiny shapes on the CPU (CI; about two minutes).")] = False,
    out: Annotated[Path, typer.Option(help="With --gpu: where gpu_check.json and gpu_check.log go.")] = Path("runs/gpu-check"),
    only: Annotated[str | None, typer.Option(help="With --gpu: comma-separated checks to run (default all), e.g. update,generate.")] = None,
) -> None:
    """Print what a bug report or a GPU run needs: CPU, bf16, GPUs, versions, extras, pulled models, BFCL and τ².

    Paste its output into a bug report. Nothing is loaded or downloaded; `--json` prints the same facts for scripts.
    """
    if not gpu:
        if cpu_shapes or only is not None or out != Path("runs/gpu-check"):
            raise SealError("--cpu-shapes, --out and --only belong to the GPU check: add --gpu.")
        from seal_rl.doctor.facts import gather, render

        facts = gather()
        return _print_json(facts) if as_json else print(render(facts))
    if as_json:
        raise SealError("--json prints the machine facts; the GPU check writes its figures to --out DIR/gpu_check.json.")
    from seal_rl.doctor import gpu_check

    gpu_check.selected(only)
    if not cpu_shapes:
        gpu_check.require_gpu()
    raise typer.Exit(gpu_check.run(cpu=cpu_shapes, out=out, only=only))
