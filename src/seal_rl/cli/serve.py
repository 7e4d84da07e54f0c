"""``seal serve``: the environment as an HTTP service (:mod:`seal_rl.service`)."""

from __future__ import annotations

from typing import Annotated

import typer

from seal_rl.cli.console import err
from seal_rl.errors import SealError

def serve_command(
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1; anything else needs --token).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8082).")] = None,
    workers: Annotated[int | None, typer.Option(help="Worker processes holding episodes (default: CPU count).")] = None,
    token: Annotated[str | None, typer.Option(help="Bearer token required on every request but /health (or SEAL_TOKEN).")] = None,
    max_episodes: Annotated[int | None, typer.Option(help="Live episodes at once (default 1024); more answer 429.")] = None,
    idle_timeout: Annotated[float | None, typer.Option(help="Seconds before an untouched episode is released (default 600).")] = None,
    step_timeout: Annotated[float | None, typer.Option(help="Seconds one step may run before its episode fails (default 30).")] = None,
    max_request_bytes: Annotated[int | None, typer.Option(help="Largest request body (default 1 MiB); larger answer 413.")] = None,
) -> None:
    """Serve the environment over HTTP: episodes, steps, verifier reward and diagnosis (docs/service.md).

    Every option can also be set as an environment variable SEAL_<OPTION> (e.g. SEAL_WORKERS=8).
    """
    import socket

    from pydantic import ValidationError

    from seal_rl.service.server import ensure_descriptors, serve
    from seal_rl.service.settings import ServiceSettings

    given = {"host": host, "port": port, "workers": workers, "token": token, "max_episodes": max_episodes,
             "idle_timeout": idle_timeout, "step_timeout": step_timeout, "max_request_bytes": max_request_bytes}  # fmt: skip
    try:
        settings = ServiceSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise SealError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())) from None
    try:
        with socket.create_server((settings.host, settings.port)):
            pass
    except OSError as exc:
        raise SealError(f"Cannot listen on {settings.host}:{settings.port} ({exc.strerror}); choose another --port.") from None
    ensure_descriptors(settings)
    err.print(f"seal serve: {settings.workers} workers on http://{settings.host}:{settings.port} (API docs at /docs)")
    serve(settings)
