"""Diagnosis Ψ: one failure label per ground-truth user turn, grounded in executable evidence.

    Z(τ) = {z_1..z_T},  z_i = Ψ(a_i, ξ_i, s_{i−1}, s_i, F)                    (SEAL Eq. 5–6)

Ψ is a deterministic rule table over an episode's record (the execution trace and the per-turn
verifier checks, as :func:`seal_rl.env.episode_record` and ``results.jsonl`` hold them). It never
changes the reward. Scorer problems first, then turn type, then the first matching rule
(DESIGN.md §4):

* ``checker_error`` — the episode could not be scored; ``gt_error`` — a ground-truth call of the
  turn raised. Both are excluded from every weighting.
* ``not_reached`` — the episode ended before the turn was asked (excluded; never an abstention).
* Ground-truth-empty turn: ``spurious_tool_call`` if the model attempted any call, else
  ``correct_abstention``.
* A turn that passes the official per-turn check: ``pass``.
* A failed turn, first match wins: ``invalid_tool_call`` (a message of the turn was rejected:
  unparseable, or an unavailable tool; or, with no accepted call, a message holds a call written
  in another call syntax, :func:`wrong_syntax_call`) → ``argument_mismatch`` (an accepted call broke its schema
  or raised an argument error) → ``missing_tool_call`` (no accepted call) → ``recovery_failure``
  (a call returned an execution error) → ``instance_mismatch`` → ``state_mismatch`` →
  ``response_mismatch`` (as the checker reports).

Every label carries its evidence (the call, the error, the checker message). The ``reference``
preset (:func:`reference_labels`) reproduces the released SEAL code's label set instead,
including its treatment of unreached turns as padding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seal_rl.reasoning import answer
from seal_rl.tools import FORMATS

LABELS: tuple[str, ...] = (
    "gt_error", "checker_error", "not_reached", "spurious_tool_call", "correct_abstention", "pass",
    "invalid_tool_call", "argument_mismatch", "missing_tool_call", "recovery_failure",
    "instance_mismatch", "state_mismatch", "response_mismatch",
)  # fmt: skip
EXCLUDED_LABELS: frozenset[str] = frozenset({"gt_error", "checker_error", "not_reached"})
FAILURE_LABELS: tuple[str, ...] = LABELS[6:] + ("spurious_tool_call",)

REFERENCE_LABELS: tuple[str, ...] = (
    "gt_error", "checker_error", "spurious_tool_call", "correct_abstention",
    "empty_turn_model_response", "instance_mismatch", "state_mismatch", "response_mismatch", "pass",
)  # fmt: skip

_ARGUMENT_ERROR = re.compile(
    r"unexpected keyword argument|missing \d+ required (positional|keyword-only) argument|"
    r"takes \d+ positional arguments? but|got multiple values for argument"
)
_EXCERPT = 200


@dataclass(frozen=True)
class TurnLabel:
    """The label of one ground-truth turn and the evidence for it (JSON-able)."""

    turn: int
    label: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"turn": self.turn, "label": self.label, "evidence": self.evidence}


@dataclass(frozen=True)
class Diagnosis:
    """Ψ of one episode: one label per ground-truth turn plus per-episode progress scalars.

    progress: passed / scorable turns (ground truth non-empty), excluded labels left out.
    progress_with_abstentions: (passed + correct abstentions) / countable turns.
    """

    labels: tuple[TurnLabel, ...]
    progress: float
    progress_with_abstentions: float

    @property
    def label_names(self) -> list[str]:
        return [t.label for t in self.labels]

    def to_json(self) -> dict[str, Any]:
        return {
            "labels": [t.to_json() for t in self.labels],
            "progress": self.progress,
            "progress_with_abstentions": self.progress_with_abstentions,
        }


def _excerpt(text: Any) -> str:
    text = str(text)
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 3] + "..."


def _assistant_texts(record: Mapping[str, Any]) -> list[str]:
    """What the model answered in each of its messages (reasoning is not an answer: seal_rl.reasoning)."""
    return [answer(m["content"]) for m in record.get("messages", ()) if m.get("role") == "assistant"]


_FENCE = "```"
_MAX_BLOCKS = 8  # fenced blocks looked at per message (model text is hostile: bounded work)


def _call_shaped_parts(text: str) -> list[str]:
    """The whole message, then each Markdown code fence in it on its own (the json and pythonic
    parsers strip a fence that wraps the whole text, language tag included)."""
    pieces = text.split(_FENCE, 2 * _MAX_BLOCKS + 1)[1 : 2 * _MAX_BLOCKS : 2]  # odd pieces: inside a fence
    return [text, *(f"{_FENCE}{piece}{_FENCE}" for piece in pieces)]


def wrong_syntax_call(text: str, known_tools: frozenset[str]) -> dict[str, str | None] | None:
    """A tool call written in a call syntax the episode's format rejected, or ``None``.

    SEAL Table 5 defines ``invalid_tool_call`` as a call that cannot be parsed or executed and
    ``missing_tool_call`` as a skipped call or an early answer. A model that writes
    ```` ```json {"name": "move_file", "arguments": {...}} ``` ```` under the hermes format did try
    to call: its message is plain text to the episode's parser (and to BFCL's), but it parses as a
    call in another of seal-rl's formats (hermes, json, pythonic), whole or inside a code fence.
    Counted: a ``<tool_call>`` block, even a malformed or unclosed one (under the bfcl protocol the
    episode reads it as text, as BFCL's decoder does), a JSON object that names its arguments
    (``arguments`` or ``parameters``), or any call whose name is one of ``known_tools`` (the turn's
    tools). Evidence: the syntax and the name (``None`` for a malformed block, with its error).
    """
    hermes = FORMATS["hermes"].parse(text)
    if hermes.error:  # a <tool_call> tag is a call attempt even when it never closes (cut by the token budget)
        return {"syntax": "hermes", "call": None, "error": hermes.error}
    for part in _call_shaped_parts(text):
        for name, call_format in FORMATS.items():
            parsed = call_format.parse(part)
            for call in parsed.calls:
                names_arguments = name == "json" and re.search(r'"(arguments|parameters)"\s*:', part) is not None
                if name == "hermes" or names_arguments or call.name in known_tools:
                    return {"syntax": name, "call": call.name}
    return None


def _steps_of_turn(record: Mapping[str, Any], turn: int) -> list[int]:
    return [i for i, step in enumerate(record.get("steps", ())) if step["turn"] == turn]


def _call_evidence(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"step": entry["step"], "call": entry["name"], "arguments": entry["arguments"]}


PRIORITIES: Mapping[str, tuple[str, ...]] = {
    "seal": ("invalid_tool_call", "argument_mismatch", "missing_tool_call", "recovery_failure", "missing_needed_tool",
             "instance_mismatch", "state_mismatch", "response_mismatch"),
    "paper": ("invalid_tool_call", "argument_mismatch", "instance_mismatch", "state_mismatch", "recovery_failure",
              "missing_tool_call", "missing_needed_tool", "response_mismatch"),
}  # fmt: skip
"""First match wins among a failed turn's candidate labels. ``seal``: DESIGN.md §4, where a turn
with no accepted call is ``missing_tool_call`` before an unrecovered error is looked at, and a
needed tool never called among other calls (``missing_needed_tool``, labelled ``missing_tool_call``)
comes after ``recovery_failure``: a failed attempt left unrecovered explains the missing call.
``paper``: SEAL Table 5 (invalid → argument → state → recovery → missing call → response), with
``instance_mismatch``, which Table 5 does not rank, just before the state check as in the
official checker."""

EXECUTION_LABELS = frozenset({"invalid_tool_call", "argument_mismatch", "recovery_failure"})


def _raised_argument_error(entry: Mapping[str, Any]) -> bool:
    result = entry["result"]
    return result is not None and result.startswith("Error during execution") and bool(_ARGUMENT_ERROR.search(result))


def _tool_classes(check: Mapping[str, Any]) -> dict[str, str]:
    """Tool name -> the backend class that answers it, for the tools of one turn (JSON pairs)."""
    return {tool: owner for tool, owner in check.get("tool_classes", ())}


def _blamed(entry: Mapping[str, Any], entries: Sequence[Mapping[str, Any]], check: Mapping[str, Any]) -> bool:
    """Did this failed call plausibly cause the turn's failure? (causal attribution)

    Yes when the same tool never succeeds later in the turn (an unparseable message: when no call
    succeeds after it), or when a missing ground-truth output was that tool's to produce, or when
    a differing state attribute belongs to the class that answers that tool. Outputs and
    attributes an earlier failed turn left wrong (``carried_over``) are not this call's doing.
    """
    name = entry["name"]
    succeeded_later = any(
        e["accepted"] and e["error_kind"] is None and e["step"] > entry["step"] and (name is None or e["name"] == name)
        for e in entries
    )
    if not succeeded_later:
        return True
    if name is None:
        return False
    owner = _tool_classes(check).get(name)
    carried = set(check.get("carried_over", ()))  # left behind by an earlier failed turn: not this call's doing
    own = [d for d in check["state_differences"] if f"{d['class_name']}.{d['attribute']}" not in carried]
    own_missing = set(check.get("missing_calls", ())) - set(check.get("carried_over_calls", ()))
    return name in own_missing or any(d["class_name"] == owner for d in own)


def failure_candidates(turn: int, entries: list[Mapping[str, Any]], check: Mapping[str, Any], record) -> dict[str, TurnLabel]:
    """Every label a failed turn qualifies for, with its evidence (the priority picks one).

    Execution-level labels only for calls that plausibly caused the failure (:func:`_blamed`);
    ``missing_tool_call`` when the turn has no accepted call or never calls a tool the ground
    truth needed; ``instance_mismatch`` when a class the turn's ground truth does not use has a
    state difference and the model called that class in this turn; the checker-level labels as
    the verifier found them.
    """
    candidates: dict[str, TurnLabel] = {}
    rejected = [e for e in entries if e["error_kind"] in ("parse", "unknown_tool") and _blamed(e, entries, check)]
    if rejected:
        first = rejected[0]
        evidence = {"step": first["step"], "kind": first["error_kind"], "error": first["error"]}
        texts = _assistant_texts(record)
        if first["step"] < len(texts):
            evidence["message"] = _excerpt(texts[first["step"]])
        if first["name"] is not None:
            evidence["call"] = first["name"]
        candidates["invalid_tool_call"] = TurnLabel(turn, "invalid_tool_call", evidence)
    accepted = [e for e in entries if e["accepted"]]
    for entry in accepted:
        if (entry["schema_violations"] or _raised_argument_error(entry)) and _blamed(entry, entries, check):
            evidence = _call_evidence(entry)
            evidence["violations"] = [dict(v) for v in entry["schema_violations"]]
            if entry["error"]:
                evidence["error"] = entry["error"]
            candidates["argument_mismatch"] = TurnLabel(turn, "argument_mismatch", evidence)
            break
    called = {e["name"] for e in accepted}
    never_called = [name for name in dict.fromkeys(check.get("ground_truth_tools", ())) if name not in called]
    if not accepted or never_called:
        texts = _assistant_texts(record)
        steps = _steps_of_turn(record, turn)
        evidence = {"text": _excerpt(texts[steps[-1]])} if steps and steps[-1] < len(texts) else {}
        if accepted:
            evidence["never_called"] = never_called
        key = "missing_needed_tool" if accepted else "missing_tool_call"  # the same label, ranked apart
        candidates[key] = TurnLabel(turn, "missing_tool_call", evidence)
    if not accepted and "invalid_tool_call" not in candidates:
        known = frozenset(check.get("ground_truth_tools", ())) | frozenset(_tool_classes(check))
        texts = _assistant_texts(record)
        for step in _steps_of_turn(record, turn):
            attempt = wrong_syntax_call(texts[step], known) if step < len(texts) and isinstance(texts[step], str) else None
            if attempt is not None:
                evidence = {"step": step, "kind": "wrong_syntax", **attempt, "message": _excerpt(texts[step])}
                candidates["invalid_tool_call"] = TurnLabel(turn, "invalid_tool_call", evidence)
                break
    errors = [e for e in accepted if e["error_kind"] == "execution" and not _raised_argument_error(e) and _blamed(e, entries, check)]
    if errors:
        first = errors[0]
        evidence = {**_call_evidence(first), "error": first["error"],
                    "later_calls": sum(1 for e in accepted if e["step"] > first["step"])}  # fmt: skip
        candidates["recovery_failure"] = TurnLabel(turn, "recovery_failure", evidence)
    classes = _tool_classes(check)
    in_scope = {classes.get(name) for name in check.get("ground_truth_tools", ())}
    touched = {classes.get(e["name"]) for e in accepted} - in_scope - {None}
    stray = sorted({d["class_name"] for d in check["state_differences"]} & touched)
    if stray or not check["instances_ok"]:
        candidates["instance_mismatch"] = TurnLabel(turn, "instance_mismatch", {"classes": stray})
    if not check["state_ok"]:
        differences = [{k: d[k] for k in ("class_name", "attribute")} for d in check["state_differences"]]
        candidates["state_mismatch"] = TurnLabel(turn, "state_mismatch", {"differences": differences})
    if not check["response_ok"]:
        candidates["response_mismatch"] = TurnLabel(turn, "response_mismatch",
                                                    {"missing": [_excerpt(m) for m in check["missing_responses"]]})  # fmt: skip
    return candidates


def _label_failed_turn(turn: int, entries: list[Mapping[str, Any]], check: Mapping[str, Any], record, priority: str) -> TurnLabel:
    candidates = failure_candidates(turn, entries, check, record)
    if check.get("inherited"):  # its own calls were right: keep the checker's verdict, say so
        checker = [z for z in PRIORITIES[priority] if z in candidates and z not in EXECUTION_LABELS
                   and z not in ("missing_tool_call", "missing_needed_tool")]  # fmt: skip
        chosen = candidates[checker[0]] if checker else next(iter(candidates.values()))
        return TurnLabel(turn, chosen.label, {**chosen.evidence, "inherited": True})
    for label in PRIORITIES[priority]:
        if label in candidates:
            return candidates[label]
    raise AssertionError(f"turn {turn} failed but no rule matched")  # unreachable: a failure has a checker label


def diagnose(record: Mapping[str, Any], priority: str = "seal") -> Diagnosis:
    """Ψ over one finished episode's record: exactly one :class:`TurnLabel` per ground-truth turn.

    ``priority``: which label wins when a failed turn qualifies for several (:data:`PRIORITIES`).
    """
    if priority not in PRIORITIES:
        raise ValueError(f"Unknown diagnosis priority {priority!r}; expected one of {sorted(PRIORITIES)}.")
    verdict = record["verdict"]
    num_turns = record["num_turns"]
    if verdict.get("checker_error") or len(verdict["turns"]) != num_turns:
        error = verdict.get("checker_error") or "verdict does not cover every turn"
        labels = tuple(TurnLabel(t, "checker_error", {"error": error}) for t in range(num_turns))
        return Diagnosis(labels, 0.0, 0.0)
    by_turn: dict[int, list[Mapping[str, Any]]] = {}
    for entry in record["trace"]:
        by_turn.setdefault(entry["turn"], []).append(entry)
    labels = []
    for check in verdict["turns"]:
        turn = check["turn"]
        entries = by_turn.get(turn, [])
        if check["ground_truth_errors"]:
            labels.append(TurnLabel(turn, "gt_error", {"errors": [_excerpt(e) for e in check["ground_truth_errors"]]}))
        elif not check["reached"]:
            labels.append(TurnLabel(turn, "not_reached", {"turns_reached": record.get("turns_reached")}))
        elif not check["scorable"]:
            if entries:
                calls = [{"step": e["step"], "call": e["name"], "accepted": e["accepted"]} for e in entries]
                labels.append(TurnLabel(turn, "spurious_tool_call", {"calls": calls}))
            else:
                labels.append(TurnLabel(turn, "correct_abstention", {}))
        elif check["failure"] is None:
            labels.append(TurnLabel(turn, "pass", {}))
        else:
            labels.append(_label_failed_turn(turn, entries, check, record, priority))
    return _with_progress(tuple(labels))


def _with_progress(labels: tuple[TurnLabel, ...]) -> Diagnosis:
    counted = [t.label for t in labels if t.label not in EXCLUDED_LABELS]
    scorable = [z for z in counted if z not in ("correct_abstention", "spurious_tool_call")]
    passed = scorable.count("pass")
    progress = passed / len(scorable) if scorable else 0.0
    with_abstentions = (passed + counted.count("correct_abstention")) / len(counted) if counted else 0.0
    return Diagnosis(labels, progress, with_abstentions)


def reference_labels(record: Mapping[str, Any]) -> list[str]:
    """The released SEAL code's labels for this episode (its label set and priority).

    Per ground-truth turn: ``gt_error``; on an empty-ground-truth turn ``spurious_tool_call`` if
    any call was accepted else ``correct_abstention``; then ``empty_turn_model_response`` (no
    accepted call), ``instance_mismatch``, ``state_mismatch``, ``response_mismatch``, ``pass``.
    Like the released code, turns the episode never reached are scored as padding (an unreached
    empty-ground-truth turn becomes ``correct_abstention``).
    """
    verdict = record["verdict"]
    if verdict.get("checker_error") or len(verdict["turns"]) != record["num_turns"]:
        return ["checker_error"] * record["num_turns"]
    labels = []
    for check in verdict["turns"]:
        if check["ground_truth_errors"]:
            labels.append("gt_error")
        elif not check["scorable"]:
            labels.append("spurious_tool_call" if check["has_calls"] else "correct_abstention")
        elif not check["has_calls"]:
            labels.append("empty_turn_model_response")
        elif not check["instances_ok"]:
            labels.append("instance_mismatch")
        elif not check["state_ok"]:
            labels.append("state_mismatch")
        elif not check["response_ok"]:
            labels.append("response_mismatch")
        else:
            labels.append("pass")
    return labels


def add_diagnosis(record: dict[str, Any], priority: str = "seal") -> Diagnosis:
    """Write Ψ's ``diagnosis`` and the reference ``reference_labels`` into a finished episode's
    record (the fields of a ``results.jsonl`` line); return the diagnosis."""
    diagnosis = diagnose(record, priority)
    record["diagnosis"] = diagnosis.to_json()
    record["reference_labels"] = reference_labels(record)
    return diagnosis


def error_template(text: str) -> str:
    """An error message with its specifics blanked, to group "the same" error across episodes."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", str(text))
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    return _excerpt(text)


