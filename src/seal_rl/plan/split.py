"""Generation servers on their own GPUs: ``seal plan --gpus N --server-gpus M``.

M of the N GPUs run ``vllm serve`` generation servers, each a full copy of the weights in vLLM's
dtype, tensor-parallel over as few GPUs as hold the weights and a KV cache for one full sequence
(vLLM's own start-up rule); the other N − M GPUs only train, sharded over N − M processes, with no
colocated engine taking a share of them. A round then costs:

* synchronous (``staleness: 0``, on-policy: generation waits for the update):
  generation on M + update on N − M + weight sync, in series;
* asynchronous (``staleness: k >= 1``, generation runs up to k weight versions ahead):
  max(generation, update) + weight sync, as the two overlap in the steady state;
* colocated on all N GPUs (today's plan, :func:`~seal_rl.plan.estimate.estimate`):
  generation + update, in series, on the same GPUs.

Generation is priced with the same decode roofline as the colocated engine
(:func:`~seal_rl.plan.estimate.decode_tokens_per_s`, after Pope et al. 2022, §2) and the servers'
memory with the same vLLM arithmetic (:func:`~seal_rl.plan.memory.vllm_engine`). The weight sync
sends the bf16 weights, 2Ψ bytes, once per round in one NCCL broadcast from the trainers to every
server; a pipelined (ring or tree) broadcast costs about size / bandwidth whatever the number of
receivers (NCCL's performance notes, ``nccl-tests/doc/PERFORMANCE.md``), at the assumed
:attr:`~seal_rl.plan.estimate.Assumptions.sync_gb_per_s`.

``staleness`` and the ``server`` section are read from the recipe where it has them
(``staleness`` defaults to 0).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from seal_rl.errors import SealError
from seal_rl.plan.estimate import Assumptions, Plan, _training_tasks, decode_tokens_per_s, estimate
from seal_rl.plan.memory import VLLM_DTYPE_BYTES, GiB, VLLMPlan, vllm_engine
from seal_rl.plan.micro_batch import AUTO, choose_micro_batch, with_micro_batch
from seal_rl.plan.shapes import ModelShape, model_shape

if TYPE_CHECKING:
    from seal_rl.train.recipe import SealRecipe


@dataclass(frozen=True)
class Servers:
    """The generation servers on the M server GPUs: ``count`` engines of ``engine.tensor_parallel`` GPUs."""

    count: int
    engine: VLLMPlan
    """one GPU's share of one server"""
    gpu_memory: int
    tokens_per_s: float
    """decoded tokens per second of all servers together"""

    @property
    def gpus(self) -> int:
        return self.count * self.engine.tensor_parallel


@dataclass(frozen=True)
class Split:
    """A recipe on N GPUs, M of them generation servers, next to the same recipe colocated on N."""

    gpus: int
    servers: Servers
    training: Plan
    """the training side on N − M GPUs (no engine on them); its generation time is the servers'"""
    colocated: Plan | None
    """today's plan on all N GPUs; None when the recipe cannot be laid out on them"""
    colocated_error: str
    """why there is no colocated plan, or ``""``"""
    staleness: int
    sync_bytes: int
    training_choice: str = ""
    """what ``per_device_train_batch_size: auto`` chose for the training GPUs, or ``""``"""
    colocated_choice: str = ""

    @property
    def server_gpus(self) -> int:
        return self.gpus - self.training.gpus

    @property
    def generation_seconds(self) -> float:
        return self.training.generated_tokens / self.servers.tokens_per_s

    @property
    def update_seconds(self) -> float:
        return self.training.train_seconds_per_round

    @property
    def sync_seconds(self) -> float:
        return self.sync_bytes / (self.training.assumptions.sync_gb_per_s * 1e9)

    @property
    def synchronous_seconds(self) -> float:
        """staleness 0: generation, then the update, then the sync, in series."""
        return self.generation_seconds + self.update_seconds + self.sync_seconds

    @property
    def asynchronous_seconds(self) -> float:
        """staleness >= 1: generation of the next round overlaps the update of this one."""
        return max(self.generation_seconds, self.update_seconds) + self.sync_seconds

    @property
    def seconds_per_round(self) -> float:
        """At the recipe's staleness."""
        return self.asynchronous_seconds if self.staleness >= 1 else self.synchronous_seconds

    @property
    def fits(self) -> bool:
        return not self.reason

    @property
    def reason(self) -> str:
        """Why the split does not fit (one line), or ``""``. Servers that cannot start are refused earlier."""
        context = self.training.shape.max_position_embeddings
        sequence = self.training.longest_sequence
        if context and sequence > context:
            return (f"the budgets ({sequence:,} tokens) exceed the model's context length ({context:,}), which the vLLM "
                    "servers refuse as max_model_len; shorten budgets.max_prompt_tokens or max_completion_tokens.")  # fmt: skip
        if not self.training.fits:
            return f"on the {self.training.gpus} training GPUs, {self.training.reason.rstrip('.')}, or fewer --server-gpus."
        return ""


