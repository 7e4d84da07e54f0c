"""transformers ``generate`` on token ids (CPU or GPU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seal_rl.rollout import Generation, Request
from seal_rl.trajectory import ChatTokens


class HFGenerator:
    """transformers ``generate`` on token ids: left-padded batches, sampling or greedy."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_batch: int = 16,
    ) -> None:
        self.model = model
        self.chat = ChatTokens(tokenizer)
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.top_p = top_p
        self.max_batch = max_batch

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        import torch

        out: list[Generation | None] = []
        for start in range(0, len(requests), self.max_batch):
            batch = requests[start : start + self.max_batch]
            torch.manual_seed(seed + start)  # per-call seed: reruns and resumed runs sample the same
            out += self._generate(batch)
        return out

    def _generate(self, batch: Sequence[Request]) -> list[Generation]:
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
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                max_new_tokens=max(r.max_new_tokens for r in batch),
                do_sample=sampling,
                temperature=self.temperature if sampling else None,
                top_p=self.top_p if sampling else None,
                top_k=None,
                eos_token_id=sorted(self.chat.eos_ids),
                pad_token_id=pad,
            )
        generations = []
        for row, request in enumerate(batch):
            ids = output[row, width:].tolist()
            ids = ids[: request.max_new_tokens]
            if any(i in self.chat.eos_ids for i in ids):  # keep the first end-of-message token, drop padding
                ids = ids[: next(k for k, i in enumerate(ids) if i in self.chat.eos_ids) + 1]
            generations.append(Generation(self.chat.decode(ids), ids))
        return generations
