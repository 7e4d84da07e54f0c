"""The training recipe: its sections as dataclasses, loading and validation, and the batch layout.

A :class:`SealRecipe` is everything ``seal train`` needs, read from YAML (a file or a shipped
recipe's name, :mod:`seal_rl.recipes`) plus ``key=value`` overrides and checked on load: each
free-form section (``env``, ``budgets``, ``interface``, ``apatch``) is built into the config
dataclass its module owns, so that module's own checks run too. :func:`batch_layout` turns the
recipe's task counts into TRL's batch settings for a number of processes.

Not here: which tasks a recipe trains and validates on (:mod:`seal_rl.train.prepare`).
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from seal_rl import recipes
from seal_rl.apatch import ApatchConfig
from seal_rl.credit import CREDITS
from seal_rl.diagnose import PRIORITIES
from seal_rl.env import EnvConfig
from seal_rl.errors import SealError
from seal_rl.generators.prefix_cache import DEFAULT_MAX_TOKENS as DEFAULT_PREFIX_CACHE_TOKENS
from seal_rl.interface import InterfaceConfig, InterfaceState
from seal_rl.precision import resolve_bf16  # noqa: F401  (where run.py and plan/ have always found it)
from seal_rl.protocol import PROTOCOLS
from seal_rl.rollout import SCHEDULERS, Budgets
from seal_rl.sft import WarmStartConfig, check_source
from seal_rl.train.lora import LoraSettings, check_recipe as check_lora
from seal_rl.train.samples import REWARDS


@dataclass
class ModelConfig:
    path: str = MISSING
    """a local model directory (weights are never downloaded at run time), or ``tiny`` for a random
    tiny Llama-architecture model built into the run directory (smoke runs and tests)"""
    tiny_vocab_size: int = 4096
    """``tiny``: vocabulary size of the byte-level tokenizer the tiny model's builder trains on BFCL's text"""
    tiny_hidden_size: int = 64
    """``tiny``: hidden size (width) of the tiny model"""
    tiny_layers: int = 2
    """``tiny``: decoder layers of the tiny model"""
    tiny_heads: int = 4
    """attention heads of the tiny model; head_dim = tiny_hidden_size / tiny_heads (16 by default). vLLM's
    CPU attention accepts only some head sizes (32, 64, 80, 96, 112, 128, ...): with ``use_vllm`` on a CPU
    set ``tiny_heads: 1`` (head_dim 64) or a wider ``tiny_hidden_size``"""
    tiny_kv_heads: int = 2
    """key/value heads of the tiny model (grouped-query attention); must divide ``tiny_heads``"""
    dtype: str = "auto"
    """``auto`` | ``bfloat16`` | ``float32``"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass instead of keeping them (transformers' activation
    checkpointing; the RL update and the warm start's SFT): less memory, more compute"""
    lora: LoraSettings | None = None
    """LoRA adapters (``rank``, ``alpha``, ``dropout``, ``target_modules``) instead of full fine-tuning;
    absent or null: every weight trains. The reference is the base model (adapters off); checkpoints
    hold the adapter, ``model/`` the merged model (:mod:`seal_rl.train.lora`, docs/guides/lora.md)"""


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
    per_device_train_batch_size: Any = 4
    """samples per device per micro-batch (the paper: 1), or ``auto``: the largest group-aligned size
    that seal plan's estimate says fits the machine (:mod:`seal_rl.plan.micro_batch`); a whole group
    per micro-batch forwards its shared prompt once (``shared_prefix``)"""
    learning_rate: float = 1e-6
    """AdamW learning rate [1e-6]"""
    lr_scheduler_type: str = "constant"
    """transformers' learning-rate schedule (``constant``, ``linear``, ``cosine``, ...) [constant]"""
    num_train_epochs: float = 6.0
    """passes over the training tasks, ``tasks_per_step`` tasks a round [6]; a positive ``max_steps``
    overrides it"""
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
    """sampling temperature of the training rollouts (validation is greedy) [1.0]"""
    top_p: float = 1.0
    """nucleus-sampling threshold of the training rollouts (1: off)"""
    seed: int = 0
    """seeds TRL's trainer, the rollouts' sampling (per round and rank), the default validation
    holdout's draw and the tiny model's initial weights"""
    weight_decay: float = 0.0
    """AdamW weight decay (TRL's default 0; the reference's verl actor uses 0.01, set in the paper recipe)"""
    use_bias_correction_kl: bool = False
    """multiply the KL term by the importance ratio (TRL's default True); off: the paper's plain
    low-variance KL"""
    bf16: Any = False
    """``true`` | ``false`` | ``auto``: bfloat16 mixed precision. On GPUs, TRL's ``bf16``. On a CPU, torch's
    CPU autocast with float32 master weights (a ``model.dtype: auto`` checkpoint in bfloat16 is loaded
    in float32): matrix products in bfloat16, weights, gradients and Adam in float32. ``auto``: on
    where the GPU supports bfloat16 or the CPU reports AMX-BF16 or AVX512-BF16, off otherwise; said
    at start (:func:`resolve_bf16`)"""
    use_vllm: bool = False
    """load a vLLM engine in the trainer's processes (TRL's colocated engine); ``generator: vllm`` needs it"""
    vllm_mode: str = "colocate"
    """only ``colocate`` is supported: TRL's server mode is a collective over all ranks, which
    multi-turn episodes of different lengths would deadlock"""
    vllm_gpu_memory_utilization: float = 0.4
    """share of each GPU's memory the colocated vLLM engine may take (TRL's ``vllm_gpu_memory_utilization``)"""
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
    vllm_importance_sampling_mode: str = "token_truncate"
    """how TRL's correction applies the ratio (``token_truncate`` | ``token_mask`` | ``sequence_truncate`` |
    ``sequence_mask``). TRL's default is ``sequence_mask``; ours is per token, because a multi-turn episode's
    product of ratios drifts far from 1 once its sampler is an update old: measured with ``staleness: 1``,
    50-100% of episodes fell outside [1/3, 3] per sequence against 0% of tokens (docs/concepts/rounds.md,
    "Asynchronous rounds")"""
    logging_steps: int = 1
    """log TRL's training metrics every N optimizer steps"""
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
    """validate after every N rounds, before the first round (``at_start``) and after the last (0: never)"""
    tasks: list[str] = field(default_factory=list)
    """validation task ids; empty: ``holdout`` tasks of the training split not trained on (the test
    split is used only if a recipe lists its tasks here)"""
    holdout: int = 16
    """size of the default validation set, drawn per category from the training split; when the
    recipe trains on the whole split these tasks are removed from training"""
    keep_best: bool = False
    """save the model with the best validation success (average of category rates) to ``best/``"""
    at_start: bool = True
    """validate before the first round too (false: runs that share a start, as a study's arms do, can
    measure it once)"""
    protocol: str | None = None
    """``bfcl`` | ``seal``: the protocol validation episodes are played under (None: ``env.protocol``,
    the one training uses). ``bfcl`` measures as ``seal eval`` does by default"""

    def __post_init__(self) -> None:
        if self.every_rounds < 0 or self.holdout < 0:
            raise SealError("eval.every_rounds and eval.holdout must be >= 0.")
        if self.protocol not in (None, *PROTOCOLS):
            raise SealError(f"eval.protocol must be one of {list(PROTOCOLS)} (or left out: env.protocol), got {self.protocol!r}.")


