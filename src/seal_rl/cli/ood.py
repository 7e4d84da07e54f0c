"""``seal eval --benchmark tau2-DOMAIN``: the τ²-bench half of ``seal eval`` (:mod:`seal_rl.ood.tau2_run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from seal_rl.cli.console import err, out, run_progress
from seal_rl.errors import SealError
from seal_rl.environments.tau2_bench import Protocol, benchmark_domain, load_tasks, load_tau2


def tau2_eval(benchmark: str, *, policy: str, user: str | None, out_dir: Path, split: str | None, tasks: str | None,
              trials: int, max_steps: int | None, max_errors: int | None, seed: int | None, concurrency: int,
              prompt_mode: str, call_format: str, settings: Any, overwrite: bool, category: Any = None) -> None:  # fmt: skip
    """Check everything (benchmark, split, tasks, players, protocol) before a conversation starts, play, print."""
    from seal_rl.environments.tau2_players import check_specs, players
    from seal_rl.ood.tau2_run import evaluate_tau2

    domain = benchmark_domain(benchmark)
    if category:
        raise SealError("--category selects BFCL multi-turn categories; τ² runs take --split or --tasks.")
    if max_steps is not None and max_steps < 1 or max_errors is not None and max_errors < 1:
        raise SealError("--max-steps and --max-errors must be at least 1.")
    defaults = Protocol()
    protocol = Protocol(max_steps=max_steps or defaults.max_steps, max_errors=max_errors or defaults.max_errors,
                        seed=defaults.seed if seed is None else seed, trials=trials)  # fmt: skip
    _, _, user_spec = check_specs(policy, user)  # a bad spec is one line before τ² is even imported
    tau2 = load_tau2()
    ids = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    chosen = load_tasks(tau2, domain, split, ids)
    if not chosen:
        raise SealError(f"No tau2-{domain} task matches that selection.")
    config = {"benchmark": benchmark, "policy": policy, "user": user_spec, "split": None if ids else (split or "test"),
              "prompt_mode": prompt_mode, "call_format": call_format,
              "model_settings": None if policy == "oracle" else {k: getattr(settings, k) for k in
                                                                 ("temperature", "top_p", "max_new_tokens", "dtype")}}  # fmt: skip
    total = len(chosen) * protocol.trials
    counts = {"done": 0, "reward": 0.0, "errors": 0}
    with players(policy, user, settings, prompt_mode=prompt_mode, call_format=call_format, out=out_dir,
                 overwrite=overwrite) as (agent, user_player, precision):  # fmt: skip
        config.update(precision)
        with run_progress(benchmark, "reward", total) as update:

            def advance(record: dict) -> None:
                counts["done"] += 1
                counts["errors"] += bool(record.get("error"))
                counts["reward"] += 0.0 if record.get("error") else record["reward"]
                scored = counts["done"] - counts["errors"]
                update(rate=f"{counts['reward'] / scored:.2f}" if scored else "-", errors=counts["errors"])

            def resumed(done: list[dict]) -> None:
                err.print(f"resuming {out_dir}: {len(done)} of {total} conversations already done", soft_wrap=True)
                for record in done:
                    advance(record)

            summary = evaluate_tau2(tau2, domain, chosen, out_dir, agent=agent, user=user_player, protocol=protocol,
                                    config=config, concurrency=concurrency, overwrite=overwrite,
                                    on_conversation=advance, on_resume=resumed)  # fmt: skip
    print_tau2_summary(summary, out_dir)
    if summary["generation_errors"] and not summary["conversations"]:
        err.print("[bold red]error:[/] every conversation ended in a generation error (see 'error' in results.jsonl)")
        raise typer.Exit(1)


def print_tau2_summary(summary: dict, out_dir: Path) -> None:
    scope = f"{summary['tasks']} tasks × {summary['trials']} trials" + (f" of the {summary['split']} split" if summary.get("split") else "")
    table = Table("conversations", "avg reward", "success", "95% CI", *(f"pass^{k}" for k in summary["pass_hat_k"]),
                  title=f"{summary['benchmark']} — {summary['policy']} (user: {summary['user']})", caption=scope)  # fmt: skip
    low, high = summary["success_interval"]
    table.add_row(str(summary["conversations"]), f"{summary['avg_reward']:.3f}", f"{summary['success_rate']:.1%}",
                  f"{low:.1%}–{high:.1%}", *(f"{v:.1%}" for v in summary["pass_hat_k"].values()))  # fmt: skip
    out.print(table)
    endings = ", ".join(f"{reason} {n}" for reason, n in sorted(summary["terminations"].items()))
    out.print(f"endings: {endings or '-'}")
    if summary["generation_errors"]:
        err.print(f"[red]{summary['generation_errors']} conversations ended in generation errors[/] (left out; played again on resume)")
    out.print(f"results: {out_dir / 'results.jsonl'}  summary: {out_dir / 'summary.json'}  τ² results: {out_dir / 'tau2_results.json'}")


def memory_eval(*, policy: str, out_dir: Path, split: str | None, category: list[str] | None, tasks: str | None,
                env_config: Any, settings: Any, overwrite: bool) -> None:  # fmt: skip
    """``seal eval --benchmark bfcl-memory``: check the selection and the policy, play, print."""
    from seal_rl.ood.bfcl_memory import BACKENDS, backend_category, evaluate_memory
    from seal_rl.policies import ModelPolicy, ServerPolicy, VLLMPolicy, parse_policy

    backends = [b.strip() for c in category for b in c.split(",") if b.strip()] if category else list(BACKENDS)
    for backend in backends:
        backend_category(backend)  # one line for vector or an unknown backend
    if policy != "oracle" and not isinstance(parse_policy(policy), (ModelPolicy, VLLMPolicy, ServerPolicy)):
        raise SealError("bfcl-memory plays --policy oracle, hf:, vllm: or openai:; replay and bfcl-result files are BFCL multi-turn runs.")
    scenarios = None if split in (None, "all") else [s.strip() for s in split.split(",") if s.strip()]
    ids = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    counts = {"done": 0, "passed": 0, "scored": 0, "errors": 0}
    with run_progress("bfcl-memory", "accuracy", None) as update:

        def advance(record: dict) -> None:
            counts["done"] += 1
            counts["errors"] += bool(record.get("error"))
            if not record.get("prereq") and not record.get("error"):
                counts["scored"] += 1
                counts["passed"] += record["reward"] == 1.0
            update(rate=f"{counts['passed'] / counts['scored']:.1%}" if counts["scored"] else "-", errors=counts["errors"])

        def resumed(done: list[dict]) -> None:
            err.print(f"resuming {out_dir}: {len(done)} entries already done", soft_wrap=True)
            for record in done:
                advance(record)

        summary = evaluate_memory(backends, out_dir, policy=policy, env_config=env_config, settings=settings,
                                  scenarios=scenarios, ids=ids, overwrite=overwrite, on_episode=advance,
                                  on_resume=resumed, on_entries=lambda total: update(advance=0, total=total))  # fmt: skip
    table = Table("backend", "questions", "passed", "accuracy", "95% CI", title=f"bfcl-memory — {summary['policy']}",
                  caption=f"{summary['prerequisites']} prerequisite conversations played")  # fmt: skip
    for backend, row in summary["backends"].items():
        low, high = row["interval"]
        table.add_row(backend, str(row["questions"]), str(row["passed"]), f"{row['accuracy']:.1%}", f"{low:.1%}–{high:.1%}")
    out.print(table)
    out.print(f"memory accuracy (mean over backends): {summary['accuracy']:.1%}")
    if summary["failures"]:
        out.print("failures: " + ", ".join(f"{kind} {n}" for kind, n in sorted(summary["failures"].items())))
    if summary["generation_errors"]:
        err.print(f"[red]{summary['generation_errors']} entries ended in generation errors[/] (played again on resume)")
    out.print(f"results: {out_dir / 'results.jsonl'}  summary: {out_dir / 'summary.json'}")
    if summary["generation_errors"] and not summary["questions"]:
        err.print("[bold red]error:[/] every question ended in a generation error (see 'error' in results.jsonl)")
        raise typer.Exit(1)