def estimate_split(
    recipe: SealRecipe,
    *,
    gpus: int,
    server_gpus: int,
    gpu_memory_gb: float,
    strategy: str = "zero3",
    assumptions: Assumptions = Assumptions(),
    shape: ModelShape | None = None,
    num_tasks: int | None = None,
) -> Split:
    """Plan ``recipe`` on ``gpus`` GPUs of which ``server_gpus`` hold vLLM generation servers (see
    the module docstring). ``per_device_train_batch_size: auto`` is chosen for each side on its own:
    on the N − M training GPUs and, for the comparison, on all N colocated."""
    if gpus < 1:
        raise SealError(f"--gpus must be at least 1; got {gpus}.")
    if not 0 < server_gpus < gpus:
        raise SealError(f"--server-gpus must be between 1 and --gpus - 1 = {gpus - 1} (0: colocated, the default); got "
                        f"{server_gpus}.")  # fmt: skip
    if gpu_memory_gb <= 0:
        raise SealError(f"--gpu-memory must be positive (GiB per GPU); got {gpu_memory_gb}.")
    staleness = getattr(recipe, "staleness", 0)
    if not isinstance(staleness, int) or staleness < 0:
        raise SealError(f"staleness must be a whole number >= 0; got {staleness!r}.")
    shape = shape or model_shape(recipe.model.path)
    num_tasks = _training_tasks(recipe) if num_tasks is None else num_tasks
    trainers = gpus - server_gpus
    servers = size_servers(recipe, shape, server_gpus, int(gpu_memory_gb * GiB), trainers, assumptions)

    def on_trainers(r: SealRecipe) -> Plan:
        return estimate(r, gpus=trainers, gpu_memory_gb=gpu_memory_gb, strategy=strategy, assumptions=assumptions, shape=shape,
                        num_tasks=num_tasks, server_tokens_per_s=servers.tokens_per_s)  # fmt: skip

    def colocated(r: SealRecipe) -> Plan:
        return estimate(colocated_recipe(r), gpus=gpus, gpu_memory_gb=gpu_memory_gb, strategy=strategy, assumptions=assumptions, shape=shape,
                        num_tasks=num_tasks)  # fmt: skip

    try:
        training, training_choice = _with_micro_batch(recipe, trainers, on_trainers)
    except SealError as exc:  # the batch does not divide over the training GPUs, and the like
        raise SealError(f"With --server-gpus {server_gpus}, {trainers} of the {gpus} GPUs train: {exc}") from exc
    together, together_choice, error = None, "", ""
    try:
        together, together_choice = _with_micro_batch(recipe, gpus, colocated)
    except SealError as exc:  # e.g. the batch does not divide over all N: the split is still planned
        error = str(exc)
    return Split(gpus=gpus, servers=servers, training=training, colocated=together, colocated_error=error,
                 staleness=staleness, sync_bytes=shape.parameters * VLLM_DTYPE_BYTES, training_choice=training_choice,
                 colocated_choice=together_choice)  # fmt: skip


def colocated_recipe(recipe: SealRecipe) -> SealRecipe:
    """The recipe as today's colocated run would have it: a ``generator: server`` recipe (which sets
    ``grpo.use_vllm: false``, as no engine shares its training GPUs) gets TRL's colocated engine back,
    with no server section and on-policy rounds; any other recipe is planned as it is."""
    if getattr(recipe, "generator", "") != "server":
        return recipe
    changes = {"generator": "vllm", "grpo": dataclasses.replace(recipe.grpo, use_vllm=True)}
    changes.update({name: value for name, value in (("server", {}), ("staleness", 0)) if hasattr(recipe, name)})
    return dataclasses.replace(recipe, **changes)


