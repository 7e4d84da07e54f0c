"""Generation servers: episodes' requests sent straight to one or more ``vllm serve`` processes.

During training with ``generator: server`` every rank's episodes ask the servers for their next
message themselves, so generation is never a collective (TRL's own server mode gathers every
rank's prompts, which multi-turn episodes of different lengths would deadlock). Each request is one
``POST /v1/completions`` with the prompt as token ids, and comes back with the sampled token ids
(``return_token_ids``) and each token's log-probability (``logprobs: 0``; the server should run
with ``--logprobs-mode processed_logprobs``, the values after temperature, which TRL's importance
correction compares with the trainer's). The episode driver's continuous scheduler is unchanged:
this is a :class:`~seal_rl.rollout.StreamingGenerator`.

:class:`ServerPool` holds the servers: which one takes the next request (``least_loaded``: fewest
in flight, or ``round_robin``), which stopped answering (its requests are retried on the others,
and one line says so), and the weight-sync routes of vLLM's development mode
(``VLLM_SERVER_DEV_MODE=1``): ``/pause``, ``/collective_rpc``, ``/reset_prefix_cache``,
``/resume``. The trainer side of a sync (the weights gathered from ZeRO-3/FSDP shards) is in
:mod:`seal_rl.train.server_sync`.

Every generation carries the weight versions it ran under (:attr:`Generation.weight_versions`: the
version when it was sent and when it came back; they differ when a sync paused it half-way), which
asynchronous rounds (:mod:`seal_rl.train.async_rounds`) admit and drop groups by.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from seal_rl.errors import SealError, SealWarning
from seal_rl.generators.event_loop import BackgroundLoop
from seal_rl.rollout import Generation, Request, derived_seed
from seal_rl.trajectory import ChatTokens

BALANCES = ("least_loaded", "round_robin")
WEIGHT_SYNCS = ("auto", "reload", "nccl")
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class ServerConfig:
    """The recipe's ``server:`` section (``generator: server``)."""

    urls: list[str] = field(default_factory=list)
    """the servers' base URLs (``http://host:8000``), each a ``vllm serve`` of the trained model
    (``seal rollout-server MODEL`` starts one with the settings below)"""
    weight_sync: str = "auto"
    """how the trainer's weights reach the servers after every update: ``reload`` (written to
    ``weights_dir`` and loaded by each server through ``/collective_rpc``; any device, the servers
    must read that directory), ``nccl`` (TRL's ``VLLMClient`` over vLLM's NCCL weight transfer; CUDA
    only, the server started with ``--weight-transfer-config '{"backend": "nccl"}'``), ``auto``
    (nccl where the trainer has CUDA, else reload)"""
    balance: str = "least_loaded"
    """which server takes the next request: ``least_loaded`` (fewest in flight) or ``round_robin``"""
    weights_dir: str | None = None
    """``reload``: where the trainer writes the weights the servers load (a directory they can read;
    None: ``server_weights/`` in the run directory)"""
    timeout: float = 600.0
    """seconds a request may take before it is retried on another server"""
    max_retries: int = 2
    """further tries of a failed request (each on another live server where there is one); after
    them the episode ends with ``generation_error``, excluded from success rates"""
    concurrency: int = 256
    """connections per server each training process may hold (the HTTP client's limit is this times the
    servers): requests beyond it wait in the client"""
    check_tolerance: float = 0.05
    """at start: the largest difference allowed between a server's and the trainer's log-probability
    of a probe sequence, after the first weight sync (a different model is refused)"""

    def __post_init__(self) -> None:
        if not self.urls:
            raise SealError("generator: server needs server.urls: the base URLs of one or more `vllm serve` processes "
                            "(start one with `seal rollout-server MODEL`).")  # fmt: skip
        for url in self.urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise SealError(f"server.urls: {url!r} is not an http:// or https:// URL.")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise SealError(f"server.weight_sync must be one of {', '.join(WEIGHT_SYNCS)}, got {self.weight_sync!r}.")
        if self.balance not in BALANCES:
            raise SealError(f"server.balance must be one of {', '.join(BALANCES)}, got {self.balance!r}.")
        if self.timeout <= 0 or self.max_retries < 0 or self.concurrency < 1:
            raise SealError("server: need timeout > 0, max_retries >= 0 and concurrency >= 1.")


@dataclass
class Server:
    """One server of the pool and what the pool knows of it."""

    url: str
    model: str = ""
    """the name it serves (``/v1/models``), sent with every request"""
    max_model_len: int = 0
    cpu: bool = False
    """vLLM's CPU build (``/server_info``): per-request seeds crash its engine ("CPU Generator does not
    use offset"), so its requests carry none"""
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    down: str | None = None
    """why it was taken out of the pool (None: it takes requests)"""


