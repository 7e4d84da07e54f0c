"""A study's page: its tables (Markdown, printed as they are written), its learning curves and one
self-contained HTML page of both.

:func:`render` turns a study's results (:func:`seal_rl.study.summary.summarize_study` plus the design)
into four tables — the curves by round (mean of seeds), the outcomes pooled over seeds with the
comparisons with the baseline, where the sampled episodes' passed turns are, and each run by round;
the committed records of a study give the same bytes back (``tests/study-tradingbot/``).

A study of an environment family (``results["family"]``, docs/guides/your-environment.md) says what scored it
(τ²'s reward, the family's verifier) where a BFCL study says "bfcl protocol", and leaves out the
per-turn columns: a family's episode is one conversation with one check.
"""

from __future__ import annotations

import base64
import html
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from seal_rl.study.design import BASELINE


def _mean(values: list[float]) -> float:
    """The mean of ``values`` (0 for none)."""
    return sum(values) / len(values) if values else 0.0


def _curve(seeds: list[dict], key: str) -> str:
    rounds = min(len(s[key]) for s in seeds)
    return " → ".join(f"{_mean([s[key][i] for s in seeds]):.2f}" for i in range(rounds))


def _vs(entry: dict, key: str) -> str:
    vs = entry.get(key)
    return "—" if vs is None else f"{vs['difference']:+.2f} ({vs['ci95'][0]:+.2f} to {vs['ci95'][1]:+.2f}), p={vs['p_mcnemar']:.2f}"


def scored_by(family: str | None, short: bool = False) -> str:
    """What scored a study's episodes: BFCL's protocol, τ²'s reward, or a family's verifier (``short``: a
    plot's label)."""
    if family is None:
        return "bfcl" if short else "bfcl protocol"
    if family.startswith("tau2-"):
        return "τ² reward" if short else "seal protocol, scored by the τ² reward (τ²'s evaluate_simulation)"
    return "the family's verifier" if short else f"seal protocol, scored by the family's verifier ({family})"


PER_TURN = ("rollout turns passed", "turn anchors varied", "held-out turn pass", "test turn pass")
"""columns of a BFCL study that a family's one-check conversations leave out"""


def render(results: dict, console: Console) -> str:
    """Three tables, printed and returned as Markdown: the curves per round, the outcomes, and where
    the sampled episodes' passed turns are (a family's study: its conversations passed)."""
    warm = results["warm_start"]
    held = warm.get("held_out", {})
    family = results.get("family")
    tasks = (f"held-out: {len(results['held_out'])} training-split tasks never trained on; test: {len(results['tests'])} "
             "test-split tasks") if family is None else (f"family {family}; held-out: {len(results['held_out'])} tasks never "
                                                         f"trained on; test: {len(results['tests'])} tasks")  # fmt: skip
    title = (("Interim (each run at the round it has reached; the outcomes compare those rounds): " if results.get("interim") else "")
             + f"{results['recipe']}, {results['rounds']} rounds; {tasks}; greedy, {scored_by(family)}; compared with "
             f"{results.get('baseline', BASELINE)}. Warm start: "
             f"held-out success {held.get('success', 0):.2f}, accepted-call share {held.get('call_share', 0):.2f}"
             + (f"; test success {warm['test']['success'][0]:.2f}, call share {warm['test']['call_share']:.2f}" if "test" in warm else ""))  # fmt: skip
    curves = {"arm": lambda a, e: a, "seeds": lambda a, e: ",".join(str(s["seed"]) for s in e["seeds"]),
              "rounds validated": lambda a, e: ",".join(str(s["held_out_rounds"][-1]) for s in e["seeds"]),
              "rollout success": lambda a, e: _curve(e["seeds"], "rollout_success"),
              "rollout turns passed": lambda a, e: _curve(e["seeds"], "rollout_progress"),
              "non-zero-advantage groups": lambda a, e: _curve(e["seeds"], "nonzero_advantage_groups"),
              "turn anchors varied": lambda a, e: _curve(e["seeds"], "turn_anchors_varied"),
              "held-out success (round 0 = warm start)": lambda a, e: _curve(e["seeds"], "held_out_success"),
              "held-out turn pass": lambda a, e: _curve(e["seeds"], "held_out_turn_pass"),
              "held-out accepted-call share": lambda a, e: _curve(e["seeds"], "held_out_call_share"),
              "held-out most-called tool: share of accepted calls": lambda a, e: _top_tool(e["seeds"], "held_out_tools")}  # fmt: skip
    outcomes = {"arm": lambda a, e: a,
                "held-out final (95% CI)": lambda a, e: "{:.2f} ({:.2f}–{:.2f})".format(*e["held_out_final"]),
                "held-out vs baseline: Δ (95% CI), McNemar p": lambda a, e: _vs(e, "held_out_vs_vanilla"),
                "test success (95% CI)": lambda a, e: _test(e, lambda t: "{:.2f} ({:.2f}–{:.2f})".format(*t["success"])),
                "test call share": lambda a, e: _test(e, lambda t: f"{t['call_share']:.2f}"),
                "test turn pass": lambda a, e: _test(e, lambda t: f"{t['turn_pass_rate']:.2f}"),
                "test vs baseline": lambda a, e: _vs(e, "test_vs_vanilla")}  # fmt: skip
    turns = {"arm": lambda a, e: a,
             "first scorable turn passed": lambda a, e: _turns(e["seeds"], "first_passed", "first_reached"),
             "later turns passed": lambda a, e: _turns(e["seeds"], "later_passed", "later_reached"),
             "later turns right where the model stood (turn-local)": lambda a, e: _turns(e["seeds"], "later_local", "later_reached"),
             "most-called tool: share of accepted calls": lambda a, e: _top_tool(e["seeds"], "tools")}  # fmt: skip
    turns_caption, run_columns = "Turns of the sampled episodes, by round (summed over seeds)", list(RUN_COLUMNS)
    if family is not None:  # one conversation, one check: no per-turn column
        curves, outcomes = ({k: v for k, v in table.items() if k not in PER_TURN} for table in (curves, outcomes))
        turns = {"arm": lambda a, e: a,
                 f"conversations passed ({scored_by(family, short=True)})": lambda a, e: _turns(e["seeds"], "first_passed", "first_reached"),
                 "most-called tool: share of accepted calls": lambda a, e: _top_tool(e["seeds"], "tools")}  # fmt: skip
        turns_caption, run_columns = "Conversations of the sampled episodes, by round (summed over seeds)", list(FAMILY_RUN_COLUMNS)
    markdown = [title, ""]
    for caption, columns in (("By round (mean of seeds)", curves), ("Outcomes (pooled over seeds)", outcomes),
                             (turns_caption, turns)):  # fmt: skip
        table = Table(*columns, title=caption)
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for arm, entry in results["arms"].items():
            row = [cell(arm, entry) for cell in columns.values()]
            table.add_row(*row)
            lines.append("| " + " | ".join(row) + " |")
        console.print(table)
        markdown += [f"**{caption}**", "", *lines, ""]
    caption, columns = "Each run, by round", run_columns
    table = Table(*columns, title=caption)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in run_rows(results):
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    markdown += [f"**{caption}**", "", *lines, ""]
    console.print(title, highlight=False, soft_wrap=True)
    return "\n".join(markdown)