def _with_micro_batch(recipe: SealRecipe, processes: int, plan_of) -> tuple[Plan, str]:
    """The plan at the recipe's micro-batch, or at what ``auto`` chooses on ``processes`` (and what it chose)."""
    if recipe.grpo.per_device_train_batch_size != AUTO:
        return plan_of(recipe), ""
    choice = choose_micro_batch(recipe, processes, plan_of)
    return plan_of(with_micro_batch(recipe, choice.size)), choice.describe()


def size_servers(
    recipe: SealRecipe, shape: ModelShape, server_gpus: int, gpu_memory: int, trainers: int, assumptions: Assumptions
) -> Servers:
    """The fewest GPUs per server that start: vLLM needs its weights, its overhead and the KV cache of
    one ``max_model_len`` sequence (prompt + completion budgets) in ``server_memory_utilization`` of each
    GPU, and a tensor-parallel size that divides the attention heads (``ModelConfig.verify_with_parallel_config``
    in vLLM 0.30); the size must also divide M, so that every server GPU serves.

    Each training process is taken to keep ``concurrency`` episodes in flight, spread evenly over the
    servers (at most the round's episodes), and at most ``server.concurrency`` requests at one server
    (its HTTP client's connections per server, :class:`~seal_rl.generators.vllm_server.ServerConfig`);
    the decode roofline runs as many of them as the cache holds.
    """
    from seal_rl.generators.vllm_server import ServerConfig

    per_process = (getattr(recipe, "server", None) or {}).get("concurrency", ServerConfig.__dataclass_fields__["concurrency"].default)
    sequence = recipe.budgets["max_prompt_tokens"] + recipe.budgets["max_completion_tokens"]
    mean_context = recipe.budgets["max_prompt_tokens"] + recipe.budgets["max_completion_tokens"] // 2
    episodes = recipe.grpo.tasks_per_step * recipe.grpo.num_generations
    in_flight = min(episodes, trainers * recipe.concurrency)
    utilization = assumptions.server_memory_utilization
    overhead = int(assumptions.vllm_overhead_gib * GiB)

    def engine(tp: int) -> VLLMPlan:
        count = server_gpus // tp
        return vllm_engine(shape, tensor_parallel=tp, utilization=utilization, budget=int(utilization * gpu_memory),
                           overhead=overhead, max_model_len=sequence,
                           concurrent_sequences=min(math.ceil(in_flight / count), trainers * per_process))  # fmt: skip

    for tp in range(1, server_gpus + 1):
        if server_gpus % tp or shape.num_attention_heads % tp:
            continue
        one = engine(tp)
        if one.starts:
            rate = (assumptions.gen_tokens_per_s if assumptions.gen_tokens_per_s is not None
                    else decode_tokens_per_s(one, mean_context, assumptions))  # fmt: skip
            return Servers(count=server_gpus // tp, engine=one, gpu_memory=gpu_memory, tokens_per_s=rate * server_gpus)
    widest = engine(server_gpus)
    need = widest.weights + widest.overhead + sequence * widest.kv_bytes_per_token_per_gpu
    if not widest.starts:
        raise SealError(f"--server-gpus {server_gpus} cannot hold one vLLM server even as one tensor-parallel group of "
                        f"{server_gpus}: its weights ({widest.weights / GiB:.1f} GiB per GPU), non-KV overhead and the KV "
                        f"cache of one {sequence:,}-token sequence need {need / GiB:.1f} GiB per GPU, {utilization:g} x "
                        f"{gpu_memory / GiB:g} GiB = {widest.budget / GiB:.1f} GiB is there; give more --server-gpus, "
                        "larger GPUs or shorter budgets.")  # fmt: skip
    raise SealError(f"No tensor-parallel size that divides both --server-gpus {server_gpus} and the model's "
                    f"{shape.num_attention_heads} attention heads (vLLM's rule) holds a server; choose --server-gpus "
                    "as a multiple of a size that does.")  # fmt: skip
