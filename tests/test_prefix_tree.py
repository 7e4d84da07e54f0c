"""Shared-prefix packing is exact: per row, log-probabilities, the loss and every parameter's gradient
of the packed path equal each row forwarded alone (fp32, dropout 0, train mode), for the shapes the
update meets; broken variants (a suffix that sees another, shifted positions, a plain causal mask)
are caught by the same comparison; model families that mix tokens outside attention are refused.
``SEAL_TEST_DEVICE=cuda`` and ``SEAL_TEST_DTYPE=bfloat16`` run the same tests on a GPU and in bf16."""

from __future__ import annotations

import os
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, Gemma3TextConfig, GptOssConfig, LlamaConfig, Qwen2Config, Qwen3Config
from trl.trainer.utils import add_fused_lm_head

from seal_rl.prefix_tree import (
    PackedTree, Segment, UnsupportedModel, attention_switched, check_model, forward_tree, gather_rows, group_order,
    pack, rows_of, scored_positions, unsupported_reason,
)  # fmt: skip

DEVICE = os.environ.get("SEAL_TEST_DEVICE", "cpu")
"""where the models run: ``SEAL_TEST_DEVICE=cuda`` runs the same tests on a GPU (SDPA's CUDA kernels)"""
DTYPE_NAME = os.environ.get("SEAL_TEST_DTYPE", "float32")
"""the toy models' dtype: ``SEAL_TEST_DTYPE=bfloat16`` runs the same comparisons in bf16 (on CUDA, SDPA's
bf16 flash and memory-efficient kernels), against bf16's tolerances"""
TOLERANCES = {
    # (log-prob, loss, gradient relative per parameter, check_model's probe); the real-model test keeps float32's
    "float32": (2e-5, 1e-3, 1e-4, 2e-3),  # the probe in DESIGN.md §9 saw 2.1e-5 on a real 135M model at 6.6k tokens
    # bf16 on CPU lies up to 0.16 in log-prob, 0.34 in loss and 0.11 in gradient from float32 on these toys; on CUDA the
    # packed and the plain path run different kernels, each that far from float32. 0.25: the trainer's bf16 probe.
    "bfloat16": (0.4, 1.0, 0.25, 0.25),
}
if DTYPE_NAME not in TOLERANCES:
    raise ValueError(f"SEAL_TEST_DTYPE={DTYPE_NAME!r}; expected one of {', '.join(TOLERANCES)}.")
DTYPE = getattr(torch, DTYPE_NAME)
LOGP_TOLERANCE, LOSS_TOLERANCE, GRADIENT_TOLERANCE, PROBE_TOLERANCE = TOLERANCES[DTYPE_NAME]
CONTROL_MARGIN = 10 if DTYPE == torch.float32 else 3
"""how far past the tolerances a broken tree must land"""
VOCAB = 211
SHARP = 0.3
"""initializer range: a random model with transformers' default (0.02) attends almost uniformly and barely
notices positions, so a broken tree would differ by little more than float noise"""


def _model(config) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(DEVICE, DTYPE)
    model.train()  # dropout is 0 in these configs; train mode as in the update
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def _llama(heads=4, kv_heads=2, layers=2):
    return _model(LlamaConfig(vocab_size=VOCAB, hidden_size=8 * heads, intermediate_size=48, num_hidden_layers=layers,
                              num_attention_heads=heads, num_key_value_heads=kv_heads, initializer_range=SHARP))  # fmt: skip


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _rows(case: str) -> tuple[list[list[int]], list[int]]:
    """Rows (prompt + completion) and their prompt lengths for the shapes the issue lists."""
    prompt = _tokens(40, 1)
    if case == "one_row":  # G = 1
        return [prompt + _tokens(9, 2)], [40]
    if case == "unequal_suffixes":
        return [prompt + _tokens(n, 10 + n) for n in (7, 19, 3, 12)], [40] * 4
    if case == "one_token_suffix":
        return [prompt + _tokens(1, 3), prompt + _tokens(6, 4)], [40, 40]
    if case == "two_tasks":  # rows of two tasks with a partial common prefix (shared tool docs)
        other = prompt[:25] + _tokens(11, 5)
        return [prompt + _tokens(5, 6), other + _tokens(8, 7), prompt + _tokens(4, 8), other + _tokens(2, 9)], [40, 36, 40, 36]
    if case == "turn_chain":  # the turn layout: each sample's prompt holds the previous sample
        first = prompt + _tokens(6, 11)
        second = first + _tokens(5, 12) + _tokens(4, 13)
        return [first, second, prompt + _tokens(3, 14)], [40, len(first) + 5, 40]
    raise ValueError(case)