@dataclass
class DiagnosisConfig:
    priority: str = "seal"
    """``seal`` (DESIGN.md §4: invalid → argument → missing call → recovery → instance → state →
    response) or ``paper`` (SEAL Table 5: invalid → argument → state → recovery → missing call →
    response); see docs/concepts/diagnosis.md"""

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise SealError(f"diagnosis.priority must be one of {sorted(PRIORITIES)}, got {self.priority!r}.")


@dataclass
class SealRecipe:
    """A training recipe: everything ``seal train`` needs, validated on load."""

    family: str = "bfcl"
    """the environment family: ``bfcl`` (the paper's), ``tau2-airline`` | ``tau2-retail`` | ``tau2-telecom`` |
    ``tau2-mock``, or your own as ``package.module:Class`` / ``path/to/file.py:Class`` (docs/guides/your-environment.md)"""
    family_settings: dict[str, Any] = field(default_factory=dict)
    """keyword arguments the family is built with (τ²: ``solo``, ``user``; your family's own)"""
    model: ModelConfig = field(default_factory=ModelConfig)
    """the policy model to train"""
    data: DataConfig = field(default_factory=DataConfig)
    """which tasks to train on"""
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    """the RL update and the rollouts' sampling"""
    env: dict[str, Any] = field(default_factory=lambda: {"call_format": "hermes", "prompt_mode": "bfcl_qwen_fc", "max_model_calls": 20})
    """how an episode is played (:class:`~seal_rl.env.EnvConfig`); ``auto`` for a key: picked for the model at start"""
    budgets: dict[str, int] = field(default_factory=lambda: asdict(Budgets()))
    """token budgets of one episode (:class:`~seal_rl.rollout.Budgets`)"""
    interface: dict[str, Any] = field(default_factory=lambda: asdict(InterfaceConfig()))
    """the interface and when it evolves (SEAL Eq. 15; :class:`~seal_rl.interface.InterfaceConfig`)"""
    apatch: dict[str, Any] = field(default_factory=lambda: {k: v for k, v in asdict(ApatchConfig()).items()})
    """A-Patch, the diagnosis-guided advantage reweighting (SEAL Eq. 10-12; :class:`~seal_rl.apatch.ApatchConfig`)"""
    profile_window: int = 1
    """rounds the capability profile aggregates over"""
    layout: str = "episode"
    """what one training sample is (docs/concepts/credit.md, "Sample layouts"): ``episode`` (the whole
    episode, token-exact; the paper's) or ``turn`` (one model message, prompted by the model's own
    template as at inference; ``turn_samples`` per episode)"""
    turn_samples: int = 4
    """``turn`` layout: samples per episode (messages drawn without replacement when it has more;
    masked copies when fewer); must divide ``grpo.per_device_train_batch_size``"""
    shared_prefix: Any = "auto"
    """``auto`` | ``true`` | ``false``: forward the tokens that a micro-batch's samples share (a group's
    prompt; in the ``turn`` layout an episode's conversation) once, as a prefix tree, in every
    log-probability pass of the update (policy, old log-probs, reference). Exact up to float order.
    ``auto`` packs when it saves tokens and the model passes the check (else TRL's path, with a
    warning); ``true`` refuses a model that cannot be packed. See docs/guides/rollouts-and-updates.md"""
    generator: str = "hf"
    """``hf`` (transformers generate; CPU or GPU), ``vllm`` (TRL's colocated engine; needs use_vllm),
    ``server`` (one or more ``vllm serve`` generation servers on GPUs of their own: the ``server``
    section), or ``module:function`` naming a factory ``(trainer) -> Generator`` (custom backends, tests)"""
    server: dict[str, Any] = field(default_factory=dict)
    """``generator: server``: the servers' ``urls``, ``weight_sync`` (auto | reload | nccl), ``balance``,
    ``weights_dir``, ``timeout``, ``max_retries``, ``concurrency``, ``check_tolerance``
    (:class:`~seal_rl.generators.vllm_server.ServerConfig`; docs/guides/servers.md, "Generation servers")"""
    staleness: int = 0
    """asynchronous rounds: 0 plays every round on-policy after the update before it (the paper's);
    k >= 1 lets the generation servers play up to k rounds ahead of the update (AReaL's admission),
    drops groups more than k weight versions old, and corrects each token by TRL's importance ratio
    against the log-probability it was sampled with. Needs ``generator: server`` and
    ``grpo.vllm_importance_sampling_correction: true`` (docs/concepts/rounds.md, "Asynchronous rounds")"""
    reward: str = "binary"
    """what GRPO's advantages are computed from: ``binary`` (the paper's: 1 when every user turn
    passes the official checks, else 0) or ``progress`` (Environment Tuning's: the share of user
    turns that pass them). The round log reports both, whichever trains. See docs/concepts/credit.md"""
    credit: str = "episode"
    """``episode`` (GRPO's: every token of an episode gets its group advantage) or ``turn`` (GiGPO with
    (task, user turn) anchors: each model token of user turn k also gets ``credit_weight`` times that
    turn's pass/fail normalised over the group's episodes at turn k, weighted by the turn's own A-Patch
    label weight; :mod:`seal_rl.credit`). See docs/concepts/credit.md, section "Turn-level credit"."""
    credit_weight: float = 1.0
    """ω, the weight of the turn term under ``credit: turn`` (GiGPO's default 1); 0 gives exactly
    ``credit: episode``'s advantages"""
    silent_updates: str = "step"
    """what the update of a round with nothing to learn does (no group whose rewards differ and, under
    ``credit: turn``, no (task, user turn) anchor whose outcomes differ): ``step`` (TRL's and verl's: the
    forward and backward passes run, the gradient is 0, and AdamW still moves the weights along the
    momentum of earlier rounds) or ``skip`` (no forward, backward or weight update; Adam's moments stay
    as they were). ``skip`` needs ``grpo.beta: 0`` and no entropy bonus or MoE load-balancing loss,
    whose terms have a gradient of their own. See docs/concepts/rounds.md, "Rounds with nothing to learn"."""
    rollout_scheduler: str = "auto"
    """``continuous`` (each episode asks for its next message as soon as its environment has stepped;
    the engine batches whatever is pending at every decoding step), ``lockstep`` (ticks: every
    active episode's next message in one batched call, all waiting for the slowest), or ``auto``
    (continuous where the generator can: hf on full-attention models, vllm without tensor
    parallelism). See docs/guides/rollouts-and-updates.md"""
    concurrency: int = 64
    """episodes played at once per rank"""
    generation_batch: int = 16
    """hf generator: sequences per generate() call"""
    prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS
    """hf generator: tokens of prompt KV states kept so a call only prefills what earlier prompts did
    not have (the tool prompt, a group's shared opening, the conversation so far); 0: off. Ignored
    (off) when the weights are sharded over several processes (FSDP, ZeRO-3). See docs/guides/rollouts-and-updates.md."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """a supervised warm start (``seal sft``) run before RL into ``warm_start/``"""
    eval: ValidationConfig = field(default_factory=ValidationConfig)
    """validation during training"""
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    """how Ψ labels a failed turn that qualifies for several labels"""


LAYOUTS = ("episode", "turn")
SILENT_UPDATES = ("step", "skip")


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
    _section("env", EnvConfig, {k: v for k, v in recipe.env.items() if v != "auto"})  # auto: picked per model at start
    if recipe.eval.protocol is not None:
        try:
            EnvConfig(**{k: v for k, v in {**recipe.env, "protocol": recipe.eval.protocol}.items() if v != "auto"})
        except SealError as exc:
            raise SealError(f"eval.protocol {recipe.eval.protocol!r} cannot play this recipe's env: {exc}") from None
    _section("budgets", Budgets, recipe.budgets)
    if recipe.family != "bfcl":
        check_family_spec(recipe)
    for source in recipe.warm_start.data:
        check_source(source)
    for preset in recipe.warm_start.interfaces:
        InterfaceState.initial(preset)
    _section("interface", InterfaceConfig, recipe.interface)
    _section("apatch", ApatchConfig, recipe.apatch)
    g = recipe.grpo
    if recipe.credit not in CREDITS:
        raise SealError(f"credit must be one of {', '.join(CREDITS)}, got {recipe.credit!r}.")
    if not recipe.credit_weight >= 0:
        raise SealError(f"credit_weight (ω) must be >= 0 (0: the episode advantages alone), got {recipe.credit_weight}.")
    if recipe.silent_updates not in SILENT_UPDATES:
        raise SealError(f"silent_updates must be one of {', '.join(SILENT_UPDATES)}, got {recipe.silent_updates!r}.")
    if recipe.silent_updates == "skip" and g.beta != 0:
        raise SealError(f"silent_updates: skip needs grpo.beta: 0 (got {g.beta}): the KL term has a gradient in every "
                        "round, so no round has nothing to learn.")  # fmt: skip
    if recipe.layout not in LAYOUTS:
        raise SealError(f"layout must be one of {', '.join(LAYOUTS)}, got {recipe.layout!r}.")
    b = g.per_device_train_batch_size
    if b != "auto" and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
        raise SealError(f"grpo.per_device_train_batch_size must be a positive number of samples or auto, got {b!r}.")
    if recipe.layout == "turn" and (recipe.turn_samples < 1 or (b != "auto" and b % recipe.turn_samples)):
        raise SealError(f"layout turn: turn_samples ({recipe.turn_samples}) must be at least 1 and divide "
                        f"grpo.per_device_train_batch_size ({g.per_device_train_batch_size}), so that every process "
                        "holds whole episodes.")  # fmt: skip
    if g.num_generations < 2:
        raise SealError(f"Group-relative advantages need >= 2 rollouts per task; got num_generations={g.num_generations}.")
    if g.tasks_per_step % g.tasks_per_update:
        raise SealError(f"tasks_per_step ({g.tasks_per_step}) must be a multiple of tasks_per_update ({g.tasks_per_update}).")
    if recipe.generator not in ("hf", "vllm", "server") and ":" not in recipe.generator:
        raise SealError(f"Unknown generator {recipe.generator!r}; expected 'hf', 'vllm', 'server' or 'module:function'.")
    _check_servers(recipe)
    if g.vllm_importance_sampling_mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        raise SealError(f"grpo.vllm_importance_sampling_mode must be one of token_truncate, token_mask, sequence_truncate, "
                        f"sequence_mask (TRL's), got {g.vllm_importance_sampling_mode!r}.")  # fmt: skip
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
    if g.bf16 not in (True, False, "auto"):
        raise SealError(f"grpo.bf16 must be auto, true or false; got {g.bf16!r}.")
    sft_settings = recipe.warm_start.sft
    if sft_settings.bf16 not in (True, False, "auto"):
        raise SealError(f"warm_start.sft.bf16 must be auto, true or false; got {sft_settings.bf16!r}.")
    if sft_settings.shared_prefix not in (True, False, "auto"):
        raise SealError(f"warm_start.sft.shared_prefix must be auto, true or false; got {sft_settings.shared_prefix!r}.")
    if recipe.shared_prefix not in (True, False, "auto"):
        raise SealError(f"shared_prefix must be auto, true or false; got {recipe.shared_prefix!r}.")
    if recipe.prefix_cache_tokens < 0:
        raise SealError(f"prefix_cache_tokens must be >= 0 (0 turns the cache off); got {recipe.prefix_cache_tokens}.")
    if recipe.reward not in REWARDS:
        raise SealError(f"Unknown reward {recipe.reward!r}; choose one of: {', '.join(REWARDS)}.")
    if recipe.rollout_scheduler not in (*SCHEDULERS, "auto"):
        raise SealError(f"Unknown rollout_scheduler {recipe.rollout_scheduler!r}; choose one of: {', '.join(SCHEDULERS)}, auto.")
    if recipe.rollout_scheduler == "continuous" and g.use_vllm and g.vllm_tensor_parallel_size > 1:
        raise SealError("rollout_scheduler continuous cannot run with grpo.vllm_tensor_parallel_size > 1 (the TP group's "
                        "ranks must call the engine together); choose rollout_scheduler: lockstep (or auto).")  # fmt: skip
    check_report_to(g.report_to)
    check_lora(recipe)


def check_family_spec(recipe: SealRecipe) -> None:
    """A family other than BFCL: a well-formed name, the seal protocol, and no BFCL-only setting."""
    from seal_rl.environments.load import BUILT_IN

    if recipe.family not in BUILT_IN and ":" not in recipe.family:
        raise SealError(f"Unknown family {recipe.family!r}: expected one of {', '.join(BUILT_IN)}, or an import path "
                        "'package.module:Class' or 'path/to/file.py:Class' (docs/guides/your-environment.md).")  # fmt: skip
    if recipe.env.get("protocol", "seal") != "seal" or (recipe.eval.protocol or "seal") != "seal":
        raise SealError(f"family {recipe.family}: env.protocol and eval.protocol must be seal (bfcl is BFCL's own loop).")
    for source in recipe.warm_start.data:
        if source.source.startswith("oracle:"):
            raise SealError(f"family {recipe.family}: warm-start source {source.source!r} perturbs BFCL's ground truth; a "
                            "family warm-starts from source: oracle (Family.oracle), replay:FILE or run:DIR (a "
                            "`seal eval --family` run).")  # fmt: skip


def _check_servers(recipe: SealRecipe) -> None:
    """``generator: server`` and ``staleness``: the server section builds, and the pairs that cannot run together."""
    from seal_rl.generators.vllm_server import ServerConfig

    if isinstance(recipe.staleness, bool) or not isinstance(recipe.staleness, int) or recipe.staleness < 0:
        raise SealError(f"staleness must be a whole number >= 0 (0: on-policy rounds; k: generation up to k rounds ahead), "
                        f"got {recipe.staleness!r}.")  # fmt: skip
    if recipe.generator != "server":
        if recipe.server:
            raise SealError(f"The server section is for generator: server (this recipe's generator is {recipe.generator!r}); "
                            "set generator: server or remove it.")  # fmt: skip
        if recipe.staleness:
            raise SealError(f"staleness {recipe.staleness} needs generator: server: generation can run ahead of the update "
                            "only on servers of its own (a colocated engine shares the trainer's GPUs).")  # fmt: skip
        return
    _section("server", ServerConfig, recipe.server)
    if recipe.grpo.use_vllm:
        raise SealError("generator: server generates on the servers: set grpo.use_vllm: false (no colocated engine).")
    if recipe.staleness and not recipe.grpo.vllm_importance_sampling_correction:
        raise SealError(f"staleness {recipe.staleness} trains on tokens sampled by older weights: set "
                        "grpo.vllm_importance_sampling_correction: true (TRL's TIS/MIS correction against each token's "
                        "sampling log-probability).")  # fmt: skip


def episodes_per_window(recipe: SealRecipe) -> int:
    """Episodes the capability profile aggregates at a time: a round's (tasks x rollouts) x ``profile_window``."""
    return recipe.grpo.tasks_per_step * recipe.grpo.num_generations * recipe.profile_window


