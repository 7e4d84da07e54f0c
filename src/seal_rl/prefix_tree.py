"""Shared-prefix packing: forward each token of a micro-batch once, however many samples share it.

Every episode of a GRPO group starts with the same prompt (the system prompt with the tool docs and
the first question, ~6k tokens), and in the ``turn`` layout every sample of an episode repeats the
conversation before its message. TRL forwards each sample's whole sequence, so an update pays for
that prompt once per sample. Here the samples of a micro-batch become one **prefix tree**: each
sample is a path from the root, each node a run of tokens (a *segment*) that a set of samples share,
and the tree is packed into one row ``[root | segment | segment | ...]`` that the model forwards once.

Exactness (docs/results/update.md, "Shared-prefix updates"): a token's hidden state depends on the tokens
before it on its own path and on nothing else, so it is the same wherever that path is forwarded.
Three things make the packed row compute exactly that:

* **positions** — a token's position id is its depth on its path (RoPE and absolute embeddings see
  what they would see with the sample alone);
* **attention** — :func:`tree_attention` lets a segment attend to the tokens of its ancestors on
  its own path and causally to itself, never to a sibling; keys are gathered along the path, so
  the mask is the plain causal rule on position ids (``key position <= query position``, and a
  sliding window on the same positions);
* **the first token of a segment** — a child segment starts one token early, with a copy of its
  parent's last token, so that every scored token's predecessor sits right before it in the row
  (TRL's fused LM head scores position ``j`` from the hidden state at ``j - 1``). The copy attends
  to the path before it, exactly as the original does.

Layers stay pure functions of their inputs (the tree travels as a keyword argument into the
attention function), so gradient checkpointing recomputes them unchanged, reentrant or not.

Token-mixing layers outside attention (convolutions, linear attention, state-space layers) see the
packed row as one sequence and would leak across branches: such models are refused
(:func:`unsupported_reason`), and :func:`check_model` compares the packed path with plain
forwards on a small probe once per model before it is trusted.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ATTENTION_NAME = "seal_prefix_tree"
"""the name :func:`tree_attention` is registered under in transformers' ``AttentionInterface``"""

TREE_KWARG = "seal_prefix_tree"
"""the keyword argument that carries a :class:`PackedTree` from ``model(...)`` to the attention function"""

_IGNORED_KWARGS = frozenset({"position_ids", "use_cache", "past_key_values", "cache_position", "output_attentions",
                             "position_embeddings", "is_causal", "layer_idx"})  # fmt: skip
"""keyword arguments models hand their attention function that do not change its result here"""

_TOKEN_MIXING_LAYERS = frozenset({"conv", "linear_attention", "mamba", "ssm", "recurrent", "deltanet", "mlstm", "slstm"})


class UnsupportedModel(Exception):
    """The model mixes tokens in a way the packed row cannot reproduce (or the probe disagreed)."""


@dataclass(frozen=True)
class Segment:
    """One node of the tree: tokens ``[start, end)`` of the packed row, attending to ``context``
    (packed indices of its ancestors' tokens on its path, in path order) and causally to itself."""

    start: int
    end: int
    context: tuple[int, ...]


@dataclass
class PackedTree:
    """Rows packed as a prefix tree: the one row the model forwards and where each row's tokens are.

    ``where[r][t]`` is the packed index holding row ``r``'s token at depth ``t`` whose predecessor
    (depth ``t - 1`` on the same path) sits at ``where[r][t] - 1``; the log-probability of that
    token is therefore at ``where[r][t] - 1`` of the fused head's shifted output.
    """

    input_ids: list[int]
    position_ids: list[int]
    segments: list[Segment]
    where: list[list[int]]
    _device_cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def forwarded(self) -> int:
        """tokens the packed row forwards"""
        return len(self.input_ids)

    @property
    def row_tokens(self) -> int:
        """tokens the rows hold (what forwarding each row alone costs)"""
        return sum(len(w) for w in self.where)

    def plan(self, device: Any) -> list[tuple[int, int, Any, Any, Any]]:
        """Per segment: ``(start, end, key index, query positions, key positions)`` as tensors on
        ``device`` (key index None for a root, whose keys are its own tokens). Built once per
        forward and reused by every layer."""
        import torch

        key = ("plan", str(device))
        if key not in self._device_cache:
            positions = torch.tensor(self.position_ids, dtype=torch.long, device=device)
            plan = []
            for s in self.segments:
                if s.context:
                    index = torch.tensor([*s.context, *range(s.start, s.end)], dtype=torch.long, device=device)
                    plan.append((s.start, s.end, index, positions[s.start:s.end], positions[index]))
                else:
                    plan.append((s.start, s.end, None, positions[s.start:s.end], positions[s.start:s.end]))
            self._device_cache[key] = plan
        return self._device_cache[key]

    def mask(self, i: int, plan_entry: tuple, window: int | None) -> Any:
        """Segment ``i``'s boolean mask (query × key): causal on position ids, within ``window``
        when the layer has a sliding window; None for a root without window (SDPA's own causal)."""
        start, end, index, q_pos, k_pos = plan_entry
        if index is None and window is None:
            return None
        key = ("mask", i, window, str(q_pos.device))
        if key not in self._device_cache:
            allowed = k_pos[None, :] <= q_pos[:, None]
            if window is not None:
                allowed = allowed & (k_pos[None, :] > q_pos[:, None] - window)
            self._device_cache[key] = allowed
        return self._device_cache[key]


