"""seal-rl models as τ²'s LLMs: a litellm provider in front of a shared generator.

τ²'s agent (``tau2.agent.llm_agent.LLMAgent``) and user simulator
(``tau2.user.user_simulator.UserSimulator``) ask litellm for each message. seal-rl registers a
litellm custom provider (``seal-rl/NAME``), so both run unchanged — their prompts, guidelines,
retries and message handling are τ²'s own — while the message comes from an ``hf:`` or ``vllm:``
model with the model's chat template and seal-rl's call formats:

* ``--prompt-mode bfcl_qwen_fc``: the tools are a Qwen/hermes ``# Tools`` block after τ²'s system
  prompt, past calls are written in ``--format`` and tool results are ``<tool_response>`` blocks
  in a user message (how seal-rl trains); ``chat_template``: the tools go to the template's
  ``tools`` and results are ``tool`` messages.
* The reply is parsed by ``--format`` (``native``: the tokenizer's response parser) into τ² tool
  calls or text. Nothing is ever evaluated: a reply whose call markup does not parse is passed on
  as its text (τ² sends it to the user), with the parse error kept in the message's ``raw_data``
  (``seal``) for the failure profile; an unknown tool or wrong arguments reach τ²'s environment,
  which answers with its own error message. A conversation that no longer fits the model's
  context ends with τ²'s ``agent_error`` / ``user_error``.

Many conversations run at once, each on its own thread: an :class:`Engine` owns the generator and
feeds it from all of them (continuous batching where the generator can, :mod:`seal_rl.rollout`).
``openai:`` players need none of this: litellm's own OpenAI provider calls the server.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from seal_rl.errors import SealError
from seal_rl.interface import qwen_tools_block
from seal_rl.rollout import Generation, Request, derived_seed, resolve_scheduler
from seal_rl.tools import ParsedMessage, ToolCall, get_format
from seal_rl.trajectory import ChatTokens, render_or_explain

PROVIDER = "seal-rl"
"""the litellm provider name: τ² players are given ``llm="seal-rl/NAME"``"""


class PlayerFailure(Exception):
    """The model's side of the conversation cannot go on (it no longer fits the model's context):
    the conversation ends as τ²'s ``agent_error`` / ``user_error``. litellm wraps whatever a custom
    provider raises in its ``APIConnectionError``; this one, in the chain, says it was the player."""


class EngineError(Exception):
    """The generator could not answer (a server down, retries spent): the conversation is recorded
    as a generation error and played again on resume, as ``seal eval`` does for BFCL."""


def engine_failure(tau2: SimpleNamespace, exc: BaseException) -> bool:
    """Whether ``exc`` says no message could be generated (a server down, an engine that failed),
    not something a player did: an :class:`EngineError` or litellm's connection-level errors,
    unless a :class:`PlayerFailure` of seal-rl's provider is what litellm wrapped."""
    litellm = tau2.litellm
    infrastructure = (litellm.APIConnectionError, litellm.Timeout, litellm.RateLimitError, litellm.ServiceUnavailableError,
                      litellm.InternalServerError, litellm.AuthenticationError, litellm.NotFoundError)  # fmt: skip
    chain, seen = [], exc
    while seen is not None and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(e, EngineError) for e in chain):
        return True
    if any(isinstance(e, PlayerFailure) for e in chain):
        return False
    return isinstance(exc, infrastructure)