def interface_config(recipe: SealRecipe) -> InterfaceConfig:
    """The recipe's interface settings, ``min_count: auto`` resolved for its profile window."""
    return InterfaceConfig(**recipe.interface).resolved(episodes_per_window(recipe))


def planned_interface(recipe: SealRecipe, max_turns: int | None = None) -> tuple[str, str | None]:
    """What the recipe's interface does, in words (``seal train``'s banner, ``seal plan``), and a
    warning when the ``seal`` preset can never switch a component on: its ``min_count`` is more
    turns than a window can hold (``max_turns``: the most user turns of a training task; each
    labels at most once per episode)."""
    config, episodes = interface_config(recipe), episodes_per_window(recipe)
    if config.preset != "seal":
        return f"{config.preset} (fixed: the interface never changes during the run)", None
    how = "auto: the paper's 8 per 256 episodes, scaled" if recipe.interface.get("min_count", "auto") == "auto" else "as set"
    window = f"{recipe.profile_window} round(s) x {episodes // recipe.profile_window} episodes"
    text = (f"seal: a component switches on when its label has >= {config.min_count} turns "
            f"(min_count {how}) and >= {config.prevalence_on:.0%} "
            f"of the countable turns in the profile window ({window} = {episodes} episodes)")  # fmt: skip
    if max_turns is not None and config.min_count > episodes * max_turns:
        return text, (f"interface.min_count {config.min_count} is more turns than a profile window can hold ({episodes} episodes "
                      f"x at most {max_turns} user turns): the seal interface can never switch on in this run; "
                      "set interface.min_count=auto or raise tasks_per_step, num_generations or profile_window.")  # fmt: skip
    return text, None


