"""``seal eval``, ``export-bfcl``, ``report``, ``compare`` and ``diagnose``: play and score agents
strictly, and read what evaluation and training runs hold."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Column, Table

from seal_rl.bfcl import BFCL_VERSION
from seal_rl.cli.ood import memory_eval, tau2_eval
from seal_rl.cli.console import FamilySetOption, JsonOption, family_settings, _print_json, err, load_tokenizer, out, run_progress
from seal_rl.diagnose import EXCLUDED_LABELS, LABELS
from seal_rl.env import EnvConfig
from seal_rl.errors import SealError, SealWarning
from seal_rl.evaluate import DEFAULT_PREFIX_CACHE_TOKENS, SCRIPTED, ModelSettings, evaluate, read_results
from seal_rl.families import AUTO, resolve_auto
from seal_rl.interface import PROMPT_MODES
from seal_rl.ood import BENCHMARKS
from seal_rl.policies import BfclResultPolicy, ModelPolicy, VLLMPolicy, parse_policy, with_samples
from seal_rl.profile import describe_run
from seal_rl.stats import compare_runs
from seal_rl.tasks import CATEGORIES, TaskSet
from seal_rl.tools import FORMATS

def eval_command(
    policy: Annotated[str, typer.Option("--policy", "-p", help="oracle | oracle:faults=P,seed=S | replay:FILE.jsonl | bfcl-result:PATH[#fc|#hermes|#pythonic] | hf:MODEL_DIR | vllm:MODEL_DIR | openai:MODEL@URL")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Run directory for results.jsonl and summary.json (re-run the same command to resume).")],
    benchmark: Annotated[str, typer.Option(help=f"{', '.join(BENCHMARKS)}: BFCL multi-turn, BFCL V4 memory (bfcl-eval's memory backends and checker), or a τ²-bench domain run by τ²'s own orchestrator and evaluator (docs/guides/ood.md).")] = "bfcl",
    family: Annotated[str, typer.Option(help="An environment family played through training's own episodes (seal protocol): tau2-DOMAIN or path/to/file.py:Class (docs/guides/your-environment.md); bfcl (default): --benchmark decides.")] = "bfcl",
    family_set: FamilySetOption = None,
    user: Annotated[str | None, typer.Option("--user", help="τ²: the user simulator, as --policy (hf:, vllm:, openai:; oracle with the oracle agent), τ²'s own prompt and guidelines.")] = None,
    trials: Annotated[int, typer.Option(help="τ²: conversations per task (pass^k for k = 1..trials).")] = 1,
    max_steps: Annotated[int | None, typer.Option(help="τ²: orchestrator steps before a conversation ends (default: τ²'s 200).")] = None,
    max_errors: Annotated[int | None, typer.Option(help="τ²: tool errors before a conversation ends (default: τ²'s 10).")] = None,
    split: Annotated[str | None, typer.Option(help="train, test or all (default: test); τ²: its own split names (train, test, base, ...); bfcl-memory: scenarios, comma-separated (customer, finance, healthcare, notetaker, student; default all).")] = None,
    category: Annotated[list[str] | None, typer.Option("--category", "-c", help=f"Only this category (repeatable): {', '.join(CATEGORIES)}; bfcl-memory: the memory backend, kv or rec_sum (default both).")] = None,
    tasks: Annotated[str | None, typer.Option("--tasks", help="Comma-separated task ids (instead of --split).")] = None,
    call_format: Annotated[str, typer.Option("--format", help=f"Tool-call format: {', '.join(FORMATS)}, or auto (the model's template family decides; docs/guides/models.md).")] = "hermes",
    prompt_mode: Annotated[str, typer.Option(help=f"Prompt mode: {', '.join(PROMPT_MODES)}, or auto.")] = "bfcl_qwen_fc",
    protocol: Annotated[str, typer.Option(help="bfcl: the official `bfcl generate` loop (leaderboard numbers); seal: the released SEAL code's loop (as the paper trained). See docs/concepts/environment.md.")] = "bfcl",
    max_model_calls: Annotated[int, typer.Option(help="seal protocol: model messages per episode before truncation.")] = 20,
    max_steps_per_turn: Annotated[int, typer.Option(help="bfcl protocol: executing steps per user turn before force-termination.")] = 20,
    samples: Annotated[int, typer.Option(help="Play every task K times (pass@k, variance); use --temperature > 0.")] = 1,
    overwrite: Annotated[bool, typer.Option(help="Start over in --out instead of resuming.")] = False,
    temperature: Annotated[float, typer.Option(help="Model policies: sampling temperature (0 = greedy).")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Model policies: nucleus sampling.")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(help="Model policies: longest model message, in tokens.")] = 1024,
    max_thinking_tokens: Annotated[int, typer.Option(help="hf/vllm: longest reasoning of one message; a message still reasoning past it ends the episode (0 = no cap).")] = 0,
    seed: Annotated[int | None, typer.Option(help="Model policies: sampling seed (default 0); τ²: the run seed each trial's seed is drawn from (default: τ²'s 300).")] = None,
    concurrency: Annotated[int, typer.Option(help="Episodes played at once.")] = 8,
    prefix_cache_tokens: Annotated[int, typer.Option(help="hf: tokens of prompt KV states kept so later calls only read their new tokens (0 = off; docs/guides/evaluate.md).")] = DEFAULT_PREFIX_CACHE_TOKENS,
    rollout_scheduler: Annotated[str, typer.Option(help="hf:/vllm:: continuous (each episode's next message starts as soon as it has stepped), lockstep (ticks: every episode waits for the slowest message), or auto (continuous where the engine can; docs/guides/evaluate.md).")] = "auto",
    dtype: Annotated[str, typer.Option(help="hf:/vllm: the dtype the weights load in: auto (the checkpoint's where the device computes bfloat16 natively — a GPU, a CPU with AMX-BF16 or AVX512-BF16 — float32 on other CPUs; recorded, kept on resume), float32, bfloat16 or float16 (always wins). docs/guides/evaluate.md.")] = "auto",
    timeout: Annotated[float, typer.Option(help="openai: seconds per request before a retry.")] = 120.0,
    retries: Annotated[int, typer.Option(help="openai: retries before an episode is recorded as a generation error.")] = 4,
    api_key_env: Annotated[str, typer.Option(help="openai: environment variable holding the API key.")] = "OPENAI_API_KEY",
    requests_per_minute: Annotated[float, typer.Option(help="openai: rate limit (0 = none).")] = 0.0,
) -> None:
    """Evaluate a policy on BFCL multi-turn (by default under the official bfcl protocol; see --protocol) or on τ²-bench (--benchmark)."""
    settings = ModelSettings(
        temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed or 0, concurrency=concurrency,
        prefix_cache_tokens=prefix_cache_tokens, max_thinking_tokens=max_thinking_tokens, rollout_scheduler=rollout_scheduler,
        dtype=dtype, timeout=timeout, max_retries=retries, api_key_env=api_key_env, requests_per_minute=requests_per_minute,
    )  # fmt: skip
    if benchmark == "bfcl-memory":
        if user is not None or trials != 1 or max_steps is not None or max_errors is not None or samples != 1:
            raise SealError("--user, --trials, --max-steps, --max-errors and --samples do not apply to bfcl-memory "
                            "(a single play of each question under the bfcl protocol).")  # fmt: skip
        if protocol != "bfcl" or AUTO in (call_format, prompt_mode):
            raise SealError("bfcl-memory plays the bfcl protocol with an explicit --format and --prompt-mode.")
        env_config = EnvConfig(protocol="bfcl", call_format=call_format, prompt_mode=prompt_mode, max_steps_per_turn=max_steps_per_turn)
        return memory_eval(policy=policy, out_dir=out_dir, split=split, category=category, tasks=tasks,
                           env_config=env_config, settings=settings, overwrite=overwrite)  # fmt: skip
    if benchmark != "bfcl":
        if call_format == AUTO or prompt_mode == AUTO:
            raise SealError("τ² runs take an explicit --format and --prompt-mode (auto reads a BFCL episode's template).")
        if max_thinking_tokens or requests_per_minute:
            raise SealError("--max-thinking-tokens and --requests-per-minute do not apply to τ² runs (τ²'s players have no such caps).")
        return tau2_eval(benchmark, policy=policy, user=user, out_dir=out_dir, split=split, tasks=tasks, trials=trials,
                         max_steps=max_steps, max_errors=max_errors, seed=seed, concurrency=concurrency, prompt_mode=prompt_mode,
                         call_format=call_format, settings=settings, overwrite=overwrite, category=category)  # fmt: skip
    if user is not None or trials != 1 or max_steps is not None or max_errors is not None:
        raise SealError("--user, --trials, --max-steps and --max-errors are τ²-bench options; BFCL runs take --samples (and --max-steps-per-turn).")
    chosen = parse_policy(policy)
    if family != "bfcl" or family_set:
        return family_eval(family, family_set or [], chosen, out_dir=out_dir, split=split, category=category, tasks=tasks,
                           call_format=call_format, prompt_mode=prompt_mode, protocol=protocol, max_model_calls=max_model_calls,
                           samples=samples, settings=settings, overwrite=overwrite)  # fmt: skip
    if isinstance(chosen, BfclResultPolicy):  # the files decide how their steps are decoded
        if protocol != "bfcl":
            raise SealError("bfcl-result files are replayed under the bfcl protocol, the one that wrote them; drop --protocol.")
        call_format = chosen.call_format()
        prompt_mode = "bfcl_qwen_fc" if call_format == "hermes" else "chat_template"
    if AUTO in (call_format, prompt_mode):
        picked, note = resolve_auto({"prompt_mode": prompt_mode, "call_format": call_format}, _tokenizer_of(chosen))
        prompt_mode, call_format = picked["prompt_mode"], picked["call_format"]
        err.print(note, markup=False, highlight=False, soft_wrap=True)
    env_config = EnvConfig(protocol=protocol, call_format=call_format, prompt_mode=prompt_mode,
                           max_model_calls=max_model_calls, max_steps_per_turn=max_steps_per_turn)  # fmt: skip
    task_set = TaskSet.load()
    if chosen.selects_tasks:
        ids = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
        selected = task_set.select(split or "test", category, ids)
        if not selected:
            raise SealError("No task matches that selection; see `seal tasks list`.")
    elif split or category or tasks:
        raise SealError("--split, --category and --tasks select tasks for the oracle and models; replay and bfcl-result files name their own tasks.")
    else:
        selected = []
    episodes = with_samples(chosen.episodes(selected, task_set, call_format), samples)
    if samples > 1 and temperature == 0 and not isinstance(chosen, SCRIPTED):
        warnings.warn(f"--samples {samples} at --temperature 0 (greedy) plays the same episode {samples} times; "
                      "pass --temperature > 0 for pass@k.", SealWarning, stacklevel=1)  # fmt: skip
    for task_id in getattr(chosen, "unknown", ()):
        err.print(f"[yellow]skipped[/] {task_id}: the pinned bfcl-eval {BFCL_VERSION} data has no such task", soft_wrap=True)

    counts = {"done": 0, "ok": 0, "errors": 0}
    with run_progress("eval", "success", len(episodes)) as update:

        def resumed(done: list[dict]) -> None:
            err.print(f"resuming {out_dir}: {len(done)} of {len(episodes)} episodes already done", soft_wrap=True)
            for record in done:
                advance(record)

        def advance(record: dict) -> None:
            counts["done"] += 1
            if record.get("error"):
                counts["errors"] += 1
                counts.setdefault("first_error", record["error"])
            else:
                counts["ok"] += record["reward"] == 1.0
            scored = counts["done"] - counts["errors"]
            update(rate=f"{counts['ok'] / scored:.1%}" if scored else "-", errors=counts["errors"])

        summary = evaluate(episodes, env_config, out_dir, policy=chosen, settings=settings, overwrite=overwrite,
                           on_episode=advance, on_resume=resumed,
                           split=(split or "test") if chosen.selects_tasks and not tasks else None)  # fmt: skip
    _print_summary(summary, out_dir)
    if summary["errors"] and not summary["episodes"]:  # nothing was scored: a script must not read 0% as a result
        err.print(f"[bold red]error:[/] every episode ended in a generation error, e.g.: {counts.get('first_error', '?')}",
                  highlight=False, soft_wrap=True)  # fmt: skip
        raise typer.Exit(1)


def export_bfcl_command(
    run_dir: Annotated[Path, typer.Argument(help="A `seal eval` run directory.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Result directory to write (give it to `bfcl evaluate --result-dir`).")],
    model: Annotated[str | None, typer.Option(help="BFCL model name whose handler decodes the run's call format (default: Qwen/Qwen3-8B-FC for hermes runs, Qwen/Qwen3-8B for pythonic ones).")] = None,
) -> None:
    """Write an evaluation run as BFCL result files, so that the official `bfcl evaluate` scores it."""
    import json

    from seal_rl.bfcl_results import export_model, export_run

    try:
        config = json.loads((run_dir / "config.json").read_text())
        call_format = config["env"]["call_format"]
    except (OSError, ValueError, KeyError, TypeError):
        raise SealError(f"{run_dir}/config.json is missing or not a `seal eval` config; export needs the run's call format.") from None
    if config.get("benchmark") == "bfcl-memory":
        from seal_rl import jsonl
        from seal_rl.ood.bfcl_memory import export_memory

        model = export_model(call_format, model)
        written = export_memory(jsonl.read(run_dir / "results.jsonl").values, out_dir, model)
        category = "memory"
    else:
        written = export_run(read_results(run_dir), out_dir, call_format=call_format, model_name=model)
        category = "multi_turn"
    for path in written:
        out.print(f"wrote {path}")
    out.print(f"score them with: bfcl evaluate --model <the folder name with _ as /> --test-category {category} "
              f"--result-dir {out_dir} --partial-eval   (see docs/guides/ood.md)")


def report_command(
    run_dir: Annotated[Path, typer.Argument(help="An evaluation or training run directory, or a study's (seal study --out).")],
) -> None:
    """Write RUN/report.html: a self-contained page with tables, charts and a trajectory browser.

    On a study's directory: its page (the tables and learning curves of seal study) from its
    summary.json, beside it (OUT/report.html, or OUT/interim/report.html while runs are left).
    """
    from seal_rl.study.page import study_summary

    summary = study_summary(run_dir)
    if summary is not None:
        import io
        import json

        from rich.console import Console

        from seal_rl.study.page import write_page

        target = write_page(json.loads(summary.read_text(encoding="utf-8")), summary.parent, Console(file=io.StringIO()))
        out.print(f"report: {target} ({target.stat().st_size / 2**20:.1f} MiB)")
        return
    from seal_rl.report import write_report

    target = write_report(run_dir)
    out.print(f"report: {target} ({target.stat().st_size / 2**20:.1f} MiB)")


def compare_command(
    run_a: Annotated[Path, typer.Argument(help="The baseline run directory (A).")],
    run_b: Annotated[Path, typer.Argument(help="The run compared with it (B).")],
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples for the interval of the average difference.")] = 10_000,
    html: Annotated[Path | None, typer.Option("--html", help="Also write this HTML page: both runs side by side, label shift, flipped tasks.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Compare two evaluation runs task by task: exact McNemar tests and a bootstrap interval."""
    result = compare_runs(_comparable_records(run_a, run_b, "a"), _comparable_records(run_b, run_a, "b"), resamples=resamples)
    if not result.overall.pairs:
        raise SealError(f"{run_a} and {run_b} share no episode (task and sample); nothing to compare.")
    if as_json:
        _print_json(_comparison_json(run_a, run_b, result))
    else:
        _print_comparison(run_a, run_b, result)
    if html is not None:
        from seal_rl.report import write_compare_report

        target = write_compare_report(run_a, run_b, html, resamples=resamples)
        (err if as_json else out).print(f"report: {target} ({target.stat().st_size / 2**20:.1f} MiB)")


