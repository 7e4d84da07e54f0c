"""``seal report RUN``: a self-contained ``report.html`` for an evaluation or a training run.

Everything is inline (PNG charts as data URIs, CSS, a few lines of JavaScript for filters), so the
file opens offline and can be mailed around. Every piece of text that came from a model or a
tool is HTML-escaped: model output is hostile input.

* Evaluation runs (``results.jsonl``): success per category with Wilson 95% intervals, the label
  profile, and a trajectory browser (per episode: each turn's question, messages, calls,
  observations, label and evidence), filterable by category, label and outcome.
* Training runs (``metrics.jsonl``): rollout success per category over rounds with interval
  bands, the in-training validation (``kind: validation`` lines; or ``seal eval`` runs of checkpoints in ``RUN/validation/step_N/``), the
  label distribution over rounds, a timeline of active interface components, the A-Patch label
  weights over rounds, reward and A-Patch scale distributions, and where the time went.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seal_rl.diagnose import LABELS, stored_diagnosis, diagnose
from seal_rl.errors import SealError
from seal_rl.evaluate import read_results, summarize
from seal_rl.stats import wilson
from seal_rl.tasks import CATEGORIES
from seal_rl.train import read_metrics

REPORT_FILE = "report.html"
_TEXT_LIMIT = 2000
LABEL_COLOURS = {
    "pass": "#2e7d32", "correct_abstention": "#66bb6a", "spurious_tool_call": "#ab47bc",
    "invalid_tool_call": "#e53935", "argument_mismatch": "#fb8c00", "missing_tool_call": "#fdd835",
    "recovery_failure": "#8d6e63", "instance_mismatch": "#5c6bc0", "state_mismatch": "#1e88e5",
    "response_mismatch": "#00acc1", "not_reached": "#bdbdbd", "gt_error": "#616161", "checker_error": "#212121",
}  # fmt: skip

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:4px 10px;text-align:right}
th{background:#f5f5f5}td:first-child,th:first-child{text-align:left}
img{max-width:100%}.meta{color:#666}.chip{display:inline-block;border-radius:3px;padding:0 6px;margin:1px;color:#fff;font-size:12px}
details{border:1px solid #e0e0e0;border-radius:4px;margin:4px 0;padding:4px 8px}summary{cursor:pointer}
.turn{border-left:3px solid #ccc;margin:8px 0;padding-left:10px}pre{white-space:pre-wrap;word-break:break-word;background:#fafafa;
padding:6px;margin:4px 0;font-size:12px;max-height:320px;overflow:auto}.ok{color:#2e7d32}.bad{color:#c62828}
.filters{position:sticky;top:0;background:#fff;padding:8px 0;border-bottom:1px solid #eee}select,label{margin-right:12px}
"""

_FILTER_JS = """
function applyFilters(){const c=document.getElementById('f-cat').value,l=document.getElementById('f-label').value,
o=document.getElementById('f-out').value;let shown=0;document.querySelectorAll('details.episode').forEach(d=>{
const ok=(!c||d.dataset.category===c)&&(!l||d.dataset.labels.split(' ').includes(l))&&(!o||d.dataset.outcome===o);
d.style.display=ok?'':'none';if(ok)shown++;});document.getElementById('f-count').textContent=shown+' episodes';}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _clip(text: Any, limit: int = _TEXT_LIMIT) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def _figure(draw) -> str:
    """A matplotlib figure drawn by ``draw(fig)`` as an inline PNG <img>."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(9, 3.6), dpi=110)
    try:
        draw(fig)
        from matplotlib.ticker import MaxNLocator

        for ax in fig.axes:  # rounds and steps are whole numbers
            if ax.get_xlabel() in ("round", "optimizer step"):
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    return f'<img alt="chart" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


_LIGHT = {"missing_tool_call", "correct_abstention", "not_reached"}


def _chip(label: str) -> str:
    text = "#222" if label in _LIGHT else "#fff"
    return f'<span class="chip" style="background:{LABEL_COLOURS.get(label, "#777")};color:{text}">{_e(label)}</span>'