RUN_COLUMNS = ("arm", "seed", "round", "rollout turns passed", "groups with a spread", "first scorable turn passed",
               "later turns passed (turn-locally)", "accepted calls", "held-out success", "held-out turn pass",
               "held-out most-called tool")  # fmt: skip
FAMILY_RUN_COLUMNS = ("arm", "seed", "round", "rollout success", "groups with a spread", "conversations passed",
                      "accepted calls", "held-out success", "held-out most-called tool")  # fmt: skip


def run_rows(results: dict) -> list[list[str]]:
    """One row per run and round: the figures the write-up quotes for each run (sampled episodes of the
    round, then its greedy held-out validation; "—" where the round has not been measured)."""
    rows = []
    for arm, entry in results["arms"].items():
        for s in entry["seeds"]:
            validated = {r: k for k, r in enumerate(s["held_out_rounds"])}
            for r in range(1, len(s["rollout_progress"]) + 1):
                turns = s["turns"][r - 1] if r <= len(s["turns"]) else None
                tools = Counter(s["tools"][r - 1]) if r <= len(s["tools"]) else None
                k = validated.get(r)
                held = s["held_out_tasks"][k] if k is not None else None
                top = Counter(s["held_out_tools"][k]) if k is not None and k < len(s["held_out_tools"]) else Counter()
                row = [arm, str(s["seed"]), str(r), f"{s['rollout_progress'][r - 1]:.1%}", f"{s['nonzero_advantage_groups'][r - 1]:.2f}",
                       f"{turns['first_passed']}/{turns['first_reached']}" if turns else "—",
                       f"{turns['later_passed']}/{turns['later_reached']} ({turns['later_local']})" if turns else "—",
                       str(tools.total()) if tools is not None else "—",
                       f"{sum(v == 1.0 for v in held.values())}/{len(held)}" if held is not None else "—",
                       f"{s['held_out_turn_pass'][k]:.2f}" if k is not None else "—",
                       (lambda n, c: f"{n} {c / top.total():.2f}")(*top.most_common(1)[0]) if top else "—"]  # fmt: skip
                if results.get("family") is not None:  # FAMILY_RUN_COLUMNS: rollout success, no later turns nor turn pass
                    row = [*row[:3], f"{s['rollout_success'][r - 1]:.2f}", row[4], row[5], *row[7:9], row[10]]
                rows.append(row)
    return rows


def _turns(seeds: list[dict], passed: str, reached: str) -> str:
    rounds = min(len(s["turns"]) for s in seeds)
    return " → ".join(f"{sum(s['turns'][i][passed] for s in seeds)}/{sum(s['turns'][i][reached] for s in seeds)}" for i in range(rounds))


