"""A batch of sequences decoding together that admits and releases rows between decoding steps.

This is what continuous batching means for the episode driver: an episode's next message starts
decoding as soon as its environment has stepped, beside whatever other messages are mid-way, and
leaves the batch as soon as it ends; nobody waits for the longest message of a tick.

The batch keeps each layer's keys and values in buffers allocated ahead
(``[slots, kv_heads, capacity, head_dim]``, :class:`_BufferLayer`, handed to the model as a
transformers ``Cache``) and a 0/1 mask of which columns are real. A window of columns
``[start, end)`` is in use; each :meth:`DecodeBatch.forward` feeds every row its next token at once
and writes the new keys and values into column ``end`` in place (``DynamicLayer`` concatenates,
copying the whole cache at every step):

* the attention mask is the row's mask over the window plus the new column, so padding is never
  attended to;
* the positions are each row's own count of real tokens, so row ``i``'s ``j``-th token has position
  ``j`` however much padding the batch puts before it — as ``generate`` computes them from a
  left-padded mask, and as :mod:`seal_rl.generators.prefix_cache` builds its states.

Rows join with the states of their prompt except its last token (which :meth:`forward` then
feeds), written into the next free slot and right-aligned with the window's end (the window opens
to the left for a longer prompt); a row that ends is overwritten by the last row (a copy of one
row), and columns that no remaining row uses leave the window from the left. The buffers are
reallocated, with the window copied in, only when the window reaches their end or needs more room
on the left or more slots: like a list's growth, every so many steps.

Exactness: the same tokens at the same positions, so the logits are those of a single-sequence
forward up to floating-point order (the padding width and batch size change the reduction order
of the attention and matrix products). Greedy tokens are the same unless two logits tie to that
precision; the tests compare token for token with the lockstep ``generate`` path.
"""

from __future__ import annotations

