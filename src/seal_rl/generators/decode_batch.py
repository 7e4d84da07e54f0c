"""A batch of sequences decoding together that admits and releases rows between decoding steps.

This is what continuous batching means for the episode driver: an episode's next message starts
decoding as soon as its environment has stepped, beside whatever other messages are mid-way, and
leaves the batch as soon as it ends; nobody waits for the longest message of a tick.

The batch keeps one left-padded key/value cache (transformers' ``DynamicCache`` layers, plain
full-attention ``DynamicLayer`` states ``[rows, kv_heads, width, head_dim]``) and a 0/1 mask of
which columns are real. Each :meth:`DecodeBatch.forward` feeds every row its next token at once:

* the attention mask is the row mask plus the new column, so padding is never attended to;
* the positions are each row's own count of real tokens, so row ``i``'s ``j``-th token has position
  ``j`` however much padding the batch puts before it — as ``generate`` computes them from a
  left-padded mask, and as :mod:`seal_rl.generators.prefix_cache` builds its states.

Rows join with the states of their prompt except its last token (which :meth:`forward` then
feeds), padded on the left to the batch's width (or the batch padded to theirs); rows that end are
dropped with an index select, and columns that no remaining row uses are cut from the left. Both
copy the cache, once per message that starts or ends — not once per decoding step.

Exactness: the same tokens at the same positions, so the logits are those of a single-sequence
forward up to floating-point order (the padding width and batch size change the reduction order
of the attention and matrix products). Greedy tokens are the same unless two logits tie to that
precision; the tests compare token for token with the lockstep ``generate`` path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from seal_rl.generators.prefix_cache import last_logits_only

NEAR_TIE_FLOOR = 1e-3
"""the smallest logit gap :func:`divergence` calls a near-tie (float32 batch-order noise is ~1e-5)"""


@dataclass
class Row:
    """One message being decoded."""

    key: int
    """who asked (the episode)"""
    prompt: list[int]
    budget: int
    """most tokens to generate"""
    rng: Any = None
    """a ``torch.Generator`` seeded for this request (sampling), or None (greedy)"""
    generated: list[int] = field(default_factory=list)

    @property
    def next_token(self) -> int:
        """The token the next forward pass feeds: the newest generated, else the prompt's last."""
        return self.generated[-1] if self.generated else self.prompt[-1]


class DecodeBatch:
    """Rows decoding together on ``model``; see the module docstring."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._last_logits = last_logits_only(model)  # read once: inspect.signature is not for every step
        self.rows: list[Row] = []
        self._cache: Any = None  # a DynamicCache, per layer keys and values [rows, heads, width, dim]
        self._mask: Any = None  # [rows, width] long, 1 where the column holds a real token

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        """Columns of the cache (the longest row's real tokens, plus padding)."""
        return 0 if self._mask is None else int(self._mask.shape[1])

    def _layers(self) -> list[tuple[Any, Any]]:
        return [(layer.keys, layer.values) for layer in self._cache.layers] if self._cache is not None else []

    def _set(self, layers: list[tuple[Any, Any]]) -> None:
        from transformers import DynamicCache

        self._cache = DynamicCache(layers, config=self.model.config) if layers else None

    def admit(self, rows: list[Row], states: list[list[tuple[Any, Any]]]) -> None:
        """Add ``rows``, each with per-layer ``(keys, values)`` ``[1, heads, n, dim]`` of its prompt
        except the last token (``n = len(prompt) - 1``)."""
        import torch

        if not rows:
            return
        device = states[0][0][0].device
        width = max([self.width] + [s[0][0].shape[2] for s in states])
        current = self._layers()
        layers = []
        for layer in range(len(states[0])):
            parts = []
            for part in (0, 1):
                new = [s[layer][part] for s in states]
                old = [_left_pad(current[layer][part], width)] if current else []
                parts.append(torch.cat(old + [_left_pad(t, width) for t in new]))
            layers.append((parts[0], parts[1]))
        masks = [_left_pad_mask(self._mask, width)] if self._mask is not None else []
        for s in states:
            n = s[0][0].shape[2]
            masks.append(torch.cat([torch.zeros(1, width - n, dtype=torch.long, device=device),
                                    torch.ones(1, n, dtype=torch.long, device=device)], dim=1))  # fmt: skip
        self._set(layers)
        self._mask = torch.cat(masks)
        self.rows += rows

    def forward(self) -> Any:
        """Feed every row its next token (one forward pass); the next-token logits ``[rows, vocab]``."""
        import torch

        device = self._mask.device
        ids = torch.tensor([[row.next_token] for row in self.rows], dtype=torch.long, device=device)
        positions = self._mask.sum(dim=1, keepdim=True)
        attention = torch.cat([self._mask, torch.ones_like(positions)], dim=1)
        output = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=self._cache,
                            use_cache=True, **self._last_logits)  # fmt: skip  (the cache grows by one column in place)
        self._mask = attention
        return output.logits[:, -1]

    def release(self, ended: set[int]) -> None:
        """Drop the rows at positions ``ended``, then the columns no remaining row uses."""
        if not ended:
            return
        import torch

        keep = [i for i in range(len(self.rows)) if i not in ended]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, None
            return
        index = torch.tensor(keep, device=self._mask.device)
        mask = self._mask.index_select(0, index)
        used = mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else mask.shape[1]
        self._mask = mask[:, start:]
        self._set([(k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:]) for k, v in self._layers()])


def _left_pad(tensor: Any, width: int) -> Any:
    """``[rows, heads, n, dim]`` zero-padded on the left to ``width`` columns."""
    import torch

    missing = width - tensor.shape[2]
    if not missing:
        return tensor
    pad = torch.zeros((tensor.shape[0], tensor.shape[1], missing, tensor.shape[3]), dtype=tensor.dtype, device=tensor.device)
    return torch.cat([pad, tensor], dim=2)


def _left_pad_mask(mask: Any, width: int) -> Any:
    import torch

    missing = width - mask.shape[1]
    return mask if not missing else torch.cat([torch.zeros((mask.shape[0], missing), dtype=mask.dtype, device=mask.device), mask], dim=1)


@dataclass(frozen=True)
class Divergence:
    """Where two greedy samples of the same episode part, and how close the model's call was there."""

    position: int
    """index of the first different token"""
    tokens: tuple[int, int]
    gap: float
    """|logit difference| of the two tokens, from one unbatched forward pass over the shared prefix"""
    tolerance: float
    """the largest gap a different batch composition can explain: two units in the last place of
    the larger logit in the model's dtype (bfloat16: 0.25 at a logit of 25), at least
    :data:`NEAR_TIE_FLOOR`"""

    @property
    def near_tie(self) -> bool:
        return self.gap <= self.tolerance


def divergence(model: Any, expected: Sequence[int], got: Sequence[int]) -> Divergence | None:
    """The first difference of two token sequences that share a prompt (None: equal), with the
    model's logit gap between the two tokens there. Greedy decoding under different batch
    compositions may part only at a near-tie (see the module docstring)."""
    import torch

    if list(expected) == list(got):
        return None
    at = next((k for k, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    if at >= min(len(expected), len(got)):  # one is a prefix of the other: a different stop, no tie to read
        return Divergence(at, (-1, -1), float("inf"), 0.0)
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(expected[:at])], device=device)).logits[0, -1]
    a, b = float(logits[expected[at]]), float(logits[got[at]])
    ulp = torch.finfo(logits.dtype).eps * max(abs(a), abs(b))
    return Divergence(at, (expected[at], got[at]), abs(a - b), max(NEAR_TIE_FLOOR, 2 * ulp))
