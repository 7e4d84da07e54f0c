"""BFCL multi-turn episodes inside TRL's own ``GRPOTrainer``: a ``rollout_func``.

TRL's ``environment_factory`` cannot play BFCL multi-turn: its tool loop stops at the first answer
without a call, and has no hook for the next user turn or a miss_func function reveal. TRL 1.16's
``rollout_func(prompts, trainer) -> dict`` can (experimental in TRL): :class:`BfclRollout` plays
each prompt's task as one whole episode — every user turn, reveals, budgets, the ``bfcl`` or
``seal`` protocol, the interface of the recipe's preset — with the trainer's own generation
(transformers on ``trainer.model``, or TRL's colocated vLLM engine when ``use_vllm``), and returns
what TRL trains on: the token-exact prompt and completion ids, the sampling log-probabilities and
``env_mask`` (1 on model tokens, 0 on what the environment inserted: tool results, user turns).

Every other field reaches the reward functions: ``seal_reward`` (the verifier's reward the recipe
names, binary or progress; ``None`` when unscorable), ``seal_progress`` (the progress reward),
``turn_labels`` (the diagnosis Ψ of each user turn), ``apatch_weight`` (w_j of Eq. 11) and
``task_id``. :func:`bfcl_reward`, :func:`progress_reward` and :func:`turn_pass_reward` read them.

The closed loop runs as in ``seal train`` (:class:`seal_rl.train.loop.SealLoop`): the labels of
each round update C_t, ρ(z) and Ω_{t+1}. What a plain ``GRPOTrainer`` does not do is Eq. 12 (it
does not multiply its advantages by w_j) or ``credit: turn``; :func:`bfcl_trainer_class` builds one
that does both, as ``seal train``'s trainer does. Neither forwards a group's shared prompt once
(docs/guides/train.md).

    from trl import GRPOConfig, GRPOTrainer
    from seal_rl.integrations.trl import BfclRollout, bfcl_dataset, bfcl_reward

    trainer = GRPOTrainer(model="MODEL_DIR", reward_funcs=[bfcl_reward], train_dataset=bfcl_dataset("train"),
                          args=GRPOConfig(output_dir="runs/trl", num_generations=4, remove_unused_columns=False),
                          rollout_func=BfclRollout("seal-full", out="runs/trl/seal"))
    trainer.train()

``examples/trl_grpo_bfcl.py`` is a complete script; docs/guides/integrations.md explains the options.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seal_rl import jsonl
from seal_rl.credit import turn_outcomes
from seal_rl.diagnose import add_diagnosis
from seal_rl.env import EnvConfig
from seal_rl.errors import SealError
from seal_rl.families import resolve_auto
from seal_rl.generators import HFGenerator, VLLMGenerator
from seal_rl.generators.lockstep import trainer_lockstep
from seal_rl.rollout import derived_seed, run_episodes
from seal_rl.tasks import TaskSet
from seal_rl.train.loop import CONSOLE, SealLoop, _gather, round_metrics, round_summary
from seal_rl.train.recipe import SealRecipe, load_recipe
from seal_rl.train.run_dir import METRICS_FILE
from seal_rl.train.samples import training_reward, trl_sample


def bfcl_dataset(split: str = "train", categories: Sequence[str] | None = None, tasks: Sequence[str] | None = None) -> Any:
    """The prompts a :class:`BfclRollout` plays: one row per task, ``prompt`` a one-message
    conversation holding the task id (the episode builds the real prompt), and ``task_id``.

    ``split``: ``train`` or ``test`` (the paper's 400/400 split) or ``all``; ``categories``: some of
    base, miss_func, miss_param, long_context; ``tasks``: explicit ids instead of both.
    """
    from datasets import Dataset

    task_set = TaskSet.load()
    chosen = task_set.select(split, list(categories) if categories else None, ids=list(tasks) if tasks else None)
    if not chosen:
        raise SealError(f"No BFCL task matches split {split!r} and categories {list(categories or [])}.")
    return Dataset.from_list([{"prompt": [{"role": "user", "content": t.id}], "task_id": t.id} for t in chosen])


def bfcl_reward(prompts: list[Any], completions: list[Any], seal_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """The verifier's reward of each episode, as the recipe's ``reward`` names it: ``binary`` (the
    default) 1 when every turn passes the official checker's rules, else 0; ``progress`` the share
    of turns that pass. ``None`` for an unscorable episode (checker or generation error), which TRL
    leaves out."""
    return list(seal_reward)


def progress_reward(prompts: list[Any], completions: list[Any], seal_progress: list[float | None], **kwargs: Any) -> list[float | None]:
    """Environment Tuning's progress reward of each episode (:attr:`seal_rl.verify.Verdict.progress`):
    the share of scorable user turns that were reached and pass the official checks; ``None`` when
    unscorable. :func:`bfcl_reward` gives the same under a recipe with ``reward: progress``."""
    return list(seal_progress)


def turn_pass_reward(prompts: list[Any], completions: list[Any], turn_labels: list[list[str]], **kwargs: Any) -> list[float | None]:
    """The share of an episode's user turns the diagnosis labels ``pass`` (a denser signal than
    :func:`bfcl_reward`; not the paper's reward: weight it yourself with ``reward_weights``)."""
    return [sum(label == "pass" for label in labels) / len(labels) if labels else None for labels in turn_labels]


def bfcl_trainer_class(base: type | None = None) -> type:
    """TRL's ``GRPOTrainer`` (or a subclass, ``base``) that also does what a :class:`BfclRollout`
    recipe asks of the advantages: A-Patch's Ã_j = w_j · A_j (SEAL Eq. 12, when ``apatch.enabled``)
    and ``credit: turn``'s per-token turn term (:func:`seal_rl.train.trainer.turn_credit`), as
    ``seal train``'s trainer applies them. Its ``rollout_func`` must be a :class:`BfclRollout`."""
    if base is None:
        from trl import GRPOTrainer as base

    class BfclGRPOTrainer(base):
        seal_advantages = True
        """marks a trainer that applies Eq. 12 and turn credit (:meth:`BfclRollout.__call__` checks it)"""

        def _generate_and_score_completions(self, inputs):
            from seal_rl.train.trainer import seal_advantages

            output = super()._generate_and_score_completions(inputs)
            rollout = self.rollout_func
            if isinstance(rollout, BfclRollout) and self.model.training:  # TRL's evaluation trains nothing
                seal_advantages(self, inputs, output, rollout.recipe, rollout.loop.apatch.apply_to)
            return output

    return BfclGRPOTrainer


class BfclRollout:
    """TRL's ``rollout_func`` for BFCL multi-turn, configured by a seal-rl recipe.

    ``recipe``: a shipped recipe name (``vanilla-grpo``, ``seal-full``, ``paper-qwen2.5-7b``, …), a
    recipe file, or a :class:`~seal_rl.train.recipe.SealRecipe`; ``overrides``: ``KEY=VALUE`` as
    ``seal train --set`` takes them. Its ``env`` (protocol, prompt mode, call format, caps),
    ``budgets``, ``interface``, ``apatch``, ``diagnosis``, ``profile_window``, ``concurrency``,
    ``rollout_scheduler``, ``generation_batch`` and ``prefix_cache_tokens`` apply; its ``model`` and ``grpo`` sections do not
    (``GRPOConfig`` decides: sampling temperature and top_p, ``use_vllm``, batch sizes), except
    ``grpo.seed``, which seeds the episodes. ``layout`` must be ``episode``.

    ``out``: a directory for each round's episodes (``trajectories.jsonl``, with verdict and
    diagnosis) and metrics line (``metrics.jsonl``), as ``seal train`` writes them, without advantages.
    """

    def __init__(self, recipe: str | Path | SealRecipe = "vanilla-grpo", *, overrides: Sequence[str] = (),
                 out: str | Path = "runs/trl-bfcl") -> None:  # fmt: skip
        # the model is GRPOTrainer's: a recipe that leaves model.path to --set gets a placeholder
        recipe = recipe if isinstance(recipe, SealRecipe) else load_recipe(str(recipe), ["model.path=GRPOTrainer", *overrides])
        if recipe.layout != "episode":
            raise SealError(f"BfclRollout plays whole episodes; the recipe's layout is {recipe.layout!r}. Set layout=episode.")
        self.out = Path(out)
        self.loop = _RolloutOnlyLoop(recipe, TaskSet.load(), self.out, generator_factory=self._generator)

    @property
    def recipe(self) -> SealRecipe:
        return self.loop.recipe

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Play one episode per prompt (TRL has already repeated each task ``num_generations`` times).

        During TRL's evaluation (``eval_dataset``; the model is in eval mode) the episodes are played
        under the recipe's evaluation settings — the interface removed, ``eval.protocol`` — and the
        closed loop does not move: C_t, ρ(z) and Ω are the training rounds' alone."""
        self._check(prompts)
        if self.recipe.credit == "turn" and not getattr(trainer, "seal_advantages", False):
            raise SealError("credit: turn gives every token of a user turn its own advantage, which TRL's GRPOTrainer does not "
                            "compute; build the trainer from seal_rl.integrations.trl.bfcl_trainer_class() (or use "
                            "seal train), or set credit=episode.")  # fmt: skip
        self.loop.is_main = trainer.accelerator.is_main_process
        self._resolve_auto(trainer.processing_class)
        if not trainer.model.training:
            return self._evaluate(prompts, trainer)
        output = self.loop.rollout(prompts, trainer)
        records = self.loop._round_rollouts
        output["turn_labels"] = [[t["label"] for t in r["diagnosis"]["labels"]] for r in records]
        output["task_id"] = [r["task_id"] for r in records]
        output["seal_progress"] = [training_reward(r, "progress") for r in records]
        self._log(trainer, records, output["apatch_weight"])
        return output

    def _evaluate(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        loop = self.loop
        chat = loop.chat(trainer)
        episodes = [(i, loop.task_set.get(p[-1]["content"]), {}) for i, p in enumerate(prompts)]
        rollouts = run_episodes(
            episodes, self._generator(trainer), lambda: loop.family.make_env(loop.validation_config, catalog=loop.catalog),
            chat=chat.for_inference(), budgets=loop.budgets, concurrency=loop.recipe.concurrency,
            seed=derived_seed(loop.recipe.grpo.seed, "eval", trainer.state.global_step), scheduler=loop.recipe.rollout_scheduler,
        )  # fmt: skip
        samples = [{"prompt_ids": r.trajectory.prompt_ids, **trl_sample(r, min(chat.eos_ids))} for r in rollouts]
        for r in rollouts:
            add_diagnosis(r.record, loop.recipe.diagnosis.priority)
        labels = [[t["label"] for t in r.record["diagnosis"]["labels"]] for r in rollouts]
        return {"prompt_ids": [s["prompt_ids"] for s in samples], "completion_ids": [s["completion_ids"] for s in samples],
                "logprobs": [s["logprobs"] for s in samples], "env_mask": [s["env_mask"] for s in samples],
                "seal_reward": [s["reward"] for s in samples], "turn_labels": labels, "apatch_weight": [1.0] * len(samples),
                "task_id": [r.record["task_id"] for r in rollouts],
                "seal_progress": [training_reward(r.record, "progress") for r in rollouts]}  # fmt: skip

    def _check(self, prompts: list[Any]) -> None:
        for prompt in prompts:
            content = prompt[-1].get("content") if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) else None
            try:
                self.loop.task_set.get(content)
            except SealError:
                raise SealError(f"BfclRollout plays BFCL tasks, and this prompt names none: {str(prompt)[:120]!r}. "
                                "Build the dataset with seal_rl.integrations.trl.bfcl_dataset().") from None  # fmt: skip

    def _resolve_auto(self, tokenizer: Any) -> None:
        """``prompt_mode`` / ``call_format`` ``auto``: the trainer's template family decides, once."""
        env, picked = resolve_auto(self.loop.recipe.env, tokenizer)
        if picked:
            self.loop.recipe.env = env
            self.loop.env_config = EnvConfig(**env)
            self.loop.validation_config = EnvConfig(**{**env, "protocol": self.loop.recipe.eval.protocol or env["protocol"]})
            if self.loop.is_main:
                CONSOLE.print(picked, markup=False, highlight=False)

    def _generator(self, trainer: Any):
        """The trainer's own generation, with GRPOConfig's sampling settings."""
        if getattr(trainer, "use_vllm", False):
            return VLLMGenerator(trainer)
        recipe = self.loop.recipe
        return HFGenerator(trainer.accelerator.unwrap_model(trainer.model), trainer.processing_class,
                           temperature=trainer.args.temperature, top_p=trainer.args.top_p, max_batch=recipe.generation_batch,
                           lockstep=trainer_lockstep(trainer), prefix_cache_tokens=recipe.prefix_cache_tokens)  # fmt: skip

    def _log(self, trainer: Any, records: list[dict[str, Any]], weights: list[float]) -> None:
        """Write the round's episodes and metrics line into ``out`` and print the round's summary."""
        loop = self.loop
        rows = [{"round": r["round"], "step": trainer.state.global_step, "task_id": r["task_id"],
                 "group": f"{r['round']}:{r['task_id']}", "category": r["category"], "reward": r["reward"],
                 "progress": r["progress"], "end_reason": r["end_reason"], "dropped": r.get("dropped"),
                 "labels": [t["label"] for t in r["diagnosis"]["labels"]], "reference_labels": r["reference_labels"],
                 "apatch_weight": w, "turn_outcomes": turn_outcomes(r), "messages": r["messages"], "steps": r["steps"], "trace": r["trace"],
                 "verdict": r["verdict"], "diagnosis": r["diagnosis"]}
                for r, w in zip(records, weights, strict=True)]  # fmt: skip
        rows = _gather(trainer, rows)
        if not loop.is_main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "trajectories.jsonl", "a", encoding="utf-8") as handle:
            for row in rows:
                jsonl.append(handle, row)
        metrics = round_metrics(loop.state.round, trainer.state.global_step, rows, loop.state, loop._round_interface, loop.timing,
                                loop.recipe.reward, loop.recipe.credit)  # fmt: skip
        with open(self.out / METRICS_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(metrics) + "\n")
        CONSOLE.print(round_summary(metrics, loop._round_interface, loop.state.interface), highlight=False, soft_wrap=True)


class _RolloutOnlyLoop(SealLoop):
    """``seal train``'s closed loop without its trainer: no update to time (TRL's own trainer runs
    it unmeasured), so no update line."""

    def print_update(self) -> None:
        return None
