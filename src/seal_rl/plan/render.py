"""The answer of ``seal plan`` as fixed-width text: what was planned, the memory table, vLLM,
tokens and time, the assumptions, and the verdict on the last line; with ``--server-gpus``, the
split between generation servers and training GPUs next to the colocated plan (:func:`render_split`)."""

from __future__ import annotations

from seal_rl.plan.estimate import Plan
from seal_rl.plan.memory import VLLM_DTYPE_BYTES, GiB, VLLMPlan
from seal_rl.plan.split import Split


def _gib(n: float) -> str:
    return f"{n / GiB:6.2f}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def render(plan: Plan, budgets: str | None = None) -> str:
    """The plan as fixed-width text: recipe, batch layout, memory table, vLLM, tokens and time, and
    the verdict as its last line. ``budgets``: a line on the ground truths within the budgets
    (:func:`seal_rl.budgets.summary_line`), shown under the sequence lengths."""
    a = plan.assumptions
    hardware = (f"{plan.gpus} GPU(s) x {plan.gpu_memory / GiB:g} GiB" if plan.device == "cuda" else
                f"{plan.gpus} CPU process(es) x {plan.gpu_memory / GiB:.1f} GiB of host RAM")  # fmt: skip
    lines = _header(plan, hardware, budgets, "per GPU")
    lines += ["", *_memory_table(plan, "training memory per GPU (estimate)")]
    v = plan.vllm
    if v is not None:
        title = (f"vLLM colocated, per GPU (estimate): {v.utilization:g} x {plan.gpu_memory / GiB:g} GiB = {v.budget / GiB:.2f} GiB"
                 + (f"; tensor parallel {v.tensor_parallel}: each GPU holds 1/{v.tensor_parallel} of an engine" if v.tensor_parallel > 1 else ""))  # fmt: skip
        lines += ["", title, *_engine_lines(plan, v, "engine")]
    lines += [
        "",
        "tokens and time per round (upper bounds: every episode at full length; estimate)",
        _trained_line(plan) + f"-> {_duration(plan.train_seconds_per_round)}",
        f"  generated <= {plan.episodes} x {plan.generated_tokens // plan.episodes} = {plan.generated_tokens / 1e6:.2f} M tokens "
        f"at {plan.gen_tokens_per_s:,.0f} tokens/s per GPU -> {_duration(plan.generation_seconds_per_round)}",
        f"  per round <= {_duration(plan.seconds_per_round)}; {plan.rounds} rounds <= {_duration(plan.rounds * plan.seconds_per_round)}",
        "",
        *_assumption_lines(plan, []),
        f"  {a.overhead_gib:g} GiB per GPU for the CUDA context, NCCL buffers and fragmentation; environment, validation and "
        "weight-sync time not counted",
    ]  # fmt: skip
    return "\n".join(lines + _closing(plan, plan.fits, plan.reason, "GPU"))


