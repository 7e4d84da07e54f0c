"""The closed loop (SEAL Algorithm 1): one round's rollouts, diagnosis, profile, A-Patch weights
and interface evolution, and the round's metrics and summary line.

:class:`SealLoop` is TRL's ``rollout_func``: TRL hands it one generation batch of prompts (task
ids) and trains on what it returns. It carries the SEAL state (:class:`SealState`: round, C_t,
Ω_t, ρ(z)) from one round to the next, writes the round's logs into the run directory once TRL
has computed the advantages (:meth:`SealLoop.after_advantages`), and validates the model greedily
and strictly with the interface removed (:meth:`SealLoop.validate`).

Not here: the trainer subclass that calls it (:mod:`seal_rl.train.trainer`), or the run that
builds both (:mod:`seal_rl.train.run`).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from seal_rl import jsonl
from seal_rl.apatch import ApatchConfig, budgeted, trajectory_weight, update_label_weights
from seal_rl.credit import anchors_with_signal, turn_outcomes
from seal_rl.diagnose import add_diagnosis
from seal_rl.env import EnvConfig
from seal_rl.environments.family import BfclFamily, affordances
from seal_rl.errors import SealError
from seal_rl.generators import HFGenerator, VLLMGenerator
from seal_rl.generators.lockstep import trainer_lockstep
from seal_rl.interface import Interface, InterfaceState, evolve
from seal_rl.profile import CapabilityProfile, EpisodeLabels
from seal_rl.rollout import Budgets, DriverStats, Rollout, derived_seed, run_episodes
from seal_rl.tasks import Task, TaskSet
from seal_rl.tools import ToolCatalog
from seal_rl.train.async_rounds import AsyncRounds, group_player, staleness_summary
from seal_rl.train.recipe import SealRecipe, interface_config, samples_per_task
from seal_rl.train.run_dir import METRICS_FILE, VALIDATION_DIR, _best_validation, save_model, scalar_metrics
from seal_rl.train.samples import REWARD_FIELDS, trl_sample, turn_samples
from seal_rl.trajectory import ChatTokens


CONSOLE = Console(stderr=True)
UPDATE_PASSES = ("update/policy", "update/reference", "update/old_logprobs")
"""the passes of an update whose seconds and tokens each update line books (:func:`update_summary`)"""


@contextmanager
def round_progress(round_index: int, total: int, *, shown: bool):
    """A Rich progress bar of the round's episodes (done / total, ETA) on the main process, while
    stderr is a terminal; yields the callback that advances it."""
    if not (shown and CONSOLE.is_terminal):
        yield lambda rollout: None
        return
    columns = (TextColumn(f"[bold]round {round_index}"), BarColumn(), MofNCompleteColumn(), TextColumn("episodes"),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=CONSOLE, transient=True) as progress:
        bar = progress.add_task("round", total=total)
        yield lambda rollout: progress.advance(bar)


@dataclass
class SealState:
    """Everything SEAL adds to a training run's state; saved with every checkpoint."""

    round: int
    profile: CapabilityProfile
    interface: InterfaceState
    label_weights: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "profile": self.profile.to_json(),
            "interface": self.interface.to_json(),
            "label_weights": self.label_weights,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SealState:
        return cls(
            data["round"], CapabilityProfile.from_json(data["profile"]),
            InterfaceState.from_json(data["interface"]), dict(data["label_weights"]),
        )  # fmt: skip