def pack(rows: Sequence[Sequence[int]]) -> PackedTree:
    """Pack token rows as a prefix tree (pure; rows in any order, any lengths >= 1).

    Each row joins the tree where it leaves the earlier row it shares most with: its longest common
    prefix ``d`` with them is already forwarded, and a new segment holds its tokens from depth
    ``d - 1`` (a copy of the shared token before the branch, see the module docstring) to its end.
    A row that is a prefix of an earlier one adds nothing. Identical rows share everything.
    """
    arrays = [np.asarray(r, dtype=np.int64) for r in rows]
    if any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError("every row needs at least one token")
    input_ids: list[int] = []
    position_ids: list[int] = []
    segments: list[Segment] = []
    where: list[list[int]] = []
    for r, row in enumerate(arrays):
        best, shared = -1, 0
        for q in range(r):
            n = min(len(row), len(arrays[q]))
            differs = np.flatnonzero(row[:n] != arrays[q][:n])
            common = int(differs[0]) if differs.size else n
            if common > shared:
                best, shared = q, common
        if shared == len(row):  # already on an earlier path
            where.append(where[best][: len(row)])
            continue
        start = len(input_ids)
        first = max(shared - 1, 0)  # a child repeats its parent's last token (the scored token's predecessor)
        context = tuple(where[best][:first]) if shared else ()
        input_ids.extend(int(t) for t in row[first:])
        position_ids.extend(range(first, len(row)))
        segments.append(Segment(start, len(input_ids), context))
        own = list(range(start + (1 if shared else 0), len(input_ids)))
        where.append((where[best][:shared] if shared else []) + own)
    return PackedTree(input_ids, position_ids, segments, where)


def groups_of(rows: Sequence[Sequence[int]], size: int) -> list[list[int]]:
    """Row indices split into packs of at most ``size`` rows (TRL's chunking), in order."""
    return [list(range(i, min(i + size, len(rows)))) for i in range(0, len(rows), size)]


# -- attention ------------------------------------------------------------------------------------


def tree_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                   scaling: float | None = None, sliding_window: int | None = None, s_aux: Any = None,
                   **kwargs: Any) -> tuple[Any, None]:  # fmt: skip
    """transformers' attention-function interface over a :class:`PackedTree` (batch of one row).

    Per segment, SDPA over the keys of its path (ancestors' tokens, gathered, then its own) with the
    causal rule on position ids; the root without a sliding window runs SDPA's own causal kernel.
    ``s_aux`` (gpt-oss's attention sinks: one logit per head that joins every softmax and carries no
    value) is exact through one extra key dimension: queries get a 1, keys a 0, and a sink key
    ``s / scale`` with a zero value. Anything else that would change the result (soft-capping,
    position biases) raises :class:`UnsupportedModel` instead of being ignored.
    """
    import torch
    import torch.nn.functional as F

    tree: PackedTree | None = kwargs.pop(TREE_KWARG, None)
    if tree is None:
        raise UnsupportedModel(f"attention {ATTENTION_NAME!r} was called without a packed tree")
    unknown = {k for k, v in kwargs.items() if v is not None and k not in _IGNORED_KWARGS}
    if unknown:
        raise UnsupportedModel(f"the model's attention takes {', '.join(sorted(unknown))}, which shared-prefix packing "
                               "does not implement")  # fmt: skip
    if query.shape[0] != 1:
        raise UnsupportedModel(f"a packed tree is one row; got a batch of {query.shape[0]}")
    heads, kv_heads, head_dim = query.shape[1], key.shape[1], query.shape[-1]
    gqa = heads != kv_heads  # grouped-query attention: SDPA maps heads // kv_heads query heads to each key head
    scale = scaling if scaling is not None else head_dim**-0.5
    if s_aux is not None:  # a sink key per query head: key/value heads repeated first
        if gqa:
            key, value, gqa = key.repeat_interleave(heads // kv_heads, dim=1), value.repeat_interleave(heads // kv_heads, dim=1), False
        sinks = s_aux.to(query.dtype).view(1, heads, 1, 1)
        query = torch.cat([query, query.new_ones(*query.shape[:-1], 1)], dim=-1)
        key = torch.cat([key, key.new_zeros(*key.shape[:-1], 1)], dim=-1)
        value = torch.cat([value, value.new_zeros(*value.shape[:-1], 1)], dim=-1)
        sink_key = torch.cat([key.new_zeros(1, heads, 1, head_dim), sinks / scale], dim=-1)
        sink_value = value.new_zeros(1, heads, 1, head_dim + 1)
    outputs = []
    dropout_p = dropout if module.training else 0.0
    for i, entry in enumerate(tree.plan(query.device)):
        start, end, index, _, _ = entry
        q = query[:, :, start:end]
        k = key[:, :, start:end] if index is None else key.index_select(2, index)
        v = value[:, :, start:end] if index is None else value.index_select(2, index)
        mask = tree.mask(i, entry, sliding_window)
        if s_aux is not None:
            k, v = torch.cat([sink_key, k], dim=2), torch.cat([sink_value, v], dim=2)
            if mask is None:
                mask = torch.ones(end - start, end - start, dtype=torch.bool, device=q.device).tril()
            mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale, enable_gqa=gqa)
        outputs.append(out[..., :head_dim])
    out = torch.cat(outputs, dim=2)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make :func:`tree_attention` available to transformers models as ``ATTENTION_NAME`` (no mask
    function is registered: models then build no mask of their own for it)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, tree_attention)