def _page(title: str, sections: Sequence[str], script: str = "") -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body><h1>{_e(title)}</h1>{''.join(sections)}"
        f"<script>{script}</script></body></html>"
    )


# -- evaluation runs ----------------------------------------------------------------------------


def _success_table(summary: Mapping[str, Any]) -> str:
    rows = []
    for category, row in summary["categories"].items():
        low, high = row["ci95"]
        errors = f" (+{row['errors']} errors)" if row.get("errors") else ""
        rows.append(f"<tr><td>{_e(category)}</td><td>{row['episodes']}{errors}</td><td>{row['successes']}</td>"
                    f"<td>{row['success_rate']:.1%}</td><td>{low:.1%} – {high:.1%}</td></tr>")  # fmt: skip
    low, high = summary["average_ci95"]
    rows.append(f"<tr><th>average</th><th>{summary['episodes']}</th><th>{summary['successes']}</th>"
                f"<th>{summary['average']:.1%}</th><th>{low:.1%} – {high:.1%}</th></tr>")  # fmt: skip
    return ("<table><tr><th>category</th><th>episodes</th><th>successes</th><th>success</th><th>95% interval</th></tr>"
            + "".join(rows) + "</table>")  # fmt: skip


def _success_chart(summary: Mapping[str, Any]) -> str:
    names = list(summary["categories"]) + ["average"]
    rates = [summary["categories"][c]["success_rate"] for c in names[:-1]] + [summary["average"]]
    bounds = [summary["categories"][c]["ci95"] for c in names[:-1]] + [summary["average_ci95"]]

    def draw(fig):
        ax = fig.add_subplot(111)
        errors = [[r - lo for r, (lo, _) in zip(rates, bounds)], [hi - r for r, (_, hi) in zip(rates, bounds)]]
        ax.bar(names, [r * 100 for r in rates], yerr=[[e * 100 for e in side] for side in errors], capsize=4, color="#1e88e5")
        ax.set_ylabel("success (%)")
        ax.set_ylim(0, 100)
        ax.set_title("Success per category (95% intervals)")

    return _figure(draw)


def _label_chart(per_category: Mapping[str, Counter]) -> str:
    labels = [z for z in LABELS if any(z in c for c in per_category.values())]

    def draw(fig):
        ax = fig.add_subplot(111)
        names = list(per_category)
        left = [0.0] * len(names)
        for label in labels:
            shares = [per_category[n][label] / max(1, sum(per_category[n].values())) * 100 for n in names]
            ax.barh(names, shares, left=left, color=LABEL_COLOURS.get(label), label=label)
            left = [a + b for a, b in zip(left, shares)]
        ax.set_xlabel("share of turns (%)")
        ax.set_xlim(0, 100)
        ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.25))
        ax.set_title("Label profile per category")

    return _figure(draw)