def _comparable_records(run: Path, other: Path, side: str) -> list[dict]:
    """A run's records for :func:`compare_runs`; OOD runs (τ², memory) paired by task and trial, and
    only with a run of the same benchmark."""
    from seal_rl.ood.profile import comparable, ood_benchmark

    mine, theirs = ood_benchmark(run), ood_benchmark(other)
    if mine != theirs:
        raise SealError(f"{run} is a {mine or 'BFCL multi-turn'} run and {other} a {theirs or 'BFCL multi-turn'} run; "
                        "compare runs of the same benchmark.")  # fmt: skip
    if mine is None:
        return read_results(run)
    from seal_rl import jsonl

    if not (run / "results.jsonl").exists():
        raise SealError(f"No results.jsonl in {run}; run `seal eval --benchmark {mine} --out {run}` first.")
    return comparable(jsonl.read(run / "results.jsonl").values, mine)


def _comparison_json(run_a: Path, run_b: Path, result) -> dict:
    from dataclasses import asdict

    row = lambda c: {**asdict(c), "difference": c.difference}  # noqa: E731
    estimate, low, high = result.average_difference
    return {"a": str(run_a), "b": str(run_b), "categories": {k: row(v) for k, v in result.categories.items()},
            "overall": row(result.overall), "average_difference": {"estimate": estimate, "ci95": [low, high]},
            "only_in_a": result.only_in_a, "only_in_b": result.only_in_b}  # fmt: skip