def render_split(split: Split, budgets: str | None = None) -> str:
    """``seal plan --server-gpus M``: the training GPUs' memory table, the servers' memory and
    throughput, the round time colocated and split (synchronous and asynchronous), which is faster
    and by how much, the assumptions, and the verdict on the split as the last line."""
    plan, servers, a = split.training, split.servers, split.training.assumptions
    e = servers.engine
    hardware = (f"{split.gpus} GPU(s) x {plan.gpu_memory / GiB:g} GiB: {split.server_gpus} for vLLM generation servers, "
                f"{plan.gpus} for training")  # fmt: skip
    lines = _header(plan, hardware, budgets, "per training GPU")
    lines.append(f"staleness  {split.staleness} " + ("(on-policy: generation waits for each update)" if split.staleness == 0 else
                 f"(asynchronous: generation runs up to {split.staleness} weight version(s) ahead of the update)"))  # fmt: skip
    lines += ["", *_memory_table(plan, f"training GPUs ({plan.gpus} of {split.gpus}), memory per GPU (estimate)")]
    lines += [
        "",
        f"generation servers ({servers.gpus} of {split.gpus} GPUs): {servers.count} x vLLM, tensor parallel {e.tensor_parallel}, "
        f"per GPU (estimate): {e.utilization:g} x {servers.gpu_memory / GiB:g} GiB = {e.budget / GiB:.2f} GiB",
        *_engine_lines(plan, e, "server"),
        f"  decoding at {servers.tokens_per_s / servers.count:,.0f} tokens/s per server, {servers.tokens_per_s:,.0f} in all",
    ]  # fmt: skip
    trainers, m, rounds = plan.gpus, split.server_gpus, plan.rounds
    generation, update, sync = split.generation_seconds, split.update_seconds, split.sync_seconds
    mine = f" <- the recipe's (staleness {split.staleness})"
    lines += [
        "",
        "time per round (upper bounds: every episode at full length; estimate)",
        _trained_line(plan) + f"-> {_duration(update)} on {trainers} GPUs",
        f"  generated <= {plan.episodes} x {plan.generated_tokens // plan.episodes} = {plan.generated_tokens / 1e6:.2f} M tokens "
        f"at {servers.tokens_per_s:,.0f} tokens/s on {m} server GPUs -> {_duration(generation)}",
        f"  weight sync: {split.sync_bytes / 1e9:.2f} GB of bf16 weights at {a.sync_gb_per_s:g} GB/s -> {_seconds(sync)} per round",
    ]  # fmt: skip
    c = split.colocated
    if c is None:
        lines.append(f"  colocated on {split.gpus} GPUs: not possible ({split.colocated_error.rstrip('.')})")
    else:
        verdict = (f"fits, {(c.training_budget - c.training_bytes) / GiB:.1f} GiB to spare per GPU" if c.fits
                   else f"does not fit: {c.reason.rstrip('.')}")  # fmt: skip
        lines.append(f"  colocated on {split.gpus} GPUs (micro-batch {c.micro_batch}): update {_duration(c.train_seconds_per_round)} + "
                     f"generation {_duration(c.generation_seconds_per_round)} = {_duration(c.seconds_per_round)} "
                     f"({verdict})")  # fmt: skip
    lines += [
        f"  split, staleness 0:    generation {_duration(generation)} + update {_duration(update)} + sync {_seconds(sync)} = "
        f"{_duration(split.synchronous_seconds)}" + (mine if split.staleness == 0 else ""),
        f"  split, staleness >= 1: max(generation {_duration(generation)}, update {_duration(update)}) + sync {_seconds(sync)} = "
        f"{_duration(split.asynchronous_seconds)}" + (mine if split.staleness >= 1 else ""),
    ]  # fmt: skip
    rounds_line = f"{rounds} rounds <= {_duration(rounds * split.seconds_per_round)}"
    if c is None:
        lines.append(f"  -> split at the recipe's staleness {split.staleness}: {_duration(split.seconds_per_round)} per round; {rounds_line}")
    else:
        rounds_line += f" against {_duration(rounds * c.seconds_per_round)} colocated"
        modes = [("staleness 0", split.synchronous_seconds), ("staleness >= 1", split.asynchronous_seconds)]
        if split.staleness >= 1:
            modes.reverse()
        (_, ours), (other, theirs) = modes
        lines.append(f"  -> at the recipe's staleness {split.staleness}: {_faster(ours, c.seconds_per_round)}; {rounds_line}")
        lines.append(f"     with {other}: {_faster(theirs, c.seconds_per_round)}")
    lines += [
        "",
        *_assumption_lines(plan, [
            f"  servers: vLLM takes {a.server_memory_utilization:g} of each server GPU (vLLM 0.30's default "
            "--gpu-memory-utilization); each training process keeps `concurrency` episodes in flight, spread evenly over the "
            "servers",
            f"  weight sync: 2 bytes x Ψ once per round in one NCCL broadcast at {a.sync_gb_per_s:g} GB/s (one 400 Gb/s "
            "InfiniBand NDR link; NVLink within a node: --sync-gb-s 450); per-tensor latency not counted",
        ]),
        f"  {a.overhead_gib:g} GiB per training GPU for the CUDA context, NCCL buffers and fragmentation; environment and "
        "validation time not counted",
    ]  # fmt: skip
    return "\n".join(lines + _closing(plan, split.fits, split.reason, "training GPU"))