def _weights(rows: list[list[int]]) -> list[float]:
    """A distinct advantage-like weight per row, so a gradient that swaps rows shows."""
    return [1.0 + 0.37 * r for r in range(len(rows))]


def _alone(model, rows, prompts):
    """Each row forwarded alone: per row the log-probs of its completion tokens, and the weighted loss."""
    logps = []
    for row, p in zip(rows, prompts, strict=True):
        ids = torch.tensor([row], device=DEVICE)
        logps.append(model(input_ids=ids, labels=ids, fused_lm_head=True).log_probs[0, p - 1:])
    return logps


def _packed(model, rows, prompts, tree: PackedTree | None = None):
    tree = tree or pack(rows)
    with attention_switched(model):
        flat, _ = forward_tree(model, tree, compute_entropy=False)
    return [flat[torch.tensor(tree.where[r][p:], device=DEVICE) - 1] for r, p in enumerate(prompts)]


def _loss_and_grads(model, logps, weights):
    model.zero_grad(set_to_none=True)
    loss = sum(w * x.sum() for w, x in zip(weights, logps, strict=True))
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _compare(model, rows, prompts, packed_fn=_packed, *, checkpointing: bool | None = None):
    """Max |Δ log-prob|, |Δ loss| and max relative gradient error between packed and alone."""
    if checkpointing is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing})
    weights = _weights(rows)
    alone = _alone(model, rows, prompts)
    loss_a, grads_a = _loss_and_grads(model, alone, weights)
    with attention_switched(model):  # the backward of checkpointed layers recomputes them: keep the switch
        packed = packed_fn(model, rows, prompts)
        loss_p, grads_p = _loss_and_grads(model, packed, weights)
    logp = max((a - p).abs().max().item() for a, p in zip(alone, packed, strict=True))
    assert grads_a.keys() == grads_p.keys()
    grad = max(((grads_a[n] - grads_p[n]).norm() / grads_a[n].norm().clamp(min=1e-12)).item() for n in grads_a)
    return logp, (loss_a - loss_p).abs().item(), grad


# -- exactness ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["one_row", "unequal_suffixes", "one_token_suffix", "two_tasks", "turn_chain"])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4)], ids=["gqa", "mha"])
def test_packed_rows_equal_rows_forwarded_alone(case, heads):
    model = _llama(*heads)
    rows, prompts = _rows(case)
    logp, loss, grad = _compare(model, rows, prompts)
    assert logp < LOGP_TOLERANCE and loss < LOSS_TOLERANCE and grad < GRADIENT_TOLERANCE, (logp, loss, grad)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_packed_rows_are_exact_under_gradient_checkpointing(reentrant):
    model = _llama(layers=3)
    rows, prompts = _rows("two_tasks")
    logp, loss, grad = _compare(model, rows, prompts, checkpointing=reentrant)
    assert logp < LOGP_TOLERANCE and loss < LOSS_TOLERANCE and grad < GRADIENT_TOLERANCE, (logp, loss, grad)