def _print_comparison(run_a: Path, run_b: Path, result) -> None:
    table = Table("category", "pairs", "A", "B", "B − A", "only A", "only B", "McNemar p",
                  title=f"B = {run_b}  vs  A = {run_a}")  # fmt: skip
    for name, row in [*result.categories.items(), ("all (pooled)", result.overall)]:
        table.add_row(name, str(row.pairs), f"{row.rate_a:.1%}", f"{row.rate_b:.1%}", f"{row.difference:+.1%}",
                      str(row.only_a), str(row.only_b), f"{row.p_value:.3g}")  # fmt: skip
    out.print(table)
    estimate, low, high = result.average_difference
    out.print(f"average of category rates, B − A: {estimate:+.1%} (95% paired bootstrap: {low:+.1%} to {high:+.1%})")
    if result.only_in_a or result.only_in_b:
        out.print(f"not paired: {result.only_in_a} episodes only in A, {result.only_in_b} only in B (left out)")


def _diagnosis_records(run_dir: Path, round_: int | None, last: int | None) -> tuple[list[dict], str]:
    """The episodes of an evaluation run (``results.jsonl``) or of a training run's rounds
    (``trajectories.jsonl``: all, ``--round N`` or ``--last N``), and what they are."""
    if (run_dir / "results.jsonl").exists():
        if round_ is not None or last is not None:
            raise SealError(f"{run_dir} is an evaluation run; --round and --last select rounds of a training run.")
        return read_results(run_dir), "evaluation run"
    path = run_dir / "trajectories.jsonl"
    if not path.exists():
        if not run_dir.is_dir():
            raise SealError(f"No run directory {run_dir}; give a directory written by `seal eval` or `seal train`.")
        raise SealError(f"{run_dir} holds neither results.jsonl (a `seal eval` run) nor trajectories.jsonl (a `seal train` run).")
    from seal_rl import jsonl

    lines = jsonl.read(path)
    for problem in lines.problems:
        warnings.warn(problem, SealWarning, stacklevel=2)
    rows = [r for r in lines.values if isinstance(r, dict) and not r.get("dropped") and "verdict" in r]
    rounds = sorted({r["round"] for r in rows})
    if round_ is not None:
        if round_ not in rounds:
            raise SealError(f"{run_dir} has no round {round_}; it has rounds {rounds[0]}–{rounds[-1]}." if rounds else f"{run_dir} has no rounds yet.")
        wanted, what = {round_}, f"training round {round_}"
    elif last is not None:
        if last < 1:
            raise SealError(f"--last must be at least 1, got {last}.")
        wanted = set(rounds[-last:])
        what = (f"training round {rounds[-1]}" if len(wanted) == 1 else
                f"the last {len(wanted)} training rounds ({min(wanted)}–{max(wanted)})" if wanted else "no rounds")  # fmt: skip
    else:
        wanted, what = set(rounds), f"all {len(rounds)} training rounds"
    selected = [r for r in rows if r["round"] in wanted]
    if not selected:
        raise SealError(f"{run_dir} has no training episodes to diagnose yet.")
    return selected, what


