"""One episode as the agent lived it, for the trajectory browsers of both reports.

An episode record (``results.jsonl`` line or ``trajectories.jsonl`` row) holds the transcript
(``messages``), one ``steps`` entry per assistant message (its turn and the environment's event:
``tool_results`` | ``rejected`` | ``next_turn`` | ``end``) and the ``trace`` of calls. The view
pairs the i-th assistant message with steps[i], its calls, and the messages that followed it until
the next assistant message: exactly what the agent saw next (tool results, the rejection message
with any hints, or the next question). A call in a rejected message never ran: it is shown as
rejected, with the reason, and never with a result.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from markupsafe import Markup

from seal_rl.diagnose import diagnose, stored_diagnosis
from seal_rl.report.page import chip, clip, render

_EPISODE = """<details class="episode" data-category="{{ category }}" data-labels="{{ label_names }}" data-outcome="{{ outcome }}"
data-task="{{ task_id }}"><summary>{% if index is not none %}#{{ index }} {% endif %}{{ task_id }}
{% if sample is not none %} · sample {{ sample }}{% endif %}{% for k, v in extra %} · {{ k }} {{ v }}{% endfor %} ·
{% if error is not none %}<span class="bad">error: {{ error|clip(300) }}</span>{% elif outcome == "pass" %}<span class="ok">success</span>
{% else %}<span class="bad">failure</span>{% endif %} · {{ end_reason }} · {% for z in labels %}{{ chip(z.label) }}{% endfor %}</summary>
{% if faults %}<div class="meta">injected faults: {{ faults }}</div>{% endif %}
{% for turn in turns %}<div class="turn"><div><b>turn {{ turn.index }}</b> {{ chip(turn.label) }}</div>
{% for text in turn.question %}<pre>{{ text|clip }}</pre>{% endfor %}
{% if not turn.steps and not turn.question %}<div class="meta">(not reached)</div>{% endif %}
{% for step in turn.steps %}<div class="meta">assistant, step {{ step.index }} → {{ step.event }}</div><pre>{{ step.text|clip }}</pre>
{% if step.parse_error is not none %}<div class="rejected-msg"><span class="tag">not parsed</span> nothing in this message ran: {{ step.parse_error|clip(600) }}</div>{% endif %}
{% for call in step.calls %}{% if call.status == "rejected" %}<div class="rejected-call"><span class="tag">rejected</span> <span class="rejected">{{ call.text }}</span>
{% if call.error %} <span class="meta">{{ call.error|clip(600) }}</span>{% else %} <span class="meta">not executed</span>{% endif %}</div>
{% else %}<div class="{{ call.status }}">call {{ call.text }}</div><pre>{{ call.result|clip(800) }}</pre>{% endif %}{% endfor %}
{% if step.seen and step.event == "tool_results" %}<details class="seen"><summary class="meta">what the agent saw next</summary>
{% for text in step.seen %}<pre class="seen">{{ text|clip }}</pre>{% endfor %}</details>
{% elif step.seen %}<div class="meta">what the agent saw next</div>{% for text in step.seen %}<pre class="seen">{{ text|clip }}</pre>{% endfor %}{% endif %}
{% endfor %}
{% if turn.evidence %}<div class="meta">evidence</div><pre>{{ turn.evidence|clip(800) }}</pre>{% endif %}</div>{% endfor %}
</details>"""


def outcome(record: Mapping[str, Any]) -> str:
    return "error" if record.get("error") else "pass" if record.get("reward") == 1.0 else "fail"


def _call_text(entry: Mapping[str, Any]) -> str:
    arguments = json.dumps(entry.get("arguments"), ensure_ascii=False, default=str)
    return f"{entry.get('name')}({clip(arguments, 400)})"


def _call(entry: Mapping[str, Any]) -> dict[str, Any]:
    if not entry.get("accepted", True):
        return {"status": "rejected", "text": _call_text(entry), "error": entry.get("error")}
    kind, error, result = entry.get("error_kind"), entry.get("error"), entry.get("result")
    shown = result if result is not None else ""
    if kind is not None:
        shown = f"[{kind}] {error}" + (f"\n{result}" if result is not None else "")
    return {"status": "ok" if kind is None else "bad", "text": _call_text(entry), "result": str(shown)}


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
    return f"[{message.get('role')}] {text}"


def steps_of(record: Mapping[str, Any], assistant_messages: int) -> list[Mapping[str, Any]]:
    """``record["steps"]``, or for records without it (training rows) the same list inferred from
    the trace: a message with a call entry is in that entry's turn (``rejected`` when any of its
    calls was not accepted, else ``tool_results``); a message without calls ends its turn
    (``next_turn``, or ``end`` when nothing followed it)."""
    if record.get("steps") is not None:
        return list(record["steps"])
    entries: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for entry in record.get("trace") or []:
        entries[entry.get("step")].append(entry)
    steps, turn = [], 0
    for index in range(assistant_messages):
        mine = entries.get(index)
        if mine:
            turn = mine[0].get("turn", turn)
            steps.append({"turn": turn, "event": "rejected" if any(not e.get("accepted", True) for e in mine) else "tool_results"})
        else:
            steps.append({"turn": turn, "event": "next_turn" if index + 1 < assistant_messages else "end"})
            turn += 1
    return steps


def episode_view(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as turns of steps (see the module docstring); pure, tolerant of missing fields."""
    diagnosis = stored_diagnosis(record) or diagnose(record)
    messages = [m for m in record.get("messages") or [] if isinstance(m, Mapping)]
    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    after = [messages[i + 1:(assistant_at[n + 1] if n + 1 < len(assistant_at) else len(messages))] for n, i in enumerate(assistant_at)]
    opening = [m for m in messages[: assistant_at[0] if assistant_at else len(messages)] if m.get("role") != "system"]
    by_step: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for entry in record.get("trace") or []:
        by_step[entry.get("step")].append(entry)
    questions: dict[int, list[str]] = {0: [_content(m) for m in opening]}
    steps_by_turn: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for index, step in enumerate(steps_of(record, len(assistant_at))[: len(assistant_at)]):
        event, turn = step.get("event"), step.get("turn")
        entries = by_step.get(index, [])
        parse_error = next((e.get("error") for e in entries if e.get("name") is None), None)
        following = [_content(m) for m in after[index]]
        if event == "next_turn":
            questions[turn + 1] = following
            following = []
        steps_by_turn[turn].append({
            "index": index, "event": event, "text": messages[assistant_at[index]].get("content", ""),
            "parse_error": parse_error, "calls": [_call(e) for e in entries if e.get("name") is not None], "seen": following,
        })  # fmt: skip
    turns = [{"index": t.turn, "label": t.label, "question": questions.get(t.turn, []), "steps": steps_by_turn.get(t.turn, []),
              "evidence": json.dumps(t.evidence, ensure_ascii=False, default=str) if t.evidence else ""}
             for t in diagnosis.labels]  # fmt: skip
    return {"labels": diagnosis.labels, "turns": turns}


def episode_html(record: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> Markup:
    """A collapsible ``details.episode`` block; every value is escaped by the template."""
    view = episode_view(record)
    faults = ", ".join(f"turn {f.get('turn')}: {f.get('type')}" for f in record.get("faults") or [] if isinstance(f, Mapping))
    return render(
        _EPISODE, chip=chip, turns=view["turns"], labels=view["labels"], outcome=outcome(record),
        label_names=" ".join(sorted({t.label for t in view["labels"]})), category=record.get("category", ""),
        task_id=record.get("task_id", ""), index=record.get("index"), sample=record.get("sample"),
        error=record.get("error"), end_reason=record.get("end_reason"), faults=faults, extra=list((extra or {}).items()),
    )  # fmt: skip
