"""How the GPU check reads each check's figures once its process has exited, and the one line of the
closing table that sums them up (:mod:`seal_rl.doctor.gpu_check`).

A reader returns ``(passed, figures, why not)``, given the mode (``cpu``), the scratch folder the
check wrote to and its finished process."""

from __future__ import annotations

import json
import math
import subprocess
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path
from typing import Any

Reader = Callable[[bool, Path, subprocess.CompletedProcess], tuple[bool, dict[str, Any], str | None]]
"""(passed, figures, why not), read after the check's process exited"""


def records(path: Path) -> list[dict[str, Any]]:
    """The objects of a run's JSON-lines file (none when it was never written; a torn last line left out)."""
    from seal_rl.jsonl import read

    return [r for r in read(path).values if isinstance(r, dict)] if path.exists() else []


def tail(text: str, chars: int = 3000) -> str:
    """The end of a check's output, as its error quotes it."""
    return text[-chars:]


def child_figures(name: str) -> Reader:
    """Figures a child check wrote as ``work/NAME.json``."""

    def figures(cpu: bool, work: Path, done: subprocess.CompletedProcess) -> tuple[bool, dict, str | None]:
        path = work / f"{name}.json"
        if done.returncode != 0 or not path.exists():
            return False, {}, f"exit status {done.returncode}"
        result = json.loads(path.read_text())
        return result.pop("passed"), result, result.pop("why_not", None)

    return figures


def pytest_figures(dtype: str) -> Reader:
    """Outcomes per test from pytest's JUnit report."""

    def figures(cpu: bool, work: Path, done: subprocess.CompletedProcess) -> tuple[bool, dict, str | None]:
        report = work / f"prefix_tree_{dtype}.xml"
        if not report.exists():
            return False, {}, f"pytest wrote no report (exit status {done.returncode})"
        cases = ElementTree.parse(report).getroot().iter("testcase")
        outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
        for case in cases:
            kind = "failed" if case.find("failure") is not None or case.find("error") is not None else (
                "skipped" if case.find("skipped") is not None else "passed")  # fmt: skip
            outcome[kind].append(case.get("name", "?"))
        found = {"device": "cpu" if cpu else "cuda", "dtype": dtype, "tests": sum(map(len, outcome.values())),
                 **{k: len(v) for k, v in outcome.items()},
                 "failed_tests": outcome["failed"], "skipped_tests": outcome["skipped"]}  # fmt: skip
        passed = done.returncode == 0 and not outcome["failed"] and bool(outcome["passed"])
        return passed, found, None if passed else f"pytest exit status {done.returncode}, {len(outcome['failed'])} failed"

    return figures


def train_figures(cpu: bool, work: Path, done: subprocess.CompletedProcess) -> tuple[bool, dict, str | None]:
    """The round's log lines and advantages, read from the run directory."""
    run = work / "train"
    said = [line for line in done.stdout.splitlines() if line.startswith(("memory (seal plan", "grpo.bf16"))]  # the device
    found: dict[str, Any] = {"exit_status": done.returncode, "said": said}
    lines = records(run / "metrics.jsonl")
    rollout = [m for m in lines if m.get("kind", "rollout") == "rollout"]
    update = [m for m in lines if m.get("kind") == "update"]
    trainer = [m for m in lines if m.get("kind") == "trainer" and "loss" in m]
    if rollout:  # its scalars and where the round's time went (labels and the interface stay in the run's own log)
        found["rollout"] = {k: v for k, v in rollout[-1].items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        found["rollout"]["time/seconds"] = rollout[-1].get("time/seconds")
    if update:
        found["update"] = update[-1]
    if trainer:
        found["trainer"] = {k: v for k, v in trainer[-1].items() if isinstance(v, (int, float, str))}
    episodes = records(run / "trajectories.jsonl")
    found["rewards"] = [e.get("reward") for e in episodes]
    found["advantages_before"] = [e.get("advantage_before") for e in episodes]
    found["advantages_after"] = [e.get("advantage_after") for e in episodes]
    finite = [a for a in found["advantages_after"] if isinstance(a, (int, float)) and math.isfinite(a)]
    found["nonzero_advantages"] = sum(1 for a in finite if a != 0)
    packed = bool(update) and 0 < update[-1].get("update/policy/forwarded_tokens", 0) < update[-1].get("update/policy/rows_tokens", 0)
    found["packed"] = packed
    why = [f"seal train exit status {done.returncode}"] if done.returncode else []
    why += [] if found["nonzero_advantages"] else ["every advantage is 0"]
    why += [] if len(finite) == len(episodes) else ["an advantage is missing or not finite"]
    why += [] if packed else ["the update packed no shared prefix"]
    return not why, found, "; ".join(why) or None


def summary_environment(f: dict[str, Any]) -> str:
    """The GPU, its CUDA and the main versions."""
    gpu = f.get("gpu") or {}
    device = f"{gpu.get('name')} {gpu.get('memory_gib', 0):.0f} GiB, CUDA {f.get('cuda')}" if gpu else "no GPU"
    v = f.get("versions", {})
    return f"{device}; torch {v.get('torch')}, transformers {v.get('transformers')}, trl {v.get('trl')}"


def summary_prefix(f: dict[str, Any]) -> str:
    """The equivalence tests' outcomes."""
    return f"{f.get('passed', 0)} passed, {f.get('failed', 0)} failed, {f.get('skipped', 0)} skipped of {f.get('tests', 0)}"


def summary_train(f: dict[str, Any]) -> str:
    """The round's advantages, success and how much the update packed."""
    u, r = f.get("update", {}), f.get("rollout", {})
    if not r:
        return f"exit {f.get('exit_status')}, no round logged"
    return (f"exit {f.get('exit_status')}, {f.get('nonzero_advantages', 0)}/{len(f.get('advantages_after', []))} non-zero "
            f"advantages, success {r.get('rollout/reward_mean', float('nan')):.0%}, policy pass "
            f"{u.get('update/policy/forwarded_tokens', 0):,} of {u.get('update/policy/rows_tokens', 0):,} tokens")  # fmt: skip


def summary_update(f: dict[str, Any]) -> str:
    """Each path's throughput and peak memory against the plan, and the paths' largest log-probability gap."""
    parts = []
    for path in ("shared", "trl"):
        p = f.get(path, {})
        if p.get("status") == "ok":
            peak = "" if p.get("peak_gib") is None else f", peak {p['peak_gib']:.1f} GiB (plan {p['plan_update_gib']:.1f})"
            parts.append(f"{path} {p['policy_tokens_per_s']:,.0f} tok/s fwd+bwd{peak}")
        elif p:
            parts.append(f"{path} {p.get('status')}")
    delta = f.get("max_abs_logp_delta")
    return "; ".join(parts) + ("" if delta is None else f"; max |Δ logp| {delta:.2g}")


def summary_generate(f: dict[str, Any]) -> str:
    """Decode throughput against the plan's roofline."""
    if "decode_tokens_per_s" not in f:
        return ""
    return (f"{f['decode_tokens_per_s']:,.0f} decode tok/s ({f['tokens_per_s']:,.0f} with prefill), "
            f"plan {f['plan_tokens_per_s']:,.0f}")


def summary_server(f: dict[str, Any]) -> str:
    """The server's start, the rounds' staleness and the weight sync."""
    if not f.get("ran"):
        return f"not run: {f.get('why', '?')}"
    return (f"server up in {f['server_start_seconds']:.0f} s; staleness {f['staleness']}, dropped {f['dropped']}, "
            f"sync {f['weight_sync_seconds']:.1f} s, round-1 logp gap {f['round1_logp_gap']:.1e}")

