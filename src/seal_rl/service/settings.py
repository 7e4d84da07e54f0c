"""Settings of ``seal serve``, read from ``SEAL_*`` environment variables or given explicitly."""

from __future__ import annotations

import ipaddress
import os
from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost: addresses only this machine can reach."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServiceSettings(BaseSettings):
    """How the environment service runs. Every field can be set as ``SEAL_<FIELD>`` (e.g. ``SEAL_TOKEN``)."""

    model_config = SettingsConfigDict(env_prefix="SEAL_", extra="ignore")

    family: str = "bfcl"
    """the environment family whose episodes are served: ``bfcl``, ``tau2-DOMAIN``, ``pkg.module:Class`` or
    ``path/file.py:Class`` (docs/guides/your-environment.md)"""
    family_settings: dict[str, Any] = Field(default_factory=dict)
    """the family's settings (``SEAL_FAMILY_SETTINGS`` as JSON, e.g. ``{"solo": true}``)"""
    host: str = "127.0.0.1"
    """address to bind; anything but loopback needs ``token``"""
    port: int = Field(8082, ge=0, le=65535)
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=256)
    """worker processes that hold the episodes (BFCL backends are not thread-safe)"""
    token: str | None = None
    """bearer token every request except ``/health`` must carry (``Authorization: Bearer …``)"""
    max_episodes: int = Field(1024, ge=1)
    """live episodes at once; creating more answers 429 until some are released"""
    idle_timeout: float = Field(600.0, gt=0)
    """seconds an episode may go untouched before it is released"""
    step_timeout: float = Field(30.0, gt=0)
    """seconds one step, evaluation or creation may run; the episode fails after that"""
    kill_grace: float = Field(10.0, gt=0)
    """a worker still busy this long after ``step_timeout`` is killed and replaced (its episodes fail)"""
    max_request_bytes: int = Field(1_048_576, ge=1024)
    """larger request bodies answer 413"""
    max_model_calls_limit: int = Field(200, ge=1)
    """the largest ``max_model_calls`` an episode may ask for"""
    max_steps_per_turn_limit: int = Field(200, ge=1)
    """the largest ``max_steps_per_turn`` an episode may ask for"""
    max_message_chars_limit: int = Field(1_000_000, ge=1)
    """the largest ``max_message_chars`` (model message size) an episode may ask for"""
    max_calls_per_message_limit: int = Field(256, ge=1)
    """the largest ``max_calls_per_message`` an episode may ask for"""
    max_result_chars_limit: int = Field(1_000_000, ge=1)
    """the largest ``max_result_chars`` (one tool output) an episode may ask for"""
    observation_budget_chars_limit: int = Field(10_000_000, ge=1)
    """the largest ``observation_budget_chars`` (tool output per episode) an episode may ask for"""
    body_timeout: float = Field(30.0, gt=0)
    """seconds a request body may take to arrive in full, from its first byte read; a slower or
    trickling body answers 408 (``header_timeout`` bounds the headers)"""
    respawn_backoff: float = Field(0.5, gt=0)
    """seconds before a worker that failed to start is tried again; doubles with each failure in a row"""
    respawn_backoff_max: float = Field(30.0, gt=0)
    """the longest wait between two attempts to start a worker"""
    max_connections: int = Field(1000, ge=2)
    """open HTTP connections at once (uvicorn's ``limit_concurrency``, which answers 503 at it): the
    connection that reaches it closes the oldest one still waiting for request headers (or itself, when
    all have requests in progress), so idle sockets can neither use up the process's file descriptors
    nor crowd out ``/health``"""
    backlog: int = Field(256, ge=1)
    """connections the kernel queues before they are accepted (uvicorn's ``backlog``); asyncio also
    accepts up to this many in one go before any of them can be refused, so it counts toward the
    open files ``max_connections`` needs"""
    header_timeout: float = Field(10.0, gt=0)
    """seconds a connection may take to send a request's headers (from opening, or from its previous
    answer) before it is closed; uvicorn has no such timeout of its own"""
    keep_alive_timeout: float = Field(5.0, gt=0)
    """seconds an idle keep-alive connection is kept open after an answer (uvicorn's ``timeout_keep_alive``)"""
    log_burst: int = Field(20, ge=1)
    """log lines of one kind (same logger, level and message template) written per ``log_interval``;
    further ones are dropped, and their count is written with the next line of that kind"""
    log_interval: float = Field(60.0, gt=0)
    """seconds of the log rate limit's window"""

    @model_validator(mode="after")
    def _token_off_loopback(self) -> ServiceSettings:
        if not is_loopback(self.host) and not self.token:
            raise ValueError(
                f"host {self.host!r} is reachable from other machines, and the service executes tool calls for "
                "whoever connects; set a bearer token (--token or SEAL_TOKEN) or bind to 127.0.0.1."
            )
        if self.token is not None and len(self.token) < 16:
            raise ValueError("token must be at least 16 characters; e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`.")
        return self
