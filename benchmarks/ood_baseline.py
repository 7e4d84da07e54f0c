"""The OOD baseline on this machine (docs/guides/ood.md, issue 58): the pulled models on τ²-bench and BFCL V4 memory.

Each pulled model plays the agent on a fixed subset: the first ``--per-domain`` test tasks of each τ²
domain (τ²'s own ``test`` split, in its order; one trial, τ²'s run seed), with Qwen2.5-Coder-0.5B as τ²'s
user simulator (the strongest model the package index ships), and every ``--memory-scenario``
question of BFCL V4 memory on the ``kv`` backend (its prerequisite conversations first). Everything is
``seal eval`` — τ²'s own orchestrator and evaluator, bfcl-eval's own memory backend and checker —
greedy, ``--dtype auto``, the hermes format in ``bfcl_qwen_fc`` mode. Conversations are capped at
``--max-steps`` orchestrator steps (τ²'s default is 200: these models never end a conversation, so the
cap only saves time; a conversation that reaches it scores 0, as at 200).

Runs go to ``--out/MODEL--BENCHMARK`` and resume when interrupted (re-run the same command). The
table (printed, and as Markdown in ``--out/table.md``) gives the score with its 95% Wilson interval, how conversations ended, the failure profile's
top labels (docs/concepts/diagnosis.md, "OOD runs") and the wall time per conversation, beside the paper's
figures (Qwen2.5-7B-Instruct on 8 GPUs, not comparable in scale: the reference for what a run is
for).

Usage: python benchmarks/ood_baseline.py [--per-domain 4] [--memory-scenario notetaker] [--max-steps 30]
       [--max-new-tokens 128] [--concurrency 4] [--only MODEL] [--benchmarks B,...] [--out runs/ood-baseline]
       [--table-only]
(``make ood-baseline``; the models must be pulled: ``make models``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from seal_rl.models import pulled_path
from seal_rl.ood.profile import ood_profile
from seal_rl.stats import wilson

from harness import provenance_console, resumed_seconds

AGENTS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")
USER = "qwen2.5-coder-0.5b-instruct"
TAU2 = ("tau2-airline", "tau2-retail", "tau2-telecom")
PAPER = {"tau2": "16.11 → 20.79 (retail, airline, telecom)", "bfcl-memory": "9.17 → 12.71 (web search + memory)"}
"""SEAL Table 2, Qwen2.5-7B-Instruct: vanilla GRPO → SEAL, single seed (docs/guides/ood.md)"""


def tau2_tasks(domain: str, per_domain: int) -> list[str]:
    """The first ``per_domain`` task ids of τ²'s test split of ``domain``, in τ²'s order."""
    from seal_rl.environments.tau2_bench import load_tasks, load_tau2

    return [task.id for task in load_tasks(load_tau2(), domain, "test", None)[:per_domain]]


def command(agent: str, benchmark: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The ``seal eval`` command of one cell of the table."""
    base = [sys.executable, "-m", "seal_rl", "eval", "--benchmark", benchmark, "--policy", f"hf:{agent}",
            "--max-new-tokens", str(args.max_new_tokens), "--concurrency", str(args.concurrency), "--out", str(out)]  # fmt: skip
    if benchmark == "bfcl-memory":
        return [*base, "--category", "kv", "--split", args.memory_scenario]
    tasks = tau2_tasks(benchmark.removeprefix("tau2-"), args.per_domain)
    return [*base, "--user", f"hf:{USER}", "--tasks", ",".join(tasks), "--max-steps", str(args.max_steps)]


def summarise(run: Path, benchmark: str, seconds: float) -> dict:
    """One row: the score, its interval, the endings and the top failure labels of ``run``."""
    records = [json.loads(line) for line in (run / "results.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    scored = [r for r in records if not r.get("prereq") and not r.get("error")]
    if benchmark == "bfcl-memory":
        wins = sum(r["reward"] == 1.0 for r in scored)
    else:
        wins = sum(bool(r.get("success")) for r in scored)
    low, high = wilson(wins, len(scored))
    profile = ood_profile(records, benchmark)
    return {"wins": wins, "n": len(scored), "ci": (low, high), "endings": profile["endings"], "profile": profile,
            "seconds_per_conversation": seconds / max(1, len(records))}  # fmt: skip


def call_problems(profile: dict) -> str:
    calls = profile.get("calls") or {}
    return ", ".join(f"{kind} {count}" for kind, count in calls.items() if count) or "none"


def labels(profile: dict) -> str:
    top = [(label, count) for label, count in (profile.get("labels") or {}).items() if label != "pass" and count]
    return ", ".join(f"{label} {count}" for label, count in sorted(top, key=lambda x: -x[1])[:3]) or "—"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-domain", type=int, default=4)
    parser.add_argument("--memory-scenario", default="notetaker")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--only", default="", help="run only agents whose name contains this")
    parser.add_argument("--benchmarks", default=",".join((*TAU2, "bfcl-memory")))
    parser.add_argument("--out", type=Path, default=Path("runs/ood-baseline"))
    parser.add_argument("--table-only", action="store_true", help="print the table of the runs so far; play nothing")
    args = parser.parse_args()
    console = provenance_console(width=max(160, Console().width))
    missing = [m for m in {*AGENTS, USER} if pulled_path(m) is None]
    if missing:
        console.print(f"[yellow]not pulled: {', '.join(missing)} (run `make models`); nothing measured[/]")
        return 0
    rows: list[tuple[str, ...]] = []
    table = Table("agent", "benchmark", "score", "95% CI", "endings", "top failure labels", "call problems", "s / conversation", "paper (7B)",
                  title=f"OOD baseline: τ² first {args.per_domain} test tasks per domain (user {USER}, max {args.max_steps} steps), "
                        f"BFCL V4 memory kv '{args.memory_scenario}'; greedy, max {args.max_new_tokens} new tokens")  # fmt: skip
    for agent in AGENTS:
        if args.only not in agent:
            continue
        for benchmark in args.benchmarks.split(","):
            run = args.out / f"{agent}--{benchmark}"
            timing = run / "seconds.json"
            if args.table_only and not (run / "summary.json").exists():
                continue
            started = time.perf_counter()
            if not args.table_only:
                done = subprocess.run(command(agent, benchmark, args, run))
                if done.returncode not in (0, 1):  # 1: every conversation a generation error (in the table)
                    return done.returncode
            s = summarise(run, benchmark, resumed_seconds(timing, time.perf_counter() - started, floor=30))
            endings = ", ".join(f"{k} {v}" for k, v in sorted(s["endings"].items(), key=lambda x: -x[1])) or "—"
            paper = PAPER["bfcl-memory" if benchmark == "bfcl-memory" else "tau2"]
            rows.append((agent, benchmark, f"{s['wins']}/{s['n']}", f"{s['ci'][0]:.0%}–{s['ci'][1]:.0%}", endings, labels(s["profile"]),
                         call_problems(s["profile"]), f"{s['seconds_per_conversation']:.0f}", paper))  # fmt: skip
            table.add_row(*rows[-1])
    console.print(table)
    columns = [str(c.header) for c in table.columns]
    markdown = [f"| {' | '.join(columns)} |", f"|{'---|' * len(columns)}", *(f"| {' | '.join(row)} |" for row in rows)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text("\n".join(markdown) + "\n", encoding="utf-8")
    console.print(f"table: {args.out / 'table.md'}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
