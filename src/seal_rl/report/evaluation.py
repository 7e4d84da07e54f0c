"""The evaluation report: success per category with Wilson 95% intervals, pass@k (unbiased
estimator, Chen et al. 2021) when tasks were sampled several times, the label profile per
category and by turn position, how episodes ended, and a trajectory browser with filters and a
task-id search."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup

from seal_rl.diagnose import LABELS, diagnose, stored_diagnosis
from seal_rl.errors import SealError
from seal_rl.evaluate import read_results, summarize
from seal_rl.report.episodes import episode_html
from seal_rl.report.page import EPISODE_CAP, FILTER_JS, LABEL_COLOURS, figure, filters, page, render, sample_evenly, share_table
from seal_rl.tasks import CATEGORIES

_SUCCESS_TABLE = """<table><tr><th>category</th><th>episodes</th><th>successes</th><th>success</th><th>95% interval</th></tr>
{% for name, row in summary.categories.items() %}<tr><td>{{ name }}</td><td>{{ row.episodes }}{% if row.get("errors") %} (+{{ row.errors }} errors){% endif %}</td>
<td>{{ row.successes }}</td><td>{{ row.success_rate|pct }}</td><td>{{ row.ci95[0]|pct }} – {{ row.ci95[1]|pct }}</td></tr>{% endfor %}
<tr><th>average</th><th>{{ summary.episodes }}</th><th>{{ summary.successes }}</th><th>{{ summary.average|pct }}</th>
<th>{{ summary.average_ci95[0]|pct }} – {{ summary.average_ci95[1]|pct }}</th></tr></table>"""

_PASS_TABLE = """<table><tr><th>category</th>{% for k in ks %}<th>pass@{{ k }}</th>{% endfor %}</tr>
{% for c in categories %}<tr><td>{{ c }}</td>{% for k in ks %}<td>{{ table[k][c]|pct }}</td>{% endfor %}</tr>{% endfor %}
<tr><th>average</th>{% for k in ks %}<th>{{ averages[k]|pct }}</th>{% endfor %}</tr></table>"""


def success_table(summary: Mapping[str, Any]) -> Markup:
    return render(_SUCCESS_TABLE, summary=summary)


def success_chart(summary: Mapping[str, Any], title: str = "Success per category (95% intervals)") -> Markup:
    names = list(summary["categories"]) + ["average"]
    rates = [summary["categories"][c]["success_rate"] for c in names[:-1]] + [summary["average"]]
    bounds = [summary["categories"][c]["ci95"] for c in names[:-1]] + [summary["average_ci95"]]

    def draw(fig):
        ax = fig.add_subplot(111)
        errors = [[(r - lo) * 100 for r, (lo, _) in zip(rates, bounds)], [(hi - r) * 100 for r, (_, hi) in zip(rates, bounds)]]
        ax.bar(names, [r * 100 for r in rates], yerr=errors, capsize=4, color="#1e88e5")
        ax.set_ylabel("success (%)")
        ax.set_ylim(0, 100)
        ax.set_title(title)

    return figure(draw, alt="success per category")


def pass_at_k_section(summary: Mapping[str, Any]) -> list[Markup]:
    """pass@k per category and on average, k = 1 … samples (``summary.json``'s unbiased estimates)."""
    table = summary.get("pass_at_k")
    if not table:
        return [render("<p class='meta'>One sample per task: no pass@k. Evaluate with <code>--samples N</code> (and a "
                       "temperature above 0) to see it.</p>")]  # fmt: skip
    ks = sorted(table, key=int)
    categories = list(table[ks[0]])
    averages = {k: sum(table[k].values()) / max(1, len(table[k])) for k in ks}

    def draw(fig):
        ax = fig.add_subplot(111)
        xs = [int(k) for k in ks]
        for c in categories:
            ax.plot(xs, [table[k][c] * 100 for k in ks], marker="o", label=c)
        ax.plot(xs, [averages[k] * 100 for k in ks], marker="s", color="black", linewidth=2, label="average")
        ax.set_xlabel("k (samples)")
        ax.set_xticks(xs)
        ax.set_ylabel("pass@k (%)")
        ax.set_ylim(0, 100)
        ax.legend(fontsize=8)
        ax.set_title(f"pass@k over {summary.get('samples_per_task', len(ks))} samples per task (unbiased estimator)")

    return [figure(draw, alt="pass at k"), render(_PASS_TABLE, ks=ks, categories=categories, table=table, averages=averages)]


def stacked_shares(rows: Mapping[str, Counter], title: str, *, ylabel: str = "") -> Markup:
    """Horizontal 100% bars: the label mix of each row, label colours as everywhere."""
    labels = [z for z in LABELS if any(z in c for c in rows.values())]

    def draw(fig):
        ax = fig.add_subplot(111)
        names = list(rows)[::-1]
        left = [0.0] * len(names)
        for label in labels:
            shares = [rows[n][label] / max(1, sum(rows[n].values())) * 100 for n in names]
            ax.barh(names, shares, left=left, color=LABEL_COLOURS.get(label), label=label)
            left = [a + b for a, b in zip(left, shares)]
        ax.set_xlabel("share of turns (%)")
        ax.set_ylabel(ylabel)
        ax.set_xlim(0, 100)
        ax.legend(fontsize=7, ncol=1, loc="center left", bbox_to_anchor=(1.0, 0.5))
        ax.set_title(title)

    return figure(draw, height=max(2.4, 0.35 * len(rows) + 1.4), alt=title)


def label_counts(records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Counter], dict[str, Counter]]:
    """Label counts per category and per turn position (``turn 0``, ``turn 1``, …)."""
    per_category: dict[str, Counter] = defaultdict(Counter)
    per_turn: dict[int, Counter] = defaultdict(Counter)
    for record in records:
        diagnosis = stored_diagnosis(record) or diagnose(record)
        for t in diagnosis.labels:
            per_category[record["category"]][t.label] += 1
            per_turn[t.turn][t.label] += 1
    ordered = {c: per_category[c] for c in [*CATEGORIES, *sorted(set(per_category) - set(CATEGORIES))] if c in per_category}
    return ordered, {f"turn {t}": per_turn[t] for t in sorted(per_turn)}