def test_the_trl_layout_round_trips():
    """TRL's left-padded prompts and right-padded completions, read as rows and scattered back to
    ``[B, C]``: equal to TRL's own forward of the padded batch where the completion mask is 1, 0 elsewhere."""
    model = _llama()
    rows, prompts = _rows("two_tasks")
    width, cut = max(len(r) - p for r, p in zip(rows, prompts)), max(prompts)
    ids = torch.zeros(len(rows), cut + width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (row, p) in enumerate(zip(rows, prompts)):
        ids[i, cut - p:cut], mask[i, cut - p:cut] = torch.tensor(row[:p]), 1
        ids[i, cut:cut + len(row) - p], mask[i, cut:cut + len(row) - p] = torch.tensor(row[p:]), 1
    ids, mask = ids.to(DEVICE), mask.to(DEVICE)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-width] = -100
    with torch.no_grad():
        trl = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs[:, -width:]
        read = rows_of(ids, mask, width)
        assert read.tokens == rows and read.prompt == prompts
        tree = pack(read.tokens)
        with attention_switched(model):
            flat, _ = forward_tree(model, tree, compute_entropy=False, scored=scored_positions(tree, read, range(len(rows))))
        ours = gather_rows(flat, tree, read, range(len(rows)), width)
    completion = mask[:, cut:].bool()
    assert (ours - trl).abs()[completion].max() < LOGP_TOLERANCE
    assert (ours[~completion] == 0).all()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 12), st.integers(0, 10**6)), min_size=1, max_size=6))
def test_any_rows_pack_into_a_tree_that_holds_each_row_on_its_path(spec):
    """Property: following ``where`` along any row reads that row back from the packed row, every
    token's predecessor sits right before it, a segment's context is its path, and nothing is
    forwarded twice except one repeated token per branch."""
    base = _tokens(30, 99)
    rows = [base[:shared] + _tokens(extra, seed) for shared, extra, seed in spec]
    tree = pack(rows)
    for row, where in zip(rows, tree.where, strict=True):
        assert [tree.input_ids[j] for j in where] == row
        assert [tree.position_ids[j] for j in where] == list(range(len(row)))
        assert all(tree.input_ids[j - 1] == row[t - 1] and tree.position_ids[j - 1] == t - 1 for t, j in enumerate(where) if t)
    assert tree.forwarded <= len(set(tuple(r[:i + 1]) for r in rows for i in range(len(r)))) + len(tree.segments) - 1
    for s in tree.segments:
        assert [tree.position_ids[j] for j in s.context] == list(range(len(s.context)))
        assert tree.position_ids[s.start] == len(s.context)


# -- negative controls: the comparison catches a broken tree ------------------------------------


def _leaky(model, rows, prompts):
    """A tree whose second suffix also sees the first suffix's tokens."""
    tree = pack(rows)
    first, second = tree.segments[1], tree.segments[2]
    leak = Segment(second.start, second.end, (*second.context, *range(first.start + 1, first.end)))
    broken = PackedTree(tree.input_ids, tree.position_ids, [tree.segments[0], first, leak, *tree.segments[3:]], tree.where)
    return _packed(model, rows, prompts, broken)


def _shifted(model, rows, prompts):
    """Suffix positions one past where they belong (as if the repeated token were not there)."""
    tree = pack(rows)
    positions = list(tree.position_ids)
    for s in tree.segments[1:]:
        positions[s.start:s.end] = [p + 1 for p in positions[s.start:s.end]]
    return _packed(model, rows, prompts, PackedTree(tree.input_ids, positions, tree.segments, tree.where))


def _plain_causal(model, rows, prompts):
    """The packed row under a plain causal mask (every suffix sees every earlier suffix)."""
    tree = pack(rows)
    ids, positions = torch.tensor([tree.input_ids], device=DEVICE), torch.tensor([tree.position_ids], device=DEVICE)
    switched, model.config._attn_implementation = model.config._attn_implementation, "sdpa"  # no checkpointing here
    try:
        flat = model(input_ids=ids, position_ids=positions, labels=ids, fused_lm_head=True).log_probs[0]
    finally:
        model.config._attn_implementation = switched
    return [flat[torch.tensor(tree.where[r][p:], device=DEVICE) - 1] for r, p in enumerate(prompts)]


