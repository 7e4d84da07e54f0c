"""What every report page shares: the Jinja2 environment (autoescaping on, so every value from a
run is HTML-escaped unless it is a chart this module drew), the stylesheet, the browser script,
label colours and inline matplotlib charts.

Model output is hostile input (STYLE.md): no value read from a run directory is ever written into
the page except through an autoescaped template variable; charts are PNG data URIs.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from jinja2 import Environment, StrictUndefined, Template
from markupsafe import Markup

TEXT_LIMIT = 2000
"""longest text shown in one block; the rest is cut with a note of how much"""
EPISODE_CAP = 1000
"""most evaluation episodes embedded in one page (the page says when it shows a selection)"""
ROLLOUT_CAP = 500
"""most training rollouts embedded in one page (spread evenly over the run; the page says so)"""

LABEL_COLOURS = {
    "pass": "#2e7d32", "correct_abstention": "#66bb6a", "spurious_tool_call": "#ab47bc",
    "invalid_tool_call": "#e53935", "argument_mismatch": "#fb8c00", "missing_tool_call": "#fdd835",
    "recovery_failure": "#8d6e63", "instance_mismatch": "#5c6bc0", "state_mismatch": "#1e88e5",
    "response_mismatch": "#00acc1", "not_reached": "#bdbdbd", "gt_error": "#616161", "checker_error": "#212121",
}  # fmt: skip
_LIGHT = {"missing_tool_call", "correct_abstention", "not_reached"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:4px 10px;text-align:right}
th{background:#f5f5f5}td:first-child,th:first-child,td.l{text-align:left}
img{max-width:100%}.meta{color:#666}.chip{display:inline-block;border-radius:3px;padding:0 6px;margin:1px;font-size:12px}
details{border:1px solid #e0e0e0;border-radius:4px;margin:4px 0;padding:4px 8px}summary{cursor:pointer}
.turn{border-left:3px solid #ccc;margin:8px 0;padding-left:10px}pre{white-space:pre-wrap;word-break:break-word;background:#fafafa;
padding:6px;margin:4px 0;font-size:12px;max-height:320px;overflow:auto}.ok{color:#2e7d32}.bad{color:#c62828}
.rejected{color:#757575;text-decoration:line-through}.tag{font-size:11px;border-radius:3px;padding:0 4px;background:#ffcdd2;color:#b71c1c}
.seen{border-left:3px solid #90caf9}.warning{background:#fff3e0;border:2px solid #e65100;padding:8px 12px;border-radius:4px}
.filters{position:sticky;top:0;background:#fff;padding:8px 0;border-bottom:1px solid #eee;z-index:1}select,label,input{margin-right:12px}
.legend span{margin-right:14px}.swatch{display:inline-block;width:12px;height:12px;vertical-align:middle;margin-right:4px;border:1px solid #999}
"""

# Filters of a trajectory browser: category, label, outcome and a task-id search; counts what is shown.
FILTER_JS = """
function applyFilters(){const v=id=>{const e=document.getElementById(id);return e?e.value:'';};
const c=v('f-cat'),l=v('f-label'),o=v('f-out'),q=v('f-task').trim().toLowerCase();let shown=0;
document.querySelectorAll('details.episode').forEach(d=>{
const ok=(!c||d.dataset.category===c)&&(!l||d.dataset.labels.split(' ').includes(l))&&(!o||d.dataset.outcome===o)
&&(!q||d.dataset.task.toLowerCase().includes(q));d.style.display=ok?'':'none';if(ok)shown++;});
document.getElementById('f-count').textContent=shown+' episodes shown';}
document.addEventListener('DOMContentLoaded',applyFilters);
"""