class SealLoop:
    """Plays rounds and carries C_t, Ω_t and ρ(z) from one round to the next."""

    def __init__(
        self,
        recipe: SealRecipe,
        task_set: TaskSet,
        out: Path,
        *,
        is_main: bool = True,
        generator_factory: Any = None,
        validation: Sequence[Task] = (),
        family: Any = None,
    ) -> None:
        self.recipe = recipe
        self.family = family if family is not None else BfclFamily(task_set)
        """the environment family whose episodes the rounds play (:mod:`seal_rl.environments`)"""
        self.task_set = task_set
        self.out = out
        self.is_main = is_main
        self.env_config = EnvConfig(**recipe.env)
        self.validation_config = replace(self.env_config, protocol=recipe.eval.protocol or self.env_config.protocol)
        self.budgets = Budgets(**recipe.budgets)
        self.interface_config = interface_config(recipe)  # min_count auto resolved for the profile window
        self.apatch = ApatchConfig(**recipe.apatch)
        self.state = SealState(
            round=0,
            profile=CapabilityProfile(window=recipe.profile_window),
            interface=InterfaceState.initial(self.interface_config.preset),
            label_weights=self.apatch.base_utility,
        )
        self.catalog = ToolCatalog()  # tool specs and validators, shared by every episode of the run
        self.generator_factory = generator_factory
        """optional ``(trainer) -> Generator``, replacing the recipe's generator (tests, custom backends)"""
        self.timing: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()
        """per update pass (``update/policy``, ``update/old_logprobs``, ``update/reference``): ``/rows``, the
        tokens of its samples, and ``/forwarded``, what the model forwarded (shared prefixes once)"""
        self._update_marks: dict[str, float] = {}
        self.apatch_hook_calls = 0
        self._round_rollouts: list[dict[str, Any]] = []
        self._round_driver: dict[str, Any] = {}
        self._round_started = time.perf_counter()
        self.nothing_to_learn = False
        """the running round gives no advantage (:func:`nothing_to_learn`); ``silent_updates: skip`` skips its update"""
        self.rounds_played = 0
        """rounds this process has played (``state.round`` counts from the run's start, checkpoints included)"""
        self.validation = list(validation)
        self.train_tasks: list[Task] = []  # asynchronous rounds draw their own order of them
        # generator: server: the servers' generator and the check of what they serve (seal_rl.train.server_sync), the
        # producer of groups under staleness >= 1 (async_rounds), the round's importance ratios (importance)
        self.server = self.server_check = None
        self.producer: AsyncRounds | None = None
        self.importance: dict[str, float] = {}
        self.best_validation = _best_validation(out)
        self._chat: ChatTokens | None = None

    def chat(self, trainer: Any) -> ChatTokens:
        """The episodes' renderer, resolved once per run: the template check (and its note on TRL's
        training variant) runs at the first rollout or validation, not every round."""
        if self._chat is None:
            self._chat = ChatTokens.for_episodes(trainer.processing_class, self.env_config.prompt_mode, self.env_config.call_format)
        return self._chat

    # validation (greedy, strict, interface removed) -------------------------------------------

    def validate(self, trainer: Any, round_index: int) -> dict[str, Any]:
        """Play the validation tasks greedily under the evaluation interface and ``eval.protocol``; log the
        success, turn pass rate, accepted-call share and labels, and keep the best.

        A collective: every rank plays its share of the tasks and the results are gathered.
        """
        from seal_rl.evaluate import episode_counts, summarize, turn_measures

        began = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        training = model.training
        model.eval()
        generator = HFGenerator(model, trainer.processing_class, temperature=0.0, max_batch=self.recipe.generation_batch,
                                lockstep=trainer_lockstep(trainer), prefix_cache_tokens=self.recipe.prefix_cache_tokens)  # fmt: skip
        rank, world = _rank(trainer), trainer.accelerator.num_processes
        mine = [(i, t, {}) for i, t in enumerate(self.validation) if i % world == rank]
        rollouts = run_episodes(
            mine, generator, lambda: self.family.make_env(self.validation_config, catalog=self.catalog), chat=self.chat(trainer).for_inference(),
            budgets=self.budgets, concurrency=self.recipe.concurrency, seed=derived_seed(self.recipe.grpo.seed, 0, rank),
            scheduler=self.recipe.rollout_scheduler,
        )  # fmt: skip
        generator.close()
        model.train(training)
        for r in rollouts:
            add_diagnosis(r.record, self.recipe.diagnosis.priority)
        results = sorted(_gather(trainer, [r.record for r in rollouts]), key=lambda r: r["index"])
        summary = summarize(results)
        measures = turn_measures(episode_counts(r) for r in results)
        elapsed = time.perf_counter() - began
        line = {
            "round": round_index, "step": trainer.state.global_step, "kind": "validation",
            "validation/average": summary["average"], "validation/average_ci95": summary["average_ci95"],
            "validation/overall": summary["overall"], "validation/episodes": summary["episodes"],
            "validation/categories": summary["categories"], "validation/tasks": {r["task_id"]: r["reward"] for r in results},
            "validation/turn_pass_rate": measures["turn_pass_rate"], "validation/call_share": measures["call_share"],
            "validation/labels": measures["labels"], "validation/turns": measures["turns"],
            "validation/messages": measures["messages"], "validation/protocol": self.validation_config.protocol,
            "validation/seconds": round(elapsed, 2),
        }  # fmt: skip
        self.timing["validation"] += elapsed
        self._round_started += elapsed  # not optimisation time
        average = line["validation/average"]
        best = self.recipe.eval.keep_best and (self.best_validation is None or average > self.best_validation)
        if best:
            self.best_validation = average
            save_model(trainer, self.out / "best")  # every rank: sharded models gather for the save
        if self.is_main:
            if best:
                (self.out / "best" / "validation.json").write_text(json.dumps(line, indent=1) + "\n")
            with open(self.out / METRICS_FILE, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(line) + "\n")
            (self.out / VALIDATION_DIR).mkdir(exist_ok=True)
            with open(self.out / VALIDATION_DIR / f"round_{round_index}.jsonl", "w", encoding="utf-8") as handle:
                for record in results:
                    jsonl.append(handle, record)
        return line

    # rollout_func (TRL calls it with this process's prompts) --------------------------------

    def rollout(self, prompts: list[list[dict[str, str]]], trainer: Any) -> dict[str, list[Any]]:
        started = time.perf_counter()
        if self.rounds_played:  # the previous round's update ran in this process (a resumed one has none to book)
            self.timing["optimisation"] += started - self._round_started
            self.print_update()
        if self.server_check is not None:  # TRL has just pushed the weights to the servers for the first time
            self.server_check()
            self.server_check = None
        self.rounds_played += 1
        self.state.round += 1
        round_index = self.state.round
        per_episode = self.recipe.turn_samples if self.recipe.layout == "turn" else 1
        chat = self.chat(trainer).for_turns() if self.recipe.layout == "turn" else self.chat(trainer)
        if self.recipe.staleness:
            rollouts = self._take_groups(trainer, chat, len(prompts) // per_episode, round_index)
        else:
            rollouts = self._play_round(trainer, chat, prompts[::per_episode], round_index)

        began = time.perf_counter()
        local = []
        for rollout in rollouts:
            record = rollout.record
            diagnosis = add_diagnosis(record, self.recipe.diagnosis.priority)
            local.append(EpisodeLabels(record["task_id"], record["category"], record["reward"], diagnosis,
                                       tuple(record["reference_labels"])))  # fmt: skip
        everyone = _gather(trainer, local)
        self.state.profile = self.state.profile.add_round(round_index, everyone)
        self.timing["diagnosis"] += time.perf_counter() - began

        began = time.perf_counter()
        if self.apatch.enabled and self.apatch.dynamic:  # before scaling, as the released code does
            evidence = self.state.profile.apatch_evidence(self.apatch.preset, self.apatch.excluded)
            self.state.label_weights = update_label_weights(
                self.state.label_weights, evidence, self.apatch.base_utility, alpha=self.apatch.alpha,
                beta=self.apatch.beta, k=self.apatch.k, w_min=self.apatch.w_min, w_max=self.apatch.w_max,
                excluded=self.apatch.excluded,
            )  # fmt: skip
        weights = [self._weight(r.record) for r in rollouts]
        if self.apatch.enabled and self.apatch.budget:
            import torch

            tagged = torch.tensor([any(z not in self.apatch.excluded for z in self._labels(r.record)) for r in rollouts])
            weights = budgeted(torch.tensor(weights), tagged, strength=self.apatch.budget_strength,
                               w_min=self.apatch.w_min, w_max=self.apatch.w_max).tolist()  # fmt: skip
        self.timing["apatch"] += time.perf_counter() - began

        self._round_interface = self.state.interface
        self.state.interface = evolve(self.state.interface, self.state.profile, self.interface_config)
        self._round_rollouts = [r.record for r in rollouts]
        self._round_weights = list(weights)
        if self.recipe.layout == "turn":
            seed = derived_seed(self.recipe.grpo.seed, round_index, _rank(trainer), "turns")
            samples = [s for r in rollouts for s in turn_samples(r, per_episode, min(chat.eos_ids), derived_seed(seed, r.index),
                                                                   self.recipe.reward)]
        else:
            samples = [{"prompt_ids": r.trajectory.prompt_ids, **trl_sample(r, min(chat.eos_ids), self.recipe.reward)} for r in rollouts]
        output = {
            "prompt_ids": [s["prompt_ids"] for s in samples],
            "completion_ids": [s["completion_ids"] for s in samples],
            "logprobs": [s["logprobs"] for s in samples],
            "env_mask": [s["env_mask"] for s in samples],
            "seal_reward": [s["reward"] for s in samples],
            "apatch_weight": [w for w in weights for _ in range(per_episode)],  # a turn sample has its episode's weight (Eq. 12)
        }
        if self.recipe.credit == "turn":  # what SealGRPOTrainer's turn term needs (seal_rl.credit)
            output["seal_token_turns"] = [s["turns"] for s in samples]
            output["seal_turn_outcomes"] = [turn_outcomes(r.record) for r in rollouts for _ in range(per_episode)]
            output["seal_turn_weights"] = [self._turn_weights(r.record) for r in rollouts for _ in range(per_episode)]
        return output

    def _interface(self) -> Interface:
        """The training-time interface Ω_t of the current state (SEAL §3.3)."""
        return Interface(self.env_config.prompt_mode, self.state.interface, call_format=self.env_config.call_format,
                         catalog=self.catalog, protocol=self.env_config.protocol, **affordances(self.family))  # fmt: skip

    def _play_round(self, trainer: Any, chat: ChatTokens, prompts: list[Any], round_index: int) -> list[Rollout]:
        """On-policy: play the round's episodes now, one per prompt TRL handed over (its task id)."""
        interface = self._interface()
        generator = self._generator(trainer)
        # TRL repeats each task num_generations x per_episode times in a row: one episode per block
        episodes = [(i, self.task_set.get(p[-1]["content"]), {"round": round_index}) for i, p in enumerate(prompts)]
        stats = DriverStats()
        with round_progress(round_index, len(episodes), shown=self.is_main) as advance:
            rollouts = run_episodes(
                episodes, generator, lambda: self.family.make_env(self.env_config, interface, catalog=self.catalog), chat=chat,
                budgets=self.budgets, concurrency=self.recipe.concurrency,
                seed=derived_seed(self.recipe.grpo.seed, round_index, _rank(trainer)), stats=stats, on_done=advance,
                scheduler=self.recipe.rollout_scheduler,
            )  # fmt: skip
        if hasattr(generator, "close") and generator is not self.server:  # lockstep generators serve the other ranks until all are done
            generator.close()
        self.timing["generation"] += stats.generation
        self.timing["environment"] += stats.environment
        self._round_driver = stats.summary()  # this rank's; logged by the main rank
        return rollouts

    def _take_groups(self, trainer: Any, chat: ChatTokens, episodes: int, round_index: int) -> list[Rollout]:
        """``staleness`` ≥ 1: the round's groups from the producer (:mod:`seal_rl.train.async_rounds`)."""
        size = samples_per_task(self.recipe) // (self.recipe.turn_samples if self.recipe.layout == "turn" else 1)
        per_round = episodes // size
        if self.producer is None:  # a resumed run goes on where its rounds left the task order
            play = group_player(self, chat, size, _rank(trainer), trainer.accelerator.num_processes)
            self.producer = AsyncRounds(play, lambda: self.server.version, staleness=self.recipe.staleness, groups_per_round=per_round,
                                        workers=max(1, self.recipe.concurrency // size), first_group=(round_index - 1) * per_round)  # fmt: skip
        rollouts, taken = self.producer.take_rollouts(per_round, round_index)
        self.timing["rollout_wait"] += taken.waited
        self._round_driver = {"scheduler": "asynchronous", **staleness_summary(taken)}
        return rollouts

    def _labels(self, record: dict[str, Any]) -> list[str]:
        if self.apatch.preset == "reference":
            return record["reference_labels"]
        turns = record["diagnosis"]["labels"]
        return [t["label"] for t in turns if self.apatch.count_inherited or not t["evidence"].get("inherited")]

    def _turn_weights(self, record: dict[str, Any]) -> list[float]:
        """v(z_k) of each user turn: Eq. 11 on the turn's own label alone (1 for a label not counted:
        excluded, inherited unless ``count_inherited``, or A-Patch off), for the turn term."""
        weights = [1.0] * record["num_turns"]
        if not self.apatch.enabled:
            return weights
        if self.apatch.preset == "reference":
            labels = dict(enumerate(record["reference_labels"]))
        else:
            labels = {t["turn"]: t["label"] for t in record["diagnosis"]["labels"]
                      if self.apatch.count_inherited or not t["evidence"].get("inherited")}  # fmt: skip
        for turn, label in labels.items():
            if 0 <= turn < len(weights):
                weights[turn] = trajectory_weight([label], self.state.label_weights, w_min=self.apatch.w_min,
                                                  w_max=self.apatch.w_max, excluded=self.apatch.excluded)  # fmt: skip
        return weights

    def _weight(self, record: dict[str, Any]) -> float:
        if not self.apatch.enabled:
            return 1.0
        return trajectory_weight(self._labels(record), self.state.label_weights, w_min=self.apatch.w_min,
                                 w_max=self.apatch.w_max, excluded=self.apatch.excluded)  # fmt: skip

    def _generator(self, trainer: Any):
        if self.generator_factory is not None:
            return self.generator_factory(trainer)
        if ":" in self.recipe.generator:
            return _import_factory(self.recipe.generator)(trainer)
        if self.recipe.generator == "vllm":
            return VLLMGenerator(trainer)
        if self.recipe.generator == "server":
            return self.server
        model = trainer.accelerator.unwrap_model(trainer.model)
        return HFGenerator(model, trainer.processing_class, temperature=self.recipe.grpo.temperature,
                           top_p=self.recipe.grpo.top_p, max_batch=self.recipe.generation_batch,
                           lockstep=trainer_lockstep(trainer), prefix_cache_tokens=self.recipe.prefix_cache_tokens)  # fmt: skip

    def write_timing(self, path: Path, step: int) -> None:
        """Write the seconds per phase up to now, the running round's optimisation so far included:
        the run's ``time.json`` when training ends, and each checkpoint's (a resumed run goes on
        counting from it)."""
        seconds = Counter(self.timing)
        if self.rounds_played:
            seconds["optimisation"] += time.perf_counter() - self._round_started
        path.write_text(json.dumps({"round": self.state.round, "step": step,
                                    "time/seconds": {k: round(v, 4) for k, v in seconds.items()}}) + "\n")  # fmt: skip

    def restore_timing(self, seconds: dict[str, float]) -> None:
        """Count on from a checkpoint's seconds per phase (its ``time.json``): ``time/seconds`` covers
        the whole run, and the next update line only what this process spent on that update."""
        self.timing.update(seconds)
        self._update_marks = {k: self.timing[k] for k in UPDATE_PASSES}

    def print_update(self) -> None:
        """One line after each round's update: where its time went and how many tokens each pass
        forwarded (since the previous line); the same as a ``kind: update`` line in ``metrics.jsonl``."""
        spent = {k: self.timing[k] - self._update_marks.get(k, 0.0) for k in UPDATE_PASSES}
        counts = {f"{k}/{n}": self.tokens[f"{k}/{n}"] - self._update_marks.get(f"{k}/{n}", 0) for k in UPDATE_PASSES
                  for n in ("rows", "forwarded")}  # fmt: skip
        self._update_marks = {**{k: self.timing[k] for k in UPDATE_PASSES}, **{k: self.tokens[k] for k in counts}}
        skipped = self.nothing_to_learn and self.recipe.silent_updates == "skip"
        if self.is_main:
            CONSOLE.print(update_summary(self.state.round, spent, self.recipe, counts, skipped=skipped), highlight=False, soft_wrap=True)
            line = {"round": self.state.round, "kind": "update", "update/skipped": skipped,
                    **{f"{k}/seconds": round(v, 3) for k, v in spent.items()},
                    **{f"{k}_tokens": v for k, v in counts.items()}}  # fmt: skip
            with open(self.out / METRICS_FILE, "a", encoding="utf-8") as handle:
                jsonl.append(handle, line)

    # after TRL's advantages -------------------------------------------------------------------

    def after_advantages(self, trainer: Any, inputs: list[dict[str, Any]], before: Any, after: Any,
                         turn_terms: list[list[float]] | None = None) -> None:  # fmt: skip
        """Log the round: trajectories with advantages before/after A-Patch (and, under ``credit: turn``,
        each episode's turn advantages Ã(g, k)), metrics, profile, Ω."""
        rows = []
        per_episode = self.recipe.turn_samples if self.recipe.layout == "turn" else 1
        before, after = before[::per_episode], after[::per_episode]  # an episode's turn samples share its advantage
        terms = turn_terms if turn_terms is not None else [None] * len(self._round_rollouts)
        for record, weight, a, b, term in zip(self._round_rollouts, self._round_weights, before.tolist(), after.tolist(), terms,
                                              strict=True):  # fmt: skip
            rows.append({
                "round": record["round"], "step": trainer.state.global_step, "task_id": record["task_id"],
                "group": f"{record['round']}:{record['task_id']}" + (f":{record['group']}" if "group" in record else ""),
                "category": record["category"], "reward": record["reward"], "progress": record["progress"],
                "end_reason": record["end_reason"],
                "dropped": record.get("dropped"),
                "labels": [t["label"] for t in record["diagnosis"]["labels"]],
                "reference_labels": record["reference_labels"], "apatch_weight": weight,
                "advantage_before": a, "advantage_after": b, "turn_outcomes": turn_outcomes(record), "turn_advantages": term,
                "messages": record["messages"], "steps": record["steps"],
                "trace": record["trace"], "verdict": record["verdict"], "diagnosis": record["diagnosis"],
                **{k: record[k] for k in ("weight_versions", "interface_round") if k in record},
            })  # fmt: skip
        rows = _gather(trainer, rows)
        self.nothing_to_learn = nothing_to_learn(rows, self.recipe.reward, self.recipe.credit, self.recipe.credit_weight)
        self._round_started = time.perf_counter()
        if not self.is_main:
            return
        round_index = self.state.round
        with open(self.out / "trajectories.jsonl", "a", encoding="utf-8") as handle:
            for row in rows:
                jsonl.append(handle, row)
        self.state.profile.save(self.out / "profile" / f"step_{round_index}.json")
        (self.out / "interface").mkdir(parents=True, exist_ok=True)
        (self.out / "interface" / f"step_{round_index}.json").write_text(
            json.dumps({"used": self._round_interface.to_json(), "next": self.state.interface.to_json(),
                        "changes": {k: list(v) for k, v in self._round_interface.diff(self.state.interface).items()}},
                       indent=1) + "\n"  # fmt: skip
        )
        metrics = round_metrics(round_index, trainer.state.global_step, rows, self.state, self._round_interface, self.timing,
                                self.recipe.reward, self.recipe.credit)  # fmt: skip
        metrics.update({f"rollout/{key}": value for key, value in self._round_driver.items()})
        metrics.update({f"rollout/importance/{key}": round(value, 6) for key, value in self.importance.items()})  # main rank's batch
        with open(self.out / METRICS_FILE, "a", encoding="utf-8") as handle:
            jsonl.append(handle, metrics)
        for name, value in scalar_metrics(metrics).items():  # to every report_to backend at TRL's next log
            trainer._metrics["train"][name].append(value)
        CONSOLE.print(round_summary(metrics, self._round_interface, self.state.interface), highlight=False, soft_wrap=True)
        if self.nothing_to_learn and round_index == 1:
            CONSOLE.print("round 1 had nothing to learn: no group's rewards differ, so its update changes nothing. "
                          "`seal preflight RECIPE` plays one round without training and says which reward or setting "
                          "gives a spread (docs/guides/preflight-and-studies.md).", highlight=False, soft_wrap=True)  # fmt: skip


def round_summary(metrics: dict[str, Any], used: InterfaceState, following: InterfaceState) -> str:
    """The one line printed after each round: success, zero-variance groups, top labels, A-Patch
    scale range and the interface components switched on or off for the next round."""
    labels = sorted(((v, k) for k, v in metrics["labels/share"].items() if k != "pass"), reverse=True)[:3]
    top = ", ".join(f"{k} {v:.0%}" for v, k in labels) or "none"
    before, after = set(used.active_components), set(following.active_components)
    changes = [f"+{c}" for c in sorted(after - before)] + [f"-{c}" for c in sorted(before - after)]
    return (f"round {metrics['round']}: success {metrics['rollout/reward_mean']:.1%} of {metrics['rollout/episodes']}, "
            f"turns passed {metrics['rollout/progress_mean']:.1%} | zero-variance groups {metrics['rollout/groups_zero_variance']:.0%}"
            f"{' (progress reward)' if metrics.get('rollout/reward') == 'progress' else ''}"
            f"{' | turn anchors varied ' + format(metrics['rollout/turn_anchors_varied'], '.0%') if metrics.get('rollout/credit') == 'turn' else ''}"
            f" | top labels {top} | "
            f"A-Patch scale {metrics['apatch/scale_min']:.2f}–{metrics['apatch/scale_max']:.2f} | "
            f"interface {' '.join(changes) or 'unchanged'}")


def update_summary(round_index: int, spent: dict[str, float], recipe: SealRecipe, tokens: dict[str, int] | None = None,
                   skipped: bool = False) -> str:  # fmt: skip
    """The line printed after a round's update: the policy's forward and backward passes, the
    reference model's log-probabilities (only with ``grpo.beta`` > 0) and the old policy's (only when
    TRL needs them: several updates per generation, or vLLM's importance-sampling correction); with
    ``tokens``, how many tokens each pass forwarded of the tokens its samples hold. ``skipped``: the
    round had nothing to learn and ``silent_updates: skip`` ran no update."""
    g = recipe.grpo
    tokens = tokens or {}
    if skipped:
        return (f"round {round_index} update: skipped, nothing to learn (no group's rewards differ"
                f"{', no turn outcomes differ' if recipe.credit == 'turn' and recipe.credit_weight else ''}; silent_updates: skip)")

    def part(key: str, name: str, why_not: str) -> str:
        if spent[key] <= 0:
            return f"{name} not computed ({why_not})"
        rows, forwarded = tokens.get(f"{key}/rows", 0), tokens.get(f"{key}/forwarded", 0)
        return f"{name} {spent[key]:.0f} s" + (f" ({forwarded:,} tokens forwarded for {rows:,})" if rows else "")

    total = sum(spent.values())
    return (f"round {round_index} update: {total:.0f} s | " + part("update/policy", "policy forward+backward", "no update") + " | "
            + part("update/reference", "reference model", f"grpo.beta {g.beta}") + " | "
            + part("update/old_logprobs", "old log-probs", "one update per generation"))


def nothing_to_learn(rows: list[dict[str, Any]], reward: str = "binary", credit: str = "episode", credit_weight: float = 1.0) -> bool:
    """True when a round's rows (all ranks', as :meth:`SealLoop.after_advantages` gathers them) give
    GRPO no advantage: in every group the training reward is the same (TRL's A = (r − mean)/(std + ε)
    is then 0, and A-Patch's w·A too) and, under ``credit: turn`` with ω > 0, no (task, user turn)
    anchor's outcomes differ (GiGPO's Ã is 0). The test is on the rewards, not on TRL's advantages: an
    equal-reward group of a size other than 2 or 4 can leave float noise there (up to ~6e-4 under the
    progress reward with G = 8)."""
    groups, outcomes = _by_group(rows, reward)
    if any(len(values) > 1 for values in groups.values()):
        return False
    return credit != "turn" or credit_weight == 0 or anchors_with_signal(outcomes)[0] == 0


def _by_group(rows: list[dict[str, Any]], reward: str) -> tuple[dict[str, set[float]], list[list[list[float | None]]]]:
    """Each group's distinct training rewards, and each group's episodes' turn outcomes."""
    groups: dict[str, set[float]] = {}
    outcomes: dict[str, list[list[float | None]]] = {}
    for row in rows:
        groups.setdefault(row["group"], set()).add(row[REWARD_FIELDS[reward]])
        outcomes.setdefault(row["group"], []).append(row.get("turn_outcomes") or [])
    return groups, list(outcomes.values())


def round_metrics(round_index: int, step: int, rows: list[dict[str, Any]], state: SealState,
                  used: InterfaceState, timing: Counter, reward: str = "binary", credit: str = "episode") -> dict[str, Any]:  # fmt: skip
    """One ``metrics.jsonl`` line (metric names grouped by prefix). ``rollout/reward_mean`` is the
    binary success and ``rollout/progress_mean`` the share of turns passed, whichever trains
    (``reward``); ``rollout/groups_zero_variance`` is counted on the reward that trains, and
    ``rollout/turn_anchors_varied`` is the share of (task, user turn) anchors whose episodes' turn
    outcomes differ: where ``credit: turn`` has a gradient."""
    by_category: dict[str, list[float]] = {}
    labels: Counter[str] = Counter()
    for row in rows:
        by_category.setdefault(row["category"], []).append(row["reward"])
        labels.update(row["labels"])
    total = sum(labels.values()) or 1
    weights = [row["apatch_weight"] for row in rows] or [1.0]
    groups, outcomes = _by_group(rows, reward)
    varied, anchors = anchors_with_signal(outcomes)
    seconds = {k: round(v, 4) for k, v in timing.items()}
    return {
        "round": round_index,
        "step": step,
        "kind": "rollout",
        "rollout/reward": reward,
        "rollout/credit": credit,
        "rollout/reward_mean": sum(r["reward"] for r in rows) / max(1, len(rows)),
        "rollout/progress_mean": sum(r["progress"] for r in rows) / max(1, len(rows)),
        "rollout/success_by_category": {k: sum(v) / len(v) for k, v in sorted(by_category.items())},
        "rollout/episodes": len(rows),
        "rollout/groups_zero_variance": sum(len(v) == 1 for v in groups.values()) / max(1, len(groups)),
        "rollout/turn_anchors_varied": varied / max(1, anchors),
        "rollout/dropped": dict(Counter(row["dropped"] for row in rows if row.get("dropped"))),
        "labels/share": {k: v / total for k, v in sorted(labels.items())},
        "apatch/scale_mean": sum(weights) / len(weights),
        "apatch/scale_min": min(weights),
        "apatch/scale_max": max(weights),
        "apatch/label_weights": state.label_weights,
        "interface/active": used.active_components,
        "time/seconds": seconds,
    }


def _import_factory(spec: str) -> Any:
    import importlib

    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise SealError(f"Cannot load generator factory {spec!r} ({exc}).") from None


def _rank(trainer: Any) -> int:
    return trainer.accelerator.process_index


def _gather(trainer: Any, items: list[Any]) -> list[Any]:
    """Every rank's items, in rank order (a collective: all ranks must call it)."""
    if trainer.accelerator.num_processes == 1:
        return list(items)
    from accelerate.utils import gather_object

    return list(gather_object(items))
