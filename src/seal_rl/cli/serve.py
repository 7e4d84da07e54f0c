"""``seal serve``: the environment as an HTTP service (:mod:`seal_rl.service`); ``seal serve-openenv``; and
``seal rollout-server``, a vLLM generation server for ``generator: server`` training."""

from __future__ import annotations

from typing import Annotated

import typer

from seal_rl.cli.console import FamilySetOption, err, family_settings
from seal_rl.errors import SealError

def serve_command(
    family: Annotated[str | None, typer.Option(help="The environment family to serve: bfcl (default), tau2-DOMAIN, pkg.module:Class or path/to/file.py:Class (docs/guides/your-environment.md).")] = None,
    family_set: FamilySetOption = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1; anything else needs --token).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8082).")] = None,
    workers: Annotated[int | None, typer.Option(help="Worker processes holding episodes (default: CPU count).")] = None,
    token: Annotated[str | None, typer.Option(help="Bearer token required on every request but /health (or SEAL_TOKEN).")] = None,
    max_episodes: Annotated[int | None, typer.Option(help="Live episodes at once (default 1024); more answer 429.")] = None,
    idle_timeout: Annotated[float | None, typer.Option(help="Seconds before an untouched episode is released (default 600).")] = None,
    step_timeout: Annotated[float | None, typer.Option(help="Seconds one step may run before its episode fails (default 30).")] = None,
    max_request_bytes: Annotated[int | None, typer.Option(help="Largest request body (default 1 MiB); larger answer 413.")] = None,
) -> None:
    """Serve the environment over HTTP: episodes, steps, verifier reward and diagnosis (docs/guides/service.md).

    Every option can also be set as an environment variable SEAL_<OPTION> (e.g. SEAL_WORKERS=8).
    """
    import socket

    from pydantic import ValidationError

    from seal_rl.service.server import ensure_descriptors, serve
    from seal_rl.service.settings import ServiceSettings

    given = {"family": family, "family_settings": family_settings(family_set) if family_set else None, "host": host, "port": port, "workers": workers, "token": token, "max_episodes": max_episodes,
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
    serve(settings, announce=lambda: err.print(f"seal serve: {settings.family} episodes, {settings.workers} workers on "
                                               f"http://{settings.host}:{settings.port} (API docs at /docs)"))  # fmt: skip


def serve_openenv_command(
    host: Annotated[str, typer.Option(help="Address to bind (OpenEnv has no auth: keep it local or behind a proxy).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (OpenEnv's default 8000).")] = 8000,
    max_sessions: Annotated[int, typer.Option(help="WebSocket sessions (episodes) at once.")] = 64,
) -> None:
    """Serve the environment as an OpenEnv environment: reset/step/state over OpenEnv's HTTP and
    WebSocket API, verdict and diagnosis in the final observation (docs/guides/integrations.md)."""
    import socket

    if max_sessions < 1:
        raise SealError(f"--max-sessions must be at least 1, got {max_sessions}.")
    try:
        import uvicorn

        from seal_rl.integrations.openenv import create_bfcl_app
    except ImportError as exc:
        raise SealError(f"OpenEnv is not installed here ({exc}): `make install-openenv` builds .venv-openenv "
                        "(openenv cannot share the main environment's lock); run .venv-openenv/bin/seal serve-openenv.") from None  # fmt: skip
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise SealError(f"Cannot listen on {host}:{port} ({exc.strerror}); choose another --port.") from None
    err.print(f"seal serve-openenv: OpenEnv environment seal_bfcl on http://{host}:{port} (/reset, /step, /state, /schema, /ws)")
    if host not in ("127.0.0.1", "localhost", "::1"):
        err.print(f"warning: OpenEnv's server has no authentication; anyone who reaches {host}:{port} can play episodes "
                  "(`seal serve` has a bearer token).")  # fmt: skip
    uvicorn.run(create_bfcl_app(max_sessions), host=host, port=port, log_level="warning")


def rollout_server_command(
    model: Annotated[str, typer.Argument(help="The model to serve: a directory or a pulled model's name (seal models list); "
                                              "the trainer's weights replace it at the first sync.")],
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind (the trainer's nodes must reach it; the dev routes have no auth).")] = "127.0.0.1",
    dtype: Annotated[str | None, typer.Option(help="vLLM's dtype (default: the checkpoint's, as the trainer loads it).")] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Longest sequence (default: the model's).")] = None,
    nccl: Annotated[bool, typer.Option("--nccl", help="Open vLLM's NCCL weight transfer (server.weight_sync: nccl; GPUs only).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the command and its environment instead of running it.")] = False,
    vllm_args: Annotated[list[str] | None, typer.Argument(help="More `vllm serve` options, after --.")] = None,
) -> None:
    """Start a generation server for `generator: server` training: `vllm serve` with what seal's
    weight sync and importance correction need (docs/guides/servers.md, "Generation servers")."""
    from seal_rl.generators.server_launch import launch

    launch(model, port=port, host=host, dtype=dtype, max_model_len=max_model_len, nccl=nccl, dry_run=dry_run,
           extra=vllm_args or [])  # fmt: skip