ENV = Environment(autoescape=True, undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
ENV.filters["clip"] = lambda text, limit=TEXT_LIMIT: clip(text, limit)
ENV.filters["pct"] = lambda value: f"{value:.1%}"

PAGE = ENV.from_string("""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>{{ css }}</style></head><body><h1>{{ title }}</h1>
{% for section in sections %}{{ section }}{% endfor %}
<script>{{ script }}</script></body></html>""")

CHIP = ENV.from_string('<span class="chip" style="background:{{ colour }};color:{{ text }}">{{ label }}</span>')

FILTERS = ENV.from_string("""<div class="filters">
<input id="f-task" type="search" placeholder="task id" oninput="applyFilters()">
<select id="f-cat" onchange="applyFilters()"><option value="">all categories</option>
{% for c in categories %}<option value="{{ c }}">{{ c }}</option>{% endfor %}</select>
<select id="f-label" onchange="applyFilters()"><option value="">any label</option>
{% for z in labels %}<option value="{{ z }}">{{ z }}</option>{% endfor %}</select>
<select id="f-out" onchange="applyFilters()"><option value="">any outcome</option>
{% for o in outcomes %}<option value="{{ o }}">{{ o }}</option>{% endfor %}</select><span id="f-count"></span></div>""")


@lru_cache(maxsize=256)
def _compiled(source: str) -> Template:
    """Templates are this package's string constants: compile each once, not once per episode."""
    return ENV.from_string(source)


def render(template: str, **values: Any) -> Markup:
    """A fragment from an autoescaped template string (values are escaped; Markup stays as is)."""
    return Markup(_compiled(template).render(**values))


def page(title: str, sections: Sequence[Any], script: str = "") -> str:
    """The whole document. ``script`` is this module's own code, never data from a run."""
    return PAGE.render(title=title, css=Markup(CSS), sections=sections, script=Markup(script))


def clip(text: Any, limit: int = TEXT_LIMIT) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def chip(label: str) -> Markup:
    return Markup(CHIP.render(label=label, colour=LABEL_COLOURS.get(label, "#777"), text="#222" if label in _LIGHT else "#fff"))


def filters(categories: Sequence[str], labels: Sequence[str], outcomes: Sequence[str]) -> Markup:
    return Markup(FILTERS.render(categories=categories, labels=labels, outcomes=outcomes))


def figure(draw: Callable[[Any], None], *, height: float = 3.6, alt: str = "chart") -> Markup:
    """A matplotlib figure drawn by ``draw(fig)`` as an inline PNG <img>."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig = plt.figure(figsize=(9, height), dpi=100)
    try:
        draw(fig)
        for ax in fig.axes:  # rounds and steps are whole numbers
            if ax.get_xlabel() in ("round", "optimizer step"):
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode()
    return render('<img alt="{{ alt }}" src="data:image/png;base64,{{ data }}">', alt=alt, data=data)


def sample_evenly(items: Sequence[Any], cap: int) -> list[Any]:
    """At most ``cap`` items spread evenly over ``items`` (first and last kept), in order."""
    if len(items) <= cap:
        return list(items)
    if cap <= 1:
        return list(items[:cap])
    return [items[round(i * (len(items) - 1) / (cap - 1))] for i in range(cap)]


def share_table(counts: Mapping[str, Mapping[str, int]], columns: Sequence[str], row_title: str, *, transpose: bool = False) -> Markup:
    """Each row's counts as shares of the row's total (with the total); ``transpose`` puts the
    rows in columns (for many columns, e.g. labels by turn position)."""
    totals = {name: sum(row.values()) for name, row in counts.items()}
    share = {name: {c: row.get(c, 0) / totals[name] if totals[name] else 0.0 for c in columns} for name, row in counts.items()}
    return render("""<div style="overflow-x:auto">{% if not transpose %}<table><tr><th>{{ row_title }}</th><th>n</th>
{% for c in columns %}<th>{{ c }}</th>{% endfor %}</tr>{% for name in share %}<tr><td>{{ name }}</td><td>{{ totals[name] }}</td>
{% for c in columns %}<td>{{ share[name][c]|pct }}</td>{% endfor %}</tr>{% endfor %}</table>
{% else %}<table><tr><th></th>{% for name in share %}<th>{{ name }}</th>{% endfor %}</tr><tr><td>n</td>
{% for name in share %}<td>{{ totals[name] }}</td>{% endfor %}</tr>{% for c in columns %}<tr><td>{{ c }}</td>
{% for name in share %}<td>{{ share[name][c]|pct }}</td>{% endfor %}</tr>{% endfor %}</table>{% endif %}</div>""",
                  share=share, totals=totals, columns=columns, row_title=row_title, transpose=transpose)  # fmt: skip
