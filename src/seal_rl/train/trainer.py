"""The TRL integration: the GRPO trainer subclass, its callbacks and sampler.

:func:`make_trainer_class` builds ``SealGRPOTrainer``. Its change to TRL's algorithm is A-Patch
(SEAL Eq. 12) applied to the group advantages, and under ``credit: turn`` each user turn's own
advantage added per token (:func:`turn_credit`, :mod:`seal_rl.credit`); its change to TRL's arithmetic is the shared-prefix
update (:mod:`seal_rl.prefix_tree`): every log-probability pass forwards a micro-batch as one
prefix tree, and generation batches are shuffled by whole groups so that a group's samples share a
micro-batch. Its sampler draws each epoch's task order from (seed, epoch), so a resumed run replays
the same order. The callbacks save the SEAL state into every checkpoint, copy TRL's logs into
``metrics.jsonl`` and run validation.

Not here: what a round plays and logs (:mod:`seal_rl.train.loop`), what TRL trains on
(:mod:`seal_rl.train.samples`), saving the policy (:func:`seal_rl.train.run_dir.save_model`).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seal_rl import jsonl
from seal_rl.apatch import reweight
from seal_rl.errors import SealError, SealWarning
from seal_rl.rollout import derived_seed
from seal_rl.prefix_tree import (
    attention_switched, check_model, forward_tree, gather_rows, group_order, groups_of, own_precision, pack, rows_of,
    scored_positions,
)  # fmt: skip
from seal_rl.train.lora import adapters_off
from seal_rl.train.run_dir import METRICS_FILE, SEAL_STATE_FILE, TIME_FILE

if TYPE_CHECKING:
    from seal_rl.train.loop import SealLoop


def seal_reward(prompts: list[Any], completions: list[Any], seal_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """The verifier's binary reward, computed by the environment during the rollout (None: unscorable)."""
    return list(seal_reward)