class ServerPool:
    """The generation servers: health, choice of server per request, and the weight-sync routes.

    Synchronous calls (:meth:`connect`, :meth:`post`) use ``httpx``'s blocking client; the
    generator's requests use its asynchronous one on the generator's event loop.
    """

    def __init__(self, config: ServerConfig, log: Any = None) -> None:
        self.config = config
        self.servers = [Server(url.rstrip("/")) for url in config.urls]
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self.log = log if log is not None else (lambda line: warnings.warn(line, SealWarning, stacklevel=3))

    def connect(self, timeout: float = 30.0) -> None:
        """Ask every server what it serves (``GET /v1/models``); one line and no training when one
        cannot be reached or the servers disagree."""
        import httpx

        for server in self.servers:
            try:
                response = httpx.get(f"{server.url}/v1/models", timeout=timeout)
                response.raise_for_status()
                model = response.json()["data"][0]
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                raise SealError(f"Generation server {server.url} cannot be reached ({type(exc).__name__}: {exc}); start it "
                                "(`seal rollout-server MODEL --port PORT`) or fix server.urls.") from None  # fmt: skip
            server.model, server.max_model_len = str(model["id"]), int(model.get("max_model_len") or 0)
            try:  # a dev-mode route: without it the server cannot take a weight sync either
                info = httpx.get(f"{server.url}/server_info", timeout=timeout)
                server.cpu = info.status_code == 200 and "device_config=cpu" in str(info.json().get("vllm_config", ""))
            except (httpx.HTTPError, ValueError, AttributeError):
                server.cpu = False
        lengths = {s.max_model_len for s in self.servers}
        if len(lengths) > 1:
            raise SealError(f"The generation servers have different context lengths ({sorted(lengths)}); start them alike.")

    @property
    def live(self) -> list[Server]:
        return [s for s in self.servers if s.down is None]

    @property
    def context_tokens(self) -> int | None:
        return min((s.max_model_len for s in self.servers if s.max_model_len), default=None)

    def choose(self, avoid: set[str] = frozenset()) -> Server | None:
        """The server for the next request (None: none is live); ``avoid``: those that just failed it."""
        with self._lock:
            candidates = [s for s in self.live if s.url not in avoid] or self.live
            if not candidates:
                return None
            if self.config.balance == "round_robin":
                server = candidates[next(self._turn) % len(candidates)]
            else:
                start = next(self._turn) % len(candidates)  # ties go round the pool
                rotated = candidates[start:] + candidates[:start]
                server = min(rotated, key=lambda s: s.in_flight)
            server.in_flight += 1
            server.requests += 1
            return server

    def release(self, server: Server, failure: str | None = None) -> None:
        """A request to ``server`` is over; ``failure``: why it failed (the server leaves the pool)."""
        with self._lock:
            server.in_flight -= 1
            if failure is None:
                return
            server.failures += 1
            if server.down is not None:
                return
            server.down = failure
            left = len(self.live)
        self.log(f"generation server {server.url} stopped answering ({failure}); its requests go to the "
                 f"{left} other{'s' if left != 1 else ''}" + ("" if left else ": none is left, episodes end with generation_error"))  # fmt: skip

    def revive(self) -> list[Server]:
        """Servers that left the pool and answer ``/health`` again rejoin it; returns them."""
        import httpx

        back = []
        for server in self.servers:
            if server.down is None:
                continue
            try:
                if httpx.get(f"{server.url}/health", timeout=5.0).status_code == 200:
                    server.down = None
                    back.append(server)
            except httpx.HTTPError:
                pass
        return back

    def post(self, server: Server, path: str, json: Any = None, timeout: float | None = None) -> Any:
        """A blocking POST to one server's route; its JSON answer (None when empty). Failures raise
        :class:`SealError` with the server, the route and what it said."""
        import httpx

        try:
            response = httpx.post(f"{server.url}{path}", json=json, timeout=timeout or self.config.timeout)
        except httpx.HTTPError as exc:
            raise SealError(f"Generation server {server.url}: {path} failed ({type(exc).__name__}: {exc}).") from None
        if response.status_code != 200:
            hint = " (start it with VLLM_SERVER_DEV_MODE=1: `seal rollout-server` does)" if response.status_code == 404 else ""
            raise SealError(f"Generation server {server.url}: {path} answered HTTP {response.status_code}: {response.text[:300]}{hint}")
        return response.json() if response.content else None

    def reload(self, weights_path: str, method: str = "seal_reload_weights", loaded: Any = None) -> float:
        """Every live server loads the checkpoint in ``weights_path``: all pause (requests in flight
        are kept and resume under the new weights), each runs ``collective_rpc(method, weights_path)``
        and drops its prefix cache (its keys and values are the old weights'), ``loaded()`` runs
        while they are still paused (the caller raises its weight version there, so no answer of the
        new weights is counted under the old one), and all resume. Returns the seconds."""
        started = time.perf_counter()
        paused = []
        try:
            for server in self.live:
                self.post(server, "/pause?mode=keep")
                paused.append(server)
            for server in paused:
                self.post(server, "/collective_rpc", {"method": method, "kwargs": {"weights_path": weights_path}})
                self.post(server, "/reset_prefix_cache")
            if loaded is not None:
                loaded()
        finally:
            for server in paused:
                self.post(server, "/resume")
        return time.perf_counter() - started