def _closing(plan: Plan, fits: bool, reason: str, per: str) -> list[str]:
    """The plan's notes, then whether it fits (with the memory to spare per ``per``) or why not."""
    spare = (plan.training_budget - plan.training_bytes) / GiB
    return [f"note: {note}" for note in plan.notes] + ["", f"fits ({spare:.1f} GiB to spare per {per})" if fits else f"does not fit: {reason}"]


def _seconds(seconds: float) -> str:
    """Short times (the weight sync) with their decimals; long ones as :func:`_duration`."""
    return f"{seconds:.2f} s" if seconds < 10 else _duration(seconds)


def _faster(split: float, colocated: float) -> str:
    """Which of a split round and a colocated round is faster, and by how much."""
    def exact(seconds: float) -> str:  # whole seconds below an hour, so that close rounds still differ
        return f"{seconds:.0f} s" if seconds < 3600 else _duration(seconds)

    if split < colocated:
        return f"the split is faster by {colocated / split:.2f}x ({exact(split)} against {exact(colocated)} colocated per round)"
    return f"colocated is faster by {split / colocated:.2f}x ({exact(colocated)} against {exact(split)} split per round)"


def _header(plan: Plan, hardware: str, budgets: str | None, per: str) -> list[str]:
    """What was planned: the model, the hardware, the sequence, the batch and the run's length."""
    s, lay = plan.shape, plan.layout
    return [
        f"model      {plan.model}: {s.num_layers} layers, hidden {s.hidden_size}, heads {s.num_attention_heads} "
        f"(kv {s.num_key_value_heads}), MLP {s.intermediate_size}, vocab {s.vocab_size}; Ψ = {s.parameters / 1e9:.2f} B parameters"
        + (f" ({s.num_experts} experts, {s.experts_per_token} per token: {s.matmul_parameters / 1e9:.2f} B active besides the embedding)"
           if s.num_experts > 1 else ""),
        f"hardware   {hardware}, strategy {plan.strategy}, {plan.precision.name}, "
        f"gradient checkpointing {'on' if plan.checkpointing else 'off'}",
        *([_lora_line(plan)] if plan.lora is not None else []),
        f"sequence   prompt {plan.prompt_tokens} + completion {plan.completion_tokens} = {plan.longest_sequence} tokens at most",
        *([budgets] if budgets else []),
        f"batch      {plan.episodes} episodes per round ({plan.episodes // plan.gpus} {per}); micro-batch {plan.micro_batch}; "
        f"steps_per_generation {lay['steps_per_generation']}, gradient_accumulation_steps {lay['gradient_accumulation_steps']}, "
        f"optimizer steps per round {lay['updates_per_round']}",
        f"run        {plan.num_tasks} training tasks -> {plan.rounds} rounds, {plan.steps} optimizer steps",
    ]  # fmt: skip


def _lora_line(plan: Plan) -> str:
    """``model.lora``: the rank, what trains (count and share of Ψ) and what the KL reference is."""
    lora, psi = plan.lora, plan.shape.parameters
    reference = ("a frozen copy of the warm-started adapter on the same base" if lora.reference_adapter else
                 "the same model with the adapters off (no copy of the weights)")  # fmt: skip
    return (f"lora       rank {lora.rank} on {lora.targets}: Φ = {lora.trainable / 1e6:.1f} M trainable parameters "
            f"({100 * lora.trainable / psi:.2f}% of Ψ); the KL reference is {reference}")


