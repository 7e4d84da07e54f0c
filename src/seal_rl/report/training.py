"""The training report: what a SEAL run did, round by round.

* a warning at the top when the run had no learning signal (every group's rewards identical, so
  every GRPO advantage and the loss were 0);
* rollout success per category over rounds, one small chart per category with its Wilson band;
* validation (``kind: validation`` lines of ``metrics.jsonl``, or ``seal eval`` runs of
  checkpoints in ``RUN/validation/step_N/``);
* TRL's optimisation metrics (loss, KL, entropy, gradient norm, clip fraction, completion length,
  zero-variance fraction), each on its own axis: from ``metrics.jsonl`` when the run logged them
  there (with or without a ``train/`` prefix), else from the newest checkpoint's
  ``trainer_state.json`` ``log_history``;
* the label distribution, the interface timeline (legend, the labels under pressure that switched
  each component on, and the system prompt the agent saw under each state, rendered with
  :class:`~seal_rl.interface.Interface` for one task of the run), the A-Patch weights, reward and
  A-Patch scale on separate axes, a browser of the training rollouts (``trajectories.jsonl``),
  and where the time went.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup

from seal_rl import jsonl
from seal_rl.diagnose import LABELS
from seal_rl.errors import SealError, SealWarning
from seal_rl.report.episodes import episode_html
from seal_rl.report.interface import example_task, interface_section
from seal_rl.report.page import FILTER_JS, LABEL_COLOURS, ROLLOUT_CAP, figure, filters, page, render, sample_evenly
from seal_rl.stats import wilson
from seal_rl.tasks import CATEGORIES

METRICS_FILE = "metrics.jsonl"
TRAJECTORIES_FILE = "trajectories.jsonl"
TIME_FILE = "time.json"

# TRL 1.16 GRPOTrainer / transformers Trainer log keys, with a readable name each.
OPTIMISATION_METRICS: tuple[tuple[str, str], ...] = (
    ("loss", "loss"),
    ("kl", "KL to the reference"),
    ("entropy", "entropy"),
    ("grad_norm", "gradient norm"),
    ("clip_ratio/region_mean", "clip fraction"),
    ("completions/mean_length", "completion length (tokens)"),
    ("frac_reward_zero_std", "zero-variance fraction"),
)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; torn and corrupt lines are reported and left out."""
    if not path.exists():
        return []
    lines = jsonl.read(path)
    for problem in lines.problems:
        warnings.warn(problem, SealWarning, stacklevel=2)
    return [value for value in lines.values if isinstance(value, dict)]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value == value else None


def optimisation_metrics(run_dir: Path, lines: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, dict[int, float]]]:
    """TRL's metrics by optimizer step, and where they came from.

    ``metrics.jsonl`` lines carrying any of :data:`OPTIMISATION_METRICS` (``kl`` or ``train/kl``)
    win; otherwise the ``log_history`` of the newest ``checkpoints/*/trainer_state.json``."""
    source, found = METRICS_FILE, _collect(lines)
    if not found:
        states = sorted((run_dir / "checkpoints").glob("checkpoint-*/trainer_state.json"),
                        key=lambda p: int(p.parent.name.rsplit("-", 1)[-1]) if p.parent.name.rsplit("-", 1)[-1].isdigit() else -1)  # fmt: skip
        if states:
            try:
                history = json.loads(states[-1].read_text()).get("log_history", [])
            except (OSError, json.JSONDecodeError):
                history = []
            source, found = str(states[-1].relative_to(run_dir)), _collect([h for h in history if isinstance(h, dict)])
    return source, found