def end_reasons(records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Counter], list[str]]:
    """``end_reason`` counts per category, and the reasons seen (``completed`` first)."""
    table: dict[str, Counter] = defaultdict(Counter)
    for record in records:
        table[record["category"]][str(record.get("end_reason"))] += 1
    reasons = sorted({r for row in table.values() for r in row}, key=lambda r: (r != "completed", r))
    return dict(table), reasons


def browsable(records: Sequence[Mapping[str, Any]], cap: int) -> list[Mapping[str, Any]]:
    """At most ``cap`` records for the browser, in run order: every task's first sample before any
    second one (so the task-id search finds every task while they fit), each group spread evenly."""
    if len(records) <= cap:
        return list(records)
    first = [i for i, r in enumerate(records) if not r.get("sample")]
    if len(first) >= cap:
        return [records[i] for i in sample_evenly(first, cap)]
    chosen = set(first)
    chosen.update(sample_evenly([i for i in range(len(records)) if i not in chosen], cap - len(first)))
    return [records[i] for i in sorted(chosen)]


def eval_report(run_dir: Path, *, cap: int = EPISODE_CAP) -> str:
    records = read_results(run_dir)
    if not records:
        raise SealError(f"{run_dir}/results.jsonl has no episodes yet.")
    summary = summarize(records)
    config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
    per_category, per_turn = label_counts(records)
    present = [z for z in LABELS if any(z in c for c in per_category.values())]
    reasons_by_category, reasons = end_reasons(records)
    shown = browsable(records, cap)
    versions = " · ".join(f"{k} {v}" for k, v in (config.get("versions") or {}).items())
    sections = [
        render("<p class='meta'>policy {{ policy }} · {{ n }} episodes · {{ versions }}</p>",
               policy=config.get("policy", "?"), n=len(records), versions=versions),
        Markup("<h2>Success</h2>"), success_table(summary), success_chart(summary),
        Markup("<h2>pass@k</h2>"), *pass_at_k_section(summary),
        Markup("<h2>Failure labels</h2>"), stacked_shares(per_category, "Label profile per category"),
        Markup("<h3>Label mix by turn position</h3>"),
        stacked_shares(per_turn, "Label mix by turn position (all categories)"), share_table(per_turn, present, "turn", transpose=True),
        Markup("<h2>How episodes ended</h2>"), share_table(reasons_by_category, reasons, "category"),
        Markup("<h2>Trajectories</h2>"),
        render("{% if shown < total %}<p class='meta'>Showing {{ shown }} of {{ total }} episodes, spread evenly over the run "
               "(every task's first sample first; the page keeps at most {{ shown }}); every rate above counts all {{ total }}.</p>{% endif %}",
               shown=len(shown), total=len(records)),  # fmt: skip
        filters([c for c in CATEGORIES if c in per_category], present, ["pass", "fail", "error"]),
        *(episode_html(r) for r in shown),
    ]
    return page(f"seal-rl evaluation: {run_dir.name}", sections, FILTER_JS)
