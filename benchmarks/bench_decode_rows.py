"""What one decoding step costs by the number of messages in flight: the ceiling on what continuous
batching can win on this machine (issue 43).

Continuous batching wins by keeping more rows busy at every decoding step (occupancy). That pays
only where a step costs about the same with 4 rows as with 8 (a GPU, or any engine bound by reading
the weights); where a step's cost grows with its rows, tokens per second barely depend on how many
are in flight. This benchmark measures that curve on the real SmolLM2-135M-Instruct with the
continuous generator's own batch (:class:`seal_rl.generators.decode_batch.DecodeBatch`): ``rows``
copies of a ``--context``-token prompt (the study's TradingBot prompts are 1.5–2k tokens) decode
together, and the median of ``--steps`` steps is kept.

Each ``--dtypes`` is measured in the same run: ``float32`` is what training generates with on a
CPU (the CPU recipes' ``model.dtype``), ``bfloat16`` what ``from_pretrained`` gives SmolLM2 by
default (its checkpoint's dtype). Columns, per dtype: milliseconds a step and a token, and tokens
per second against the first dtype's single row. The last lines give the ceiling: the per-token
cost at lockstep's occupancy in ``make bench-rollouts`` (``--lockstep-occupancy``, 6.65 on the
greedy round) over the per-token cost at the full batch — what a scheduler that never left a row
idle could gain over lockstep on this machine, before any saving in the generator's own overhead.

Usage: python benchmarks/bench_decode_rows.py [--rows 1,2,4,6,8] [--context 1700] [--steps 16]
       [--dtypes float32,bfloat16] [--lockstep-occupancy 6.65]   (the model: ``make models``)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from rich.table import Table

from bench_rollouts import MODEL
from harness import provenance_console, require_model, times


def step_costs(model, rows: list[int], context: int, steps: int) -> dict[int, float]:
    """Median seconds of one decoding step with ``n`` rows in flight, for each ``n`` of ``rows``."""
    import torch

    from seal_rl.generators.decode_batch import DecodeBatch, Row

    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, model.config.vocab_size - 100, (1, context), generator=generator)
    with torch.no_grad():
        cache = model(input_ids=prompt, use_cache=True).past_key_values
        state = [(layer.keys[:, :, :-1], layer.values[:, :, :-1]) for layer in cache.layers]
        costs = {}
        for n in rows:
            batch = DecodeBatch(model, n)
            batch.admit([Row(i, prompt[0].tolist(), steps + 2) for i in range(n)], [state] * n)
            times = []
            for _ in range(steps + 2):  # the first two warm up
                started = time.perf_counter()
                logits = batch.forward()
                for row, token in zip(batch.rows, logits.argmax(dim=-1).tolist(), strict=True):
                    row.generated.append(token)
                times.append(time.perf_counter() - started)
            costs[n] = statistics.median(times[2:])
    return costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,6,8", help="comma-separated numbers of rows in flight")
    parser.add_argument("--context", type=int, default=1700, help="prompt tokens each row attends to")
    parser.add_argument("--steps", type=int, default=16, help="timed decoding steps per row count (median kept)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes, each measured in turn")
    parser.add_argument("--lockstep-occupancy", type=float, default=6.65,
                        help="rows in flight per step under lockstep (make bench-rollouts, round greedy)")
    args = parser.parse_args()
    try:
        rows = sorted({int(n) for n in args.rows.split(",")})
    except ValueError:
        parser.error(f"--rows must be comma-separated whole numbers, got {args.rows!r}")
    if rows[0] < 1 or args.context < 2 or args.steps < 1:
        parser.error("--rows, --context and --steps must be positive (--context at least 2)")
    path = require_model(MODEL)
    import torch
    from transformers import AutoModelForCausalLM

    dtypes = [name.strip() for name in args.dtypes.split(",") if name.strip()]
    unknown = [name for name in dtypes if not isinstance(getattr(torch, name, None), torch.dtype)]
    if unknown or not dtypes:
        parser.error(f"--dtypes: {', '.join(unknown) or 'none given'} is not a torch dtype (float32, bfloat16, float16)")
    console = provenance_console()
    console.print(f"{MODEL}; torch threads {torch.get_num_threads()}; context {args.context}; rows {rows}")
    per_token: dict[str, dict[int, float]] = {}
    costs: dict[str, dict[int, float]] = {}
    for name in dtypes:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, name)).eval()
        costs[name] = step_costs(model, rows, args.context, args.steps)
        per_token[name] = {n: cost / n for n, cost in costs[name].items()}
        del model
    baseline = per_token[dtypes[0]][rows[0]]
    table = Table(title=f"one decoding step by rows in flight (DecodeBatch); tokens/s against {dtypes[0]} at {rows[0]} row(s)")
    table.add_column("rows", justify="right")
    for name in dtypes:
        for column in ("ms / step", "ms / token", "tokens/s"):
            table.add_column(f"{name} {column}", justify="right")
    for n in rows:
        cells = [str(n)]
        for name in dtypes:
            cells += [f"{costs[name][n] * 1000:.1f}", f"{per_token[name][n] * 1000:.1f}", times(baseline, per_token[name][n])]
        table.add_row(*cells)
    console.print(table)
    full, occupancy = rows[-1], args.lockstep_occupancy
    lower = max((n for n in rows if n <= occupancy), default=rows[0])
    upper = min((n for n in rows if n >= occupancy), default=full)
    for name in dtypes:
        cost = per_token[name]
        # the per-token cost at lockstep's occupancy, interpolated between the measured row counts
        at = cost[lower] if upper == lower else cost[lower] + (cost[upper] - cost[lower]) * (occupancy - lower) / (upper - lower)
        console.print(f"{name}: ceiling of continuous over lockstep from occupancy alone ({occupancy} → {full} rows): "
                      f"[bold]{at / cost[full]:.2f}×[/] tokens per second")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