def make_trainer_class():
    """``SealGRPOTrainer``: TRL's GRPOTrainer with A-Patch applied after the group advantages."""
    from trl import GRPOTrainer

    class SealGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose advantages are reweighted per trajectory (SEAL Eq. 12).

        The one change to the algorithm: after TRL computes the group-relative advantages (gathered
        across ranks), each local trajectory's advantage is multiplied by its A-Patch weight. The
        rest changes how, not what: the log-probability passes pack shared prefixes
        (``_get_per_token_logps_and_entropies``; exact up to float order) and generation batches are
        shuffled by whole groups (``_prepare_inputs``). Under ``silent_updates: skip`` a round with
        nothing to learn runs no forward, backward or weight update (``training_step``).
        """

        seal: SealLoop

        def _get_train_sampler(self, dataset=None):
            sampler = super()._get_train_sampler(dataset)
            sampler.__class__ = _epoch_seeded(type(sampler))
            return sampler

        _seal_scoring_seconds = 0.0
        """time inside ``_generate_and_score_completions`` (rollouts, old and reference log-probs)"""

        _seal_after_backward: ExitStack | None = None
        """open during ``training_step``: what must stay in force until its backward pass is done"""
        _seal_switched: set[int]
        """models (ids) whose attention is switched to the packed tree until the end of ``training_step``"""

        def training_step(self, model, inputs, num_items_in_batch):
            started, scoring = time.perf_counter(), self._seal_scoring_seconds
            if self.seal.recipe.silent_updates == "skip":
                model.train()
                inputs = _Prepared(self._prepare_inputs(inputs))  # a round is generated here: then the loop knows it
                if self.seal.nothing_to_learn:
                    # No forward or backward: the gradients stay None, so AdamW leaves every weight and its
                    # moments as they are. Every rank decides alike (the loop gathers the rows first).
                    import torch

                    self._step += 1  # TRL's count of micro-batches, which picks the next buffered one
                    self.seal.timing["update/policy"] += time.perf_counter() - started - (self._seal_scoring_seconds - scoring)
                    return torch.zeros((), device=self.accelerator.device)
            self._seal_switched = set()
            with ExitStack() as self._seal_after_backward:
                output = super().training_step(model, inputs, num_items_in_batch)
            self._seal_after_backward = None
            elapsed = time.perf_counter() - started - (self._seal_scoring_seconds - scoring)
            self.seal.timing["update/policy"] += elapsed  # the policy's forward and backward passes, optimizer step
            return output

        def _prepare_inputs(self, generation_batch):
            """TRL's, with the generation batch shuffled by whole groups (:func:`group_order`), so that
            samples sharing a prompt travel in the same micro-batch and are forwarded once."""
            from trl.trainer.utils import split_pixel_values_by_grid, split_tensor_dict, unsplit_pixel_values_by_grid

            if isinstance(generation_batch, _Prepared):  # prepared by training_step (silent_updates: skip)
                return generation_batch.batch
            if not self.model.training or self.seal.recipe.shared_prefix is False:
                return super()._prepare_inputs(generation_batch)
            generate_every = self.args.steps_per_generation * self.num_iterations
            if self._step % generate_every == 0 or self._buffered_inputs is None:
                batch = split_pixel_values_by_grid(self._generate_and_score_completions(generation_batch))
                size = len(next(v for v in batch.values() if v is not None))
                order = group_order(size, self.num_generations)
                batch = {k: _reordered(v, order) for k, v in batch.items()}
                self._buffered_inputs = [unsplit_pixel_values_by_grid(b) for b in split_tensor_dict(batch, self.args.steps_per_generation)]
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                               compute_entropy=False, compute_aux_loss=False, **extra):  # fmt: skip
            import torch

            started = time.perf_counter()
            grad = torch.is_grad_enabled()
            reference = model is self.ref_model or adapters_off(self.accelerator.unwrap_model(model))  # PEFT: adapters off
            kind = "update/policy" if grad else ("update/reference" if reference else "update/old_logprobs")
            packs = self._seal_packs(model, input_ids, attention_mask, logits_to_keep, batch_size, grad, extra, compute_aux_loss)
            if packs is not None:
                rows, chunks, trees = packs
                output = self._seal_packed_logps(model, rows, chunks, trees, logits_to_keep, compute_entropy, grad)
                held, forwarded = sum(t.row_tokens for t in trees), sum(t.forwarded for t in trees)
            else:
                output = super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **extra)
                held, forwarded = int(attention_mask.sum()), input_ids.numel()  # padded rows, as TRL forwards them
            self.seal.tokens[f"{kind}/rows"] += held
            self.seal.tokens[f"{kind}/forwarded"] += forwarded
            if not grad:  # the no-grad passes before the update; the loss's own pass is in update/policy
                self.seal.timing[kind] += time.perf_counter() - started
            return output

        _seal_checked: dict[int, str | None]
        """per model (id of the unwrapped module): why packing is not used for it (None: it is)"""

        def _seal_packs(self, model, input_ids, attention_mask, logits_to_keep, batch_size, grad, extra, compute_aux_loss):
            """This pass's rows, TRL's chunks of ``batch_size`` rows and one prefix tree per chunk; None
            when the pass takes TRL's own path (``shared_prefix``: auto/true/false)."""
            setting = self.seal.recipe.shared_prefix
            if setting is False or any(v is not None for v in extra.values()) or compute_aux_loss:
                return None  # multimodal inputs and the MoE load-balancing loss take TRL's own path
            if grad and self._seal_after_backward is None:
                return None  # a backward outside training_step would recompute layers unswitched
            unwrapped = self.accelerator.unwrap_model(model)
            checked = getattr(self, "_seal_checked", None)
            if checked is None:
                checked = self._seal_checked = {}
            if id(unwrapped) not in checked:  # before anything rank-dependent: under FSDP the probe's forwards are collectives
                checked[id(unwrapped)] = self._seal_check(model, unwrapped)
            reason = checked[id(unwrapped)]
            if reason and setting is True:
                raise SealError(f"shared_prefix: true, but this model cannot be trained on shared prefixes: {reason}. "
                                "Set shared_prefix: auto (falls back to TRL's path) or false.")  # fmt: skip
            if reason:
                return None
            rows = rows_of(input_ids, attention_mask, logits_to_keep)
            chunks = groups_of(rows.tokens, batch_size or len(rows.tokens))
            trees = [pack([rows.tokens[i] for i in chunk]) for chunk in chunks]
            if setting == "auto" and sum(t.forwarded for t in trees) >= sum(t.row_tokens for t in trees):
                return None  # nothing shared: TRL's path costs the same
            return rows, chunks, trees

        def _seal_check(self, model, unwrapped) -> str | None:
            import torch

            parameter = next(unwrapped.parameters())
            tolerance = 2e-3 if parameter.dtype == torch.float32 else 0.25
            training = unwrapped.training
            unwrapped.eval()  # no dropout in the comparison
            try:
                with own_precision(unwrapped):  # bf16 noise (~0.2 in a token's log-prob) would hide a leak or fail the probe
                    reason = check_model(model, unwrapped.config.get_text_config().vocab_size, tolerance=tolerance)
            finally:
                unwrapped.train(training)
            if reason and self.accelerator.is_main_process:
                warnings.warn(f"Shared-prefix updates are off for this model: {reason}; TRL forwards every sample's "
                              "whole sequence instead.", SealWarning, stacklevel=2)  # fmt: skip
            return reason

        def _seal_packed_logps(self, model, rows, chunks, trees, width, compute_entropy, grad):
            """Each chunk of rows forwarded once as its prefix tree; TRL's ``[B, C]`` layout back."""
            import torch

            unwrapped = self.accelerator.unwrap_model(model)
            if grad:  # gradient checkpointing recomputes layers in the backward pass: keep them switched till then
                if id(unwrapped) not in self._seal_switched:
                    self._seal_after_backward.enter_context(attention_switched(unwrapped))
                    self._seal_switched.add(id(unwrapped))
                switched = nullcontext()
            else:
                switched = attention_switched(unwrapped)
            logps, entropies = [], []
            with switched:
                for tree, chunk in zip(trees, chunks, strict=True):
                    with self.accelerator.autocast():
                        flat, entropy = forward_tree(model, tree, compute_entropy=compute_entropy,
                                                     scored=scored_positions(tree, rows, chunk))
                    logps.append(gather_rows(flat, tree, rows, chunk, width))
                    if compute_entropy:
                        entropies.append(gather_rows(entropy, tree, rows, chunk, width))
            return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            try:
                return self._seal_generate_and_score(inputs)
            finally:
                self._seal_scoring_seconds += time.perf_counter() - started

        def _seal_generate_and_score(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if output.get("sampling_per_token_logps") is not None and output.get("old_per_token_logps") is not None:
                from seal_rl.train.importance import importance_spread

                mask = output["completion_mask"] * output["tool_mask"] if "tool_mask" in output else output["completion_mask"]
                self.seal.importance = importance_spread(output["old_per_token_logps"], output["sampling_per_token_logps"], mask,
                                                         self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max)  # fmt: skip
            before, after, terms = seal_advantages(self, inputs, output, self.seal.recipe, self.seal.apatch.apply_to)
            self.seal.apatch_hook_calls += 1
            self.seal.after_advantages(self, inputs, before, after, terms)
            return output

    return SealGRPOTrainer


def seal_advantages(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any], recipe: Any,
                    apply_to: str) -> tuple[Any, Any, list[list[float]] | None]:  # fmt: skip
    """SEAL's advantages in place of TRL's group advantages ``output["advantages"]`` (B,): A-Patch's
    Ã_j = w_j · A_j (SEAL Eq. 12; w_j is each sample's ``apatch_weight``, 1 when A-Patch is off), then,
    under ``credit: turn``, the per-token turn term (:func:`turn_credit`), which makes them ``[B, T]``.
    Returns TRL's A, the reweighted Ã and this process's episodes' turn advantages (``None`` under
    ``credit: episode``)."""
    import torch

    before = output["advantages"].clone()
    weights = torch.tensor([float(x["apatch_weight"]) for x in inputs], dtype=before.dtype, device=before.device)
    output["advantages"] = after = reweight(before, weights, apply_to)
    terms = None
    if recipe.credit == "turn":
        output["advantages"], terms = turn_credit(
            trainer, inputs, after, output["completion_ids"].shape[1], omega=recipe.credit_weight,
            per_episode=recipe.turn_samples if recipe.layout == "turn" else 1, apply_to=apply_to)  # fmt: skip
    return before, after, terms


