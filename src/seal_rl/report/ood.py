"""The report of an OOD run (τ²-bench, BFCL memory): the run's own summary, its failure profile
(:mod:`seal_rl.ood.profile`), how conversations ended, and every conversation's transcript."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from markupsafe import Markup

from seal_rl import jsonl
from seal_rl.errors import SealError
from seal_rl.ood.profile import CALL_KINDS, OOD_LABELS, memory_label, ood_profile, tau2_labels
from seal_rl.report.page import EPISODE_CAP, chip, page, render, sample_evenly, share_table

_CONVERSATION = """<details class="episode"><summary>{{ task }}{% if trial is not none %} · trial {{ trial }}{% endif %}
· reward {{ reward }} · {{ ending }} {% for label in labels %}{{ label }}{% endfor %}</summary>
{% for role, text in messages %}<div class="msg {{ role }}"><b>{{ role }}</b><pre>{{ text|clip }}</pre></div>{% endfor %}</details>"""


def _messages(record: Mapping[str, Any], benchmark: str) -> list[tuple[str, str]]:
    if benchmark == "bfcl-memory":
        return [(m.get("role", "?"), str(m.get("content") or "")) for m in record.get("messages") or ()]
    shown = []
    for m in (record.get("simulation") or {}).get("messages") or ():
        text = str(m.get("content") or "")
        calls = m.get("tool_calls") or ()
        if calls:
            text += "".join(f"\n→ {c.get('name')}({json.dumps(c.get('arguments'), ensure_ascii=False)})" for c in calls)
        shown.append((m.get("role", "?"), text))
    return shown


def ood_report(run_dir: Path, benchmark: str, *, cap: int = EPISODE_CAP) -> str:
    """The page for ``seal report RUN`` on a ``seal eval --benchmark`` run other than BFCL multi-turn."""
    path = Path(run_dir) / "results.jsonl"
    records = [r for r in jsonl.read(path).values if isinstance(r, dict)] if path.exists() else []
    scored = [r for r in records if not r.get("prereq")]
    if not scored:
        raise SealError(f"{run_dir}/results.jsonl has no {benchmark} conversations yet.")
    summary = json.loads((Path(run_dir) / "summary.json").read_text()) if (Path(run_dir) / "summary.json").exists() else {}
    profile = ood_profile(records, benchmark)
    memory = benchmark == "bfcl-memory"
    group = (lambda r: r["category"]) if memory else (lambda r: r.get("benchmark", benchmark))
    labels_by: dict[str, Counter] = {}
    endings_by: dict[str, Counter] = {}
    for r in scored:
        if r.get("error"):
            continue
        found = [memory_label(r)] if memory else tau2_labels(r)
        labels_by.setdefault(group(r), Counter()).update(item["label"] for item in found)
        endings_by.setdefault(group(r), Counter())[str(r.get("end_reason") if memory else r.get("termination_reason"))] += 1
    present = [z for z in OOD_LABELS if any(z in c for c in labels_by.values())]
    endings = sorted({e for c in endings_by.values() for e in c})
    headline = (f"accuracy {summary.get('accuracy', 0):.1%} over {summary.get('questions', len(scored))} questions "
                f"({summary.get('prerequisites', 0)} prerequisite conversations)" if memory else
                f"average reward {summary.get('avg_reward', 0):.3f}, success {summary.get('success_rate', 0):.1%} "
                f"over {summary.get('conversations', len(scored))} conversations")  # fmt: skip
    shown = sample_evenly(scored, cap)
    conversations = []
    for r in shown:
        found = [] if r.get("error") else [memory_label(r)] if memory else tau2_labels(r)
        conversations.append(render(_CONVERSATION, task=r.get("task_id"), trial=None if memory else r.get("trial"),
                                    reward=r.get("reward"), ending=r.get("error") or (r.get("end_reason") if memory else r.get("termination_reason")),
                                    labels=[chip(item["label"]) for item in found], messages=_messages(r, benchmark)))  # fmt: skip
    sections = [
        render("<p class='meta'>{{ benchmark }} · policy {{ policy }} · {{ headline }}</p>", benchmark=benchmark,
               policy=summary.get("policy", "?"), headline=headline),  # fmt: skip
        Markup("<h2>Failure labels</h2>"),
        render("<p class='meta'>What the benchmark checks, in SEAL's taxonomy (docs/concepts/diagnosis.md, OOD runs).</p>"),
        share_table(labels_by, present, "benchmark" if not memory else "backend"),
        Markup("<h2>Calls</h2>"), share_table({"calls": Counter(profile["calls"])}, list(CALL_KINDS), "agent"),
        Markup("<h2>How conversations ended</h2>"), share_table(endings_by, endings, "benchmark" if not memory else "backend"),
        Markup("<h2>Conversations</h2>"),
        render("{% if shown < total %}<p class='meta'>Showing {{ shown }} of {{ total }}, spread evenly over the run.</p>{% endif %}",
               shown=len(shown), total=len(scored)),  # fmt: skip
        *conversations,
    ]
    return page(f"seal-rl {benchmark}: {Path(run_dir).name}", sections)