def to_seal_messages(messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, prompt_mode: str,
                     call_format: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:  # fmt: skip
    """τ²'s conversation (litellm's OpenAI-shaped messages) as seal-rl renders an episode: the
    messages for the chat template, and the tools the template takes (``chat_template`` mode)."""
    fmt = get_format(call_format)
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = [ToolCall(c["function"]["name"], _arguments(c["function"].get("arguments"))) for c in message["tool_calls"]]
            written = fmt.render(calls, content)
            if isinstance(written, dict):  # native: structured tool_calls, with τ²'s ids
                for call, given in zip(written["tool_calls"], message["tool_calls"]):
                    call["id"] = given.get("id") or call["id"]
                out.append(written)
            else:
                out.append({"role": "assistant", "content": written})
        elif role == "tool":
            if prompt_mode == "chat_template":
                out.append({"role": "tool", "content": content, **({"tool_call_id": message["tool_call_id"]} if message.get("tool_call_id") else {})})
            else:  # consecutive results share one user message, as in seal-rl's episodes
                block = f"<tool_response>\n{content}\n</tool_response>"
                if out and out[-1].get("_results"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_results": True})
        else:
            out.append({"role": role, "content": content})
    for message in out:
        message.pop("_results", None)
    if prompt_mode == "chat_template":
        return out, tools or None
    if not tools:
        return out, None
    block = qwen_tools_block([json.dumps(tool) for tool in tools])
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out, None


def _encodable(text: str) -> str:
    """``text`` with lone surrogates (half an emoji, which a server's reply can hold) as ``?``:
    tokenizers cannot encode them."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Reply:
    """One generated message: its raw text, what the call format read in it, and token counts."""

    text: str
    parsed: ParsedMessage
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class Engine:
    """A seal-rl generator (``make_generator``'s) answering many conversations' threads at once.

    One thread owns the generator. Under the ``continuous`` scheduler it adds each request as it
    arrives and takes one decoding step at a time, so a message starts as soon as its conversation
    asks; under ``lockstep`` it answers whatever has queued in one batch."""

    def __init__(self, generator: Any, chat: ChatTokens, *, prompt_mode: str, call_format: str, max_new_tokens: int,
                 scheduler: str = "auto") -> None:  # fmt: skip
        self.generator, self.chat = generator, chat
        self.prompt_mode, self.call_format, self.max_new_tokens = prompt_mode, call_format, max_new_tokens
        self.format = get_format(call_format)
        self.scheduler = resolve_scheduler(generator, scheduler)
        model = getattr(generator, "model", None)
        self.context = getattr(generator, "context_tokens", None) or getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self._ids = itertools.count()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="seal-tau2-engine", daemon=True)
        self._thread.start()

    def reply(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None, seed: int) -> Reply:
        """The next message of a conversation (litellm's messages and tools), parsed."""
        shown, template_tools = to_seal_messages(messages, tools, self.prompt_mode, self.call_format)
        text = render_or_explain(self.chat.tokenizer, shown, tools=template_tools, generation_prompt=True)
        prompt = self.chat.encode(_encodable(text))
        budget = self.max_new_tokens if self.context is None else min(self.max_new_tokens, self.context - len(prompt))
        if budget < 1:
            raise PlayerFailure(f"the conversation ({len(prompt)} tokens) no longer fits the model's context ({self.context} tokens)")
        request = Request(next(self._ids), None, shown, [], {}, prompt, budget, template_tools)  # type: ignore[arg-type]
        future: Future = Future()
        self._queue.put((request, derived_seed(seed, len(messages)), future))
        generation: Generation | None = future.result()
        if generation is None or generation.error is not None:
            raise EngineError(generation.error if generation is not None else "the generator returned no message")
        ids = generation.token_ids
        if self.chat.native and ids is not None:
            parsed = self.format.parse(self.chat.response(ids, prompt, template_tools))
        else:
            parsed = self.format.parse(generation.text)
        used = len(ids) if ids is not None else len(self.chat.encode(_encodable(generation.text)))
        stopped = ids is not None and bool(ids) and ids[-1] in self.chat.eos_ids
        return Reply(generation.text, parsed, len(prompt), used, "stop" if stopped or ids is None else "length")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if hasattr(self.generator, "close"):
            self.generator.close()

    def _serve(self) -> None:
        asked: dict[int, Future] = {}
        while True:
            items = [self._queue.get()] if not asked else []
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if None in items:
                for future in asked.values():
                    future.set_exception(EngineError("the engine was closed"))
                return
            try:
                if self.scheduler == "lockstep":
                    answers = self.generator.generate([r for r, _, _ in items], items[0][1])
                    for (_, _, future), answer in zip(items, answers):
                        future.set_result(answer)
                    continue
                for request, seed, future in items:
                    self.generator.add(request, seed)
                    asked[request.episode] = future
                for episode, generation in self.generator.step():
                    asked.pop(episode).set_result(generation)
            except Exception as exc:  # noqa: BLE001 - an engine failure fails its requests, not the thread
                for future in [*asked.values(), *(f for _, _, f in items)]:
                    if not future.done():
                        future.set_exception(EngineError(f"{type(exc).__name__}: {exc}"))
                asked.clear()


def _provider_class() -> type:
    from litellm.llms.custom_llm import CustomLLM
    from litellm.types.utils import Choices, Message, Usage

    class SealProvider(CustomLLM):
        """litellm's ``seal-rl/NAME`` models: each name is an :class:`Engine`."""

        def __init__(self) -> None:
            super().__init__()
            self.engines: dict[str, Engine] = {}

        def completion(self, model: str, messages: list, *args: Any, optional_params: dict, model_response: Any, **kwargs: Any) -> Any:
            engine = self.engines.get(model.removeprefix(f"{PROVIDER}/"))
            if engine is None:
                raise SealError(f"No seal-rl engine is serving {model!r}.")
            try:
                reply = engine.reply(messages, optional_params.get("tools"), int(optional_params.get("seed") or 0))
            except EngineError:
                raise
            except Exception as exc:  # noqa: BLE001 - marked as the player's, whatever litellm wraps it in
                raise PlayerFailure(f"{type(exc).__name__}: {exc}") from exc
            calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                      "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in reply.parsed.calls]  # fmt: skip
            content = reply.text if reply.parsed.error or not calls else (reply.parsed.text or None)
            message = Message(content=content, role="assistant", tool_calls=calls or None)
            message.provider_specific_fields = {"seal": {"raw": reply.text, "parse_error": reply.parsed.error}}
            model_response.choices = [Choices(finish_reason=reply.finish_reason, index=0, message=message)]
            model_response.model = model
            model_response.usage = Usage(prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                                         total_tokens=reply.prompt_tokens + reply.completion_tokens)  # fmt: skip
            return model_response

    return SealProvider


@contextmanager
def serving(litellm: Any, engines: dict[str, Engine]) -> Iterator[dict[str, str]]:
    """Serve ``engines`` to litellm for the duration: yields each name's litellm model string.
    litellm keeps its custom providers in module state; the provider is registered once per process
    and the names are unique per run, so runs in one process do not see each other's engines."""
    entry = next((e for e in litellm.custom_provider_map if e["provider"] == PROVIDER), None)
    if entry is None:
        entry = {"provider": PROVIDER, "custom_handler": _provider_class()()}
        litellm.custom_provider_map.append(entry)
        from litellm.utils import custom_llm_setup

        custom_llm_setup()
    provider = entry["custom_handler"]
    names = {name: f"{name}-{uuid.uuid4().hex[:8]}" for name in engines}
    provider.engines.update({names[name]: engine for name, engine in engines.items()})
    try:
        yield {name: f"{PROVIDER}/{unique}" for name, unique in names.items()}
    finally:
        for unique in names.values():
            provider.engines.pop(unique, None)