def _configs(model: Any) -> list[Any]:
    """Every config object the model's modules read ``_attn_implementation`` from."""
    seen: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            seen.setdefault(id(config), config)
    return list(seen.values())


@contextmanager
def attention_switched(model: Any) -> Iterator[None]:
    """Within the block, the model's attention layers call :func:`tree_attention`; restored after.

    The block must cover the backward pass too when gradient checkpointing recomputes layers there.
    """
    register()
    configs = _configs(model)
    before = [c._attn_implementation for c in configs]
    for c in configs:
        c._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        for c, name in zip(configs, before, strict=True):
            c._attn_implementation = name


def unsupported_reason(model: Any) -> str | None:
    """Why a model cannot be trained on packed trees (None: it can, subject to :func:`check_model`).

    Layers that mix tokens outside attention (LFM2's convolutions, Qwen3.5's and Qwen3-Next's
    linear attention, state-space layers) would see one long sequence across branches; attention
    logit soft-capping (Gemma 2) has no SDPA form.
    """
    for config in _configs(model) or [model.config]:
        layer_types = set(getattr(config, "layer_types", None) or ())
        mixing = {t for t in layer_types if any(word in str(t).lower() for word in _TOKEN_MIXING_LAYERS)}
        if mixing:
            return f"its layers mix tokens outside attention ({', '.join(sorted(mixing))})"
        if getattr(config, "attn_logit_softcapping", None):
            return "its attention soft-caps logits (attn_logit_softcapping), which SDPA cannot"
    return None


# -- the update's log-probabilities ---------------------------------------------------------------


@dataclass(frozen=True)
class Rows:
    """TRL's padded ``[B, P + C]`` batch as token rows: row ``r`` is its valid prompt tokens, then
    its valid completion tokens; ``scored[r]`` is how many completion tokens it has (at depths
    ``prompt[r] ..``), each the completion column of the same index."""

    tokens: list[list[int]]
    prompt: list[int]
    scored: list[int]


def rows_of(input_ids: Any, attention_mask: Any, logits_to_keep: int) -> Rows:
    """Read TRL's layout: prompts left-padded, completions right-padded, the last ``logits_to_keep``
    columns the completion."""
    ids, mask = input_ids.tolist(), attention_mask.tolist()
    cut = len(ids[0]) - logits_to_keep
    tokens, prompt, scored = [], [], []
    for row, keep in zip(ids, mask, strict=True):
        head = [t for t, k in zip(row[:cut], keep[:cut], strict=True) if k]
        tail = [t for t, k in zip(row[cut:], keep[cut:], strict=True) if k]
        tokens.append(head + tail or row[-1:])
        prompt.append(len(head))
        scored.append(len(tail) if head else 0)  # a completion with no prompt has no predecessor to score its first token
    return Rows(tokens, prompt, scored)


def scored_positions(tree: PackedTree, rows: Rows, offset: Sequence[int]) -> list[int]:
    """Packed indices of the completion tokens of ``rows`` (indices ``offset``) that ``tree`` packs."""
    return sorted({tree.where[i][d] for i, r in enumerate(offset) for d in range(rows.prompt[r], rows.prompt[r] + rows.scored[r])})