def planned_scheduler(recipe: SealRecipe) -> str:
    """How the recipe's rollouts will be scheduled, in words (``seal train``'s banner, ``seal plan``);
    the round log says which scheduler actually ran."""
    chosen = recipe.rollout_scheduler
    if chosen == "lockstep":
        return "lockstep (ticks: every active episode waits for the slowest message)"
    if recipe.generator == "server":
        ahead = f"; asynchronous, up to {recipe.staleness} round(s) ahead of the update" if recipe.staleness else "; on-policy rounds"
        return f"continuous (each episode's requests go straight to the {len(recipe.server.get('urls', []))} generation server(s){ahead})"
    if recipe.generator not in ("hf", "vllm"):
        return f"{chosen}: continuous if the {recipe.generator} generator has add/step" + (", else lockstep" if chosen == "auto" else "")
    if recipe.generator == "vllm" and recipe.grpo.vllm_tensor_parallel_size > 1:
        return "lockstep (auto: a tensor-parallel vLLM group calls its engine together)"
    where = " where the model's cache layers allow (full attention), else lockstep" if recipe.generator == "hf" and chosen == "auto" else ""
    return f"continuous ({recipe.generator} batches whatever requests are pending at every decoding step{where})"


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


def samples_per_task(recipe: SealRecipe) -> int:
    """TRL samples per task and round: ``num_generations`` episodes, ``turn_samples`` each in the
    ``turn`` layout (TRL's ``num_generations``, its group size)."""
    return recipe.grpo.num_generations * (recipe.turn_samples if recipe.layout == "turn" else 1)


def batch_layout(recipe: SealRecipe, world_size: int) -> dict[str, int]:
    """TRL batch settings for the recipe on ``world_size`` processes."""
    g = recipe.grpo
    if g.per_device_train_batch_size == "auto":
        raise SealError("grpo.per_device_train_batch_size is auto here; it is chosen for a machine by "
                        "seal_rl.fit.resolve_micro_batch (seal train, seal plan) before batches are laid out.")  # fmt: skip
    per_process = g.per_device_train_batch_size * world_size
    round_samples = g.tasks_per_step * samples_per_task(recipe)
    update_samples = g.tasks_per_update * samples_per_task(recipe)
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


def recipe_fields() -> list[str]:
    """Top-level recipe keys (for error messages and docs)."""
    return [f.name for f in fields(SealRecipe)]