def _collect(lines: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    series: dict[str, dict[int, float]] = {}
    for line in lines:
        step = _number(line.get("step", line.get("train/global_step")))
        if step is None:
            continue
        for key, _ in OPTIMISATION_METRICS:
            value = _number(line.get(key, line.get(f"train/{key}")))
            if value is not None:
                series.setdefault(key, {})[int(step)] = value
    return series


def no_learning_signal(rollouts: Sequence[Mapping[str, Any]], trl: Mapping[str, Mapping[int, float]]) -> str | None:
    """Why the run had no learning signal, or None: every group's rewards were identical in every
    round (``frac_reward_zero_std`` = 1, or our ``rollout/groups_zero_variance`` = 1), so every
    GRPO advantage was 0 (with ``loss`` 0 as the symptom)."""
    zero_std = list(trl.get("frac_reward_zero_std", {}).values()) or [
        m["rollout/groups_zero_variance"] for m in rollouts if _number(m.get("rollout/groups_zero_variance")) is not None]
    losses = list(trl.get("loss", {}).values())
    if zero_std and all(v >= 1.0 for v in zero_std):
        loss = " and the loss was 0 at every step" if losses and all(abs(v) < 1e-12 for v in losses) else ""
        return (f"No learning signal: in every logged step all of a group's rollouts had the same reward "
                f"(zero-variance fraction = 1), so every GRPO advantage was 0{loss}. The model did not learn from this run. "
                "Make rewards differ within groups: more generations per task, a higher temperature, tasks the model "
                "sometimes solves, or a warm start.")  # fmt: skip
    if losses and all(abs(v) < 1e-12 for v in losses):
        return "No learning signal: the loss was 0 at every logged step."
    return None


def success_section(rows: Sequence[Mapping[str, Any]]) -> Markup:
    """One small chart per category: rollout success over rounds with its 95% Wilson band."""
    counts: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for row in rows:
        cell = counts[row["category"]][row["round"]]
        cell[0] += row.get("reward") == 1.0
        cell[1] += 1
    names = [c for c in CATEGORIES if c in counts] + sorted(set(counts) - set(CATEGORIES))

    def draw(fig):
        axes = fig.subplots(1, max(1, len(names)), sharey=True, squeeze=False)[0]
        for ax, category in zip(axes, names):
            per_round = counts[category]
            xs = sorted(per_round)
            bands = [wilson(*per_round[x]) for x in xs]
            ax.fill_between(xs, [b[0] * 100 for b in bands], [b[1] * 100 for b in bands], alpha=0.2, color="#1e88e5", linewidth=0)
            ax.plot(xs, [per_round[x][0] / per_round[x][1] * 100 for x in xs], marker="o", markersize=3, color="#0d47a1")
            ax.set_title(category, fontsize=10)
            ax.set_xlabel("round")
            ax.set_ylim(0, 100)
        axes[0].set_ylabel("rollout success (%)")
        fig.suptitle("Training rollouts: success per category (95% Wilson bands)", fontsize=11)

    return figure(draw, height=3.2, alt="rollout success per category")


def _validation(run_dir: Path, lines: Sequence[Mapping[str, Any]]) -> tuple[str, dict[int, dict[str, Any]]]:
    """Validation points: the in-training validation (``metrics.jsonl`` lines of kind ``validation``,
    by round) or else summaries of ``seal eval`` runs of checkpoints saved as RUN/validation/step_N/
    (by optimizer step)."""
    logged = [m for m in lines if m.get("kind") == "validation" and "round" in m]
    if logged:
        return "round", {m["round"]: {key.removeprefix("validation/"): value for key, value in m.items()} for m in logged}
    points = {}
    for summary in sorted((run_dir / "validation").glob("step_*/summary.json")):
        try:
            points[int(summary.parent.name.split("_", 1)[1])] = json.loads(summary.read_text())
        except (ValueError, OSError):
            continue
    return "optimizer step", dict(sorted(points.items()))


def validation_section(run_dir: Path, lines: Sequence[Mapping[str, Any]]) -> Markup:
    axis, validation = _validation(run_dir, lines)
    if not validation:
        return Markup(
            "<p class='meta'>No validation points. Turn on validation in the recipe (<code>eval.every_rounds</code>) or "
            "evaluate checkpoints strictly with <code>seal eval --policy hf:RUN/checkpoints/checkpoint-K --split test "
            "--out RUN/validation/step_K</code> and re-run <code>seal report</code>.</p>"
        )
    steps = list(validation)
    names = [c for c in CATEGORIES if any(c in (validation[s].get("categories") or {}) for s in steps)]

    def draw(fig):
        axes = fig.subplots(1, len(names) + 1, sharey=True, squeeze=False)[0]
        averages = [(s, validation[s]) for s in steps if "average_ci95" in validation[s]]
        panels = [("average of categories", [(s, v["average"], v["average_ci95"]) for s, v in averages])]
        for c in names:
            points = [(s, validation[s]["categories"].get(c)) for s in steps]
            panels.append((c, [(s, p["success_rate"], p["ci95"]) for s, p in points if p]))
        for ax, (title, points) in zip(axes, panels):
            xs = [s for s, _, _ in points]
            ax.fill_between(xs, [b[0] * 100 for _, _, b in points], [b[1] * 100 for _, _, b in points], alpha=0.2,
                            color="#43a047", linewidth=0)  # fmt: skip
            ax.plot(xs, [r * 100 for _, r, _ in points], marker="o", markersize=3, color="#1b5e20")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(axis)
            ax.set_ylim(0, 100)
        axes[0].set_ylabel("validation success (%)")
        fig.suptitle("Validation: greedy, strict, interface removed (95% intervals)", fontsize=11)

    return figure(draw, height=3.2, alt="validation")


def optimisation_section(source: str, series: Mapping[str, Mapping[int, float]]) -> list[Markup]:
    shown = [(key, name) for key, name in OPTIMISATION_METRICS if series.get(key)]
    if not shown:
        return [Markup("<p class='meta'>No optimisation metrics logged (neither in metrics.jsonl nor in a checkpoint's "
                       "trainer_state.json).</p>")]  # fmt: skip
    columns = 4 if len(shown) > 3 else len(shown)
    rows = (len(shown) + columns - 1) // columns

    def draw(fig):
        for i, (key, name) in enumerate(shown):
            ax = fig.add_subplot(rows, columns, i + 1)
            xs = sorted(series[key])
            ax.plot(xs, [series[key][x] for x in xs], marker="o" if len(xs) < 40 else None, markersize=3, color="#6a1b9a")
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("optimizer step")
            ax.tick_params(labelsize=8)

    return [figure(draw, height=2.6 * rows, alt="optimisation metrics"),
            render("<p class='meta'>From {{ source }}; each metric on its own axis.</p>", source=source)]


def time_section(rollouts: Sequence[Mapping[str, Any]], end: Mapping[str, Any] | None) -> list[Markup]:
    """Seconds per phase over the whole run.

    ``time/seconds`` is cumulative over the run: a checkpoint keeps the seconds so far and a resumed
    run counts on from them. Runs of older versions restarted at zero on resume, so a drop starts a
    new session and the total is the sum over sessions of each one's last value. A round's optimisation is booked
    when the next round starts; ``time.json``, written when training ends, books the last one. The
    optimisation window also holds in-training validation and the policy's forward and backward
    passes (``update/policy``), which have their own rows, so they are subtracted there; the
    reference model's and old policy's log-probabilities (``update/reference``,
    ``update/old_logprobs``) lie outside every other phase."""
    timed = [m["time/seconds"] for m in rollouts if isinstance(m.get("time/seconds"), dict)]
    complete = isinstance(end, Mapping) and isinstance(end.get("time/seconds"), dict) and end.get("round") == rollouts[-1]["round"]
    if complete:
        timed.append(end["time/seconds"])
    if not timed:
        return []
    totals: Counter[str] = Counter()
    previous: dict[str, float] = {}
    for seconds in timed:
        current = {k: float(v) for k, v in seconds.items() if _number(v) is not None}
        if any(current.get(k, 0.0) < v for k, v in previous.items()):  # a new session: bank the old one
            totals.update(previous)
        previous = current
    totals.update(previous)
    if "validation" in totals and "optimisation" in totals:
        totals["optimisation"] = max(0.0, totals["optimisation"] - totals["validation"])
    if "update/policy" in totals and "optimisation" in totals:  # its own row: what is left is checkpoints and logging
        totals["optimisation"] = max(0.0, totals["optimisation"] - totals["update/policy"])
    total = sum(totals.values()) or 1.0
    note = ("" if complete else "The last round's optimisation is not included: the run has no time.json for its last "
            "round (training has not finished, or an older seal-rl wrote it).")  # fmt: skip
    return [Markup("<h2>Where the time went</h2>"), render(
        """<table><tr><th>phase</th><th>seconds</th><th>share</th></tr>{% for k, v in rows %}<tr><td>{{ k }}</td>
<td>{{ "%.1f"|format(v) }}</td><td>{{ (v / total)|pct }}</td></tr>{% endfor %}<tr><th>total</th><th>{{ "%.1f"|format(total) }}</th>
<th>100.0%</th></tr></table>{% if note %}<p class="meta">{{ note }}</p>{% endif %}""",
        rows=sorted(totals.items(), key=lambda kv: -kv[1]), total=total, note=note)]  # fmt: skip


def _trajectory_rows(path: Path, cap: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Light fields of every row (for the charts) and the full rows of at most ``cap`` of them,
    spread evenly, plus the row count; full rows outside the sample are never kept in memory."""
    if not path.exists():
        return [], [], 0
    with open(path, encoding="utf-8") as handle:
        total = sum(1 for line in handle if line.strip())
    keep = set(sample_evenly(range(total), cap))
    light, full, index = [], [], 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                index += 1
                continue
            if isinstance(row, dict) and "round" in row and "category" in row:
                light.append({k: row.get(k) for k in ("round", "category", "reward", "apatch_weight")})
                if index in keep:
                    full.append(row)
            index += 1
    return light, full, total


def training_report(run_dir: Path, *, cap: int = ROLLOUT_CAP) -> str:
    lines = read_lines(run_dir / METRICS_FILE)
    rollouts = sorted((m for m in lines if m.get("kind", "rollout") == "rollout" and "round" in m and "labels/share" in m),
                      key=lambda m: m["round"])  # one per round; lines of other kinds (TRL's, validation) are read apart
    if not rollouts:
        raise SealError(f"{run_dir}/metrics.jsonl has no rounds yet.")
    light, sampled, total = _trajectory_rows(run_dir / TRAJECTORIES_FILE, cap)
    rounds = [m["round"] for m in rollouts]
    source, trl = optimisation_metrics(run_dir, lines)
    warning = no_learning_signal(rollouts, trl)
    sections: list[Any] = [
        render("<p class='meta'>{{ rounds }} rounds · {{ episodes }} episodes · recipe: <code>{{ recipe }}</code></p>"
               "{% if warning %}<p class='warning' id='no-signal'><b>Warning.</b> {{ warning }}</p>{% endif %}",
               rounds=len(rounds), episodes=total, recipe=str(run_dir / "config.yaml"), warning=warning),  # fmt: skip
        Markup("<h2>Success over training</h2>"), success_section(light),
        Markup("<h2>Validation</h2>"), validation_section(run_dir, lines),
        Markup("<h2>Optimisation</h2>"), *optimisation_section(source, trl),
    ]

    shares = [m.get("labels/share") or {} for m in rollouts]
    labels = [z for z in LABELS if any(z in s for s in shares)]

    def label_area(fig):
        ax = fig.add_subplot(111)
        ax.stackplot(rounds, *[[s.get(z, 0.0) * 100 for s in shares] for z in labels], labels=labels,
                     colors=[LABEL_COLOURS.get(z) for z in labels])  # fmt: skip
        ax.set_xlabel("round")
        ax.set_ylabel("share of turns (%)")
        ax.set_ylim(0, 100)
        ax.legend(fontsize=7, ncol=1, loc="center left", bbox_to_anchor=(1.0, 0.5))
        ax.set_title("Label distribution over rounds")

    sections += [Markup("<h2>Failure labels over training</h2>"), figure(label_area, alt="labels over rounds")]
    example = next((r for r in sampled if r.get("task_id")), {})
    task = example_task(example.get("task_id"), example.get("category"))
    sections += [Markup("<h2>Interface evolution</h2>"), *interface_section(run_dir, rollouts, task)]

    weights = [m.get("apatch/label_weights") or {} for m in rollouts]
    weight_labels = [z for z in LABELS if any(z in w for w in weights)]

    def weight_lines(fig):
        ax = fig.add_subplot(111)
        for label in weight_labels:
            ax.plot(rounds, [w.get(label, 1.0) for w in weights], label=label, color=LABEL_COLOURS.get(label))
        ax.set_xlabel("round")
        ax.set_ylabel("utility ρ(z)")
        ax.legend(fontsize=7, ncol=1, loc="center left", bbox_to_anchor=(1.0, 0.5))
        ax.set_title("A-Patch label weights over rounds")

    recent = list(zip(rounds, weights))[-8:]
    sections += [Markup("<h2>A-Patch weights</h2>"), figure(weight_lines, alt="A-Patch weights"), render(
        """<table><tr><th>label</th>{% for r, _ in recent %}<th>r{{ r }}</th>{% endfor %}</tr>{% for z in labels %}<tr><td>{{ z }}</td>
{% for _, w in recent %}<td>{{ "%.3f"|format(w.get(z, 1.0)) }}</td>{% endfor %}</tr>{% endfor %}</table>""",
        recent=recent, labels=weight_labels)]  # fmt: skip

    def distributions(fig):
        reward, scale, histogram = fig.subplots(1, 3)
        reward.plot(rounds, [m.get("rollout/reward_mean", float("nan")) for m in rollouts], marker="o", markersize=3, color="#1565c0")
        reward.set_xlabel("round")
        reward.set_ylabel("mean reward")
        reward.set_ylim(-0.02, 1.02)
        reward.set_title("Mean rollout reward")
        scale.fill_between(rounds, [m.get("apatch/scale_min", 1.0) for m in rollouts], [m.get("apatch/scale_max", 1.0) for m in rollouts],
                           alpha=0.25, color="#fb8c00", linewidth=0, label="min–max")  # fmt: skip
        scale.plot(rounds, [m.get("apatch/scale_mean", 1.0) for m in rollouts], marker="s", markersize=3, color="#e65100", label="mean")
        scale.set_xlabel("round")
        scale.set_ylabel("w_j")
        scale.legend(fontsize=8)
        scale.set_title("A-Patch trajectory scale")
        histogram.hist([r["apatch_weight"] for r in light if _number(r.get("apatch_weight")) is not None], bins=20, color="#fb8c00")
        histogram.set_xlabel("A-Patch weight w_j")
        histogram.set_ylabel("episodes")
        histogram.set_title("All trajectory weights")

    sections += [Markup("<h2>Rewards and scales</h2>"), figure(distributions, height=3.2, alt="reward and scale")]
    sections += time_section(rollouts, _json(run_dir / TIME_FILE))

    categories = sorted({r["category"] for r in sampled}, key=lambda c: (c not in CATEGORIES, CATEGORIES.index(c) if c in CATEGORIES else 0, c))
    present = [z for z in LABELS if any(z in (r.get("labels") or []) for r in sampled)]
    sections += [
        Markup("<h2>Training rollouts</h2>"),
        render("{% if shown < total %}<p class='meta'>Showing {{ shown }} of {{ total }} rollouts, spread evenly over the run "
               "(the page keeps at most {{ shown }}).</p>{% endif %}", shown=len(sampled), total=total),  # fmt: skip
        filters(categories, present, ["pass", "fail", "error"]),
        *(episode_html(r, {"round": r.get("round"), "w": _fmt(r.get("apatch_weight")),
                           "advantage": f"{_fmt(r.get('advantage_before'))} → {_fmt(r.get('advantage_after'))}"})
          for r in sampled),  # fmt: skip
    ]
    return page(f"seal-rl training: {run_dir.name}", sections, FILTER_JS)


def _fmt(value: Any) -> str:
    number = _number(value)
    return f"{number:.3g}" if number is not None else "–"
