"""SEAL training on TRL: multi-turn GRPO rollouts, A-Patch and the closed loop (SEAL Algorithm 1).

Per round (one TRL generation batch: ``tasks_per_step`` tasks × ``num_generations`` rollouts):

1. ``rollout_func`` plays every episode with the current interface Ω_t (training mode) through
   :func:`seal_rl.rollout.run_episodes`, building token-exact samples (loss mask = model tokens);
2. the verifier's binary reward becomes the GRPO reward (TRL computes group advantages, gathered
   across ranks; an unscorable episode gets ``None`` and no advantage);
3. Ψ labels every turn; labels from all ranks update the capability profile C_t;
4. the label utilities ρ(z) take one closed-loop step (before scaling, as the released code does)
   and each trajectory gets its A-Patch weight w_j (Eq. 10–11);
5. :class:`SealGRPOTrainer` multiplies TRL's advantages by w_j (Eq. 12) — the one override of TRL;
6. Ω_{t+1} = Evolve(Ω_t, C_t) for the next round.

All SEAL state (C_t, Ω_t, ρ, round) is saved in every checkpoint and restored by ``--resume``.
A run directory holds ``config.yaml`` (with the resolved task ids), ``metrics.jsonl`` (a
``rollout`` line per round and a ``validation`` line per validation), ``trajectories.jsonl``,
``profile/``, ``interface/``, ``time.json``, ``checkpoints/`` and ``model/``; with a recipe's ``warm_start``
also ``warm_start/`` (the SFT model RL starts from, :mod:`seal_rl.sft`), with ``eval.keep_best``
also ``best/``. Validation is greedy and strict with the interface removed, on held-out
training-split tasks unless the recipe names others.

Departures from the reference: TRL normalises group advantages with ``std + 1e-4`` (the reference
uses ``1e-6``); each SEAL round is one TRL generation batch.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import time
import warnings
from contextlib import ExitStack, contextmanager, nullcontext
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from seal_rl.apatch import ApatchConfig, budgeted, reweight, trajectory_weight, update_label_weights
from seal_rl.budgets import count_for_recipe, summary_line
from seal_rl.diagnose import PRIORITIES, add_diagnosis
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl import jsonl, recipes
from seal_rl.errors import SealError, SealWarning
from seal_rl.interface import Interface, InterfaceConfig, InterfaceState, evolve
from seal_rl.profile import CapabilityProfile, EpisodeLabels
from seal_rl.generators import HFGenerator, VLLMGenerator, vllm_cpu
from seal_rl.generators.vllm_engines import trl_engine_dtype
from seal_rl.generators.lockstep import trainer_lockstep
from seal_rl.generators.prefix_cache import DEFAULT_MAX_TOKENS as DEFAULT_PREFIX_CACHE_TOKENS
from seal_rl.rollout import Budgets, DriverStats, Rollout, derived_seed, run_episodes
from seal_rl.runlock import run_lock
from seal_rl.sft import WarmStartConfig, build_samples, check_source, run_sft
from seal_rl.tasks import Task, TaskSet
from seal_rl.tools import ToolCatalog
from seal_rl.trajectory import ChatTokens

SEAL_STATE_FILE = "seal_state.json"
METRICS_FILE = "metrics.jsonl"
TIME_FILE = "time.json"
"""this session's seconds per phase when training ended, the last round's optimisation included"""


# -- recipe ------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    path: str = MISSING
    """a local model directory (weights are never downloaded at run time), or ``tiny`` for a random
    tiny Qwen2 model built into the run directory (smoke runs and tests)"""
    tiny_vocab_size: int = 4096
    tiny_hidden_size: int = 64
    tiny_layers: int = 2
    tiny_heads: int = 4
    """attention heads of the tiny model; head_dim = tiny_hidden_size / tiny_heads (16 by default). vLLM's
    CPU attention accepts only some head sizes (32, 64, 80, 96, 112, 128, ...): with ``use_vllm`` on a CPU
    set ``tiny_heads: 1`` (head_dim 64) or a wider ``tiny_hidden_size``"""
    tiny_kv_heads: int = 2
    """key/value heads of the tiny model (grouped-query attention); must divide ``tiny_heads``"""
    dtype: str = "auto"
    """``auto`` | ``bfloat16`` | ``float32``"""
    gradient_checkpointing: bool = False


@dataclass
class DataConfig:
    split: str = "train"
    """tasks to train on: ``train`` | ``test`` | ``all`` (the paper trains on ``train``)"""
    categories: list[str] = field(default_factory=list)
    """restrict to these categories (empty: all four)"""
    task_ids: list[str] = field(default_factory=list)
    """exactly these tasks (overrides split and categories)"""
    limit: int = 0
    """use only the first N selected tasks (0: all)"""


@dataclass
class GRPOSettings:
    """GRPO hyper-parameters (SEAL recipe in brackets); passed to TRL's ``GRPOConfig``."""

    num_generations: int = 8
    """rollouts per task (G) [8]"""
    tasks_per_step: int = 32
    """tasks per round / generation batch [32]"""
    tasks_per_update: int = 8
    """tasks per optimizer step (PPO mini-batch) [8]: tasks_per_step / tasks_per_update updates per round"""
    per_device_train_batch_size: int = 4
    """samples per device per micro-batch (the paper: 1; GPU recipes use 1 and accumulate)"""
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "constant"
    num_train_epochs: float = 6.0
    max_steps: int = -1
    """optimizer steps; -1: from epochs"""
    beta: float = 0.001
    """KL to the reference (TRL uses the low-variance k3 estimator) [0.001]"""
    epsilon: float = 0.2
    """PPO clip [0.2]"""
    delta: float | None = 10.0
    """dual-clip bound on the ratio for negative advantages [10]; null disables"""
    loss_type: str = "dapo"
    """token-mean over model tokens [dapo]"""
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    weight_decay: float = 0.0
    """AdamW weight decay (TRL's default 0; the reference's verl actor uses 0.01, set in the paper recipe)"""
    use_bias_correction_kl: bool = False
    """multiply the KL term by the importance ratio (TRL's default True); off: the paper's plain
    low-variance KL"""
    bf16: bool = False
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    """only ``colocate`` is supported: TRL's server mode is a collective over all ranks, which
    multi-turn episodes of different lengths would deadlock"""
    vllm_gpu_memory_utilization: float = 0.4
    vllm_tensor_parallel_size: int = 1
    """ranks per vLLM engine; a TP group generates the union of its ranks' requests in lockstep"""
    vllm_dtype: str = "auto"
    """the colocated engine's dtype: ``auto`` is the trainer's (the loaded model's; vLLM by itself would
    run a float32 checkpoint in bfloat16, far from the trainer's log-probabilities), or any vLLM dtype
    (``bfloat16``, ``float32``)"""
    vllm_importance_sampling_correction: bool = False
    """TRL's correction for the vLLM/trainer probability mismatch (TRL's default True). Off by
    default: the paper's reference (verl) trains without it. Needs the sampled log-probabilities,
    which the vllm generator returns"""
    logging_steps: int = 1
    save_steps: int = 0
    """save a checkpoint every N optimizer steps (0: once per round)"""
    save_total_limit: int | None = None
    """keep at most this many checkpoints (a 7B ZeRO-3 checkpoint with optimizer state is ~100 GB)"""
    report_to: list[str] = field(default_factory=lambda: ["none"])
    """``tensorboard`` / ``wandb`` through TRL; metrics.jsonl is always written"""
    extra: dict[str, Any] = field(default_factory=dict)
    """any other ``GRPOConfig`` field, passed through unchanged"""