import functools
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

    def __init__(self, model: Any, rows: int = 1) -> None:
        self.model = model
        self._last_logits = last_logits_only(model)  # read once: inspect.signature is not for every step
        self._row_capacity = max(1, rows)
        self.rows: list[Row] = []
        """the rows decoding, ``rows[i]`` in slot ``i`` of the buffers"""
        self._layers: list[Any] = []  # _BufferLayer per model layer
        self._cache: Any = None  # a transformers Cache over self._layers
        self._mask: Any = None  # [slots, capacity] long, 1 where the column holds a real token
        self._start = self._end = 0  # the window of columns in use: [start, end)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        """Columns of the window (the longest row's real tokens, plus padding)."""
        return self._end - self._start

    def admit(self, rows: list[Row], states: list[list[tuple[Any, Any]]]) -> None:
        """Add ``rows``, each with per-layer ``(keys, values)`` ``[1, heads, n, dim]`` of its prompt
        except the last token (``n = len(prompt) - 1``), into the next free slots, right-aligned
        with the window's newest column."""
        if not rows:
            return
        longest = max(s[0][0].shape[2] for s in states)
        count = len(self.rows) + len(rows)
        if not self._layers or count > self._row_capacity or longest > self._end:
            self._relayout(max(count, self._row_capacity), left=max(longest - self.width, 0), like=states[0])
        if longest > self.width:  # open columns on the left, empty for the rows already here
            start = self._end - longest
            self._mask[: len(self.rows), start : self._start] = 0
            self._start = start
        for row, state in zip(rows, states, strict=True):
            slot, n = len(self.rows), state[0][0].shape[2]
            for layer, (keys, values) in zip(self._layers, state, strict=True):
                layer.keys_buffer[slot, :, self._end - n : self._end] = keys[0]
                layer.values_buffer[slot, :, self._end - n : self._end] = values[0]
            self._mask[slot, self._start : self._end] = 0
            self._mask[slot, self._end - n : self._end] = 1
            self.rows.append(row)

    def forward(self) -> Any:
        """Feed every row its next token (one forward pass); the next-token logits ``[rows, vocab]``."""
        import torch

        if self._end == self._mask.shape[1]:
            self._relayout(self._row_capacity, left=0)
        live = len(self.rows)
        self._mask[:live, self._end] = 1
        attention = self._mask[:live, self._start : self._end + 1]
        positions = attention[:, :-1].sum(dim=1, keepdim=True)
        ids = torch.tensor([[row.next_token] for row in self.rows], dtype=torch.long, device=self._mask.device)
        for layer in self._layers:
            layer.window = (live, self._start, self._end)
        output = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=self._cache,
                            use_cache=True, **self._last_logits)  # fmt: skip  (each layer writes column `end` in place)
        self._end += 1
        return output.logits[:, -1]

    def release(self, ended: set[int]) -> None:
        """Drop the rows at positions ``ended``: the last row moves into each freed slot (one row's
        copy, not the batch's), then the columns no remaining row uses leave the window."""
        if not ended:
            return
        window = slice(self._start, self._end)
        for slot in sorted(ended, reverse=True):
            last = len(self.rows) - 1
            if slot != last:
                for layer in self._layers:
                    layer.keys_buffer[slot, :, window] = layer.keys_buffer[last, :, window]
                    layer.values_buffer[slot, :, window] = layer.values_buffer[last, :, window]
                self._mask[slot, window] = self._mask[last, window]
                self.rows[slot] = self.rows[last]
            self.rows.pop()
        if not self.rows:
            self._start = self._end
            return
        used = self._mask[: len(self.rows), window].any(dim=0).nonzero()
        self._start += int(used[0]) if len(used) else self.width

    def _relayout(self, row_capacity: int, left: int, like: list[tuple[Any, Any]] | None = None) -> None:
        """New buffers for ``row_capacity`` rows, with ``left`` free columns before the window, and
        as many free columns after it as it holds plus 64; the window copied in. Amortised like a
        list's growth: a copy of the batch every so many steps, not every step."""
        import torch
        from transformers.cache_utils import Cache

        width = self.width
        start = left + (width + 64) // 2
        capacity = start + 2 * width + 64
        old, old_rows = self._layers, len(self.rows)
        if not old:  # shapes, dtype and device from the first prompt's states
            old = [_BufferLayer(keys, values) for keys, values in like]
        self._layers = []
        for layer in old:
            fresh = _BufferLayer(layer.keys_buffer, layer.values_buffer, rows=row_capacity, capacity=capacity)
            if width:
                fresh.keys_buffer[:old_rows, :, start : start + width] = layer.keys_buffer[:old_rows, :, self._start : self._end]
                fresh.values_buffer[:old_rows, :, start : start + width] = layer.values_buffer[:old_rows, :, self._start : self._end]
            self._layers.append(fresh)
        mask = torch.zeros((row_capacity, capacity), dtype=torch.long, device=self._layers[0].keys_buffer.device)
        if width:
            mask[:old_rows, start : start + width] = self._mask[:old_rows, self._start : self._end]
        self._cache = Cache(layers=self._layers)
        self._mask, self._row_capacity = mask, row_capacity
        self._start, self._end = start, start + width


@functools.cache
def _buffer_layer_class() -> type:
    """:class:`_BufferLayer`'s class, made on first use: a transformers ``DynamicLayer`` (the core
    imports this module without transformers installed)."""
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        """One model layer's keys and values, preallocated ``[slots, heads, capacity, dim]`` (zeros:
        free columns are attended with weight 0, and 0 x NaN would not be 0). The model's attention
        calls :meth:`update` with each step's new column and gets the window back, as from
        ``DynamicLayer``, but the column is written in place instead of concatenated."""

        def __init__(self, keys: Any, values: Any, rows: int = 0, capacity: int = 0) -> None:
            import torch

            super().__init__()
            self.keys_buffer = torch.zeros((rows, keys.shape[1], capacity, keys.shape[3]), dtype=keys.dtype, device=keys.device)
            self.values_buffer = torch.zeros((rows, values.shape[1], capacity, values.shape[3]), dtype=values.dtype, device=values.device)
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self.window = (0, 0, 0)
            """(rows, start, end) of the next :meth:`update`"""

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            rows, start, end = self.window
            self.keys_buffer[:rows, :, end : end + 1] = key_states
            self.values_buffer[:rows, :, end : end + 1] = value_states
            self.keys, self.values = self.keys_buffer[:rows, :, start : end + 1], self.values_buffer[:rows, :, start : end + 1]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.window[2] - self.window[1]

    return BufferLayer


def _BufferLayer(keys: Any, values: Any, rows: int = 0, capacity: int = 0) -> Any:  # noqa: N802  (reads as the class it makes)
    return _buffer_layer_class()(keys, values, rows, capacity)


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
