"""The real-model baseline (docs/guides/real-models.md): the pulled models on 20 fixed test tasks.

Each model is evaluated with ``seal eval`` (greedy, strict, the ``bfcl`` protocol) in every prompt
mode its chat template supports: Qwen2.5-Coder in ``bfcl_qwen_fc`` and ``chat_template`` (its
template renders tools), SmolLM2 in ``bfcl_qwen_fc`` only (its template ignores ``tools``, so in
``chat_template`` mode the model would never see a tool). The tasks are the first five of the
test split in each category, in BFCL order. Runs go to ``runs/real-eval/MODEL--MODE`` and resume
when interrupted (re-run the same command). The table gives success with its 95% Wilson interval,
user turns reached, the top failure labels, seconds per task and what the model wrote.

Usage: python benchmarks/real_eval.py [--max-new-tokens 256] [--per-category 5] [--out runs/real-eval]
(``make real-eval``; the models must be pulled: ``make models``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from rich.table import Table

from seal_rl.diagnose import diagnose
from seal_rl.models import pulled_path
from seal_rl.stats import wilson
from seal_rl.tasks import CATEGORIES, TaskSet

from harness import provenance_console, resumed_seconds

RUNS = [("qwen2.5-coder-0.5b-instruct", "bfcl_qwen_fc"), ("qwen2.5-coder-0.5b-instruct", "chat_template"),
        ("smollm2-135m-instruct", "bfcl_qwen_fc")]  # fmt: skip
EXCLUDED = {"pass", "correct_abstention", "not_reached"}


def fixed_tasks(per_category: int) -> list[str]:
    """The first ``per_category`` test-split tasks of each category, in BFCL order."""
    task_set = TaskSet.load()
    return [t.id for category in CATEGORIES for t in task_set.select("test", [category])[:per_category]]


def behaviour(text: str) -> str:
    """What one model message looks like, by its syntax (not whether it is right)."""
    if "<tool_call>" in text:
        return "<tool_call> block"
    fenced = re.findall(r"```(\w*)\s*\n?(.*?)```", text, flags=re.S)
    if any('"name"' in body and ("arguments" in body or "parameters" in body) for _, body in fenced):
        return "fenced JSON call"
    if fenced:
        kinds = {lang or "plain" for lang, _ in fenced}
        return "fenced code (" + ", ".join(sorted(kinds)) + ")"
    if re.search(r'^\s*[\[{].*"name"', text, flags=re.S):
        return "bare JSON call"
    if re.search(r"^\s*\[?\w+\(.*\)\]?\s*$", text, flags=re.S):
        return "bare pythonic call"
    return "plain text"


def summarise(run: Path, seconds: float) -> dict:
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text(encoding="utf-8").split("\n") if line.strip()]
    successes = sum(r["reward"] for r in rows)
    labels: Counter[str] = Counter()
    wrote: Counter[str] = Counter()
    for row in rows:
        labels.update(t.label for t in diagnose(row).labels if t.label not in EXCLUDED)  # today's rules, not those stored
        wrote.update(behaviour(m["content"] or "") for m in row["messages"] if m["role"] == "assistant")
    low, high = wilson(int(successes), len(rows))
    return {"episodes": len(rows), "successes": int(successes), "ci95": (low, high),
            "turns": (sum(r["turns_reached"] for r in rows), sum(r["num_turns"] for r in rows)),
            "labels": labels.most_common(3), "wrote": wrote.most_common(3), "seconds_per_task": seconds / max(1, len(rows))}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("runs/real-eval"))
    parser.add_argument("--only", default="", help="run only models whose name contains this")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "auto"),
                        help="seal eval --dtype: bfloat16 (default) is the published baseline's, on any CPU; auto "
                             "is float32 on a CPU without AMX-BF16 / AVX512-BF16 (faster there, other ties)")
    args = parser.parse_args()
    tasks = fixed_tasks(args.per_category)
    console = provenance_console()
    console.print("tasks: " + ", ".join(tasks), highlight=False, soft_wrap=True)
    table = Table("model", "prompt mode", "success", "95% CI", "turns reached", "top labels", "s / task", "wrote (messages)",
                  title=f"Real models, bfcl protocol, greedy, {len(tasks)} test tasks, max {args.max_new_tokens} new tokens")  # fmt: skip
    for model, mode in RUNS:
        if args.only not in model:
            continue
        if pulled_path(model) is None:
            console.print(f"[yellow]skipped {model}: run `seal models pull {model}`[/]")
            continue
        run = args.out / f"{model}--{mode}"
        started = time.perf_counter()
        command = [sys.executable, "-m", "seal_rl", "eval", "--policy", f"hf:{model}", "--split", "test", "--tasks", ",".join(tasks),
                   "--prompt-mode", mode, "--max-new-tokens", str(args.max_new_tokens), "--dtype", args.dtype, "--out", str(run)]  # fmt: skip
        done = subprocess.run(command)
        if done.returncode not in (0, 1):  # 1: every episode a generation error (reported in the table)
            return done.returncode
        s = summarise(run, resumed_seconds(run / "seconds.json", time.perf_counter() - started, floor=5))
        table.add_row(model, mode, f"{s['successes']}/{s['episodes']}", f"{s['ci95'][0]:.0%}–{s['ci95'][1]:.0%}",
                      f"{s['turns'][0]}/{s['turns'][1]}", ", ".join(f"{k} {v}" for k, v in s["labels"]) or "—",
                      f"{s['seconds_per_task']:.0f}", ", ".join(f"{k} {v}" for k, v in s["wrote"]))  # fmt: skip
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
