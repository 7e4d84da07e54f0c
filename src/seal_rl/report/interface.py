"""The interface timeline of a training run: which components of Ω were on in which rounds, the
labels under pressure that switched each on (``pressure`` in ``interface/step_N.json``, mapped
as :func:`seal_rl.interface.evolve` maps them), and the system prompt the agent saw under each
state, rendered with :class:`~seal_rl.interface.Interface` for one task of the run."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup

from seal_rl.errors import SealError
from seal_rl.interface import GUIDELINE_FOR_LABEL, PARSE_LABEL, SCHEMA_LABEL, TOOL_ERROR_LABEL, Interface, InterfaceState
from seal_rl.report.page import figure, render
from seal_rl.tasks import CATEGORIES, Task, TaskSet

INTERFACE_TEXT_CAP = 12
"""most distinct interface states whose rendered prompt the page embeds"""
TABLE_ROWS = 60
"""most changes listed in the table (the latest); the chart shows every round"""


def switched_by(component: str, pressure: Sequence[str]) -> list[str]:
    """The labels under pressure that switch ``component`` on, as :func:`seal_rl.interface.evolve`
    maps them (φ_schema ← argument_mismatch; the format note ← argument_mismatch or
    invalid_tool_call; parse hints ← invalid_tool_call; tool hints ← recovery_failure; a guideline
    ← its label; the tool list ← missing_tool_call). Empty: on from the preset."""
    if component.startswith("schema:"):
        wanted = {SCHEMA_LABEL}
    elif component.startswith("guideline:"):
        wanted = {z for z, g in GUIDELINE_FOR_LABEL.items() if g == component.split(":", 1)[1]}
    else:
        wanted = {"format_note": {SCHEMA_LABEL, PARSE_LABEL}, "parse_hints": {PARSE_LABEL},
                  "tool_hints": {TOOL_ERROR_LABEL}, "tool_list": {"missing_tool_call"}}.get(component, set())  # fmt: skip
    return [z for z in pressure if z in wanted]


def interface_states(run_dir: Path) -> dict[int, InterfaceState]:
    """The interface state each round's rollouts used (``interface/step_N.json``)."""
    states = {}
    for path in (run_dir / "interface").glob("step_*.json"):
        try:
            states[int(path.stem.split("_", 1)[1])] = InterfaceState.from_json(json.loads(path.read_text())["used"])
        except (ValueError, KeyError, OSError, SealError, TypeError):
            continue
    return dict(sorted(states.items()))


def _recipe_env(run_dir: Path) -> dict[str, Any]:
    try:
        from omegaconf import OmegaConf

        env = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml")).get("env") or {}
        return dict(env) if isinstance(env, dict) else {}
    except Exception:  # a missing or foreign recipe only costs the rendered prompt its exact mode
        return {}


def rendered_prompt(state: InterfaceState, task: Task, env: Mapping[str, Any]) -> str:
    """What the agent saw before the first question of ``task`` under ``state``."""
    interface = Interface(env.get("prompt_mode", "bfcl_qwen_fc"), state, call_format=env.get("call_format", "hermes"))
    text = "\n\n".join(m["content"] for m in interface.system(task.functions))
    if env.get("prompt_mode") == "chat_template":
        text += "\n\n[tools handed to the chat template]\n" + json.dumps(interface.tool_specs(task.functions), indent=1)
    return text


def example_task(task_id: str | None, category: str | None) -> Task | None:
    if not task_id or category not in CATEGORIES:
        return None
    try:
        return TaskSet.load([category]).get(task_id)
    except (KeyError, SealError):
        return None