def _top_tool(seeds: list[dict], key: str) -> str:
    """Per round, the tool called most (summed over seeds) and its share; named once if it never changes."""
    rounds = [sum((Counter(s[key][i]) for s in seeds), Counter()) for i in range(min(len(s[key]) for s in seeds))]
    top = [(c.most_common(1)[0], c.total()) if c else (("none", 0), 0) for c in rounds]
    shares = [f"{count / total if total else 0:.2f}" for (_, count), total in top]
    names = {name for (name, _), _ in top}
    if len(names) == 1:
        return f"{names.pop()}: " + " → ".join(shares)
    return " → ".join(f"{name} {share}" for ((name, _), _), share in zip(top, shares))


def _test(entry: dict, cell) -> str:
    return "—" if "test_final" not in entry else cell(entry["test_final"])


PANELS = [("held_out_success", "held-out success (greedy, bfcl)", True), ("held_out_turn_pass", "held-out turn pass rate", True),
          ("held_out_call_share", "held-out accepted-call share", True), ("rollout_success", "rollout success (sampled)", False),
          ("rollout_progress", "rollout turns passed (sampled)", False),
          ("nonzero_advantage_groups", "groups with non-zero advantages", False)]  # fmt: skip


def plot(results: dict, path: Path) -> None:
    """Learning curves per arm: the mean of its seeds (thick) and each seed (thin)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels, family = PANELS, results.get("family")
    if family is not None:  # one check per conversation: no turn panels; success as the family scores it
        panels = [("held_out_success", f"held-out success (greedy, {scored_by(family, short=True)})", True),
                  *(panel for panel in PANELS[2:] if panel[0] != "rollout_progress")]  # fmt: skip
    fig, axes = plt.subplots(2, len(panels) // 2, figsize=(5 * (len(panels) // 2), 7.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (key, label, from_zero), ax in zip(panels, axes.flat):
        for k, (arm, entry) in enumerate(results["arms"].items()):
            seeds, colour = entry["seeds"], colours[k % len(colours)]
            start = 0 if from_zero else 1
            for s in seeds:
                ax.plot(range(start, start + len(s[key])), s[key], color=colour, alpha=0.3, linewidth=0.8)
            n = min(len(s[key]) for s in seeds)
            ax.plot(range(start, start + n), [_mean([s[key][i] for s in seeds]) for i in range(n)], color=colour,
                    linewidth=2.2, marker="o", label=f"{arm} ({len(seeds)} seed{'s' * (len(seeds) > 1)})")  # fmt: skip
        ax.set(xlabel="round (0 = warm start)" if from_zero else "round", ylabel=label, ylim=(-0.03, 1.03))
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{results['recipe']}{f' ({family})' if family else ''}: mean of seeds (thick), each seed (thin)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_html(table_md: str, png: Path, path: Path) -> None:
    """One self-contained page: the tables and the curves (the PNG inlined)."""
    parts, rows = [], []
    for line in table_md.splitlines() + [""]:
        if line.startswith("|"):
            if not line.startswith("|--"):
                rows.append([c.strip() for c in line.strip("|").split(" | ")])
            continue
        if rows:
            parts.append("<table>" + "".join("<tr>" + "".join(f"<{t}>{html.escape(c)}</{t}>" for c in row) + "</tr>"
                                             for row, t in zip(rows, ["th"] + ["td"] * len(rows))) + "</table>")  # fmt: skip
            rows = []
        if line.strip():
            parts.append(f"<p>{html.escape(line.strip('*'))}</p>")
    image = base64.b64encode(png.read_bytes()).decode("ascii")
    path.write_text(
        "<!doctype html><meta charset='utf-8'><title>SEAL vs vanilla GRPO: the held-out study</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top}</style>"
        "<h1>SEAL vs vanilla GRPO: the held-out study</h1>" + "".join(parts)
        + f"<p><img alt='learning curves per arm' src='data:image/png;base64,{image}'></p>",
        encoding="utf-8",
    )




def write_page(results: dict, directory: Path, console: Console) -> Path:
    """Write a study's ``table.md``, ``curves.png`` and ``report.html`` (the page) into ``directory``
    from its results (``summary.json``), printing the tables; returns the page's path."""
    directory.mkdir(parents=True, exist_ok=True)
    table_md = render(results, console)
    (directory / "table.md").write_text(table_md)
    plot(results, directory / "curves.png")
    write_html(table_md, directory / "curves.png", directory / "report.html")
    return directory / "report.html"


def study_summary(directory: Path) -> Path | None:
    """The ``summary.json`` of a study's output directory (its final one, else its interim one), or
    None when ``directory`` holds no study (``seal report`` then reads it as an evaluation run)."""
    import json

    for path in (directory / "summary.json", directory / "interim" / "summary.json"):
        if path.is_file():
            try:
                summary = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                return None
            if isinstance(summary, dict) and "arms" in summary and "warm_start" in summary:
                return path
    return None
