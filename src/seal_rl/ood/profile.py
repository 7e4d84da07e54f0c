"""The failure profile of an OOD run, in SEAL's taxonomy where it maps (docs/concepts/diagnosis.md).

Ψ (:mod:`seal_rl.diagnose`) labels each BFCL user turn from per-turn state checks. The OOD
benchmarks check less, and at other points, so each label here stands for what the benchmark itself
checks, no more:

* **τ²-bench** checks each gold action (``reward_info.action_checks``: called with matching
  arguments or not) and each ``communicate_info`` string (``communicate_checks``), at the end of the
  conversation. One label per gold action: ``pass`` (τ²'s match), ``argument_mismatch`` (a call of that
  tool was made, with other arguments) or ``missing_tool_call`` (never called); one per
  ``communicate_info``: ``pass`` or ``response_mismatch``.
* **BFCL memory** checks one final answer per question. One label per question, first match wins
  as in Ψ: ``pass``; ``invalid_tool_call`` (a message that did not parse, or a call of a tool that
  does not exist); ``argument_mismatch`` (a call that broke its schema or raised an argument error);
  ``missing_tool_call`` (the memory was never consulted); ``recovery_failure`` (a call returned an
  error); ``response_mismatch`` (the answer holds no ground truth, or there was none).

Beside the labels, each run's invalid calls by kind (unparsable, unknown tool, invalid arguments)
and tool errors, counted per call, and how its conversations ended. Neither benchmark checks turn by
turn, so there is no per-turn position and no inherited failure here.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

OOD_LABELS: tuple[str, ...] = ("pass", "invalid_tool_call", "argument_mismatch", "missing_tool_call", "recovery_failure",
                               "response_mismatch")  # fmt: skip
CALL_KINDS: tuple[str, ...] = ("unparsable", "unknown_tool", "invalid_arguments", "tool_error")
_UNKNOWN_BFCL = re.compile(r"^name '.*' is not defined$")
_UNKNOWN_TAU2 = re.compile(r"^Error: Tool '.*' not found\.?$|^Error: Function .* not found in \w+ tools$")
_ARGUMENTS = re.compile(r"unexpected keyword argument|missing \d+ required|validation error|takes \d+ positional|"
                        r"got multiple values for argument")  # fmt: skip


def ood_benchmark(run_dir: Path) -> str | None:
    """The OOD benchmark a run directory's ``config.json`` names (``tau2-retail``, ``bfcl-memory``), or
    None for a BFCL multi-turn run (or no readable config)."""
    try:
        config = json.loads((Path(run_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    benchmark = config.get("benchmark") if isinstance(config, dict) else None
    return benchmark if isinstance(benchmark, str) and benchmark != "bfcl" else None


def _has_parse_error(value: Any) -> bool:
    """Whether seal-rl's adapter recorded a parse error in a τ² message's ``raw_data``."""
    if isinstance(value, Mapping):
        if value.get("parse_error"):
            return True
        return any(_has_parse_error(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_parse_error(v) for v in value)
    return False


def tau2_calls(simulation: Mapping[str, Any]) -> Counter:
    """The agent's invalid calls by kind and its tool errors, from τ²'s trajectory."""
    counts: Counter = Counter()
    for message in simulation.get("messages") or ():
        if message.get("role") == "assistant" and _has_parse_error(message.get("raw_data")):
            counts["unparsable"] += 1
        if message.get("role") == "tool" and message.get("requestor", "assistant") == "assistant" and message.get("error"):
            content = str(message.get("content") or "")
            kind = "unknown_tool" if _UNKNOWN_TAU2.match(content) else "invalid_arguments" if _ARGUMENTS.search(content) else "tool_error"
            counts[kind] += 1
    return counts


def tau2_labels(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One label per gold action and per ``communicate_info`` of a τ² conversation (module docstring)."""
    simulation = record.get("simulation") or {}
    info = simulation.get("reward_info") or {}
    called = {call.get("name") for m in simulation.get("messages") or () if m.get("role") == "assistant"
              for call in m.get("tool_calls") or ()}  # fmt: skip
    labels = []
    for check in info.get("action_checks") or ():
        action = check.get("action") or {}
        if check.get("action_match"):
            label = "pass"
        else:
            label = "argument_mismatch" if action.get("name") in called else "missing_tool_call"
        labels.append({"label": label, "evidence": f"{action.get('name')}({json.dumps(action.get('arguments'), ensure_ascii=False)[:160]})"})
    for check in info.get("communicate_checks") or ():
        labels.append({"label": "pass" if check.get("met") else "response_mismatch", "evidence": str(check.get("info"))[:160]})
    return labels