@pytest.mark.parametrize("broken", [_leaky, _shifted, _plain_causal], ids=["suffix-sees-suffix", "shifted-positions", "plain-causal"])
def test_a_broken_tree_fails_the_comparison(broken):
    if broken is _leaky and DTYPE == torch.bfloat16:
        pytest.skip("a suffix that sees another's few tokens moves log-probs by 0.32 and gradients by 0.17, within bf16's "
                    "noise; the float32 run catches it")
    model = _llama()
    rows, prompts = _rows("unequal_suffixes")
    logp, _, grad = _compare(model, rows, prompts, broken)
    assert logp > CONTROL_MARGIN * LOGP_TOLERANCE and grad > CONTROL_MARGIN * GRADIENT_TOLERANCE, (logp, grad)


def test_the_attention_refuses_what_it_does_not_implement():
    model = _llama()
    tree = pack([_tokens(5, 1)])
    q = torch.zeros(1, 4, 5, 8, device=DEVICE)
    with pytest.raises(UnsupportedModel, match="softcap"):
        from seal_rl.prefix_tree import tree_attention

        tree_attention(model.model.layers[0].self_attn, q, q, q, None, softcap=30.0, seal_prefix_tree=tree)
    with pytest.raises(UnsupportedModel, match="without a packed tree"):
        tree_attention(model.model.layers[0].self_attn, q, q, q, None)


# -- model families ------------------------------------------------------------------------------


def _family(name: str):
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, initializer_range=SHARP)  # fmt: skip
    if name == "qwen2":
        return Qwen2Config(**common)
    if name == "qwen3":
        return Qwen3Config(head_dim=8, **common)
    if name == "gemma3":  # sliding-window layers with a window shorter than the rows
        return Gemma3TextConfig(head_dim=8, sliding_window=16, layer_types=["sliding_attention", "full_attention"], **common)
    if name == "gpt_oss":  # attention sinks, sliding window, experts
        return GptOssConfig(head_dim=8, sliding_window=16, num_local_experts=4, num_experts_per_tok=2,
                            layer_types=["sliding_attention", "full_attention"], **common)  # fmt: skip
    raise ValueError(name)


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "gemma3", "gpt_oss"])
def test_model_families_are_exact(name):
    if name == "gpt_oss" and DTYPE == torch.bfloat16:
        pytest.skip("in bf16 this toy gpt-oss lies ~0.3 in log-prob from its float32 self on the packed and the plain "
                    "path alike (rounding changes which experts its router picks); its float32 run checks the packing")
    config = _family(name)
    model = _model(config) if name != "gpt_oss" else _eager(config)
    rows, prompts = _rows("two_tasks")
    logp, loss, grad = _compare(model, rows, prompts)
    assert logp < LOGP_TOLERANCE and loss < LOSS_TOLERANCE and grad < GRADIENT_TOLERANCE, (name, logp, loss, grad)
    assert check_model(model, VOCAB, tolerance=PROBE_TOLERANCE) is None