@dataclass
class ValidationConfig:
    """Greedy, strict validation during training, with the interface removed (evaluation mode)."""

    every_rounds: int = 0
    """validate after every N rounds, before the first round and after the last (0: never)"""
    tasks: list[str] = field(default_factory=list)
    """validation task ids; empty: ``holdout`` tasks of the training split not trained on (the test
    split is used only if a recipe lists its tasks here)"""
    holdout: int = 16
    """size of the default validation set, drawn per category from the training split; when the
    recipe trains on the whole split these tasks are removed from training"""
    keep_best: bool = False
    """save the model with the best validation success (average of category rates) to ``best/``"""

    def __post_init__(self) -> None:
        if self.every_rounds < 0 or self.holdout < 0:
            raise SealError("eval.every_rounds and eval.holdout must be >= 0.")


@dataclass
class DiagnosisConfig:
    priority: str = "seal"
    """``seal`` (DESIGN.md §4: invalid → argument → missing call → recovery → instance → state →
    response) or ``paper`` (SEAL Table 5: invalid → argument → state → recovery → missing call →
    response); see docs/diagnosis.md"""

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise SealError(f"diagnosis.priority must be one of {sorted(PRIORITIES)}, got {self.priority!r}.")


@dataclass
class SealRecipe:
    """A training recipe: everything ``seal train`` needs, validated on load."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    env: dict[str, Any] = field(default_factory=lambda: {"call_format": "hermes", "prompt_mode": "bfcl_qwen_fc", "max_model_calls": 20})
    budgets: dict[str, int] = field(default_factory=lambda: asdict(Budgets()))
    interface: dict[str, Any] = field(default_factory=lambda: asdict(InterfaceConfig()))
    apatch: dict[str, Any] = field(default_factory=lambda: {k: v for k, v in asdict(ApatchConfig()).items()})
    profile_window: int = 1
    """rounds the capability profile aggregates over"""
    generator: str = "hf"
    """``hf`` (transformers generate; CPU or GPU), ``vllm`` (TRL's colocated engine; needs use_vllm),
    or ``module:function`` naming a factory ``(trainer) -> Generator`` (custom backends, tests)"""
    concurrency: int = 64
    """episodes played at once per rank"""
    generation_batch: int = 16
    """hf generator: sequences per generate() call"""
    prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS
    """hf generator: tokens of prompt KV states kept so a call only prefills what earlier prompts did
    not have (the tool prompt, a group's shared opening, the conversation so far); 0: off. Ignored
    (off) when the weights are sharded over several processes (FSDP, ZeRO-3). See docs/training.md."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """a supervised warm start (``seal sft``) run before RL into ``warm_start/``"""
    eval: ValidationConfig = field(default_factory=ValidationConfig)
    """validation during training"""
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    """how Ψ labels a failed turn that qualifies for several labels"""


def load_recipe(path: Path | str | None, overrides: Sequence[str] = ()) -> SealRecipe:
    """A recipe from YAML (a path or a shipped recipe's name) plus ``key=value`` dotted overrides,
    checked against :class:`SealRecipe`."""
    try:
        base = OmegaConf.structured(SealRecipe)
        layers = [base]
        if path is not None:
            path = recipes.resolve(path)  # a file, or a shipped recipe's name (`seal train --list-configs`)
            try:
                layers.append(OmegaConf.load(path))
            except FileNotFoundError:
                raise SealError(f"Recipe {path} does not exist; see `seal train --list-configs`.") from None
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
                raise SealError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', None) or exc}).") from None
        layers.append(OmegaConf.from_dotlist(list(overrides)))
        merged = OmegaConf.merge(*layers)
        recipe: SealRecipe = OmegaConf.to_object(merged)
    except MissingMandatoryValue as exc:
        raise SealError(f"The recipe leaves {exc.full_key} unset; give it with --set {exc.full_key}=...") from None
    except OmegaConfBaseException as exc:
        raise SealError(f"Bad recipe: {str(exc).splitlines()[0]}") from None
    validate(recipe)
    return recipe


def _section(name: str, cls: type, values: dict[str, Any]) -> Any:
    """Build one free-form recipe section (``env``, ``budgets``, ``interface``, ``apatch``) with a
    one-line error for an unknown key ("did you mean") or a value of the wrong type."""
    known = [f.name for f in fields(cls)]
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f" Did you mean {name}.{close[0]}?" if close else f" Known: {', '.join(known)}."
            raise SealError(f"Bad recipe: {name}.{key} is not a setting.{hint}")
    for f in fields(cls):
        expected = {"int": int, "float": (int, float), "bool": bool, "str": str}.get(str(f.type))
        value = values.get(f.name)
        if expected is not None and f.name in values and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
            raise SealError(f"Bad recipe: {name}.{f.name} must be {f.type}, got {value!r}.")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise SealError(f"Bad recipe: {name}: {exc}") from None


def validate(recipe: SealRecipe) -> None:
    """Check what spans several fields; build every sub-config so its own checks run too."""
    _section("env", EnvConfig, recipe.env)
    _section("budgets", Budgets, recipe.budgets)
    for source in recipe.warm_start.data:
        check_source(source)
    for preset in recipe.warm_start.interfaces:
        InterfaceState.initial(preset)
    _section("interface", InterfaceConfig, recipe.interface)
    _section("apatch", ApatchConfig, recipe.apatch)
    g = recipe.grpo
    if g.num_generations < 2:
        raise SealError(f"Group-relative advantages need >= 2 rollouts per task; got num_generations={g.num_generations}.")
    if g.tasks_per_step % g.tasks_per_update:
        raise SealError(f"tasks_per_step ({g.tasks_per_step}) must be a multiple of tasks_per_update ({g.tasks_per_update}).")
    if recipe.generator not in ("hf", "vllm") and ":" not in recipe.generator:
        raise SealError(f"Unknown generator {recipe.generator!r}; expected 'hf', 'vllm' or 'module:function'.")
    if recipe.generator == "vllm" and not g.use_vllm:
        raise SealError("generator: vllm needs grpo.use_vllm: true.")
    if g.use_vllm and g.vllm_mode != "colocate":
        raise SealError(f"grpo.vllm_mode {g.vllm_mode!r} is not supported: TRL's server mode gathers every rank's "
                        "prompts in one collective call, which multi-turn episodes of different lengths deadlock. "
                        "Use vllm_mode: colocate (with vllm_tensor_parallel_size for large models).")  # fmt: skip
    if g.extra.get("vllm_enable_sleep_mode"):
        raise SealError("vllm_enable_sleep_mode is not supported: a multi-turn round calls the engine once per turn, and "
                        "level-2 sleep would re-push all weights before every call.")  # fmt: skip
    if g.vllm_tensor_parallel_size < 1:
        raise SealError("grpo.vllm_tensor_parallel_size must be >= 1.")
    if recipe.model.path == "tiny":
        check_tiny_heads(recipe.model, vllm=g.use_vllm)
    if recipe.prefix_cache_tokens < 0:
        raise SealError(f"prefix_cache_tokens must be >= 0 (0 turns the cache off); got {recipe.prefix_cache_tokens}.")
    check_report_to(g.report_to)


def check_tiny_heads(model: ModelConfig, *, vllm: bool) -> None:
    """The tiny model's attention shape is buildable, and served by vLLM's CPU attention when the
    engine runs on a CPU (it refuses other head sizes with "Unsupported CPU attention configuration")."""
    m = model
    if m.tiny_heads < 1 or m.tiny_kv_heads < 1 or m.tiny_hidden_size % m.tiny_heads or m.tiny_heads % m.tiny_kv_heads:
        raise SealError(f"model.tiny_heads ({m.tiny_heads}) must divide tiny_hidden_size ({m.tiny_hidden_size}) and be a "
                        f"multiple of tiny_kv_heads ({m.tiny_kv_heads}).")  # fmt: skip
    head_dim = m.tiny_hidden_size // m.tiny_heads
    if vllm and head_dim not in VLLM_CPU_HEAD_SIZES:
        import torch

        if not torch.cuda.is_available():
            raise SealError(f"The tiny model's head_dim is {head_dim} (tiny_hidden_size / tiny_heads) but vLLM's CPU attention "
                            f"takes only {', '.join(map(str, VLLM_CPU_HEAD_SIZES))}: set model.tiny_heads so that it is "
                            f"one (e.g. model.tiny_heads={max(1, m.tiny_hidden_size // 64)} model.tiny_kv_heads=1).")  # fmt: skip


VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)
"""head sizes vLLM 0.30's CPU attention backend supports (``CPUAttentionBackend.get_supported_head_sizes``)"""


def check_report_to(backends: Sequence[str]) -> None:
    """Every ``grpo.report_to`` backend is one transformers knows and is installed: a one-line error
    now, before any model loads (``seal-rl[wandb]`` installs W&B)."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    for name in backends:
        if name in ("none", "all"):
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            close = difflib.get_close_matches(name, list(INTEGRATION_TO_CALLBACK), n=1)
            hint = f" Did you mean {close[0]}?" if close else f" Known: {', '.join(sorted(INTEGRATION_TO_CALLBACK))}, none."
            raise SealError(f"Bad recipe: grpo.report_to {name!r} is not a logging backend.{hint}")
        module = {"tensorboard": "tensorboard", "comet_ml": "comet_ml", "azure_ml": "azureml"}.get(name, name)
        if importlib.util.find_spec(module) is None:
            how = "pip install 'seal-rl[wandb]'" if name == "wandb" else f"pip install {module}"
            raise SealError(f"grpo.report_to asks for {name}, which is not installed: {how}, or drop it from report_to.")


def batch_layout(recipe: SealRecipe, world_size: int) -> dict[str, int]:
    """TRL batch settings for the recipe on ``world_size`` processes."""
    g = recipe.grpo
    per_process = g.per_device_train_batch_size * world_size
    round_samples = g.tasks_per_step * g.num_generations
    update_samples = g.tasks_per_update * g.num_generations
    for name, samples in (("tasks_per_step", round_samples), ("tasks_per_update", update_samples)):
        if samples % per_process:
            raise SealError(
                f"{name} x num_generations = {samples} samples must be a multiple of per_device_train_batch_size x "
                f"processes = {per_process}. Change per_device_train_batch_size or the task counts."
            )
    return {
        "steps_per_generation": round_samples // per_process,
        "gradient_accumulation_steps": update_samples // per_process,
        "updates_per_round": g.tasks_per_step // g.tasks_per_update,
    }


# -- the closed loop --------------------------------------------------------------------------

CONSOLE = Console(stderr=True)


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
    ) -> None:
        self.recipe = recipe
        self.task_set = task_set
        self.out = out
        self.is_main = is_main
        self.env_config = EnvConfig(**recipe.env)
        self.budgets = Budgets(**recipe.budgets)
        self.interface_config = InterfaceConfig(**recipe.interface)
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
        self._update_marks: dict[str, float] = {}
        self.apatch_hook_calls = 0
        self._round_rollouts: list[dict[str, Any]] = []
        self._round_started = time.perf_counter()
        self.validation = list(validation)
        self.best_validation = _best_validation(out)

    # validation (greedy, strict, interface removed) -------------------------------------------

    def validate(self, trainer: Any, round_index: int) -> dict[str, Any]:
        """Play the validation tasks greedily under the evaluation interface; log and keep the best.

        A collective: every rank plays its share of the tasks and the results are gathered.
        """
        from seal_rl.evaluate import summarize

        began = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        training = model.training
        model.eval()
        generator = HFGenerator(model, trainer.processing_class, temperature=0.0, max_batch=self.recipe.generation_batch,
                                lockstep=trainer_lockstep(trainer), prefix_cache_tokens=self.recipe.prefix_cache_tokens)  # fmt: skip
        rank, world = _rank(trainer), trainer.accelerator.num_processes
        mine = [(i, t, {}) for i, t in enumerate(self.validation) if i % world == rank]
        rollouts = run_episodes(
            mine, generator, lambda: BfclEnv(self.env_config, catalog=self.catalog), chat=ChatTokens.for_episodes(trainer.processing_class, self.env_config.prompt_mode),
            budgets=self.budgets, concurrency=self.recipe.concurrency, seed=derived_seed(self.recipe.grpo.seed, 0, rank),
        )  # fmt: skip
        generator.close()
        model.train(training)
        results = _gather(trainer, [{k: r.record[k] for k in ("index", "task_id", "category", "reward")} for r in rollouts])
        results.sort(key=lambda r: r["index"])
        summary = summarize(results)
        elapsed = time.perf_counter() - began
        line = {
            "round": round_index, "step": trainer.state.global_step, "kind": "validation",
            "validation/average": summary["average"], "validation/average_ci95": summary["average_ci95"],
            "validation/overall": summary["overall"], "validation/episodes": summary["episodes"],
            "validation/categories": summary["categories"], "validation/tasks": {r["task_id"]: r["reward"] for r in results},
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
        return line

    # rollout_func (TRL calls it with this process's prompts) --------------------------------

    def rollout(self, prompts: list[list[dict[str, str]]], trainer: Any) -> dict[str, list[Any]]:
        started = time.perf_counter()
        if self.state.round > 0:
            self.timing["optimisation"] += started - self._round_started
            self.print_update()
        self.state.round += 1
        round_index = self.state.round
        interface = Interface(self.env_config.prompt_mode, self.state.interface, call_format=self.env_config.call_format,
                              catalog=self.catalog, protocol=self.env_config.protocol)  # fmt: skip
        generator = self._generator(trainer)
        chat = ChatTokens.for_episodes(trainer.processing_class, self.env_config.prompt_mode)
        episodes = [(i, self.task_set.get(p[-1]["content"]), {"round": round_index}) for i, p in enumerate(prompts)]
        stats = DriverStats()
        with round_progress(round_index, len(episodes), shown=self.is_main) as advance:
            rollouts = run_episodes(
                episodes, generator, lambda: BfclEnv(self.env_config, interface, catalog=self.catalog), chat=chat,
                budgets=self.budgets, concurrency=self.recipe.concurrency,
                seed=derived_seed(self.recipe.grpo.seed, round_index, _rank(trainer)), stats=stats, on_done=advance,
            )  # fmt: skip
        if hasattr(generator, "close"):  # lockstep generators serve the other ranks until all are done
            generator.close()
        self.timing["generation"] += stats.generation
        self.timing["environment"] += stats.environment

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
        samples = [trl_sample(r, min(chat.eos_ids)) for r in rollouts]
        return {
            "prompt_ids": [r.trajectory.prompt_ids for r in rollouts],
            "completion_ids": [s["completion_ids"] for s in samples],
            "logprobs": [s["logprobs"] for s in samples],
            "env_mask": [s["env_mask"] for s in samples],
            "seal_reward": [s["reward"] for s in samples],
            "apatch_weight": weights,
        }

    def _labels(self, record: dict[str, Any]) -> list[str]:
        if self.apatch.preset == "reference":
            return record["reference_labels"]
        turns = record["diagnosis"]["labels"]
        return [t["label"] for t in turns if self.apatch.count_inherited or not t["evidence"].get("inherited")]

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
        model = trainer.accelerator.unwrap_model(trainer.model)
        return HFGenerator(model, trainer.processing_class, temperature=self.recipe.grpo.temperature,
                           top_p=self.recipe.grpo.top_p, max_batch=self.recipe.generation_batch,
                           lockstep=trainer_lockstep(trainer), prefix_cache_tokens=self.recipe.prefix_cache_tokens)  # fmt: skip

    def print_update(self) -> None:
        """One line after each round's update: where its time went (since the previous line)."""
        keys = ("update/policy", "update/reference", "update/old_logprobs")
        spent = {k: self.timing[k] - self._update_marks.get(k, 0.0) for k in keys}
        self._update_marks = {k: self.timing[k] for k in keys}
        if self.is_main:
            CONSOLE.print(update_summary(self.state.round, spent, self.recipe), highlight=False, soft_wrap=True)

    # after TRL's advantages -------------------------------------------------------------------

    def after_advantages(self, trainer: Any, inputs: list[dict[str, Any]], before: Any, after: Any) -> None:
        """Log the round: trajectories with advantages before/after A-Patch, metrics, profile, Ω."""
        rows = []
        for record, weight, a, b in zip(self._round_rollouts, self._round_weights, before.tolist(), after.tolist(), strict=True):
            rows.append({
                "round": record["round"], "step": trainer.state.global_step, "task_id": record["task_id"],
                "group": f"{record['round']}:{record['task_id']}",
                "category": record["category"], "reward": record["reward"], "end_reason": record["end_reason"],
                "dropped": record.get("dropped"),
                "labels": [t["label"] for t in record["diagnosis"]["labels"]],
                "reference_labels": record["reference_labels"], "apatch_weight": weight,
                "advantage_before": a, "advantage_after": b, "messages": record["messages"], "steps": record["steps"],
                "trace": record["trace"], "verdict": record["verdict"], "diagnosis": record["diagnosis"],
            })  # fmt: skip
        rows = _gather(trainer, rows)
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
        metrics = round_metrics(round_index, trainer.state.global_step, rows, self.state, self._round_interface, self.timing)
        with open(self.out / METRICS_FILE, "a", encoding="utf-8") as handle:
            jsonl.append(handle, metrics)
        for name, value in scalar_metrics(metrics).items():  # to every report_to backend at TRL's next log
            trainer._metrics["train"][name].append(value)
        CONSOLE.print(round_summary(metrics, self._round_interface, self.state.interface), highlight=False, soft_wrap=True)


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """A round's ``metrics.jsonl`` line as flat scalars under stable ``seal/...`` names (nested
    dicts become path segments; the interface as the number of components on), for
    TensorBoard, W&B and any other ``report_to`` backend."""
    flat: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}/{key}", item)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[prefix] = float(value)

    for key, value in metrics.items():
        if key == "interface/active":
            flat["seal/interface/components_on"] = float(len(value))
        elif key not in ("round", "step", "kind"):
            walk(f"seal/{key}", value)
    flat["seal/round"] = float(metrics["round"])
    return flat


def round_summary(metrics: dict[str, Any], used: InterfaceState, following: InterfaceState) -> str:
    """The one line printed after each round: success, zero-variance groups, top labels, A-Patch
    scale range and the interface components switched on or off for the next round."""
    labels = sorted(((v, k) for k, v in metrics["labels/share"].items() if k != "pass"), reverse=True)[:3]
    top = ", ".join(f"{k} {v:.0%}" for v, k in labels) or "none"
    before, after = set(used.active_components), set(following.active_components)
    changes = [f"+{c}" for c in sorted(after - before)] + [f"-{c}" for c in sorted(before - after)]
    return (f"round {metrics['round']}: success {metrics['rollout/reward_mean']:.1%} of {metrics['rollout/episodes']} | "
            f"zero-variance groups {metrics['rollout/groups_zero_variance']:.0%} | top labels {top} | "
            f"A-Patch scale {metrics['apatch/scale_min']:.2f}–{metrics['apatch/scale_max']:.2f} | "
            f"interface {' '.join(changes) or 'unchanged'}")


def update_summary(round_index: int, spent: dict[str, float], recipe: SealRecipe) -> str:
    """The line printed after a round's update: the policy's forward and backward passes, the
    reference model's log-probabilities (only with ``grpo.beta`` > 0) and the old policy's (only when
    TRL needs them: several updates per generation, or vLLM's importance-sampling correction)."""
    g = recipe.grpo

    def part(key: str, name: str, why_not: str) -> str:
        return f"{name} {spent[key]:.0f} s" if spent[key] > 0 else f"{name} not computed ({why_not})"

    total = sum(spent.values())
    return (f"round {round_index} update: {total:.0f} s | policy forward+backward {spent['update/policy']:.0f} s | "
            + part("update/reference", "reference model", f"grpo.beta {g.beta}") + " | "
            + part("update/old_logprobs", "old log-probs", "one update per generation"))


def trl_sample(rollout: Rollout, filler_token: int) -> dict[str, Any]:
    """What TRL trains on for one episode: completion ids, the loss mask, sampling log-probs, reward.

    An episode that produced no tokens (its opening prompt exceeded ``max_prompt_tokens``, or its
    first generation failed) cannot be handed to TRL as is (an empty completion crashes it): it
    becomes one masked ``filler_token`` with no reward, so it carries no loss and no advantage, and
    its record says why (``dropped``). Unscorable episodes (checker error, generation error) get
    no reward either: TRL leaves them out of the group baseline and gives them advantage 0.
    """
    record, trajectory = rollout.record, rollout.trajectory
    unscorable = record["verdict"].get("checker_error") or record["end_reason"] == "generation_error"
    if not trajectory.completion_ids:
        record["dropped"] = record["end_reason"]
        return {"completion_ids": [filler_token], "env_mask": [0], "logprobs": [0.0], "reward": None}
    return {"completion_ids": trajectory.completion_ids, "env_mask": trajectory.env_mask,
            "logprobs": trajectory.logprobs, "reward": None if unscorable else record["reward"]}  # fmt: skip


def round_metrics(round_index: int, step: int, rows: list[dict[str, Any]], state: SealState,
                  used: InterfaceState, timing: Counter) -> dict[str, Any]:  # fmt: skip
    """One ``metrics.jsonl`` line (metric names grouped by prefix)."""
    by_category: dict[str, list[float]] = {}
    labels: Counter[str] = Counter()
    for row in rows:
        by_category.setdefault(row["category"], []).append(row["reward"])
        labels.update(row["labels"])
    total = sum(labels.values()) or 1
    weights = [row["apatch_weight"] for row in rows] or [1.0]
    groups: dict[str, set[float]] = {}
    for row in rows:
        groups.setdefault(row["group"], set()).add(row["reward"])
    seconds = {k: round(v, 4) for k, v in timing.items()}
    return {
        "round": round_index,
        "step": step,
        "kind": "rollout",
        "rollout/reward_mean": sum(r["reward"] for r in rows) / max(1, len(rows)),
        "rollout/success_by_category": {k: sum(v) / len(v) for k, v in sorted(by_category.items())},
        "rollout/episodes": len(rows),
        "rollout/groups_zero_variance": sum(len(v) == 1 for v in groups.values()) / max(1, len(groups)),
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


# -- TRL integration ---------------------------------------------------------------------------


def seal_reward(prompts: list[Any], completions: list[Any], seal_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """The verifier's binary reward, computed by the environment during the rollout (None: unscorable)."""
    return list(seal_reward)


def make_trainer_class():
    """``SealGRPOTrainer``: TRL's GRPOTrainer with A-Patch applied after the group advantages."""
    from trl import GRPOTrainer

    class SealGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose advantages are reweighted per trajectory (SEAL Eq. 12).

        The only override: after TRL computes the group-relative advantages (gathered across
        ranks), each local trajectory's advantage is multiplied by its A-Patch weight.
        """

        seal: SealLoop

        def _get_train_sampler(self, dataset=None):
            sampler = super()._get_train_sampler(dataset)
            sampler.__class__ = _epoch_seeded(type(sampler))
            return sampler

        _seal_scoring_seconds = 0.0
        """time inside ``_generate_and_score_completions`` (rollouts, old and reference log-probs)"""

        def training_step(self, model, inputs, num_items_in_batch):
            started, scoring = time.perf_counter(), self._seal_scoring_seconds
            output = super().training_step(model, inputs, num_items_in_batch)
            elapsed = time.perf_counter() - started - (self._seal_scoring_seconds - scoring)
            self.seal.timing["update/policy"] += elapsed  # the policy's forward and backward passes, optimizer step
            return output

        def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
            import torch

            started = time.perf_counter()
            output = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
            if not torch.is_grad_enabled():  # the no-grad passes before the update; the loss's own pass is in update/policy
                kind = "update/reference" if model is self.ref_model else "update/old_logprobs"
                self.seal.timing[kind] += time.perf_counter() - started
            return output

        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            try:
                return self._seal_generate_and_score(inputs)
            finally:
                self._seal_scoring_seconds += time.perf_counter() - started

        def _seal_generate_and_score(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            weights = [float(x["apatch_weight"]) for x in inputs]
            import torch

            before = output["advantages"].clone()
            weight_tensor = torch.tensor(weights, dtype=before.dtype, device=before.device)
            output["advantages"] = reweight(before, weight_tensor, self.seal.apatch.apply_to)
            self.seal.apatch_hook_calls += 1
            self.seal.after_advantages(self, inputs, before, output["advantages"])
            return output

    return SealGRPOTrainer


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
        """Saves SEAL state into every checkpoint directory, and copies what TRL logs (loss, KL,
        entropy, gradient norm, clip ratios, completion lengths, ``frac_reward_zero_std``, ...)
        into ``metrics.jsonl`` as ``kind: trainer`` lines, so the report has them."""

        def on_save(self, args, state, control, **kwargs):
            if loop.is_main:
                checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                checkpoint.mkdir(parents=True, exist_ok=True)
                (checkpoint / SEAL_STATE_FILE).write_text(json.dumps(loop.state.to_json(), indent=1, sort_keys=True) + "\n")
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
        """Validates before training, after every ``every_rounds`` rounds and after the last round."""

        def on_train_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:
                loop.validate(trainer, 0)
            return control

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % updates_per_round == 0:
                round_index = state.global_step // updates_per_round
                if round_index % every_rounds == 0 or state.global_step >= state.max_steps:
                    loop.validate(trainer, round_index)
            return control

    return ValidationCallback()


def read_metrics(run_dir: Path, kind: str = "rollout") -> list[dict[str, Any]]:
    """The ``metrics.jsonl`` lines of one kind: ``rollout`` (one per round) or ``validation``."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    lines = jsonl.read(path)  # a torn last line (a kill mid-write) is left out
    return [line for line in lines.values if isinstance(line, dict) and line.get("kind", "rollout") == kind]


def _best_validation(run_dir: Path) -> float | None:
    """The best validation average logged so far (a resumed run keeps choosing against it)."""
    values = [line["validation/average"] for line in read_metrics(run_dir, "validation")]
    return max(values) if values else None


def _drop_logs_after(out: Path, round_index: int) -> None:
    """Keep only log lines of rounds up to ``round_index`` (those the checkpoint has seen); a torn
    or corrupt line (a kill mid-write) goes too. Each file is replaced atomically."""
    for name in (METRICS_FILE, "trajectories.jsonl"):
        path = out / name
        if path.exists():
            lines = jsonl.read(path)
            jsonl.rewrite(path, [v for v in lines.values if isinstance(v, dict) and v.get("round", 0) <= round_index])
    for folder in ("profile", "interface"):  # per-round state files of rounds the checkpoint has not seen
        for path in (out / folder).glob("step_*.json"):
            if int(path.stem.split("_", 1)[1]) > round_index:
                path.unlink()


def latest_checkpoint(run_dir: Path, *, required: bool = True) -> Path | None:
    """The newest ``checkpoints/checkpoint-N`` of a run directory that has SEAL state (written
    last, so a checkpoint a kill cut short is never chosen); None if there is none and not
    ``required``."""
    candidates = sorted(
        (p for p in (Path(run_dir) / "checkpoints").glob("checkpoint-*") if (p / SEAL_STATE_FILE).exists()),
        key=lambda p: int(p.name.rsplit("-", 1)[1]),
    )
    if not candidates:
        if not required:
            return None
        raise SealError(f"No checkpoint with SEAL state under {run_dir}/checkpoints; nothing to resume.")
    return candidates[-1]


def scenario(task_id: str) -> str:
    """The BFCL scenario of a task: the four categories of one number share their questions."""
    return task_id.rsplit("_", 1)[1]


def select_tasks(recipe: SealRecipe, task_set: TaskSet) -> tuple[list[Task], list[Task]]:
    """The training tasks and the validation tasks of a recipe.

    Validation defaults to ``eval.holdout`` tasks of the training split, spread over categories,
    from scenarios not trained on; when training covers every scenario of the split, those
    scenarios are held out of training. The test split is never used unless ``eval.tasks`` names it.
    """
    ids = recipe.data.task_ids or None
    tasks = task_set.select(recipe.data.split, recipe.data.categories or None, ids)
    if recipe.data.limit:
        tasks = tasks[: recipe.data.limit]
    v = recipe.eval
    if v.tasks:
        return tasks, [task_set.get(t) for t in v.tasks]
    if not (v.every_rounds or v.keep_best) or not v.holdout:
        return tasks, []
    trained = {scenario(t.id) for t in tasks}
    split = task_set.select("train", None, None)
    pool = [t for t in split if scenario(t.id) not in trained]
    held_out = _spread(pool or tasks, v.holdout, recipe.grpo.seed)
    if not pool:  # training covers the split: hold these scenarios out of training
        removed = {scenario(t.id) for t in held_out}
        tasks = [t for t in tasks if scenario(t.id) not in removed]
    return tasks, held_out


def _spread(pool: Sequence[Task], n: int, seed: int) -> list[Task]:
    """``n`` tasks of ``pool``, round-robin over categories, each category in a seeded order."""
    import zlib

    by_category: dict[str, list[Task]] = {}
    for task in sorted(pool, key=lambda t: zlib.crc32(f"{seed}:{t.id}".encode())):
        by_category.setdefault(task.category, []).append(task)
    chosen: list[Task] = []
    while len(chosen) < n and any(by_category.values()):
        for queue in by_category.values():
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    return sorted(chosen, key=lambda t: (t.category, int(scenario(t.id))))


def warm_start(recipe: SealRecipe, out: Path, task_set: TaskSet, tasks: Sequence[Task], base_model: str) -> Path:
    """SFT ``base_model`` on the recipe's warm-start sources into ``out`` (model in ``out/model``).

    Samples are played under the recipe's environment and budgets and every preset of
    ``warm_start.interfaces`` (see :mod:`seal_rl.sft`); ``out/samples.json`` says what was kept.
    """
    from transformers import AutoTokenizer

    ws = recipe.warm_start
    samples, summary = build_samples(ws.data, tasks, task_set, AutoTokenizer.from_pretrained(base_model),
                                     EnvConfig(**recipe.env), Budgets(**recipe.budgets), ws.interfaces)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.json").write_text(json.dumps(summary, indent=1) + "\n")
    return run_sft(base_model, samples, ws.sft, out, dtype=recipe.model.dtype,
                   gradient_checkpointing=recipe.model.gradient_checkpointing)  # fmt: skip


def _prepare_model(recipe: SealRecipe, out: Path, task_set: TaskSet) -> str:
    if recipe.model.path == "tiny":
        from seal_rl.tiny import build_tiny_model

        target = out / "tiny-init"
        if not (target / "config.json").exists():
            m = recipe.model
            build_tiny_model(target, vocab_size=m.tiny_vocab_size, hidden_size=m.tiny_hidden_size, layers=m.tiny_layers,
                             heads=m.tiny_heads, kv_heads=m.tiny_kv_heads, seed=recipe.grpo.seed, task_set=task_set)  # fmt: skip
        return str(target)
    from seal_rl.models import resolve_model

    path = Path(resolve_model(recipe.model.path)).expanduser()
    if not (path / "config.json").exists():
        raise SealError(
            f"model.path {recipe.model.path!r} is not a local model directory (no config.json) nor a pulled model "
            "(`seal models list`). Pull one (`seal models pull smollm2-135m-instruct`) or download the weights first "
            "(e.g. `huggingface-cli download Qwen/Qwen2.5-7B-Instruct --local-dir ...`); seal-rl never fetches weights "
            "at run time."
        )
    return str(path)


def train(recipe: SealRecipe, out: Path, *, resume: Path | None = None, generator_factory: Any = None,
          recipe_path: Path | None = None) -> dict[str, Any]:
    """Run SEAL (or an ablation) as the recipe says; return a short summary.

    ``resume``: continue the run in ``out`` from its newest checkpoint (model, optimizer, RNG and
    SEAL state; log lines of rounds after that checkpoint are dropped first).

    ``seal train`` checks first that the recipe fits this machine's memory
    (:func:`seal_rl.fit.check_before_training`, called by the CLI before this function). Once the
    model directory exists this prints how many of the training tasks' ground truths fit the budgets
    (:mod:`seal_rl.budgets`).
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    task_set = TaskSet.load()
    tasks, validation = select_tasks(recipe, task_set)
    if len(tasks) < recipe.grpo.tasks_per_step:
        raise SealError(f"{len(tasks)} tasks selected but tasks_per_step is {recipe.grpo.tasks_per_step}.")

    from accelerate import PartialState

    # Joins the process group under torchrun / accelerate launch. A singleton: on a CPU-only machine
    # it must be created with cpu=True (as TRL's use_cpu does), or it stays single-process.
    distributed = PartialState(cpu=not torch.cuda.is_available())
    layout = batch_layout(recipe, distributed.num_processes)
    is_main = distributed.is_main_process
    out = Path(out)
    with ExitStack() as held:
        if is_main:
            held.enter_context(run_lock(out))  # one writer per run directory
        if resume is not None and Path(resume).resolve() != out.resolve():
            raise SealError("--resume continues a run in place: pass the same directory as --out (or omit --out).")
        if is_main:
            out.mkdir(parents=True, exist_ok=True)
            if resume is None and (out / METRICS_FILE).exists():
                raise SealError(f"{out} already holds a training run; choose another --out or resume it with --resume {out}.")
            resolved = OmegaConf.structured(recipe)
            resolved.data.task_ids = [t.id for t in tasks]
            resolved.eval.tasks = [t.id for t in validation]
            (out / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
            CONSOLE.print(start_banner(recipe, out, layout, distributed.num_processes, recipe_path), highlight=False, soft_wrap=True)
        with distributed.main_process_first():  # the main process builds a tiny model; the others reuse it
            model_path = _prepare_model(recipe, out, task_set)
        if is_main:
            _say(summary_line(count_for_recipe(recipe, AutoTokenizer.from_pretrained(model_path), task_set, tasks)))
        if recipe.warm_start.data:
            if distributed.num_processes > 1:
                raise SealError("The warm start runs in one process: run `seal sft` first, then train with "
                                "--set model.path=SFT_DIR/model and without warm_start.data.")  # fmt: skip
            if not (out / "warm_start" / "model" / "config.json").exists():
                warm_start(recipe, out / "warm_start", task_set, tasks, model_path)
            model_path = str(out / "warm_start" / "model")

        g = recipe.grpo
        budgets = Budgets(**recipe.budgets)
        save_steps = g.save_steps or layout["updates_per_round"]
        if save_steps % layout["updates_per_round"]:
            raise SealError(f"save_steps ({save_steps}) must be a multiple of the updates per round ({layout['updates_per_round']}).")
        args = GRPOConfig(
            output_dir=str(out / "checkpoints"),
            per_device_train_batch_size=g.per_device_train_batch_size,
            gradient_accumulation_steps=layout["gradient_accumulation_steps"],
            steps_per_generation=layout["steps_per_generation"],
            num_generations=g.num_generations,
            learning_rate=g.learning_rate,
            lr_scheduler_type=g.lr_scheduler_type,
            num_train_epochs=g.num_train_epochs,
            max_steps=g.max_steps,
            beta=g.beta,
            epsilon=g.epsilon,
            delta=g.delta,
            loss_type=g.loss_type,
            temperature=g.temperature,
            top_p=g.top_p,
            seed=g.seed,
            bf16=g.bf16,
            weight_decay=g.weight_decay,
            use_bias_correction_kl=g.use_bias_correction_kl,
            use_vllm=g.use_vllm,
            vllm_mode=g.vllm_mode,
            vllm_gpu_memory_utilization=g.vllm_gpu_memory_utilization,
            vllm_tensor_parallel_size=g.vllm_tensor_parallel_size,
            vllm_importance_sampling_correction=g.vllm_importance_sampling_correction,
            # The engine's context is one whole episode; a single call generates at most max_new_tokens
            # (the driver asks for less when the episode's budget is nearly spent).
            vllm_max_model_length=budgets.max_prompt_tokens + budgets.max_completion_tokens,
            max_completion_length=budgets.max_new_tokens,
            logging_steps=g.logging_steps,
            save_strategy="steps",
            save_steps=save_steps,
            save_total_limit=g.save_total_limit,
            report_to=g.report_to,
            activation_checkpointing=recipe.model.gradient_checkpointing,
            remove_unused_columns=False,
            use_cpu=not torch.cuda.is_available(),
            **g.extra,
        )
        if g.use_vllm:  # TRL's colocated sync reaches the engine's worker: the engine must run in this process
            vllm_cpu.in_process()
            if not torch.cuda.is_available():  # vLLM's CPU build would size its KV cache to most of the memory
                os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        dtype = {"auto": "auto", "bfloat16": torch.bfloat16, "float32": torch.float32}[recipe.model.dtype]
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t.id}], "task_id": t.id} for t in tasks])

        loop = SealLoop(recipe, task_set, out, is_main=is_main, generator_factory=generator_factory, validation=validation)
        checkpoint = None
        if resume is not None:
            checkpoint = latest_checkpoint(resume, required=False)
            if checkpoint is None:  # killed before the first checkpoint: nothing to keep but the recipe
                warnings.warn(f"{out} has no checkpoint yet; starting the run over from round 1.", SealWarning, stacklevel=2)
            else:
                loop.state = SealState.from_json(json.loads((checkpoint / SEAL_STATE_FILE).read_text()))
            if is_main:
                _drop_logs_after(out, loop.state.round)
            loop.best_validation = _best_validation(out)
        trainer_class = make_trainer_class()
        engine_dtype = str(model.dtype).removeprefix("torch.") if g.vllm_dtype == "auto" else g.vllm_dtype
        with _tensorboard_dir(out / "tensorboard"), trl_engine_dtype(engine_dtype) if g.use_vllm else nullcontext():
            trainer = trainer_class(
                model=model, reward_funcs=[seal_reward], args=args, train_dataset=dataset, processing_class=tokenizer,
                rollout_func=loop.rollout, callbacks=[_seal_callback(loop)],
            )  # fmt: skip
        trainer.seal = loop
        if g.use_vllm:
            vllm_cpu.install_weight_sync(trainer.vllm_generation, loop.timing)  # on vLLM's CPU build only
        _fsdp_on_cpu(trainer)
        if validation and recipe.eval.every_rounds:
            trainer.add_callback(_validation_callback(loop, trainer, layout["updates_per_round"], recipe.eval.every_rounds))
        rounds_before = loop.state.round
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        if loop.state.round > rounds_before:  # book the last round's update, which no next round will
            loop.print_update()
        if is_main and loop.state.round > rounds_before:
            loop.timing["optimisation"] += time.perf_counter() - loop._round_started
            (out / TIME_FILE).write_text(json.dumps({"round": loop.state.round, "step": trainer.state.global_step,
                                                     "time/seconds": {k: round(v, 4) for k, v in loop.timing.items()}}) + "\n")  # fmt: skip
        if loop.apatch_hook_calls != loop.state.round - rounds_before:
            raise RuntimeError(
                f"A-Patch was applied in {loop.apatch_hook_calls} of {loop.state.round - rounds_before} rounds: TRL no longer "
                f"calls GRPOTrainer._generate_and_score_completions as seal-rl expects (pinned trl==1.16.0)."
            )
        save_model(trainer, out / "model")
        return {"rounds": loop.state.round, "steps": trainer.state.global_step, "model": str(out / "model"),
                "apatch_hook_calls": loop.apatch_hook_calls,
                "validation": [line["validation/average"] for line in read_metrics(out, "validation")]}  # fmt: skip


def _say(text: str) -> None:
    """A line for the person at the terminal (stderr, like the start banner), without Rich markup."""
    CONSOLE.print(text, markup=False, highlight=False, soft_wrap=True)


@contextmanager
def _tensorboard_dir(path: Path):
    """Point transformers' TensorBoard logs at ``RUN/tensorboard`` (it reads TENSORBOARD_LOGGING_DIR
    when its callback is built) unless the user chose a directory; the variable is restored after."""
    chosen = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if chosen is None:
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(path)
    try:
        yield
    finally:
        if chosen is None:
            os.environ.pop("TENSORBOARD_LOGGING_DIR", None)


def start_banner(recipe: SealRecipe, out: Path, layout: dict[str, int], world_size: int, config: Path | None) -> str:
    """What ``seal train`` prints before it starts: recipe, batch layout, world size and outputs."""
    g = recipe.grpo
    episodes = g.tasks_per_step * g.num_generations
    return "\n".join([
        f"seal train: recipe {config or '(given in code)'}, resolved in {out / 'config.yaml'}",
        f"  model {recipe.model.path}; protocol {recipe.env.get('protocol', 'seal')}; interface {recipe.interface.get('preset')}; "
        f"A-Patch {recipe.apatch.get('preset')}; report_to {', '.join(g.report_to)}",
        f"  {world_size} process(es); per round {g.tasks_per_step} tasks x {g.num_generations} rollouts = {episodes} episodes, "
        f"{layout['updates_per_round']} update(s) of {g.tasks_per_update * g.num_generations} episodes "
        f"(micro-batch {g.per_device_train_batch_size}, gradient accumulation {layout['gradient_accumulation_steps']}); "
        f"max_steps {g.max_steps}",
        f"  writing {out}/: metrics.jsonl, trajectories.jsonl, profile/, interface/, checkpoints/, tensorboard/, model/",
    ])  # fmt: skip


def save_model(trainer: Any, path: Path) -> None:
    """Save the policy as a plain transformers model directory (weights, config, tokenizer).

    A collective: every rank must call it. ZeRO-3 gathers its 16-bit weights across ranks (on rank 0
    alone it hangs); FSDP gathers a full state dict, which rank 0 writes itself — transformers'
    ``save_pretrained`` would touch the still-sharded parameters on rank 0 alone and hang, and a
    sharded state dict would write shards, not a model.
    """
    if not trainer.is_fsdp_enabled:
        trainer.save_model(str(path))
        if trainer.accelerator.is_main_process:
            trainer.processing_class.save_pretrained(str(path))
        return
    from safetensors.torch import save_file

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # Collective; FSDP2 and FSDP1 alike: full tensors on rank 0, an empty dict elsewhere.
    state_dict = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if trainer.accelerator.is_main_process:
        model = trainer.accelerator.unwrap_model(trainer.model)
        if getattr(model.config, "tie_word_embeddings", False):
            state_dict.pop("lm_head.weight", None)  # tied to the input embeddings; safetensors refuses shared tensors
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(str(path))
        if model.generation_config is not None:
            model.generation_config.save_pretrained(str(path))
        trainer.processing_class.save_pretrained(str(path))
    trainer.accelerator.wait_for_everyone()


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


def sft(recipe: SealRecipe, out: Path, sources: Sequence[Any] = ()) -> dict[str, Any]:
    """``seal sft``: the recipe's warm start alone (or with ``sources`` instead of ``warm_start.data``).

    The model goes to ``out/model``; ``seal train --set model.path=OUT/model`` and
    ``seal eval --policy hf:OUT/model`` take it.
    """
    import torch
    from accelerate import PartialState

    if PartialState(cpu=not torch.cuda.is_available()).num_processes > 1:
        raise SealError("seal sft runs in one process; launch it without accelerate/torchrun.")
    for source in sources:  # the recipe's own sources were checked when it was loaded
        check_source(source)
    if sources:
        recipe.warm_start.data = list(sources)
    task_set = TaskSet.load()
    tasks, _ = select_tasks(recipe, task_set)
    out = Path(out)
    if (out / "model" / "config.json").exists():
        raise SealError(f"{out}/model already exists; choose another --out.")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(recipe)))
    model = warm_start(recipe, out, task_set, tasks, _prepare_model(recipe, out, task_set))
    return {"model": str(model), **json.loads((out / "samples.json").read_text()), **json.loads((out / "sft.json").read_text())}


def recipe_fields() -> list[str]:
    """Top-level recipe keys (for error messages and docs)."""
    return [f.name for f in fields(SealRecipe)]


