"""``seal compare A B --html OUT``: two evaluation runs side by side, paired by (task, sample):
success per category with Wilson intervals and the exact McNemar test, the paired bootstrap
interval of the average, the shift in the label mix, and every task that flipped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup

from seal_rl.diagnose import LABELS
from seal_rl.errors import SealError
from seal_rl.evaluate import read_results, summarize
from seal_rl.report.evaluation import label_counts
from seal_rl.report.page import LABEL_COLOURS, figure, page, render
from seal_rl.stats import compare_runs, wilson

_TABLE = """<p class="meta">A = {{ a }} · B = {{ b }}</p>
<table><tr><th>category</th><th>pairs</th><th>A</th><th>A 95%</th><th>B</th><th>B 95%</th><th>B − A</th><th>only A</th><th>only B</th><th>McNemar p</th></tr>
{% for name, row, ia, ib in rows %}<tr><td>{{ name }}</td><td>{{ row.pairs }}</td><td>{{ row.rate_a|pct }}</td><td>{{ ia }}</td><td>{{ row.rate_b|pct }}</td>
<td>{{ ib }}</td><td>{{ "%+.1f%%"|format(row.difference * 100) }}</td><td>{{ row.only_a }}</td><td>{{ row.only_b }}</td><td>{{ "%.3g"|format(row.p_value) }}</td></tr>{% endfor %}</table>
<p>Average of category rates, B − A: <b>{{ "%+.1f%%"|format(diff[0] * 100) }}</b> (95% paired bootstrap: {{ "%+.1f%%"|format(diff[1] * 100) }} to
{{ "%+.1f%%"|format(diff[2] * 100) }}).{% if unpaired %} Not paired: {{ unpaired }}.{% endif %}</p>"""

_SHIFT = """<table><tr><th>label</th><th>A</th><th>B</th><th>B − A</th></tr>{% for z, sa, sb in rows %}<tr><td>{{ z }}</td>
<td>{{ sa|pct }}</td><td>{{ sb|pct }}</td><td>{{ "%+.1f%%"|format((sb - sa) * 100) }}</td></tr>{% endfor %}</table>"""

_FLIPS = """<div class="filters"><input id="f-task" type="search" placeholder="task id" oninput="filterFlips()">
<span id="f-count"></span></div><table id="flips"><tr><th>task</th><th>sample</th><th>category</th><th>A</th><th>B</th></tr>
{% for f in flips %}<tr class="flip" data-task="{{ f.task }}"><td>{{ f.task }}</td><td>{{ f.sample }}</td><td>{{ f.category }}</td>
<td class="l">{{ f.a }}</td><td class="l">{{ f.b }}</td></tr>{% endfor %}</table>"""

_FLIP_JS = """
function filterFlips(){const q=document.getElementById('f-task').value.trim().toLowerCase();let n=0;
document.querySelectorAll('tr.flip').forEach(r=>{const ok=!q||r.dataset.task.toLowerCase().includes(q);r.style.display=ok?'':'none';if(ok)n++;});
document.getElementById('f-count').textContent=n+' flipped episodes shown';}
document.addEventListener('DOMContentLoaded',filterFlips);
"""


def _shares(counts: Mapping[str, Counter]) -> dict[str, float]:
    pooled: Counter = Counter()
    for row in counts.values():
        pooled.update(row)
    total = sum(pooled.values()) or 1
    return {z: pooled[z] / total for z in LABELS if z in pooled}


def _outcomes(records: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], tuple[str, str, str]]:
    """(task, sample) -> (category, outcome, the turn labels as text)."""
    result = {}
    for r in records:
        if r.get("error"):
            continue
        labels = " ".join(t["label"] for t in (r.get("diagnosis") or {}).get("labels", []))
        result[(r["task_id"], r.get("sample", 0))] = (r["category"], "pass" if r["reward"] == 1.0 else "fail", labels)
    return result


def _interval(rate: float, n: int) -> str:
    low, high = wilson(round(rate * n), n)
    return f"{low:.1%} – {high:.1%}"


def compare_report(run_a: Path, run_b: Path, *, resamples: int = 10_000) -> str:
    a, b = read_results(run_a), read_results(run_b)
    result = compare_runs(a, b, resamples=resamples)
    if not result.overall.pairs:
        raise SealError(f"{run_a} and {run_b} share no episode (task and sample); nothing to compare.")
    summary_a, summary_b = summarize(a), summarize(b)

    def interval(summary: Mapping[str, Any], category: str | None) -> str:
        low, high = summary["average_ci95"] if category is None else summary["categories"].get(category, {}).get("ci95", (0, 1))
        return f"{low:.1%} – {high:.1%}"

    rows = [(name, row, interval(summary_a, name), interval(summary_b, name)) for name, row in result.categories.items()]
    pooled = result.overall
    rows.append(("all (pooled)", pooled, *(_interval(rate, pooled.pairs) for rate in (pooled.rate_a, pooled.rate_b))))
    unpaired = ", ".join(part for part in (f"{result.only_in_a} episodes only in A" if result.only_in_a else "",
                                           f"{result.only_in_b} only in B" if result.only_in_b else "") if part)  # fmt: skip
    names = list(result.categories)

    def rates(fig):
        ax = fig.add_subplot(111)
        width = 0.38
        for offset, summary, colour, label in ((-width / 2, summary_a, "#90a4ae", "A"), (width / 2, summary_b, "#1e88e5", "B")):
            values = [summary["categories"][c]["success_rate"] * 100 if c in summary["categories"] else 0 for c in names]
            bounds = [summary["categories"].get(c, {}).get("ci95", (0, 0)) for c in names]
            errors = [[v - lo * 100 for v, (lo, _) in zip(values, bounds)], [hi * 100 - v for v, (_, hi) in zip(values, bounds)]]
            ax.bar([i + offset for i in range(len(names))], values, width, yerr=errors, capsize=3, color=colour, label=label)
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("success (%)")
        ax.set_ylim(0, 100)
        ax.legend()
        ax.set_title("Success per category, A vs B (95% Wilson intervals, all episodes of each run)")

    shares_a, shares_b = _shares(label_counts(a)[0]), _shares(label_counts(b)[0])
    labels = [z for z in LABELS if z in shares_a or z in shares_b]

    def shift(fig):
        ax = fig.add_subplot(111)
        deltas = [(shares_b.get(z, 0.0) - shares_a.get(z, 0.0)) * 100 for z in labels]
        ax.barh(labels[::-1], deltas[::-1], color=[LABEL_COLOURS.get(z) for z in labels[::-1]])
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel("share of turns, B − A (percentage points)")
        ax.set_title("Label mix shift")

    left, right = _outcomes(a), _outcomes(b)
    flips = [{"task": task, "sample": sample, "category": left[(task, sample)][0],
              "a": f"{left[(task, sample)][1]} ({left[(task, sample)][2]})", "b": f"{right[(task, sample)][1]} ({right[(task, sample)][2]})"}
             for task, sample in sorted(set(left) & set(right)) if left[(task, sample)][1] != right[(task, sample)][1]]  # fmt: skip
    sections = [
        Markup("<h2>Success</h2>"), render(_TABLE, a=str(run_a), b=str(run_b), rows=rows, diff=result.average_difference, unpaired=unpaired),
        figure(rates, alt="success A vs B"),
        Markup("<h2>Label mix</h2>"), figure(shift, height=max(2.4, 0.3 * len(labels) + 1.2), alt="label shift"),
        render(_SHIFT, rows=[(z, shares_a.get(z, 0.0), shares_b.get(z, 0.0)) for z in labels]),
        Markup("<h2>Flipped episodes</h2>"),
        render("<p class='meta'>{{ n }} paired episodes changed outcome: {{ gained }} pass only in B, {{ lost }} only in A.</p>",
               n=len(flips), gained=sum(f["b"].startswith("pass") for f in flips), lost=sum(f["a"].startswith("pass") for f in flips)),
        render(_FLIPS, flips=flips),
    ]  # fmt: skip
    return page(f"seal-rl comparison: {Path(run_b).name} vs {Path(run_a).name}", sections, _FLIP_JS)


def write_compare_report(run_a: Path, run_b: Path, target: Path, *, resamples: int = 10_000) -> Path:
    target = Path(target)
    if target.is_dir():
        raise SealError(f"--html {target} is a directory; give a file path such as {target / 'compare.html'}.")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(compare_report(Path(run_a), Path(run_b), resamples=resamples), encoding="utf-8",
                      errors="backslashreplace")  # lone surrogates shown as \udXXX
    return target