def _eager(config):
    """gpt-oss's own attention is eager (its sinks have no SDPA form in transformers)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(DEVICE, DTYPE)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_()  # zero-initialised sinks would hide a sink that is dropped
    model.train()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def test_models_that_mix_tokens_outside_attention_are_refused():
    from transformers import Lfm2Config

    lfm2 = AutoModelForCausalLM.from_config(Lfm2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                       num_attention_heads=4, num_key_value_heads=2,
                                                       layer_types=["conv", "full_attention"]))  # fmt: skip
    assert "conv" in unsupported_reason(lfm2)
    assert "conv" in check_model(lfm2, VOCAB, tolerance=2e-3)


def test_the_probe_catches_a_layer_that_ignores_the_tree(monkeypatch):
    """A model whose attention silently ignores the tree (as a plain causal kernel would) fails the probe."""
    import seal_rl.prefix_tree as prefix_tree

    model = _llama()

    def plain(module, q, k, v, mask, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        kwargs.pop(prefix_tree.TREE_KWARG)
        return sdpa_attention_forward(module, q, k, v, None, is_causal=True, **kwargs)

    monkeypatch.setattr(prefix_tree, "tree_attention", plain)
    assert "differ" in check_model(model, VOCAB, tolerance=PROBE_TOLERANCE)


# -- micro-batches ---------------------------------------------------------------------------------


def test_group_order_keeps_groups_whole_and_is_a_permutation():
    torch.manual_seed(3)
    order = group_order(24, 4)
    assert sorted(order) == list(range(24))
    blocks = [order[i:i + 4] for i in range(0, 24, 4)]
    assert all(b == list(range(b[0], b[0] + 4)) and b[0] % 4 == 0 for b in blocks)
    assert order != list(range(24)) or group_order(24, 4) != list(range(24))  # it does shuffle
    assert sorted(group_order(10, 4)) == list(range(10))  # not whole groups: TRL's per-row shuffle


def test_random_rows_in_random_order_are_exact():
    """Rows of three prompts sharing prefixes of random lengths, in a shuffled order."""
    model = _llama()
    rng = random.Random(7)
    base = _tokens(50, 21)
    prompts_of = [base[: rng.randint(10, 50)] for _ in range(3)]
    rows, prompts = [], []
    for i in range(7):
        p = rng.choice(prompts_of)
        rows.append(p + _tokens(rng.randint(1, 9), 100 + i))
        prompts.append(len(p))
    logp, loss, grad = _compare(model, rows, prompts)
    assert logp < LOGP_TOLERANCE and grad < GRADIENT_TOLERANCE, (logp, grad)


# -- a real model, as the trainer holds it --------------------------------------------------------


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_a_real_model_prepared_by_accelerate_passes_the_probe_and_packs(smollm2_dir, mixed_precision, request):
    """SmolLM2-135M-Instruct, prepared by accelerate as the trainer's model is (under bf16 its forward
    is wrapped in autocast): the probe compares in float32 and passes, the trainer's pass packs, and its
    log-probabilities equal TRL's own path's (float32: to float order; bf16: to bf16 noise)."""
    from collections import Counter
    from types import SimpleNamespace

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from seal_rl.train.trainer import make_trainer_class

    AcceleratorState._reset_state(reset_partial_state=True)  # a process-wide singleton: this test sets its precision
    request.addfinalizer(lambda: AcceleratorState._reset_state(reset_partial_state=True))
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    trainer = object.__new__(make_trainer_class())  # the real methods, without a dataset or a run
    trainer.accelerator = Accelerator(cpu=True, mixed_precision=mixed_precision)
    model = trainer.accelerator.prepare_model(model)
    trainer.seal = SimpleNamespace(recipe=SimpleNamespace(shared_prefix=True), tokens=Counter(), timing=Counter())
    trainer.ref_model = None
    prompt = _tokens(60, 31)
    rows = [prompt + _tokens(n, 40 + n) for n in (9, 4, 13)]
    width = 13
    ids = torch.zeros(3, 60 + width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    with torch.no_grad():
        packed, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, width, 3)
        trainer.seal.recipe.shared_prefix = False
        stock, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, width, 3)
    assert trainer._seal_checked and set(trainer._seal_checked.values()) == {None}  # the probe passed
    assert trainer.seal.tokens["update/old_logprobs/forwarded"] < 2 * trainer.seal.tokens["update/old_logprobs/rows"]
    completion = mask[:, 60:].bool()
    tolerance = TOLERANCES["float32"][0] * 10 if mixed_precision == "no" else 0.5
    assert (packed - stock).abs()[completion].max() < tolerance