def memory_label(record: Mapping[str, Any]) -> dict[str, Any]:
    """The label of one BFCL memory question (module docstring)."""
    verdict = record.get("verdict") or {}
    if record.get("reward") == 1.0:
        return {"label": "pass", "evidence": str(verdict.get("answer"))[:160]}
    trace = record.get("trace") or ()
    kinds = memory_calls(record)
    if kinds["unparsable"] or kinds["unknown_tool"]:
        entry = next(e for e in trace if e["error_kind"] in ("parse", "unknown_tool") or _UNKNOWN_BFCL.match(e.get("error") or ""))
        return {"label": "invalid_tool_call", "evidence": str(entry.get("error"))[:160]}
    if kinds["invalid_arguments"]:
        entry = next(e for e in trace if e["error_kind"] == "schema" or _ARGUMENTS.search(e.get("error") or ""))
        return {"label": "argument_mismatch", "evidence": str(entry.get("error"))[:160]}
    if not any(e["accepted"] for e in trace):
        return {"label": "missing_tool_call", "evidence": "no memory call"}
    if kinds["tool_error"]:
        entry = next(e for e in trace if e["error_kind"] == "execution")
        return {"label": "recovery_failure", "evidence": str(entry.get("error"))[:160]}
    return {"label": "response_mismatch", "evidence": f"{verdict.get('error_type')}: {str(verdict.get('answer'))[:120]}"}


def memory_calls(record: Mapping[str, Any]) -> Counter:
    """A memory episode's invalid calls by kind and its tool errors, from its trace."""
    counts: Counter = Counter()
    for entry in record.get("trace") or ():
        error = entry.get("error") or ""
        if entry["error_kind"] == "parse":
            counts["unparsable"] += 1
        elif entry["error_kind"] == "unknown_tool" or _UNKNOWN_BFCL.match(error):
            counts["unknown_tool"] += 1
        elif entry["error_kind"] == "schema" or entry["error_kind"] == "execution" and _ARGUMENTS.search(error):
            counts["invalid_arguments"] += 1
        elif entry["error_kind"] == "execution":
            counts["tool_error"] += 1
    return counts


def ood_profile(records: Iterable[Mapping[str, Any]], benchmark: str, top: int = 3) -> dict[str, Any]:
    """Label counts (and the commonest evidence per label), call problems by kind and endings of an
    OOD run's records; generation errors and memory prerequisites are left out."""
    labels: Counter = Counter()
    evidence: dict[str, Counter] = {}
    calls: Counter = Counter()
    endings: Counter = Counter()
    episodes = 0
    for record in records:
        if record.get("error") or record.get("prereq"):
            continue
        episodes += 1
        if benchmark == "bfcl-memory":
            found, problems, ending = [memory_label(record)], memory_calls(record), record.get("end_reason")
        else:
            found = tau2_labels(record)
            problems, ending = tau2_calls(record.get("simulation") or {}), record.get("termination_reason")
        for item in found:
            labels[item["label"]] += 1
            evidence.setdefault(item["label"], Counter())[item["evidence"]] += 1
        calls.update(problems)
        endings[str(ending)] += 1
    return {
        "benchmark": benchmark, "episodes": episodes,
        "labels": {label: labels[label] for label in OOD_LABELS if labels[label]},
        "top_evidence": {label: evidence[label].most_common(top) for label in OOD_LABELS if label in evidence and label != "pass"},
        "calls": {kind: calls[kind] for kind in CALL_KINDS},
        "endings": dict(sorted(endings.items())),
    }  # fmt: skip


def comparable(records: Sequence[Mapping[str, Any]], benchmark: str) -> list[dict[str, Any]]:
    """OOD records as :func:`seal_rl.stats.compare_runs` pairs them: by task and trial, a success each
    (τ²: reward 1, as its ``is_successful``; memory: the checker passed), the category being the
    benchmark (τ²) or the backend (memory)."""
    rows = []
    for r in records:
        if r.get("prereq"):
            continue
        if benchmark == "bfcl-memory":
            rows.append({"task_id": r["task_id"], "sample": 0, "category": r["category"], "reward": r["reward"], "error": r.get("error")})
        else:
            rows.append({"task_id": r["task_id"], "sample": r.get("trial", 0), "category": r.get("benchmark", benchmark),
                         "reward": 1.0 if r.get("success") else 0.0, "error": r.get("error")})  # fmt: skip
    return rows