def diagnose_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by `seal eval` or `seal train`.")],
    top: Annotated[int, typer.Option(help="Commonest error messages shown per label.")] = 3,
    priority: Annotated[str | None, typer.Option(help="Re-diagnose under this label priority: seal or paper (default: the labels stored in the run).")] = None,
    round_: Annotated[int | None, typer.Option("--round", help="Training runs: only this round.")] = None,
    last: Annotated[int | None, typer.Option("--last", help="Training runs: only the last N rounds.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Print the failure profile of a run: labels overall, per category and per turn position."""
    from seal_rl.diagnose import PRIORITIES

    if priority is not None and priority not in PRIORITIES:
        raise SealError(f"--priority must be one of {', '.join(sorted(PRIORITIES))}, got {priority!r}.")
    if round_ is not None and last is not None:
        raise SealError("Give --round or --last, not both.")
    from seal_rl.ood.profile import ood_benchmark

    benchmark = ood_benchmark(run_dir)
    if benchmark is not None:
        if priority is not None or round_ is not None or last is not None:
            raise SealError("--priority, --round and --last apply to BFCL multi-turn and training runs, not to OOD runs.")
        return _print_ood_profile(run_dir, benchmark, top, as_json)
    records, what = _diagnosis_records(run_dir, round_, last)
    run = describe_run(records, top=top, priority=priority)
    profile = run.profile
    stats = profile.label_stats()
    total = sum(s.turns for s in stats.values())
    labels = [name for name in LABELS if name in stats]
    inherited = profile.merged("inherited")
    if as_json:
        return _print_json({
            "run": str(run_dir), "episodes_from": what, "episodes": profile.episodes, "turns": total,
            "labels": {label: {"turns": stats[label].turns, "share": stats[label].turns / total,
                               "rate": None if label in EXCLUDED_LABELS else stats[label].prevalence,
                               "episodes": stats[label].trajectories, "mean_reward": stats[label].mean_reward,
                               "inherited": inherited.get(label, 0)} for label in labels},
            "categories": profile.merged("categories"), "positions": profile.merged("positions"),
            "top_evidence": {label: [{"message": m, "count": c} for m, c in run.top_messages.get(label, [])] for label in labels},
        })  # fmt: skip
    out.print(f"Failure profile of {run_dir} ({what})", markup=False, highlight=False, soft_wrap=True)
    overall = Table(Column("label", no_wrap=True, min_width=max(map(len, labels), default=5)), "turns", "share", "rate*",
                    "episodes", "mean reward", "inherited**",
                    title=f"{profile.episodes} episodes, {total} turns")  # fmt: skip
    for label in labels:
        s = stats[label]
        rate = "-" if label in EXCLUDED_LABELS else f"{s.prevalence:.1%}"
        overall.add_row(label, str(s.turns), f"{s.turns / total:.1%}", rate, str(s.trajectories), f"{s.mean_reward:.2f}",
                        str(inherited.get(label, 0)))  # fmt: skip
    out.print(overall)
    out.print("* rate: share of countable turns (not_reached, gt_error and checker_error left out); "
              "mean reward: of the episodes with the label", soft_wrap=True)  # fmt: skip
    out.print("** turns failed only by a difference carried over from an earlier failed turn (their own calls were "
              "right); not counted in turns, shares or rates", soft_wrap=True)  # fmt: skip
    _print_label_matrix("Share of each category's turns", labels, profile.merged("categories"))
    positions = {f"turn {k}": v for k, v in profile.merged("positions").items()}
    _print_label_matrix("Share of each turn position's turns", labels, positions)
    out.print("[bold]Commonest evidence[/]")
    for label in labels:
        for message, count in run.top_messages.get(label, []):
            out.print(f"  {label}: {message} ({count})", markup=False, highlight=False, soft_wrap=True)


def _print_ood_profile(run_dir: Path, benchmark: str, top: int, as_json: bool) -> None:
    """``seal diagnose`` on a τ² or BFCL memory run (:mod:`seal_rl.ood.profile`)."""
    from seal_rl import jsonl
    from seal_rl.ood.profile import ood_profile

    if not (run_dir / "results.jsonl").exists():
        raise SealError(f"No results.jsonl in {run_dir}; run `seal eval --benchmark {benchmark} --out {run_dir}` first.")
    profile = ood_profile(jsonl.read(run_dir / "results.jsonl").values, benchmark, top=top)
    if as_json:
        return _print_json({"run": str(run_dir), **profile})
    unit = "questions" if benchmark == "bfcl-memory" else "conversations"
    total = sum(profile["labels"].values()) or 1
    checked = "one final answer per question" if benchmark == "bfcl-memory" else "gold actions and communicate_info strings"
    table = Table("label", "checks", "share", title=f"{benchmark}: {profile['episodes']} {unit}, {sum(profile['labels'].values())} checks ({checked})")
    for label, count in profile["labels"].items():
        table.add_row(label, str(count), f"{count / total:.1%}")
    out.print(f"Failure profile of {run_dir} (docs/concepts/diagnosis.md, OOD runs)", markup=False, highlight=False, soft_wrap=True)
    out.print(table)
    out.print("calls: " + ", ".join(f"{kind} {n}" for kind, n in profile["calls"].items()), soft_wrap=True)
    out.print("endings: " + ", ".join(f"{reason} {n}" for reason, n in profile["endings"].items()), soft_wrap=True)
    for label, items in profile["top_evidence"].items():
        for message, count in items:
            out.print(f"  {label}: {message} ({count})", markup=False, highlight=False, soft_wrap=True)


def _print_label_matrix(title: str, labels: list[str], columns: dict[str, dict[str, int]]) -> None:
    table = Table("label", *columns, title=title, box=None)
    totals = {name: sum(counts.values()) or 1 for name, counts in columns.items()}
    for label in labels:
        cells = [f"{counts[label] / totals[name]:.0%}" if counts.get(label) else "." for name, counts in columns.items()]
        table.add_row(label, *cells)
    out.print(table)


def family_eval(spec: str, settings_given: list[str], chosen: Any, *, out_dir: Path, split: str | None, category: list[str] | None,
                tasks: str | None, call_format: str, prompt_mode: str, protocol: str, max_model_calls: int, samples: int,
                settings: ModelSettings, overwrite: bool) -> None:  # fmt: skip
    """``seal eval --family``: the family's tasks played through the episodes training plays (the seal
    protocol, the base interface), resumable, with the same summary as BFCL's."""
    from seal_rl.environments import load_family

    family = load_family(spec, **family_settings(settings_given))
    try:
        _family_eval(family, chosen, out_dir=out_dir, split=split, category=category, tasks=tasks, call_format=call_format,
                     prompt_mode=prompt_mode, protocol=protocol, max_model_calls=max_model_calls, samples=samples,
                     settings=settings, overwrite=overwrite)  # fmt: skip
    finally:
        getattr(family, "close", lambda: None)()  # a simulated user's model


def _family_eval(family: Any, chosen: Any, *, out_dir: Path, split: str | None, category: list[str] | None, tasks: str | None,
                 call_format: str, prompt_mode: str, protocol: str, max_model_calls: int, samples: int, settings: ModelSettings,
                 overwrite: bool) -> None:  # fmt: skip
    from seal_rl.environments import oracle_messages
    from seal_rl.policies import Episode, OraclePolicy, ScriptedAgent
    from seal_rl.protocol import check_protocol

    if hasattr(family, "check_user"):  # a simulated user answers (or loads) before anything is played
        family.check_user()
    check_protocol(protocol)  # a family plays the seal protocol whatever the default says
    if isinstance(chosen, BfclResultPolicy) or (isinstance(chosen, OraclePolicy) and chosen != OraclePolicy()):
        raise SealError(f"--policy {chosen.name}: family {family.name} plays oracle, replay:, hf:, vllm: or openai: policies "
                        "(the oracle without faults).")  # fmt: skip
    if AUTO in (call_format, prompt_mode):
        picked, note = resolve_auto({"prompt_mode": prompt_mode, "call_format": call_format}, _tokenizer_of(chosen))
        prompt_mode, call_format = picked["prompt_mode"], picked["call_format"]
        err.print(note, markup=False, highlight=False, soft_wrap=True)
    env_config = EnvConfig(protocol="seal", call_format=call_format, prompt_mode=prompt_mode, max_model_calls=max_model_calls)
    task_set = family.task_set()
    ids = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    selected = task_set.select(split or "test", category, ids) if chosen.selects_tasks else []
    if chosen.selects_tasks and not selected:
        raise SealError(f"No task of family {family.name} matches that selection (split {split or 'test'}).")
    if isinstance(chosen, OraclePolicy):
        played = [Episode(i, t, ScriptedAgent(oracle_messages(family, t, call_format))) for i, t in enumerate(selected, 1)]
    else:
        played = chosen.episodes(selected, task_set, call_format)
    episodes = with_samples(played, samples)
    with run_progress("eval", "success", len(episodes)) as update:
        counts = {"done": 0, "ok": 0}

        def advance(record: dict) -> None:
            counts["done"] += 1
            counts["ok"] += record.get("reward") == 1.0
            update(rate=f"{counts['ok'] / counts['done']:.1%}", errors=0)

        def resumed(done: list[dict]) -> None:
            err.print(f"resuming {out_dir}: {len(done)} of {len(episodes)} episodes already done", soft_wrap=True)
            for record in done:
                advance(record)

        summary = evaluate(episodes, env_config, out_dir, policy=chosen, settings=settings, overwrite=overwrite, on_episode=advance,
                           on_resume=resumed, split=(split or "test") if not tasks else None, family=family)  # fmt: skip
    _print_summary(summary, out_dir)


def _print_summary(summary: dict, out_dir: Path) -> None:
    scope = f"{summary.get('protocol', 'seal')} protocol, {summary.get('tasks', '?')} tasks"
    if summary.get("split"):
        scope += f" of the {summary['split']} split"
    table = Table("category", "episodes", "success", "rate", "95% CI",
                  title=f"{summary.get('family', 'BFCL multi-turn')} — {summary['policy']}", caption=scope)  # fmt: skip
    for name, row in summary["categories"].items():
        low, high = row["ci95"]
        errors = f" (+{row['errors']} errors)" if row.get("errors") else ""
        table.add_row(name, f"{row['episodes']}{errors}", str(row["successes"]), f"{row['success_rate']:.1%}", f"{low:.1%}–{high:.1%}")
    low, high = summary["average_ci95"]
    table.add_row("[bold]average[/]", str(summary["episodes"]), str(summary["successes"]),
                  f"[bold]{summary['average']:.1%}[/]", f"{low:.1%}–{high:.1%}")  # fmt: skip
    out.print(table)
    if summary.get("pass_at_k"):
        k_table = Table("category", *(f"pass@{k}" for k in summary["pass_at_k"]), title=f"pass@k over {summary['samples_per_task']} samples per task")
        for category in summary["categories"]:
            k_table.add_row(category, *(f"{summary['pass_at_k'][k].get(category, 0.0):.1%}" for k in summary["pass_at_k"]))
        out.print(k_table)
    if summary.get("errors"):
        err.print(f"[red]{summary['errors']} episodes ended in generation errors[/] (left out of the rates; see 'error' in results.jsonl)")
    out.print(f"results: {out_dir / 'results.jsonl'}  summary: {out_dir / 'summary.json'}")


def _tokenizer_of(policy: Any) -> Any:
    """The tokenizer of a model policy (hf:, vllm:), for ``auto``; None for other policies."""
    return load_tokenizer(str(policy.path)) if isinstance(policy, (ModelPolicy, VLLMPolicy)) else None