def _episode(record: Mapping[str, Any]) -> str:
    diagnosis = stored_diagnosis(record) or diagnose(record)
    labels = diagnosis.labels
    outcome = "error" if record.get("error") else "pass" if record["reward"] == 1.0 else "fail"
    assistant = [m for m in record["messages"] if m["role"] == "assistant"]
    by_turn: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for entry in record["trace"]:
        by_turn[entry["turn"]].append(entry)
    steps = record.get("steps", [])
    turns = []
    task_turns = [m for m in record["messages"] if m["role"] == "user" and not m["content"].startswith(("<tool_response>", "[ERROR]"))]
    for turn_label in labels:
        t = turn_label.turn
        question = task_turns[t]["content"] if t < len(task_turns) else "(not asked)"
        parts = [f"<div><b>turn {t}</b> {_chip(turn_label.label)}</div><pre>{_e(_clip(question))}</pre>"]
        for step_index, step in enumerate(steps):
            if step["turn"] != t or step_index >= len(assistant):
                continue
            parts.append(f"<div class='meta'>assistant, step {step_index} → {_e(step['event'])}</div>"
                         f"<pre>{_e(_clip(assistant[step_index]['content']))}</pre>")  # fmt: skip
            for entry in by_turn.get(t, []):
                if entry["step"] != step_index or entry["name"] is None:
                    continue
                status = "ok" if entry["error_kind"] is None else "bad"
                call = f"{entry['name']}({json.dumps(entry['arguments'], ensure_ascii=False)[:400]})"
                result = entry["result"] if entry["result"] is not None else f"[{entry['error_kind']}] {entry['error']}"
                parts.append(f"<div class='{status}'>call {_e(call)}</div><pre>{_e(_clip(result, 800))}</pre>")
        if turn_label.evidence:
            parts.append(f"<div class='meta'>evidence</div><pre>{_e(_clip(json.dumps(turn_label.evidence, ensure_ascii=False), 800))}</pre>")
        turns.append(f"<div class='turn'>{''.join(parts)}</div>")
    if record.get("faults"):
        injected = ", ".join(f"turn {f['turn']}: {f['type']}" for f in record["faults"])
        turns.insert(0, f"<div class='meta'>injected faults: {_e(injected)}</div>")
    label_names = " ".join(sorted({t.label for t in labels}))
    result = f"<span class='bad'>error: {_e(record['error'])}</span>" if record.get("error") else (
        "<span class='ok'>success</span>" if record["reward"] == 1.0 else "<span class='bad'>failure</span>")  # fmt: skip
    sample = f" · sample {record['sample']}" if "sample" in record else ""
    return (
        f'<details class="episode" data-category="{_e(record["category"])}" data-labels="{_e(label_names)}" '
        f'data-outcome="{outcome}"><summary>#{record["index"]} {_e(record["task_id"])}{sample} · {result} · '
        f'{_e(record["end_reason"])} · {"".join(_chip(t.label) for t in labels)}</summary>{"".join(turns)}</details>'
    )


def eval_report(run_dir: Path) -> str:
    records = read_results(run_dir)
    if not records:
        raise SealError(f"{run_dir}/results.jsonl has no episodes yet.")
    summary = summarize(records)
    config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
    per_category: dict[str, Counter] = defaultdict(Counter)
    for record in records:
        diagnosis = stored_diagnosis(record) or diagnose(record)
        per_category[record["category"]].update(t.label for t in diagnosis.labels)
    present = sorted({label for c in per_category.values() for label in c}, key=LABELS.index)
    options = "".join(f"<option>{_e(c)}</option>" for c in CATEGORIES if c in per_category)
    label_options = "".join(f"<option>{_e(label)}</option>" for label in present)
    filters = (
        '<div class="filters"><select id="f-cat" onchange="applyFilters()"><option value="">all categories</option>'
        f'{options}</select><select id="f-label" onchange="applyFilters()"><option value="">any label</option>{label_options}'
        '</select><select id="f-out" onchange="applyFilters()"><option value="">any outcome</option><option>pass</option>'
        '<option>fail</option><option>error</option></select><span id="f-count"></span></div>'
    )
    meta = (f"<p class='meta'>policy {_e(config.get('policy', '?'))} · {len(records)} episodes · "
            f"{_e(' · '.join(f'{k} {v}' for k, v in config.get('versions', {}).items()))}</p>")  # fmt: skip
    sections = [
        meta,
        "<h2>Success</h2>", _success_table(summary), _success_chart(summary),
        "<h2>Failure labels</h2>", _label_chart(per_category),
        "<h2>Trajectories</h2>", filters, "".join(_episode(r) for r in records),
    ]
    return _page(f"seal-rl evaluation: {run_dir.name}", sections, _FILTER_JS + "applyFilters();")


# -- training runs -----------------------------------------------------------------------------


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _validation(run_dir: Path) -> tuple[str, dict[int, dict[str, Any]]]:
    """Validation points: the in-training validation (``metrics.jsonl`` lines of kind ``validation``,
    by round) or else summaries of ``seal eval`` runs of checkpoints saved as RUN/validation/step_N/
    (by optimizer step)."""
    logged = read_metrics(run_dir, "validation")
    if logged:
        return "round", {m["round"]: {key.removeprefix("validation/"): value for key, value in m.items()} for m in logged}
    return "optimizer step", _checkpoint_evaluations(run_dir)