def turn_credit(trainer: Any, inputs: list[dict[str, Any]], advantages: Any, width: int, *, omega: float,
                per_episode: int = 1, apply_to: str = "all") -> tuple[Any, list[list[float]]]:  # fmt: skip
    """Per-token advantages under ``credit: turn`` (:mod:`seal_rl.credit`): ``[B, width]``, each model
    token of user turn k of episode g at w_g·A_g + ω·v_k·Ã(g, k); and this process's episodes' Ã.

    ``advantages``: this process's (B,) group advantages (after A-Patch, where the trainer applies
    it); ``inputs``: the samples with the ``seal_token_turns``, ``seal_turn_outcomes`` and
    ``seal_turn_weights`` fields :class:`~seal_rl.train.loop.SealLoop` adds. Ã needs whole groups,
    which TRL's global batch may spread over ranks, so the episodes' turn outcomes are gathered (a
    collective) and grouped as TRL groups its rewards: ``num_generations`` consecutive samples, of
    which the ``turn`` layout's ``per_episode`` consecutive ones are one episode."""
    import torch

    from seal_rl.credit import token_advantages, turn_advantages
    from seal_rl.train.loop import _gather

    mine = [x["seal_turn_outcomes"] for x in inputs[::per_episode]]
    everyone = _gather(trainer, mine)
    size = trainer.num_generations // per_episode  # episodes per group
    scale = trainer.scale_rewards != "none"
    terms = [t for start in range(0, len(everyone), size) for t in turn_advantages(everyone[start:start + size], scale=scale)]
    offset = trainer.accelerator.process_index * len(mine)
    local = terms[offset:offset + len(mine)]
    values = advantages.tolist()
    rows = []
    for i, x in enumerate(inputs):
        row = token_advantages(values[i], local[i // per_episode], x["seal_token_turns"], omega=omega,
                               turn_weights=x["seal_turn_weights"], apply_to=apply_to)
        rows.append(row[:width] + [values[i]] * (width - len(row)))
    return torch.tensor(rows, dtype=advantages.dtype, device=advantages.device), local


class _Prepared:
    """A micro-batch ``_prepare_inputs`` has already returned, handed through transformers'
    ``training_step``, which prepares its inputs once more."""

    def __init__(self, batch: dict[str, Any]) -> None:
        self.batch = batch


def gradient_without_advantages(trainer: Any) -> str | None:
    """What gives TRL's loss a gradient when every advantage is 0 (None: nothing): the KL term,
    the entropy bonus, the MoE load-balancing loss. ``silent_updates: skip`` needs None."""
    if trainer.beta != 0:
        return f"grpo.beta is {trainer.beta} (the KL term)"
    if getattr(trainer, "_entropy_bonus_enabled", False):
        return "an entropy bonus is on (entropy_coef)"
    if getattr(trainer, "aux_loss_enabled", False):
        return "the model's MoE load-balancing loss is on (router_aux_loss_coef)"
    return None


def _reordered(value: Any, order: list[int]) -> Any:
    """A generation-batch field in a new row order (tensors with a batch dimension and lists)."""
    if value is None or (hasattr(value, "ndim") and value.ndim == 0):
        return value
    if hasattr(value, "ndim"):
        import torch

        return value[torch.tensor(order, device=value.device)]
    return [value[i] for i in order]


def _epoch_seeded(sampler_class: type) -> type:
    """TRL's RepeatSampler with each epoch's task order drawn from (seed, epoch).

    TRL's sampler keeps one generator for the whole run, so a run resumed in epoch e >= 2 would
    replay epoch 1's order. transformers calls ``set_epoch`` on the sampler at every epoch start
    (also when resuming), so the order depends on the epoch alone.
    """

    class EpochSeededRepeatSampler(sampler_class):
        epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self):
            if self.shuffle:
                self.generator.manual_seed(derived_seed(self.seed or 0, self.epoch, 0))
            yield from super().__iter__()

    return EpochSeededRepeatSampler