class VLLMServerGenerator:
    """Token ids in, token ids and their sampling log-probabilities out, from a :class:`ServerPool`.

    ``sampling``: the request fields every request carries (temperature, top_p, top_k, min_p,
    repetition_penalty: TRL's settings). Each request's seed is derived from the driver's seed and
    the episode (``seed`` is sent; vLLM samples a request from its own generator then), so a rerun
    asks the same. :attr:`version` is the weight version the servers hold; the trainer's sync sets it.
    """

    def __init__(self, pool: ServerPool, chat: ChatTokens, sampling: dict[str, Any] | None = None) -> None:
        self.pool = pool
        self.chat = chat
        self.sampling = dict(sampling or {})
        self.version = 0
        """the weight version the servers hold (0: the weights they started with)"""
        self.context_tokens: int | None = pool.context_tokens
        self.stopped = False
        self.failures = 0
        """requests that failed on a server (each retried elsewhere or ended as generation_error)"""
        self._loop = BackgroundLoop("vllm-server-generator", self._open, self._close_client)

    # -- the StreamingGenerator protocol --------------------------------------------------------

    def submit(self, request: Request, seed: int) -> Future[Generation | None]:
        if self.stopped:  # the run is over: episodes still playing end at once instead of asking the servers
            done: Future[Generation | None] = Future()
            done.set_result(Generation("", error="generation stopped: the training run has ended"))
            return done
        return self._loop.submit(self._one(request, derived_seed(seed, request.episode)))

    def stop(self) -> None:
        """Answer every later request with a ``generation_error`` at once (the end of a run: groups a
        producer still plays end instead of holding the process), then :meth:`close`."""
        self.stopped = True
        self.close()

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        return [future.result() for future in [self.submit(r, seed) for r in requests]]

    def close(self) -> None:
        """Cancel requests in flight (their episodes' futures raise), close the connections and stop
        the event loop (a later request starts them again)."""
        self._loop.close()

    async def _open(self) -> None:
        import httpx

        limits = httpx.Limits(max_connections=self.pool.config.concurrency * len(self.pool.servers))
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.pool.config.timeout), limits=limits)

    async def _close_client(self) -> None:
        await self._client.aclose()

    # -- one request -----------------------------------------------------------------------------

    def payload(self, request: Request, seed: int, server: Server) -> dict[str, Any]:
        """The ``/v1/completions`` body of one request (no seed for a server on vLLM's CPU build)."""
        return {
            "model": server.model, "prompt": list(request.prompt_ids or []), "max_tokens": request.max_new_tokens,
            "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False, **({} if server.cpu else {"seed": seed}),
            "stop_token_ids": sorted(self.chat.stops.ids), **self.sampling,
        }  # fmt: skip

    async def _one(self, request: Request, seed: int) -> Generation:
        import httpx

        sent_under, tried, last = self.version, set(), "no live server"
        for _ in range(self.pool.config.max_retries + 1):
            server = self.pool.choose(avoid=tried)
            if server is None:
                break
            tried.add(server.url)
            try:
                response = await self._client.post(f"{server.url}/v1/completions", json=self.payload(request, seed, server))
            except asyncio.CancelledError:  # the generator is closing: the server did nothing wrong
                self.pool.release(server)
                raise
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                self.failures += 1
                self.pool.release(server, last)
                continue
            if response.status_code == 200:
                self.pool.release(server)
                try:
                    return self._generation(response.json(), sent_under)
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    return Generation("", error=f"unreadable answer from {server.url} ({exc})")
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            self.failures += 1
            if response.status_code in RETRYABLE:
                self.pool.release(server, last)
                continue
            self.pool.release(server)  # the request is at fault, not the server
            return Generation("", error=f"{server.url} refused the request ({last})")
        return Generation("", error=f"no generation server answered ({last})")

    def _generation(self, data: dict[str, Any], sent_under: int) -> Generation:
        choice = data["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        given = (choice.get("logprobs") or {}).get("token_logprobs")
        logprobs = None if given is None else [None if v is None else float(v) for v in given][: len(ids)]
        return Generation(self.chat.decode(ids), ids, logprobs, weight_versions=(sent_under, self.version))
