"""transformers ``generate`` on token ids (CPU or GPU)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from seal_rl.errors import SealWarning
from seal_rl.generators.decode_batch import DecodeBatch, Row
from seal_rl.generators.lockstep import Lockstep
from seal_rl.generators.prefix_cache import DEFAULT_MAX_TOKENS, PrefixCache, supports_prefix_cache
from seal_rl.rollout import Generation, Request
from seal_rl.trajectory import ChatTokens


class HFGenerator:
    """transformers on token ids, sampling or greedy, under either rollout scheduler.

    Continuous (:meth:`add` / :meth:`step`, :mod:`seal_rl.generators.decode_batch`): each request
    joins a decoding batch of at most ``max_batch`` rows as soon as it is asked, and leaves it as
    soon as its message ends; every :meth:`step` is one forward pass of the whole batch. Sampling
    draws from a generator seeded per request, so a message does not depend on which others shared
    its steps. Lockstep (:meth:`generate`): one ``generate`` per batch of up to ``max_batch``
    requests, left-padded, seeded per call.

    With ``lockstep`` (sharded weights on several ranks: FSDP, ZeRO-3) every forward pass is a
    collective, so the ranks agree before each tick on how many ``generate`` calls it takes, run
    them with ``synced_gpus`` (transformers keeps finished ranks stepping), and a rank whose episodes
    have ended keeps making one-token calls from :meth:`close` until every rank is done.

    Shared-prefix KV cache (:mod:`seal_rl.generators.prefix_cache`): with ``prefix_cache_tokens`` > 0
    (default 65,536) every prompt only prefills the tokens after the longest prefix it shares with a
    prompt read before (the tool prompt, the episode's conversation so far); up to that many tokens
    of states are kept, least recently used first out, and dropped when the weights change. 0 turns
    it off. It is off under ``lockstep`` (its per-prompt forward passes would not be matched across
    ranks; and sharded weights are gathered per pass anyway) and for models whose cache layers are
    not plain full-attention layers (sliding-window, linear attention), with a warning.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_batch: int = 16,
        lockstep: Lockstep | None = None,
        prefix_cache_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        self.model = model
        self.chat = ChatTokens(tokenizer)
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_batch = max_batch
        self.lockstep = lockstep
        self.prefix_cache: PrefixCache | None = None
        self.decode_steps = 0
        """forward passes that generated tokens so far (each ``generate`` call counts its longest message)"""
        self._batch = DecodeBatch(model, rows=max_batch)
        self._waiting: list[Row] = []
        self.continuous_unsupported = None if supports_prefix_cache(model) else (
            f"{type(model).__name__} has cache layers that cannot be cut and joined (sliding-window or linear attention)")
        """why :meth:`add`/:meth:`step` cannot run on this model, or None"""
        if prefix_cache_tokens > 0 and lockstep is None:
            if supports_prefix_cache(model):
                self.prefix_cache = PrefixCache(model, prefix_cache_tokens)
            else:
                warnings.warn(f"{type(model).__name__} has cache layers the prefix cache cannot cut and join "
                              "(sliding-window or linear attention); generating without it.", SealWarning, stacklevel=2)  # fmt: skip

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        import torch

        batches = [requests[start : start + self.max_batch] for start in range(0, len(requests), self.max_batch)]
        calls = len(batches) if self.lockstep is None else _most(self.lockstep.exchange(("calls", len(batches))))
        out: list[Generation | None] = []
        for call in range(calls):
            if call < len(batches):
                out += self._generate(batches[call], seed + call * self.max_batch)
            else:
                self._idle_call()
        return out

    def add(self, request: Request, seed: int) -> None:
        """Queue ``request``; it joins the decoding batch at the next :meth:`step` with room."""
        import torch

        rng = None
        if self.temperature > 0:
            rng = torch.Generator(device=next(self.model.parameters()).device)
            rng.manual_seed(seed)
        self._waiting.append(Row(request.episode, list(request.prompt_ids), request.max_new_tokens, rng))

    def step(self) -> list[tuple[int, Generation | None]]:
        """Admit waiting requests while the batch has room, run one forward pass, and return the
        messages that ended with it, as ``(episode, generation)``.

        Under ``lockstep`` the ranks first agree on the forward passes of this step (each admitted
        prompt is prefilled in its own pass, then one pass decodes): a rank with fewer makes
        one-token passes to match."""
        import torch

        admitted = self._waiting[: max(0, self.max_batch - len(self._batch))]
        del self._waiting[: len(admitted)]
        passes = len(admitted) + bool(admitted or self._batch)
        if self.lockstep is not None:
            spare = _most(self.lockstep.exchange(("passes", passes))) - passes
        ended: list[tuple[int, Generation | None]] = []
        with torch.no_grad(), _eval_mode(self.model):
            if admitted and self.prefix_cache is not None:
                self.prefix_cache.refresh()
            states = []
            for row in list(admitted):
                state = self._prompt_states(row.prompt) if len(row.prompt) > 1 else None
                if state is None:
                    admitted.remove(row)
                    ended.append((row.key, Generation("", error="the prompt has fewer than 2 tokens or the model kept no cache")))
                else:
                    states.append(state)
            self._batch.admit(admitted, states)
            if self._batch:
                logits = self._batch.forward()
                self.decode_steps += 1
                ended += self._take(logits)
            if self.lockstep is not None:
                for _ in range(spare):
                    self._idle_pass()
        return ended

    def _prompt_states(self, prompt: list[int]) -> list | None:
        """States of ``prompt`` except its last token: from the prefix cache, else one forward pass."""
        import torch
        from transformers import DynamicCache

        if self.prefix_cache is not None:
            return self.prefix_cache.prompt_states(prompt)
        cache = DynamicCache(config=self.model.config)
        device = next(self.model.parameters()).device
        self.model(input_ids=torch.tensor([prompt[:-1]], device=device), past_key_values=cache, use_cache=True)
        return [(layer.keys, layer.values) for layer in cache.layers] if cache.get_seq_length() == len(prompt) - 1 else None

    def _take(self, logits: Any) -> list[tuple[int, Generation]]:
        """Choose each row's next token (greedy, or sampled as ``generate`` samples: temperature, then
        top-p), and release the rows whose messages ended (an end-of-message token, or the budget)."""
        import torch

        if self.temperature > 0:
            scores = logits.float() / self.temperature
            if self.top_p < 1.0:
                scores = _top_p(scores, self.top_p)
            probs = torch.softmax(scores, dim=-1)
            chosen = [int(torch.multinomial(probs[i], 1, generator=row.rng)) for i, row in enumerate(self._batch.rows)]
        else:
            chosen = logits.argmax(dim=-1).tolist()
        ended, out = set(), []
        for i, (row, token) in enumerate(zip(self._batch.rows, chosen, strict=True)):
            row.generated.append(token)
            if token in self.chat.eos_ids or len(row.generated) >= row.budget:
                ended.add(i)
                out.append((row.key, Generation(self.chat.decode(row.generated), list(row.generated))))
        self._batch.release(ended)
        return out

    def close(self) -> None:
        """Keep the group's collective forward passes matched until every rank is done (lockstep only)."""
        if self.lockstep is not None:
            self.lockstep.drain(self._idle_calls)

    def _idle_calls(self, gathered: list[tuple[str, int] | None]) -> None:
        """Match the other ranks: their ``generate`` calls (lockstep ticks) or forward passes (:meth:`step`)."""
        kind = next(payload[0] for payload in gathered if payload is not None)
        idle = self._idle_pass if kind == "passes" else self._idle_call
        for _ in range(_most(gathered)):
            idle()

    def _idle_pass(self) -> None:
        """A one-token forward pass that takes part in the group's collectives and is thrown away
        (what :meth:`step` makes; ``generate`` with ``synced_gpus`` adds collectives of its own)."""
        import torch

        device = next(self.model.parameters()).device
        with torch.no_grad(), _eval_mode(self.model):
            self.model(input_ids=torch.tensor([[self.tokenizer.pad_token_id]], device=device), use_cache=False)

    def _idle_call(self) -> None:
        """A one-token ``generate`` that takes part in the group's collectives and is thrown away."""
        import torch

        device = next(self.model.parameters()).device
        ids = torch.tensor([[self.tokenizer.pad_token_id]], device=device)
        with torch.no_grad(), _eval_mode(self.model):  # as the real calls it matches
            self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False,
                                pad_token_id=self.tokenizer.pad_token_id, synced_gpus=True)  # fmt: skip

    def _generate(self, batch: Sequence[Request], seed: int) -> list[Generation]:
        import torch

        pad = self.tokenizer.pad_token_id
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):
            ids = torch.tensor(request.prompt_ids, dtype=torch.long)
            input_ids[row, width - len(ids):] = ids
            attention[row, width - len(ids):] = 1
        device = next(self.model.parameters()).device
        sampling = self.temperature > 0
        # Generate in eval mode: in training mode with gradient checkpointing on, transformers turns
        # the KV cache off but still feeds only the newest token, so every token after the first
        # is generated without the prompt (SmolLM2 wrote "The-----------"). Also no dropout. The
        # prefix cache's forward passes need the same (in training mode they would return no cache).
        with torch.no_grad(), _eval_mode(self.model):
            past = self.prefix_cache.past_key_values([r.prompt_ids for r in batch]) if self.prefix_cache is not None else None
            torch.manual_seed(seed)  # per-call seed: reruns and resumed runs sample the same
            output = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                past_key_values=past,
                max_new_tokens=max(r.max_new_tokens for r in batch),
                do_sample=sampling,
                temperature=self.temperature if sampling else None,
                top_p=self.top_p if sampling else None,
                # Stated, not left to the model: `generate` fills every unset option from the model's
                # generation_config.json, then transformers' defaults (top_k 50; hub chat models
                # often add top_k 20 and repetition_penalty 1.05). TRL samples with top_k 0 and
                # repetition_penalty 1.0, and so does the continuous path (temperature, top-p only).
                top_k=0,
                repetition_penalty=1.0,
                eos_token_id=sorted(self.chat.eos_ids),
                pad_token_id=pad,
                synced_gpus=self.lockstep is not None,
            )
        generations = []
        self.decode_steps += output.shape[1] - width
        for row, request in enumerate(batch):
            ids = output[row, width:].tolist()
            ids = ids[: request.max_new_tokens]
            if any(i in self.chat.eos_ids for i in ids):  # keep the first end-of-message token, drop padding
                ids = ids[: next(k for k, i in enumerate(ids) if i in self.chat.eos_ids) + 1]
            generations.append(Generation(self.chat.decode(ids), ids))
        return generations


@contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """The model in eval mode, then back in the mode it was in (even on error)."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def _top_p(scores: Any, top_p: float) -> Any:
    """Nucleus filtering as transformers' ``TopPLogitsWarper``: keep the smallest set of tokens whose
    probability reaches ``top_p`` (always the most likely one); the rest get ``-inf``."""
    import torch

    ordered, order = torch.sort(scores, descending=False)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1 - top_p)
    drop[..., -1:] = False
    return scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))


def _most(gathered: list[tuple[str, int] | None]) -> int:
    """The most ``generate`` calls (lockstep ticks) or forward passes (continuous steps) any rank of
    the group makes this time; ranks whose episodes are all done send None."""
    return max(payload[1] for payload in gathered if payload is not None)