def _memory_table(plan: Plan, title: str) -> list[str]:
    """The training side's memory per GPU, line by line, against what is available."""
    a = plan.assumptions
    lines = [f"{title:<53} GiB  formula"]
    for line in plan.memory:
        lines.append(f"  {line.name:<48} {_gib(line.bytes)}  {line.formula}")
    lines.append(f"  {'total':<48} {_gib(plan.training_bytes)}")
    if plan.vllm is not None:
        budget = (f"(1 - {plan.vllm.utilization:g}) x {plan.gpu_memory / GiB:g} GiB - {a.overhead_gib:g} GiB overhead")
    else:
        budget = f"{plan.gpu_memory / GiB:g} GiB - {a.overhead_gib:g} GiB overhead"
    lines.append(f"  {'available: ' + budget:<48} {_gib(plan.training_budget)}")
    other = "without" if plan.checkpointing else "with"
    lines.append(f"  activations {other} checkpointing would take {plan.activations_other / GiB:.2f} GiB; "
                 f"materialised fp32 logits would take {plan.logits_if_materialised / GiB:.2f} GiB (TRL's fused head avoids them)")  # fmt: skip
    return lines


def _engine_lines(plan: Plan, v: VLLMPlan, engine: str) -> list[str]:
    """A vLLM engine's share of one GPU: weights, overhead, KV cache; whether it starts; whether its
    cache holds the sequences it serves at once. ``engine``: what one is called (engine, server)."""
    s = plan.shape
    lines = [
        f"  weights {v.weights / GiB:.2f} GiB + non-KV overhead {v.overhead / GiB:.2f} GiB (assumed) + KV cache {v.kv_cache / GiB:.2f} GiB",
        f"  KV cache {v.kv_bytes_per_token:,} bytes/token (2 x {s.num_layers} layers x {s.num_key_value_heads} kv heads x "
        f"{s.head_dim} x {VLLM_DTYPE_BYTES} bytes)"
        + (f", {v.kv_bytes_per_token_per_gpu:,} per GPU" if v.tensor_parallel > 1 else "")
        + f" -> {v.kv_tokens:,} tokens per {engine}",
        f"  max_model_len {v.max_model_len:,}: {'fits' if v.starts else 'DOES NOT FIT (vLLM will not start)'}",
    ]  # fmt: skip
    need = f"{v.concurrent_sequences} concurrent sequences x {v.longest_sequence} tokens = {v.tokens_needed:,} tokens"
    if v.covers_concurrency:
        lines.append(f"  {need}: fit")
    else:
        full = v.kv_tokens // v.longest_sequence
        lines.append(f"  {need}: only {full} fit at full length; vLLM will queue or preempt the rest (slower, not a failure)")
    return lines


def _trained_line(plan: Plan) -> str:
    """The tokens the update forwards per round and their FLOPs, up to the time (which the caller adds)."""
    return ((f"  trained   <= {plan.held_tokens / 1e6:.2f} M tokens held, {plan.trained_tokens / 1e6:.2f} M forwarded "
             "(shared prefixes once); " if plan.trained_tokens < plan.held_tokens else
             f"  trained   <= {plan.held_tokens // plan.longest_sequence} x {plan.longest_sequence} = {plan.trained_tokens / 1e6:.2f} M tokens; ")
            + f"{plan.forwards:g} forward-equivalents x {plan.forward_flops_per_token / 1e9:.1f} GFLOP/token ")  # fmt: skip


def _assumption_lines(plan: Plan, extra: list[str]) -> list[str]:
    """The training and generation assumptions, then ``extra`` lines (the caller adds the overhead line)."""
    a = plan.assumptions
    return [
        "assumptions (all are options of seal plan):",
        f"  training at MFU {a.mfu:g} of {a.peak_tflops:g} TFLOP/s per GPU; forward-equivalents per token: 3 for forward and "
        "backward, +1 recompute with checkpointing, +1 old log-probs (TRL computes them with vLLM or several updates per "
        "round), +1 reference forward when beta > 0",
        "  generation at " + (f"{a.gen_tokens_per_s:g} tokens/s per GPU (given)" if a.gen_tokens_per_s else
                              f"a decode roofline: {a.decode_efficiency:g} of {a.hbm_tb_per_s:g} TB/s, each step reading the weights "
                              "and every running sequence's KV cache (mean context: prompt + completion / 2); prefill not counted"),
        *extra,
    ]  # fmt: skip
