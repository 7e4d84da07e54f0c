"""A shared-prefix KV cache: prompts only prefill the tokens no earlier prompt had.

Every model call of a BFCL episode starts with the same several-thousand-token system/tool prompt,
and every call after the first also repeats the whole conversation so far; tasks with the same
backends share the tool prompt. :class:`PrefixCache` keeps the key/value states (transformers'
``DynamicCache`` layers) of prompts a model has read, and builds the ``past_key_values`` of a new
batch from the longest prefix each prompt shares with a kept one, prefilling only the rest.

How a batch is served (:meth:`PrefixCache.past_key_values`):

1. each prompt ``p`` (its last token excluded: ``generate`` must feed at least one token) finds
   the kept entry with the longest common prefix, takes that many positions of its states (views,
   no copy) and runs the model forward on the remaining tokens, one prompt at a time (no padding),
   which extends a ``DynamicCache``; the result is kept as a new entry;
2. the rows are left-padded to the longest prompt, as the no-cache path pads its input ids, and
   stacked into one ``DynamicCache``; ``generate`` then gets the full left-padded ids and attention
   mask, computes the positions from the mask (so row ``i``'s token ``j`` has position ``j`` either
   way) and feeds only the last column.

Exactness: the cached states are the same function of the same tokens at the same positions, but
computed in different chunks (and without padding), so logits can differ in the last bits of
floating point from a single full prefill. Greedy tokens are the same unless two logits tie to
that precision (the tests compare token for token); sampling with the same seed draws the same
random numbers, so samples are the same unless a draw falls that close to a boundary.

Memory is bounded by ``max_tokens``: the total prompt length of the kept entries, least recently
used first out. An entry that is a prefix of a newer one is dropped (the newer serves everything
it did), so a multi-turn episode holds one entry, its latest prompt. The states are the model's
(dtype, device): per token ``2 x layers x kv_heads x head_dim`` numbers, e.g. 24.6 KB for
Qwen2.5-0.5B in float32 (65,536 tokens: 1.6 GB), 57 KB for Qwen2.5-7B in bfloat16.

The cache is emptied when the weights change: every call compares a fingerprint of the
parameters (their storage pointers, autograd version counters, which every in-place update
through autograd-visible tensors bumps — optimizer steps, ``load_state_dict``, ``with
torch.no_grad(): p.add_(...)`` — and a strided sample of their values, which catches dense
writes through ``p.data``). Code that changes a few weights through ``.data`` must call
:meth:`PrefixCache.clear`.

Models whose cache layers are not plain full-attention ``DynamicLayer``s (sliding-window,
linear-attention or hybrid models) are not supported: :func:`supports_prefix_cache` says so and
the generator then runs without the cache.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_TOKENS = 65536
"""tokens of prompt states kept by default: 8 concurrent episodes of 8k-token prompts"""

_PROBES_PER_TENSOR = 16


def supports_prefix_cache(model: Any) -> bool:
    """Whether ``model``'s generation cache is one plain ``DynamicLayer`` per layer (full attention),
    whose states can be cut at any position and concatenated."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # a model transformers' DynamicCache cannot describe
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def last_logits_only(model: Any) -> dict[str, int]:
    """The forward keyword that makes ``model`` compute logits for the last position only
    (``logits_to_keep=1``), or nothing for a model whose forward does not take it."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def weights_fingerprint(model: Any) -> tuple:
    """Something that changes when ``model``'s weights change (see the module docstring)."""
    import torch

    pointers, probes = [], []
    for tensor in (*model.parameters(), *model.buffers()):
        try:
            version = tensor._version
        except RuntimeError:  # inference tensors have no version counter
            version = -1
        pointers.append((tensor.data_ptr(), version))
        flat = tensor.detach().reshape(-1)
        if flat.numel():
            probes.append(flat[:: max(1, flat.numel() // _PROBES_PER_TENSOR)].float().sum())
    sample = torch.stack(probes).tolist() if probes else []  # one device sync
    return tuple(pointers), tuple(sample)


@dataclass
class _Entry:
    ids: Any
    """the prompt prefix whose states are kept (1-D long tensor on the CPU)"""
    layers: list[tuple[Any, Any]]
    """per layer (keys, values), each ``[1, kv_heads, len(ids), head_dim]``"""


class PrefixCache:
    """KV states of prompt prefixes ``model`` has read, kept LRU up to ``max_tokens`` tokens."""

    def __init__(self, model: Any, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        if max_tokens < 1:
            raise ValueError("max_tokens must be positive (turn the cache off instead).")
        self.model = model
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next_key = 0
        self._fingerprint: tuple | None = None
        self._last_logits = last_logits_only(model)
        self.prefilled = 0
        """prompt tokens run through the model so far (the rest came from the cache)"""
        self.reused = 0
        """prompt tokens taken from the cache so far"""

    @property
    def tokens(self) -> int:
        """Tokens of prompt states held now."""
        return sum(len(entry.ids) for entry in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry (call after changing weights in a way the fingerprint cannot see)."""
        self._entries.clear()

    def refresh(self) -> None:
        """Empty the cache if the weights changed since the last call (see the module docstring)."""
        fingerprint = weights_fingerprint(self.model)
        if fingerprint != self._fingerprint:
            self.clear()
            self._fingerprint = fingerprint

    def prompt_states(self, prompt: Sequence[int]) -> list[tuple[Any, Any]] | None:
        """Per layer ``(keys, values)`` ``[1, heads, len(prompt) - 1, dim]`` of ``prompt`` except its
        last token, from the longest kept prefix plus a forward pass over the rest (call
        :meth:`refresh` first when the weights may have changed); None if the model did not fill the
        cache."""
        import torch

        return self._states(torch.tensor(list(prompt)[:-1], dtype=torch.long))

    def past_key_values(self, prompts: Sequence[Sequence[int]]) -> Any:
        """One left-padded ``DynamicCache`` holding every prompt's states except its last token's,
        for ``generate(input_ids=<the prompts left-padded>, attention_mask=..., past_key_values=...)``;
        None when a prompt has a single token or the model did not fill the cache."""
        from transformers import DynamicCache

        self.refresh()
        if min(len(prompt) for prompt in prompts) < 2:
            return None
        rows = [self.prompt_states(prompt) for prompt in prompts]
        if any(row is None for row in rows):
            return None
        width = max(len(prompt) for prompt in prompts) - 1
        layers = []
        for layer in range(len(rows[0])):
            keys, values = (_left_padded([row[layer][part] for row in rows], width) for part in (0, 1))
            layers.append((keys, values))
        return DynamicCache(layers, config=self.model.config)

    def _states(self, ids: Any) -> list[tuple[Any, Any]] | None:
        """Per layer (keys, values) of ``ids``: the longest kept prefix plus a forward pass over the rest."""
        import torch
        from transformers import DynamicCache

        matches = {key: _common_prefix(entry.ids, ids) for key, entry in self._entries.items()}
        best = max(matches, key=lambda key: matches[key], default=None)
        reused = matches[best] if best is not None else 0
        start = None
        if reused:
            self._entries.move_to_end(best)
            self.reused += reused
            start = [(k[:, :, :reused], v[:, :, :reused]) for k, v in self._entries[best].layers]  # views
        if reused == len(ids):  # nothing to read: the states are (a prefix of) a kept entry's
            return start
        cache = DynamicCache(start, config=self.model.config)
        device = next(self.model.parameters()).device
        extra = self._last_logits
        with torch.no_grad():
            self.model(input_ids=ids[reused:][None].to(device), past_key_values=cache, use_cache=True, **extra)
        if cache.get_seq_length() != len(ids):  # e.g. gradient checkpointing in training mode drops the cache
            return None
        self.prefilled += len(ids) - reused
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        self._add(_Entry(ids, layers), [key for key, n in matches.items() if n == len(self._entries[key].ids)])
        return layers

    def _add(self, entry: _Entry, covered: list[int]) -> None:
        """Keep ``entry``, drop the entries it extends (``covered``), then the least recently used
        ones until at most ``max_tokens`` tokens are held."""
        if len(entry.ids) > self.max_tokens:
            return
        for key in covered:
            del self._entries[key]
        self._entries[self._next_key] = entry
        self._next_key += 1
        held = self.tokens
        while held > self.max_tokens:
            _, dropped = self._entries.popitem(last=False)
            held -= len(dropped.ids)


def _common_prefix(a: Any, b: Any) -> int:
    """Length of the longest common prefix of two 1-D tensors."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


def _left_padded(rows: list[Any], width: int) -> Any:
    """``[batch, heads, width, dim]`` with each ``[1, heads, n, dim]`` row right-aligned, zeros before it."""
    import torch

    first = rows[0]
    out = torch.zeros((len(rows), first.shape[1], width, first.shape[3]), dtype=first.dtype, device=first.device)
    for index, row in enumerate(rows):
        if row.shape[2]:
            out[index, :, width - row.shape[2]:] = row[0]
    return out
