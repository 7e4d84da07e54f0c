"""`seal eval --policy bfcl-result:` against the official evaluation, at scale; and what the
protocol choice does to the faulty oracle.

1. Parity: BFCL result files (FC, ``<tool_call>`` and pythonic prompting shapes) written from
   perturbed ground truth, the faulty oracle and hostile steps (:mod:`seal_rl.parity`), for every
   task and ``--seeds`` seeds (default 3: 7,200 entries, ~6,900 scored); each is replayed by
   ``seal eval`` and judged by the official ``_evaluate_single_multi_turn_entry`` (restated).
   Prints agreement per category and decoder; exits 1 on any disagreement.
2. Protocols: the faulty oracle (``oracle:faults=0.3``) on all 800 tasks under ``seal`` and
   ``bfcl``: success, and for each protocol difference how many episodes it touched and how many
   outcomes changed there.

Usage: python benchmarks/bfcl_parity.py [--seeds 3] [--out runs/bench-parity]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table


from seal_rl.env import EnvConfig
from seal_rl.evaluate import evaluate
from seal_rl.parity import DECODERS, json_line, official_verdict, result_entries
from seal_rl.policies import parse_policy
from seal_rl.tasks import CATEGORIES, TaskSet

from harness import provenance_console


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text(encoding="utf-8").split("\n") if line]


def parity(task_set: TaskSet, seeds: int, out: Path, console: Console) -> bool:
    agree: Counter = Counter()
    total: Counter = Counter()
    valid: Counter = Counter()
    errors = 0
    started = time.perf_counter()
    for decoder in DECODERS:
        for seed in range(seeds):
            folder = out / f"{decoder}-{seed}"
            entries = result_entries(list(task_set), decoder, seed)
            by_category: dict[str, list] = {}
            for entry in entries:
                by_category.setdefault(task_set.get(entry["id"]).category, []).append(entry)
            (folder / "result").mkdir(parents=True)
            for category, lines in by_category.items():
                (folder / "result" / f"BFCL_v4_multi_turn_{category}_result.json").write_text("".join(map(json_line, lines)))
            policy = parse_policy(f"bfcl-result:{folder / 'result'}#{decoder}")
            call_format = policy.call_format()
            env = EnvConfig(protocol="bfcl", call_format=call_format,
                            prompt_mode="bfcl_qwen_fc" if call_format == "hermes" else "chat_template")  # fmt: skip
            evaluate(policy.episodes([], task_set, call_format), env, folder / "run", policy=policy)
            ours = {r["task_id"]: r for r in _records(folder / "run")}
            for entry in entries:
                if isinstance(entry["result"], str):
                    errors += 1
                    continue
                task = task_set.get(entry["id"])
                official = official_verdict(task, entry["result"], decoder)["valid"]
                key = (task.category, decoder)
                total[key] += 1
                valid[key] += official
                agreed = official == (ours[task.id]["reward"] == 1.0)
                agree[key] += agreed
                if not agreed:
                    console.print(f"[red]disagree[/] {decoder} seed {seed} {task.id}: official {official}, seal {ours[task.id]['reward']}")
    table = Table("category", *(f"{d} agree" for d in DECODERS), "entries", "officially valid", "agreement",
                  title=f"seal eval --policy bfcl-result: vs the official evaluation ({seeds} seeds)")  # fmt: skip
    for category in CATEGORIES:
        keys = [(category, d) for d in DECODERS]
        n, a, v = (sum(c[k] for k in keys) for c in (total, agree, valid))
        table.add_row(category, *(f"{agree[k]}/{total[k]}" for k in keys), str(n), str(v), f"{a / n:.2%}")
    n, a, v = sum(total.values()), sum(agree.values()), sum(valid.values())
    table.add_row("[bold]all[/]", *(f"{sum(agree[(c, d)] for c in CATEGORIES)}/{sum(total[(c, d)] for c in CATEGORIES)}" for d in DECODERS),
                  str(n), str(v), f"[bold]{a / n:.2%}[/]")  # fmt: skip
    console.print(table)
    console.print(f"{errors} inference-error entries (generation errors, outside the rates); {time.perf_counter() - started:.0f} s")
    return a == n


def protocols(task_set: TaskSet, out: Path, console: Console) -> None:
    runs = {}
    for protocol in ("seal", "bfcl"):
        policy = parse_policy("oracle:faults=0.3,seed=0")
        episodes = policy.episodes(list(task_set), task_set, "hermes")
        summary = evaluate(episodes, EnvConfig(protocol=protocol), out / f"oracle-{protocol}", policy=policy)
        runs[protocol] = ({r["task_id"]: r for r in _records(out / f"oracle-{protocol}")}, summary)
    seal, bfcl = runs["seal"][0], runs["bfcl"][0]
    touched = {
        "undecodable message: [ERROR] observation, turn goes on (seal) / turn ends silently (bfcl)":
            lambda r: any(e["error_kind"] == "parse" for e in r["trace"]),
        "call to a tool not offered now: rejected (seal) / executed by name (bfcl)":
            lambda r: any(e["error_kind"] == "unknown_tool" for e in r["trace"]),
        "step limit: 20 messages per episode (seal) / 21 executing steps per turn (bfcl)":
            lambda r: r["end_reason"] == "max_model_calls",
    }  # fmt: skip
    table = Table("difference", "episodes touched", "outcome differs", "seal success there", "bfcl success there",
                  title="The faulty oracle (faults=0.3, seed 0, 800 tasks) under both protocols")  # fmt: skip
    for name, fired in touched.items():
        ids = [t for t, r in seal.items() if fired(r)]
        differs = sum(seal[t]["reward"] != bfcl[t]["reward"] for t in ids)
        table.add_row(name, str(len(ids)), str(differs), str(sum(seal[t]["reward"] == 1.0 for t in ids)),
                      str(sum(bfcl[t]["reward"] == 1.0 for t in ids)))  # fmt: skip
    table.add_row("miss_func reveal text (repr + sentence vs JSON lines)", "200 prompts", "0 (scripted)", "-", "-")
    console.print(table)
    for protocol, (_, summary) in runs.items():
        console.print(f"{protocol}: average {summary['average']:.1%}, overall {summary['overall']:.1%} over {summary['episodes']} episodes")
    flips = sum(seal[t]["reward"] != bfcl[t]["reward"] for t in seal)
    console.print(f"outcomes that differ between the protocols: {flips} of {len(seal)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-parity"))
    args = parser.parse_args()
    console = provenance_console(width=150)
    shutil.rmtree(args.out, ignore_errors=True)
    task_set = TaskSet.load()
    ok = parity(task_set, args.seeds, args.out, console)
    protocols(task_set, args.out, console)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
