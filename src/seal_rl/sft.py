"""Supervised warm start: fine-tune on multi-turn transcripts before RL, with TRL's ``SFTTrainer``.

RL from a model that never succeeds learns nothing: every group has reward variance 0, so every
advantage is 0. A warm start by supervised fine-tuning (SFT) on transcripts fixes that — on
curated or filtered transcripts for a 7B model (rejection-sampling fine-tuning), or on
oracle/faulty-oracle transcripts for the tiny CPU model of ``configs/learn-cpu.yaml``.

Samples are built exactly as RL rollouts are: each transcript is *played* through the
environment and the episode driver (:func:`seal_rl.rollout.run_episodes`) with the recipe's
call format, prompt mode, interface and budgets, and the token-exact builder
(:mod:`seal_rl.trajectory`) turns it into ``input_ids`` with an ``assistant_masks`` that is 1 on
the assistant's tokens only (each message plus its end-of-message token). SFT and GRPO therefore
train on identical tokens, and the loss covers assistant tokens only.

Data sources (``--data`` on the command line, ``warm_start.data`` in a recipe):

* ``oracle`` — the ground truth of the selected tasks;
* ``oracle:faults=P,seed=S[,kinds=A+B][,turn=N]`` — the faulty oracle (:mod:`seal_rl.faults`);
* ``replay:FILE`` — recorded assistant messages, one episode per JSONL line (as ``seal eval``);
* ``run:DIR`` — the transcripts of a ``seal eval`` run directory.

``successful_only`` keeps only episodes whose replayed reward is 1 (rejection-sampling
fine-tuning); ``repeat`` duplicates a source's samples (mixing weights); ``tasks`` restricts a
source to some tasks. Every transcript is rendered under each interface preset listed in
``warm_start.interfaces`` (by default only ``vanilla``, the evaluation interface), so that a model
trained with a training-time interface has also seen its prompts.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.environments.family import BfclFamily, affordances, oracle_messages
from seal_rl.errors import SealError
from seal_rl.interface import Interface, InterfaceState
from seal_rl.policies import Episode, OraclePolicy, ReplayPolicy, ScriptedAgent, parse_policy
from seal_rl.rollout import Budgets, Generation, Request, run_episodes
from seal_rl.tasks import Task, TaskSet
from seal_rl.tools import ToolCatalog
from seal_rl.trajectory import ChatTokens


TRUNCATIONS = ("prompt_budget", "completion_budget", "context_window", "max_model_calls")


@dataclass
class SFTSource:
    """One source of warm-start transcripts."""

    source: str = MISSING
    """``oracle`` | ``oracle:faults=P,seed=S[,kinds=A+B][,turn=N]`` | ``replay:FILE`` | ``run:DIR``"""
    tasks: list[str] = field(default_factory=list)
    """only these task ids (empty: oracle sources play the recipe's tasks; files keep every episode)"""
    repeat: int = 1
    """copies of each sample (relative weight of this source in the mix)"""
    successful_only: bool = False
    """keep only episodes whose replayed reward is 1 (rejection-sampling fine-tuning)"""


@dataclass
class SFTSettings:
    """SFT hyper-parameters, passed to TRL's ``SFTConfig``."""

    learning_rate: float = 1e-5
    """AdamW learning rate"""
    lr_scheduler_type: str = "constant_with_warmup"
    """transformers' learning-rate schedule (``constant_with_warmup``, ``linear``, ``cosine``, ...)"""
    warmup_steps: int = 0
    """optimizer steps of the learning-rate warm-up"""
    num_train_epochs: float = 2.0
    """passes over the warm-start samples; a positive ``max_steps`` overrides it"""
    max_steps: int = -1
    """optimizer steps; -1: from epochs"""
    per_device_train_batch_size: int = 1
    """samples per device per micro-batch"""
    gradient_accumulation_steps: int = 1
    """micro-batches per optimizer step"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    seed: int = 0
    """seeds the SFT trainer and the order of its samples (TRL's ``seed`` and ``data_seed``)"""
    bf16: Any = False
    """``true`` | ``false`` | ``auto``: bfloat16 mixed precision, as ``grpo.bf16`` (on a CPU, torch's autocast
    with float32 master weights; ``auto``: on where the GPU or the CPU has bfloat16 arithmetic)"""
    shared_prefix: Any = "auto"
    """``auto`` | ``true`` | ``false``: forward the tokens a micro-batch's samples share (the system prompt
    with the tool docs of one tool class, repeated transcripts) once, as a prefix tree
    (:mod:`seal_rl.prefix_tree`), as the RL update does; exact up to float order. ``auto``
    packs when it saves tokens and the model passes the check"""
    logging_steps: int = 5
    """log the SFT metrics every N optimizer steps"""
    report_to: list[str] = field(default_factory=lambda: ["none"])
    """``tensorboard`` / ``wandb`` through TRL, as ``grpo.report_to``"""
    extra: dict[str, Any] = field(default_factory=dict)
    """any other ``SFTConfig`` field, passed through unchanged"""


@dataclass
class WarmStartConfig:
    """The supervised warm start ``seal train`` runs before RL when ``data`` is not empty."""

    data: list[SFTSource] = field(default_factory=list)
    """transcript sources; empty: no warm start (train ``model.path`` as it is)"""
    interfaces: list[str] = field(default_factory=lambda: ["vanilla"])
    """interface presets (Ω_0 in training mode) to render every transcript under"""
    sft: SFTSettings = field(default_factory=SFTSettings)
    """the warm start's training run"""


# -- transcripts -------------------------------------------------------------------------------


def check_source(source: SFTSource) -> OraclePolicy | ReplayPolicy | Path:
    """Fail early, with a one-line reason, on a source that cannot give transcripts."""
    spec = source.source
    if source.repeat < 1:
        raise SealError(f"repeat must be at least 1 for warm-start source {spec!r}, got {source.repeat}.")
    kind, _, rest = spec.partition(":")
    if kind == "run":
        if not rest or not (Path(rest) / "results.jsonl").is_file():
            raise SealError(f"Warm-start source {spec!r}: not a `seal eval` run directory (no results.jsonl in {rest or '?'}).")
        return Path(rest)
    try:
        policy = parse_policy(spec)
    except SealError as exc:
        raise SealError(f"Bad warm-start source {spec!r}: {exc}") from None
    if not isinstance(policy, (OraclePolicy, ReplayPolicy)):
        raise SealError(f"Warm-start source {spec!r} is not a transcript source; use oracle, oracle:faults=..., "
                        "replay:FILE or run:DIR (a `seal eval` run directory).")  # fmt: skip
    if isinstance(policy, ReplayPolicy) and not policy.path.is_file():
        raise SealError(f"Warm-start source {spec!r}: replay file {policy.path} does not exist.")
    return policy


def source_episodes(source: SFTSource, tasks: Sequence[Task], task_set: TaskSet, call_format: str,
                    family: Any = None) -> list[Episode]:  # fmt: skip
    """The scripted episodes of one source (before filtering by reward). An environment family other
    than BFCL (``family``): ``oracle`` is its own (:meth:`seal_rl.environments.Family.oracle`); ``replay:``
    and ``run:`` (a ``seal eval --family`` run) name its task ids; the faulty oracle is BFCL's."""
    checked = check_source(source)
    if family is not None and not isinstance(family, BfclFamily) and isinstance(checked, OraclePolicy):
        if source.source != "oracle":
            raise SealError(f"Warm-start source {source.source!r}: the faulty oracle perturbs BFCL's ground truth; family "
                            f"{family.name} warm-starts from source: oracle, replay:FILE or run:DIR.")  # fmt: skip
        selected = [task_set.get(t) for t in source.tasks] if source.tasks else tasks
        return [Episode(i + 1, t, ScriptedAgent(oracle_messages(family, t, call_format))) for i, t in enumerate(selected)]
    if isinstance(checked, Path):
        episodes = _run_episodes(checked, task_set)
    else:
        selected = [task_set.get(t) for t in source.tasks] if source.tasks and checked.selects_tasks else tasks
        episodes = checked.episodes(selected, task_set, call_format)
    if source.tasks and not isinstance(checked, OraclePolicy):
        wanted = set(source.tasks)
        episodes = [e for e in episodes if e.task.id in wanted]
    return episodes


def _run_episodes(run_dir: Path, task_set: TaskSet) -> list[Episode]:
    from seal_rl.evaluate import read_results

    episodes = []
    for record in read_results(run_dir):
        if record.get("error"):  # a generation error is not a transcript
            continue
        messages = [m if m.get("tool_calls") else m["content"] for m in record.get("messages", []) if m.get("role") == "assistant"]
        episodes.append(Episode(len(episodes) + 1, task_set.get(record["task_id"]), ScriptedAgent(messages)))
    return episodes


class TranscriptGenerator:
    """Plays scripted messages as a model would emit them: the message's tokens plus the token the
    model ends a message with (the template's terminator, :class:`seal_rl.stops.Stops`).

    The token-exact builder then keeps the end-of-message token on the assistant side, so the
    warm-started model learns to stop where the transcript stops.
    """

    def __init__(self, agents: dict[int, Any], chat: ChatTokens) -> None:
        self.agents, self.chat = agents, chat

    def generate(self, requests: Sequence[Request], seed: int) -> list[Generation | None]:
        out: list[Generation | None] = []
        for request in requests:
            text = self.agents[request.episode].act(request.observation, request.info)
            out.append(None if text is None else Generation(*self.chat.as_generated(text)))
        return out


def build_samples(
    sources: Sequence[SFTSource],
    tasks: Sequence[Task],
    task_set: TaskSet,
    tokenizer: Any,
    env_config: EnvConfig,
    budgets: Budgets,
    interfaces: Sequence[str] = ("vanilla",),
    family: Any = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Token-exact SFT samples (``input_ids``, ``assistant_masks``) and a summary of what was kept.

    Each source's transcripts are played under every interface preset in ``interfaces`` with the
    recipe's budgets (a transcript longer than the budgets is cut as a rollout would be); an
    episode is dropped when ``successful_only`` and its replayed reward is not 1, when the opening
    prompt exceeds the prompt budget, or when it has no assistant token. ``dropped`` counts why.
    """
    if not sources:
        raise SealError("No warm-start data: give at least one source (--data oracle, --data run:DIR, ...).")
    chat = ChatTokens.for_episodes(tokenizer, env_config.prompt_mode, env_config.call_format)
    if chat.stops.end_id is None:
        raise SealError("The model names no end-of-message token (no eos_token, no generation config stops, no template "
                        "terminator); SFT needs one to end assistant messages.")
    catalog = ToolCatalog()
    samples: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    for source in sources:
        episodes = source_episodes(source, tasks, task_set, env_config.call_format, family)
        for preset in interfaces:
            interface = Interface(env_config.prompt_mode, InterfaceState.initial(preset), call_format=env_config.call_format,
                                  catalog=catalog, protocol=env_config.protocol, **affordances(family))  # fmt: skip
            make = family.make_env if family is not None else BfclEnv
            # Fresh agents for every rendering: scripted agents are consumed as they play.
            agents = {e.index: ScriptedAgent(list(e.agent.messages)) for e in episodes}
            rollouts = run_episodes(
                [(e.index, e.task, {}) for e in episodes], TranscriptGenerator(agents, chat),
                lambda: make(env_config, interface, catalog=catalog), chat=chat, budgets=budgets, concurrency=64,
            )  # fmt: skip
            for rollout in rollouts:
                trajectory, record = rollout.trajectory, rollout.record
                cut = record["end_reason"] in TRUNCATIONS
                if source.successful_only and record["reward"] != 1.0:
                    dropped[record["end_reason"] if cut else "unsuccessful"] += 1  # say when a budget cut it
                    continue
                if record["end_reason"] == "prompt_budget" or not any(trajectory.env_mask):
                    dropped[record["end_reason"] if cut else "no_assistant_tokens"] += 1
                    continue
                sample = {
                    "input_ids": trajectory.prompt_ids + trajectory.completion_ids,
                    "assistant_masks": [0] * len(trajectory.prompt_ids) + trajectory.env_mask,
                    "task_id": record["task_id"],
                    "source": source.source,
                    "interface": preset,
                    "reward": record["reward"],
                }
                samples += [sample] * source.repeat
                kept[source.source] += source.repeat
    if not samples:
        raise SealError(f"The warm-start sources gave no usable sample (dropped: {dict(dropped)}).")
    summary = {
        "samples": len(samples),
        "by_source": dict(kept),
        "dropped": dict(dropped),
        "interfaces": list(interfaces),
        "tokens": sum(len(s["input_ids"]) for s in samples),
        "assistant_tokens": sum(sum(s["assistant_masks"]) for s in samples),
        "success_rate": sum(s["reward"] for s in samples) / len(samples),
    }
    return samples, summary


# -- training ----------------------------------------------------------------------------------


def checkpointing_argument(enabled: bool) -> dict[str, bool]:
    """The ``TrainingArguments`` keyword that turns activation checkpointing on, for the installed
    transformers: ``activation_checkpointing`` from 5.23 (where ``gradient_checkpointing`` is a
    deprecated alias), ``gradient_checkpointing`` before (5.0–5.22 know only that name)."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": enabled}


def run_sft(
    model_path: str | Path,
    samples: Sequence[dict[str, Any]],
    settings: SFTSettings,
    out: Path,
    *,
    dtype: str = "auto",
    gradient_checkpointing: bool = False,
    adapters: Any = None,
) -> Path:
    """Fine-tune ``model_path`` on ``samples`` with TRL's ``SFTTrainer``; the model goes to ``out/model``.

    ``adapters``: a function ``model -> PEFT config`` to train LoRA adapters instead of every weight
    (``model.lora``); ``out/model`` is then the merged model and ``out/model/adapter`` the adapter.

    The loss is the mean negative log-likelihood of the assistant tokens (``assistant_masks``).
    ``out/sft_log.jsonl`` has TRL's log lines (loss, learning rate, gradient norm per logging step).
    """
    import os

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    from seal_rl.precision import checkpoint_dtype, resolve_bf16, training_dtype

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    bf16, said = resolve_bf16(settings.bf16, name="warm_start.sft.bf16")
    print(said, file=sys.stderr)
    loaded, said = training_dtype(dtype, checkpoint_dtype(model_path), bf16)
    print(said, file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=getattr(torch, loaded))
    dataset = Dataset.from_list([{"input_ids": s["input_ids"], "assistant_masks": s["assistant_masks"]} for s in samples])
    args = SFTConfig(
        output_dir=str(out / "checkpoints"),
        learning_rate=settings.learning_rate,
        lr_scheduler_type=settings.lr_scheduler_type,
        warmup_steps=settings.warmup_steps,
        num_train_epochs=settings.num_train_epochs,
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.per_device_train_batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        weight_decay=settings.weight_decay,
        seed=settings.seed,
        data_seed=settings.seed,
        bf16=bf16,
        logging_steps=settings.logging_steps,
        report_to=settings.report_to,
        save_strategy="no",
        max_length=None,
        **checkpointing_argument(gradient_checkpointing),
        use_cpu=not torch.cuda.is_available(),
        dataset_num_proc=None,
        **settings.extra,
    )
    peft_config = adapters(model) if adapters is not None else None
    trainer = packed_sft_trainer_class()(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                                         peft_config=peft_config)  # fmt: skip
    trainer.seal_shared_prefix = settings.shared_prefix
    began = time.perf_counter()
    trainer.train()
    with open(out / "sft_log.jsonl", "w", encoding="utf-8") as handle:
        for line in trainer.state.log_history:
            handle.write(json.dumps(line) + "\n")
    if peft_config is not None:  # the adapter alone, then the merged model (a plain model directory)
        adapted = trainer.accelerator.unwrap_model(trainer.model)
        adapted.save_pretrained(str(out / "model" / "adapter"), selected_adapters=[adapted.active_adapter])
        adapted.merge_and_unload().save_pretrained(str(out / "model"))
    else:
        trainer.save_model(str(out / "model"))
    tokenizer.save_pretrained(str(out / "model"))
    losses = [line["loss"] for line in trainer.state.log_history if "loss" in line]
    (out / "sft.json").write_text(json.dumps({
        "steps": trainer.state.global_step, "seconds": round(time.perf_counter() - began, 1),
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None, "bf16": bf16,
        "shared_prefix": trainer.seal_shared_prefix, "tokens": dict(trainer.seal_tokens),
    }, indent=1) + "\n")  # fmt: skip
    return out / "model"


def packed_sft_trainer_class() -> type:
    """TRL's ``SFTTrainer`` whose forward packs each micro-batch as a prefix tree
    (:mod:`seal_rl.prefix_tree`), so tokens its samples share are forwarded once.

    TRL's own ``compute_loss`` still computes the loss and metrics; it is handed a model that
    forwards the packed row and returns, in each sample's own layout, what the fused LM head would:
    each labelled token's log-probability, entropy, top-1 hit and label mask. A token shared by
    several samples is computed once and counted once per sample, so the loss is TRL's (sum over the
    samples' assistant tokens / ``num_items_in_batch``), up to float order. The attention stays
    switched through the backward pass (gradient checkpointing recomputes layers there).
    ``seal_shared_prefix``: ``auto`` | ``True`` | ``False`` (``warm_start.sft.shared_prefix``);
    ``seal_tokens``: tokens the samples held (``rows``) and tokens forwarded (``forwarded``).
    """
    import warnings
    from collections import Counter

    from trl import SFTTrainer

    from seal_rl.errors import SealWarning
    from seal_rl.prefix_tree import attention_switched, check_model, own_precision, pack

    class PackedSFTTrainer(SFTTrainer):
        seal_shared_prefix: Any = "auto"
        seal_tokens: Counter
        _seal_reason: str | None = None
        _seal_checked = False
        _seal_now: tuple[Any, list[list[int]]] | None = None

        def training_step(self, model, inputs, num_items_in_batch=None):
            if not hasattr(self, "seal_tokens"):
                self.seal_tokens = Counter()
            packed = self._seal_pack(model, inputs)
            if packed is None:
                return super().training_step(model, inputs, num_items_in_batch)
            self._seal_now = packed
            try:
                with attention_switched(self.accelerator.unwrap_model(model)):
                    return super().training_step(model, inputs, num_items_in_batch)
            finally:
                self._seal_now = None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self._seal_now is not None and model.training:
                model = _TreeForward(model, *self._seal_now)
            return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

        def _seal_pack(self, model, inputs):
            """(tree, each sample's labelled depths), or None for TRL's own forward."""
            mask = inputs.get("attention_mask")
            held = int(mask.sum()) if mask is not None else inputs["input_ids"].numel()
            self.seal_tokens["rows"] += held
            usable = (self.seal_shared_prefix is not False and mask is not None and "labels" in inputs
                      and self.compute_loss_func is None and self.label_smoother is None and not self.aux_loss_enabled)  # fmt: skip
            if usable and not self._seal_checked:
                self._seal_checked = True
                self._seal_reason = self._seal_check(model)
            if usable and self._seal_reason is not None:
                if self.seal_shared_prefix is True:
                    raise SealError(f"warm_start.sft.shared_prefix: true, but this model cannot be trained on shared prefixes: "
                                    f"{self._seal_reason}. Set it to auto or false.")  # fmt: skip
                usable = False
            if not usable:
                self.seal_tokens["forwarded"] += inputs["input_ids"].numel()
                return None
            rows, labelled = [], []
            for ids, keep, labels in zip(inputs["input_ids"].tolist(), mask.tolist(), inputs["labels"].tolist(), strict=True):
                n = sum(keep)  # right-padded
                rows.append(ids[:n] or ids[:1])
                labelled.append([d for d in range(1, n) if labels[d] != -100])
            tree = pack(rows)
            if self.seal_shared_prefix == "auto" and tree.forwarded >= tree.row_tokens:
                self.seal_tokens["forwarded"] += inputs["input_ids"].numel()
                return None
            self.seal_tokens["forwarded"] += tree.forwarded
            return tree, labelled

        def _seal_check(self, model) -> str | None:
            import torch

            unwrapped = self.accelerator.unwrap_model(model)
            tolerance = 2e-3 if next(unwrapped.parameters()).dtype == torch.float32 else 0.25
            training = unwrapped.training
            unwrapped.eval()
            try:
                with own_precision(unwrapped):
                    reason = check_model(unwrapped, unwrapped.config.get_text_config().vocab_size, tolerance=tolerance)
            finally:
                unwrapped.train(training)
            if reason:
                warnings.warn(f"Shared-prefix warm start is off for this model: {reason}; TRL forwards every sample whole.",
                              SealWarning, stacklevel=2)  # fmt: skip
            return reason

    return PackedSFTTrainer


class _TreeForward:
    """Stands in for the model in TRL's ``compute_loss``: forwards the packed row once and returns the
    fused LM head's per-token outputs laid out as the padded batch (``[B, L]``; zero elsewhere)."""

    def __init__(self, model: Any, tree: Any, labelled: list[list[int]]) -> None:
        self.model, self.tree, self.labelled = model, tree, labelled
        self.training = model.training

    def __call__(self, input_ids: Any, **_: Any) -> Any:
        from types import SimpleNamespace

        import torch

        from seal_rl.prefix_tree import TREE_KWARG

        tree, device = self.tree, input_ids.device
        ids = torch.tensor([tree.input_ids], dtype=torch.long, device=device)
        positions = torch.tensor([tree.position_ids], dtype=torch.long, device=device)
        labels = torch.full_like(ids, -100)
        scored = sorted({tree.where[r][d] for r, depths in enumerate(self.labelled) for d in depths})
        if scored:
            index = torch.tensor(scored, dtype=torch.long, device=device)
            labels[0, index] = ids[0, index]
        out = self.model(input_ids=ids, position_ids=positions, labels=labels, fused_lm_head=True, **{TREE_KWARG: tree})
        # the fused head's output at packed index j - 1 belongs to token j: sample r's depth d sits at (r, d - 1)
        at = torch.full(tuple(input_ids.shape), -1, dtype=torch.long)
        for r, depths in enumerate(self.labelled):
            for d in depths:
                at[r, d - 1] = tree.where[r][d] - 1
        at = at.to(device)
        valid = at >= 0

        def laid_out(flat: Any) -> Any:
            value = flat[0][at.clamp(min=0)]
            return torch.where(valid, value, torch.zeros_like(value))

        return SimpleNamespace(log_probs=laid_out(out.log_probs), entropy=laid_out(out.entropy), is_top1=laid_out(out.is_top1),
                               label_mask=valid, aux_loss=None)  # fmt: skip