_TIMELINE = """<p class="legend"><span><i class="swatch" style="background:#2e7d32"></i>on</span>
<span><i class="swatch" style="background:#fff"></i>off</span> (the state each round's rollouts used)</p>
<table><tr><th>rounds</th><th>components on</th><th>switched on by (labels under pressure)</th></tr>
{% if hidden %}<tr><td colspan="3" class="meta">{{ hidden }} earlier changes not listed (the chart shows every round)</td></tr>{% endif %}
{% for row in rows %}<tr><td>{{ row.rounds }}</td><td>{{ row.components|join(", ") or "none" }}</td>
<td>{% for c, labels in row.reasons %}{{ c }} ← {{ labels|join(", ") or "preset" }}{% if not loop.last %}; {% endif %}{% endfor %}
{% if row.pressure %}<br><span class="meta">under pressure: {{ row.pressure|join(", ") }}</span>{% endif %}</td></tr>{% endfor %}</table>
{% if texts %}<p class="meta">The system prompt the agent saw, rendered for task {{ task_id }} (one state per change):</p>
{% for t in texts %}<details><summary>rounds {{ t.rounds }}: {{ t.components|join(", ") or "base interface" }}</summary><pre>{{ t.text }}</pre></details>{% endfor %}
{% if omitted %}<p class="meta">{{ omitted }} later states not rendered (the page keeps {{ texts|length }}).</p>{% endif %}{% endif %}"""


def _spans(rounds: Sequence[int], keys: Sequence[Any]) -> list[tuple[int, int, int]]:
    """Runs of equal keys: (first round, last round, index of the first)."""
    spans: list[tuple[int, int, int]] = []
    for i, key in enumerate(keys):
        if spans and keys[spans[-1][2]] == key:
            spans[-1] = (spans[-1][0], rounds[i], spans[-1][2])
        else:
            spans.append((rounds[i], rounds[i], i))
    return spans


def interface_section(run_dir: Path, rollouts: Sequence[Mapping[str, Any]], task: Task | None) -> list[Markup]:
    states = interface_states(run_dir)
    active = {m["round"]: list(m.get("interface/active") or []) for m in rollouts}
    for r, s in states.items():
        active.setdefault(r, s.active_components)
    rounds = sorted(active)
    components = sorted({c for r in rounds for c in active[r]})
    if not components:
        return [Markup("<p class='meta'>No training-time interface component was ever on.</p>")]

    def timeline(fig):
        ax = fig.add_subplot(111)
        grid = [[1 if c in active[r] else 0 for r in rounds] for c in components]
        ax.imshow(grid, aspect="auto", cmap="Greens", vmin=0, vmax=1.2, interpolation="nearest",
                  extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(components) - 0.5, -0.5))  # fmt: skip
        ax.set_yticks(range(len(components)), components, fontsize=8)
        ax.set_xlabel("round")
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color="#2e7d32", label="on"), Patch(facecolor="white", edgecolor="#999", label="off")],
                  fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))  # fmt: skip
        ax.set_title("Active interface components (training only)")

    keys = [(tuple(active[r]), tuple(states[r].pressure) if r in states else ()) for r in rounds]
    rows = []
    spans = _spans(rounds, keys)
    for first, last, i in spans[-TABLE_ROWS:]:
        on, pressure = keys[i]
        rows.append({"rounds": f"{first}" if first == last else f"{first}–{last}", "components": on, "pressure": pressure,
                     "reasons": [(c, switched_by(c, pressure)) for c in on]})  # fmt: skip
    texts, omitted = [], 0
    if task is not None and states:
        env = _recipe_env(run_dir)
        state_rounds = sorted(states)
        state_keys = [json.dumps({**states[r].to_json(), "round": 0, "pressure": []}, sort_keys=True) for r in state_rounds]
        spans = _spans(state_rounds, state_keys)
        for first, last, i in spans[:INTERFACE_TEXT_CAP]:
            text = rendered_prompt(states[state_rounds[i]], task, env)
            texts.append({"rounds": f"{first}" if first == last else f"{first}–{last}",
                          "components": states[state_rounds[i]].active_components, "text": text})  # fmt: skip
        omitted = max(0, len(spans) - len(texts))
    return [figure(timeline, height=max(2.2, 0.3 * len(components) + 1.4), alt="interface timeline"),
            render(_TIMELINE, rows=rows, hidden=max(0, len(spans) - TABLE_ROWS), texts=texts, omitted=omitted, task_id=task.id if task else "")]  # fmt: skip