def _seal_callback(loop: SealLoop):
    from transformers import TrainerCallback

    class SealStateCallback(TrainerCallback):
        """Saves SEAL state and the seconds so far into every checkpoint directory, and copies what TRL logs (loss, KL,
        entropy, gradient norm, clip ratios, completion lengths, ``frac_reward_zero_std``, ...)
        into ``metrics.jsonl`` as ``kind: trainer`` lines, so the report has them."""

        def on_save(self, args, state, control, **kwargs):
            if loop.is_main:
                checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                checkpoint.mkdir(parents=True, exist_ok=True)
                (checkpoint / SEAL_STATE_FILE).write_text(json.dumps(loop.state.to_json(), indent=1, sort_keys=True) + "\n")
                loop.write_timing(checkpoint / TIME_FILE, state.global_step)
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            if loop.is_main and logs:
                line = {"round": loop.state.round, "step": state.global_step, "kind": "trainer"}
                line.update((k, v) for k, v in logs.items() if not k.startswith("seal/") and isinstance(v, (int, float, str)))
                with open(loop.out / METRICS_FILE, "a", encoding="utf-8") as handle:
                    jsonl.append(handle, line)
            if logs:
                # The report_to integrations (built before this callback) have read the seal/ scalars;
                # the console printer (added after it) would echo dozens of them per log: the round
                # summary line says it better. trainer_state.json keeps its own copy of every log.
                for key in [k for k in logs if k.startswith("seal/")]:
                    del logs[key]
            return control

    return SealStateCallback()