def _checkpoint_evaluations(run_dir: Path) -> dict[int, dict[str, Any]]:
    points = {}
    for summary in sorted((run_dir / "validation").glob("step_*/summary.json")):
        try:
            points[int(summary.parent.name.split("_", 1)[1])] = json.loads(summary.read_text())
        except (ValueError, OSError):
            continue
    return dict(sorted(points.items()))


def training_report(run_dir: Path) -> str:
    metrics = read_metrics(run_dir, "rollout")
    if not metrics:
        raise SealError(f"{run_dir}/metrics.jsonl has no rounds yet.")
    rows = _jsonl(run_dir / "trajectories.jsonl")
    rounds = [m["round"] for m in metrics]
    sections = [f"<p class='meta'>{len(rounds)} rounds · {len(rows)} episodes · recipe: "
                f"<code>{_e(run_dir / 'config.yaml')}</code></p>"]  # fmt: skip

    # success per category over rounds, with Wilson bands
    counts: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for row in rows:
        cell = counts[row["category"]][row["round"]]
        cell[0] += row["reward"] == 1.0
        cell[1] += 1

    def success(fig):
        ax = fig.add_subplot(111)
        for category, per_round in sorted(counts.items()):
            xs = sorted(per_round)
            rates = [per_round[x][0] / per_round[x][1] * 100 for x in xs]
            bands = [wilson(*per_round[x]) for x in xs]
            (line,) = ax.plot(xs, rates, marker="o", label=category)
            ax.fill_between(xs, [b[0] * 100 for b in bands], [b[1] * 100 for b in bands], alpha=0.08, color=line.get_color())
        ax.set_xlabel("round")
        ax.set_ylabel("rollout success (%)")
        ax.set_ylim(0, 100)
        ax.legend(fontsize=8)
        ax.set_title("Training rollouts: success per category (95% Wilson bands)")

    sections += ["<h2>Success over training</h2>", _figure(success)]
    axis, validation = _validation(run_dir)
    if validation:

        def val(fig):
            ax = fig.add_subplot(111)
            steps = list(validation)
            averages = [(s, validation[s]) for s in steps if "average_ci95" in validation[s]]
            if averages:
                xs = [s for s, _ in averages]
                ax.plot(xs, [v["average"] * 100 for _, v in averages], marker="s", color="black", linewidth=2,
                        label="average of categories")
                ax.fill_between(xs, [v["average_ci95"][0] * 100 for _, v in averages],
                                [v["average_ci95"][1] * 100 for _, v in averages], alpha=0.12, color="black")  # fmt: skip
            for category in CATEGORIES:
                points = [(s, validation[s]["categories"].get(category)) for s in steps]
                points = [(s, c) for s, c in points if c]
                if not points:
                    continue
                (line,) = ax.plot([s for s, _ in points], [c["success_rate"] * 100 for _, c in points], marker="o", label=category)
                ax.fill_between([s for s, _ in points], [c["ci95"][0] * 100 for _, c in points],
                                [c["ci95"][1] * 100 for _, c in points], alpha=0.08, color=line.get_color())  # fmt: skip
            ax.set_xlabel(axis)
            ax.set_ylabel("validation success (%)")
            ax.set_ylim(0, 100)
            ax.legend(fontsize=8)
            ax.set_title("Validation: greedy, strict, interface removed (95% intervals)")

        sections.append(_figure(val))
    else:
        sections.append(
            "<p class='meta'>No validation points. Evaluate checkpoints strictly with "
            "<code>seal eval --policy hf:RUN/checkpoints/checkpoint-K --split test --out RUN/validation/step_K</code> "
            "and re-run <code>seal report</code>.</p>"
        )

    shares = [m["labels/share"] for m in metrics]
    labels = [z for z in LABELS if any(z in s for s in shares)]

    def label_area(fig):
        ax = fig.add_subplot(111)
        ax.stackplot(rounds, *[[s.get(z, 0.0) * 100 for s in shares] for z in labels], labels=labels,
                     colors=[LABEL_COLOURS.get(z) for z in labels])  # fmt: skip
        ax.set_xlabel("round")
        ax.set_ylabel("share of turns (%)")
        ax.set_ylim(0, 100)
        ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
        ax.set_title("Label distribution over rounds")

    sections += ["<h2>Failure labels over training</h2>", _figure(label_area)]

    components = sorted({c for m in metrics for c in m["interface/active"]})
    if components:

        def timeline(fig):
            ax = fig.add_subplot(111)
            grid = [[1 if c in m["interface/active"] else 0 for m in metrics] for c in components]
            ax.imshow(grid, aspect="auto", cmap="Greens", vmin=0, vmax=1, interpolation="nearest",
                      extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(components) - 0.5, -0.5))  # fmt: skip
            ax.set_yticks(range(len(components)), components, fontsize=8)
            ax.set_xlabel("round")
            ax.set_title("Active interface components (training only)")

        sections += ["<h2>Interface evolution</h2>", _figure(timeline)]
    else:
        sections += ["<h2>Interface evolution</h2>", "<p class='meta'>No training-time interface component was ever on.</p>"]

    weights = [m["apatch/label_weights"] for m in metrics]
    weight_labels = [z for z in LABELS if any(z in w for w in weights)]

    def weight_lines(fig):
        ax = fig.add_subplot(111)
        for label in weight_labels:
            ax.plot(rounds, [w.get(label, 1.0) for w in weights], label=label, color=LABEL_COLOURS.get(label))
        ax.set_xlabel("round")
        ax.set_ylabel("utility ρ(z)")
        ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
        ax.set_title("A-Patch label weights over rounds")

    table = ("<table><tr><th>label</th>" + "".join(f"<th>r{r}</th>" for r in rounds[-8:]) + "</tr>"
             + "".join(f"<tr><td>{_e(z)}</td>" + "".join(f"<td>{w.get(z, 1.0):.3f}</td>" for w in weights[-8:]) + "</tr>"
                       for z in weight_labels) + "</table>")  # fmt: skip
    sections += ["<h2>A-Patch weights</h2>", _figure(weight_lines), table]

    def distributions(fig):
        left, right = fig.add_subplot(121), fig.add_subplot(122)
        left.plot(rounds, [m["rollout/reward_mean"] for m in metrics], marker="o", label="mean reward")
        left.plot(rounds, [m["apatch/scale_mean"] for m in metrics], marker="s", label="mean A-Patch scale")
        left.fill_between(rounds, [m["apatch/scale_min"] for m in metrics], [m["apatch/scale_max"] for m in metrics],
                          alpha=0.2, label="scale min–max")  # fmt: skip
        left.set_xlabel("round")
        left.legend(fontsize=8)
        left.set_title("Reward and A-Patch scale")
        right.hist([r["apatch_weight"] for r in rows], bins=20, color="#fb8c00")
        right.set_xlabel("A-Patch weight w_j")
        right.set_ylabel("episodes")
        right.set_title("Distribution of trajectory weights")

    sections += ["<h2>Rewards and scales</h2>", _figure(distributions)]

    seconds = metrics[-1].get("time/seconds", {})
    if seconds:
        total = sum(seconds.values()) or 1.0
        sections += ["<h2>Where the time went</h2>", "<table><tr><th>phase</th><th>seconds</th><th>share</th></tr>"
                     + "".join(f"<tr><td>{_e(k)}</td><td>{v:.1f}</td><td>{v / total:.1%}</td></tr>" for k, v in seconds.items())
                     + "</table>"]  # fmt: skip
    return _page(f"seal-rl training: {run_dir.name}", sections)


def write_report(run_dir: Path) -> Path:
    """Write ``RUN/report.html`` for an evaluation or training run directory and return its path."""
    run_dir = Path(run_dir)
    if (run_dir / "metrics.jsonl").exists():
        page = training_report(run_dir)
    elif (run_dir / "results.jsonl").exists():
        page = eval_report(run_dir)
    else:
        raise SealError(f"{run_dir} is neither an evaluation run (results.jsonl) nor a training run (metrics.jsonl).")
    target = run_dir / REPORT_FILE
    target.write_text(page, encoding="utf-8")
    return target