def evidence_message(label: TurnLabel) -> str | None:
    """The error or checker message most characteristic of a label, for summaries."""
    evidence = label.evidence
    if label.label == "argument_mismatch" and evidence.get("violations"):
        v = evidence["violations"][0]
        return f"{v['kind']} {evidence.get('call')}.{v['argument']}"
    if label.label == "state_mismatch" and evidence.get("differences"):
        d = evidence["differences"][0]
        return f"{d['class_name']}.{d['attribute']} differs"
    if label.label == "response_mismatch" and evidence.get("missing"):
        return "missing output " + error_template(evidence["missing"][0])
    if label.label == "spurious_tool_call" and evidence.get("calls"):
        return f"called {evidence['calls'][0]['call']}"
    if evidence.get("error"):
        return error_template(evidence["error"])
    return None


def labels_of(records: Sequence[Mapping[str, Any]]) -> list[Diagnosis]:
    """Ψ of many records, reusing labels already stored in a record when it has them."""
    return [stored_diagnosis(r) or diagnose(r) for r in records]


def stored_diagnosis(record: Mapping[str, Any]) -> Diagnosis | None:
    """The diagnosis saved in a ``results.jsonl`` line, if present."""
    saved = record.get("diagnosis")
    if not saved:
        return None
    labels = tuple(TurnLabel(t["turn"], t["label"], t.get("evidence", {})) for t in saved["labels"])
    return Diagnosis(labels, saved["progress"], saved["progress_with_abstentions"])