def _validation_callback(loop: SealLoop, trainer: Any, updates_per_round: int, every_rounds: int):
    from transformers import TrainerCallback

    class ValidationCallback(TrainerCallback):
        """Validates before training (``eval.at_start``), after every ``every_rounds`` rounds and after the last round."""

        def on_train_begin(self, args, state, control, **kwargs):
            if state.global_step == 0 and loop.recipe.eval.at_start:
                loop.validate(trainer, 0)
            return control

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % updates_per_round == 0:
                round_index = state.global_step // updates_per_round
                if round_index % every_rounds == 0 or state.global_step >= state.max_steps:
                    loop.validate(trainer, round_index)
            return control

    return ValidationCallback()


def _fsdp_on_cpu(trainer: Any) -> None:
    """Let ``accelerate launch`` with an FSDP config shard on CPU processes (gloo), as on GPUs.

    accelerate turns its FSDP environment (``ACCELERATE_USE_FSDP``) into FSDP only for GPU-like
    process types and silently falls back to DDP on CPU processes, although PyTorch's FSDP2 runs on
    gloo. For tests and laptops (``configs/accelerate/fsdp-cpu.yaml``) the trainer's accelerator is
    switched to FSDP, with the plugin accelerate builds from the same environment, before it wraps
    the model.
    """
    import torch
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if torch.cuda.is_available() or state.num_processes == 1 or os.environ.get("ACCELERATE_USE_FSDP", "").lower() != "true":
        return
    if state.distributed_type != DistributedType.FSDP:
        state.distributed_type = DistributedType.FSDP
        state.fsdp_plugin = FullyShardedDataParallelPlugin()
        trainer.is_fsdp_enabled = True
