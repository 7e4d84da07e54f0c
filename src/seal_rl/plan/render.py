"""The answer of ``seal plan`` as fixed-width text: what was planned, the memory table, vLLM,
tokens and time, the assumptions, and the verdict on the last line."""

from __future__ import annotations

from seal_rl.plan.estimate import Plan
from seal_rl.plan.memory import VLLM_DTYPE_BYTES, GiB


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
    s, a = plan.shape, plan.assumptions
    lay = plan.layout
    hardware = (f"{plan.gpus} GPU(s) x {plan.gpu_memory / GiB:g} GiB" if plan.device == "cuda" else
                f"{plan.gpus} CPU process(es) x {plan.gpu_memory / GiB:.1f} GiB of host RAM")  # fmt: skip
    lines = [
        f"model      {plan.model}: {s.num_layers} layers, hidden {s.hidden_size}, heads {s.num_attention_heads} "
        f"(kv {s.num_key_value_heads}), MLP {s.intermediate_size}, vocab {s.vocab_size}; Ψ = {s.parameters / 1e9:.2f} B parameters"
        + (f" ({s.num_experts} experts, {s.experts_per_token} per token: {s.matmul_parameters / 1e9:.2f} B active besides the embedding)"
           if s.num_experts > 1 else ""),
        f"hardware   {hardware}, strategy {plan.strategy}, {plan.precision.name}, "
        f"gradient checkpointing {'on' if plan.checkpointing else 'off'}",
        f"sequence   prompt {plan.prompt_tokens} + completion {plan.completion_tokens} = {plan.longest_sequence} tokens at most",
        *([budgets] if budgets else []),
        f"batch      {plan.episodes} episodes per round ({plan.episodes // plan.gpus} per GPU); micro-batch {plan.micro_batch}; "
        f"steps_per_generation {lay['steps_per_generation']}, gradient_accumulation_steps {lay['gradient_accumulation_steps']}, "
        f"optimizer steps per round {lay['updates_per_round']}",
        f"run        {plan.num_tasks} training tasks -> {plan.rounds} rounds, {plan.steps} optimizer steps",
        "",
        "training memory per GPU (estimate)                    GiB  formula",
    ]  # fmt: skip
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

    v = plan.vllm
    if v is not None:
        lines += [
            "",
            f"vLLM colocated, per GPU (estimate): {v.utilization:g} x {plan.gpu_memory / GiB:g} GiB = {v.budget / GiB:.2f} GiB"
            + (f"; tensor parallel {v.tensor_parallel}: each GPU holds 1/{v.tensor_parallel} of an engine" if v.tensor_parallel > 1 else ""),
            f"  weights {v.weights / GiB:.2f} GiB + non-KV overhead {v.overhead / GiB:.2f} GiB (assumed) + KV cache {v.kv_cache / GiB:.2f} GiB",
            f"  KV cache {v.kv_bytes_per_token:,} bytes/token (2 x {s.num_layers} layers x {s.num_key_value_heads} kv heads x "
            f"{s.head_dim} x {VLLM_DTYPE_BYTES} bytes)"
            + (f", {v.kv_bytes_per_token_per_gpu:,} per GPU" if v.tensor_parallel > 1 else "")
            + f" -> {v.kv_tokens:,} tokens per engine",
            f"  max_model_len {v.max_model_len:,}: {'fits' if v.starts else 'DOES NOT FIT (vLLM will not start)'}",
        ]  # fmt: skip
        need = f"{v.concurrent_sequences} concurrent sequences x {v.longest_sequence} tokens = {v.tokens_needed:,} tokens"
        if v.covers_concurrency:
            lines.append(f"  {need}: fit")
        else:
            full = v.kv_tokens // v.longest_sequence
            lines.append(f"  {need}: only {full} fit at full length; vLLM will queue or preempt the rest (slower, not a failure)")
    lines += [
        "",
        "tokens and time per round (upper bounds: every episode at full length; estimate)",
        (f"  trained   <= {plan.held_tokens / 1e6:.2f} M tokens held, {plan.trained_tokens / 1e6:.2f} M forwarded "
         "(shared prefixes once); " if plan.trained_tokens < plan.held_tokens else
         f"  trained   <= {plan.held_tokens // plan.longest_sequence} x {plan.longest_sequence} = {plan.trained_tokens / 1e6:.2f} M tokens; ")
        + f"{plan.forwards:g} forward-equivalents x {plan.forward_flops_per_token / 1e9:.1f} GFLOP/token "
        f"-> {_duration(plan.train_seconds_per_round)}",
        f"  generated <= {plan.episodes} x {plan.generated_tokens // plan.episodes} = {plan.generated_tokens / 1e6:.2f} M tokens "
        f"at {plan.gen_tokens_per_s:,.0f} tokens/s per GPU -> {_duration(plan.generation_seconds_per_round)}",
        f"  per round <= {_duration(plan.seconds_per_round)}; {plan.rounds} rounds <= {_duration(plan.rounds * plan.seconds_per_round)}",
        "",
        "assumptions (all are options of seal plan):",
        f"  training at MFU {a.mfu:g} of {a.peak_tflops:g} TFLOP/s per GPU; forward-equivalents per token: 3 for forward and "
        "backward, +1 recompute with checkpointing, +1 old log-probs (TRL computes them with vLLM or several updates per "
        "round), +1 reference forward when beta > 0",
        "  generation at " + (f"{a.gen_tokens_per_s:g} tokens/s per GPU (given)" if a.gen_tokens_per_s else
                              f"a decode roofline: {a.decode_efficiency:g} of {a.hbm_tb_per_s:g} TB/s, each step reading the weights "
                              "and every running sequence's KV cache (mean context: prompt + completion / 2); prefill not counted"),
        f"  {a.overhead_gib:g} GiB per GPU for the CUDA context, NCCL buffers and fragmentation; environment, validation and "
        "weight-sync time not counted",
    ]  # fmt: skip
    lines += [f"note: {note}" for note in plan.notes]
    spare = (plan.training_budget - plan.training_bytes) / GiB
    lines += ["", f"fits ({spare:.1f} GiB to spare per GPU)" if plan.fits else f"does not fit: {plan.reason}"]
    return "\n".join(lines)