def forward_tree(model: Any, tree: PackedTree, *, compute_entropy: bool, scored: Sequence[int] | None = None) -> tuple[Any, Any]:
    """One forward of the packed row through TRL's fused LM head: per packed index ``j`` the
    log-probability (and entropy) of token ``j`` given the path before it, at index ``j - 1``, for
    ``j`` in ``scored`` (default: every token; elsewhere 0 — on GPUs the head skips them).

    The model's attention must be switched (:func:`attention_switched`) around this call and, when
    gradients flow through checkpointed layers, around the backward pass too.
    """
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([tree.input_ids], dtype=torch.long, device=device)
    positions = torch.tensor([tree.position_ids], dtype=torch.long, device=device)
    labels = ids
    if scored is not None:
        labels = torch.full_like(ids, -100)
        index = torch.tensor(list(scored), dtype=torch.long, device=device)
        labels[0, index] = ids[0, index]
    out = model(input_ids=ids, position_ids=positions, labels=labels, fused_lm_head=True, **{TREE_KWARG: tree})
    return out.log_probs[0], (out.entropy[0] if compute_entropy else None)


def gather_rows(flat: Any, tree: PackedTree, rows: Rows, offset: Sequence[int], width: int) -> Any:
    """The ``[len(offset), width]`` completion log-probabilities (or entropies) of ``rows`` (indices
    ``offset`` into them) from the packed output ``flat``; padded columns are 0."""
    import torch

    index = torch.full((len(offset), width), -1, dtype=torch.long)
    for i, r in enumerate(offset):
        depths = range(rows.prompt[r], rows.prompt[r] + rows.scored[r])
        index[i, : rows.scored[r]] = torch.tensor([tree.where[i][d] - 1 for d in depths], dtype=torch.long)
    index = index.to(flat.device)
    return flat[index.clamp(min=0)].masked_fill(index < 0, 0.0)


@contextmanager
def own_precision(model: Any) -> Iterator[None]:
    """Within the block, ``model`` runs in its weights' own precision: without the autocast wrapper
    accelerate puts on ``forward`` for mixed precision (kept in ``_original_forward``), and without
    an enclosing autocast. The probe of :func:`check_model` compares structure, not precision."""
    import torch

    original = model.__dict__.get("_original_forward")
    wrapped = model.__dict__.get("forward")
    device = next(model.parameters()).device.type
    if original is not None:
        model.forward = original
    try:
        with torch.autocast(device, enabled=False):
            yield
    finally:
        if original is not None:
            model.forward = wrapped


def check_model(model: Any, vocab_size: int, *, tolerance: float) -> str | None:
    """Compare the packed path with each row forwarded alone on a small probe (three rows sharing
    prefixes of different lengths, one a prefix of another); None if they agree within
    ``tolerance`` (max |Δ log-prob|), else why not. Run once per model before packing is trusted:
    it catches what :func:`unsupported_reason` cannot see (a layer that ignores the tree)."""
    import torch

    reason = unsupported_reason(model)
    if reason:
        return reason
    generator = torch.Generator().manual_seed(0)
    draw = lambda n: torch.randint(0, vocab_size, (n,), generator=generator).tolist()  # noqa: E731
    shared = draw(24)
    probe = [shared + draw(9), shared[:10] + draw(13), shared + draw(1), (shared + draw(3))[:20]]
    tree = pack(probe)
    device = next(model.parameters()).device
    with torch.no_grad():
        alone = []
        for row in probe:
            ids = torch.tensor([row], device=device)
            alone.append(model(input_ids=ids, labels=ids, fused_lm_head=True).log_probs[0].float())
        try:
            with attention_switched(model):
                flat, _ = forward_tree(model, tree, compute_entropy=False)
        except UnsupportedModel as exc:
            return str(exc)
    worst = max((alone[r] - flat.float()[torch.tensor(tree.where[r][1:], device=device) - 1]).abs().max().item()
                for r in range(len(probe)))  # fmt: skip
    if not worst <= tolerance:
        return f"on a probe the packed log-probabilities differ from unpacked ones by {worst:.3g} (> {tolerance:g})"
    return None


def group_order(size: int, group: int) -> list[int]:
    """A random order of a generation batch's ``size`` rows that keeps each GRPO group (``group``
    consecutive rows) together, so micro-batches hold whole groups and share their prompt; TRL's
    own per-row shuffle when the batch is not made of whole groups. Draws from torch's global
    generator, as TRL's shuffle does (seeded runs stay reproducible)."""
    import torch

    if group < 2 or size % group:
        return torch.randperm(size).tolist()
    return [g * group + i for g in torch.randperm(size // group).tolist() for i in range(group)]
