"""Typed faults for the oracle player: known mistakes injected into ground-truth turns.

Each fault changes one user turn of the oracle's transcript in one documented way, so that the
label diagnosis should give that turn is known in advance (SEAL §3.2; the diagnosis benchmark):

=================  ======================================================  ====================
fault              what the oracle does in the turn                          expected label
=================  ======================================================  ====================
malformed_call     sends its calls with broken markup, then ends the turn    invalid_tool_call
unknown_tool       renames one call to a tool that does not exist            invalid_tool_call
missing_required   drops a required argument from one call                   argument_mismatch
unknown_argument   adds an argument the tool does not have to one call       argument_mismatch
wrong_value        changes the value of one argument                         (state/response)
skipped_call       leaves out one of several calls                           (state/response)
plain_text         answers in text without calling anything                  missing_tool_call
call_on_abstain    calls a tool on a turn whose ground truth is to abstain   spurious_tool_call
retry_after_error  one call fails with an argument error, then the whole    pass
                   turn is sent correctly (an error recovered from)
wrong_tool_then_   first calls another available tool without its          pass
right              required arguments (it fails), then the right turn
extra_read         the right turn, then a read-only call (e.g. pwd)        pass
=================  ======================================================  ====================

The three ``pass`` faults determine their turn's label only when they are the episode's first
fault: after an earlier faulted turn a right turn may still fail through inherited state.

Faults are drawn per turn with probability ``p`` from those applicable to the turn, with a
random generator seeded from ``(seed, task id)``, so a task's faults do not depend on which other
tasks run or in what order. ``kinds`` restricts the draw to some fault types and ``turn`` to one
user turn (negative: counted from the end), e.g. to build controlled warm-start transcripts whose
only mistake is a plain-text answer in the last turn.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from seal_rl.tasks import Task
from seal_rl.tools import CallFormat, ToolCall

FAULT_TYPES: tuple[str, ...] = (
    "malformed_call", "unknown_tool", "missing_required", "unknown_argument",
    "wrong_value", "skipped_call", "plain_text", "call_on_abstain", "retry_after_error",
    "wrong_tool_then_right", "extra_read",
)  # fmt: skip

# Tools that only read (no state change in BFCL's backends): what ``extra_read`` may add.
READ_ONLY_TOOLS: tuple[str, ...] = (
    "pwd", "get_current_time", "list_all_airports", "check_tire_pressure", "get_current_speed",
    "message_get_login_status", "posting_get_login_status", "ticket_get_login_status",
    "trading_get_login_status", "travel_get_login_status", "get_message_stats", "list_users",
)  # fmt: skip

# The label diagnosis must give a faulted turn, for the faults that determine one.
EXPECTED_LABEL: dict[str, str] = {
    "malformed_call": "invalid_tool_call",
    "unknown_tool": "invalid_tool_call",
    "missing_required": "argument_mismatch",
    "unknown_argument": "argument_mismatch",
    "plain_text": "missing_tool_call",
    "call_on_abstain": "spurious_tool_call",
    "retry_after_error": "pass",  # the error was recovered from: the turn passes, nobody is blamed
    "wrong_tool_then_right": "pass",
    "extra_read": "pass",
}

TURN_DONE = "I have completed the requested actions."
ABSTAIN = "I cannot do this with the functions and information I have. Could you provide what is missing?"
PLAIN_TEXT_ANSWER = "Sure, that has been taken care of."
UNKNOWN_ARGUMENT = "unexpected_option"


@dataclass(frozen=True)
class Fault:
    """One injected fault: the user turn, its type and what exactly was changed."""

    turn: int
    type: str
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _docs_by_name(task: Task) -> dict[str, dict[str, Any]]:
    return {doc["name"]: doc for doc in task.all_functions()}


def applicable_faults(calls: Sequence[ToolCall], docs: dict[str, dict[str, Any]], available: Sequence[str] = ()) -> list[str]:
    """The fault types that can be injected into a turn with these ground-truth calls."""
    if not calls:
        return ["call_on_abstain"]
    kinds = ["malformed_call", "unknown_tool", "unknown_argument", "plain_text", "retry_after_error"]
    names = {call.name for call in calls}
    if any(name not in names and docs[name].get("parameters", {}).get("required") for name in available):
        kinds.append("wrong_tool_then_right")
    if any(name in available for name in READ_ONLY_TOOLS):
        kinds.append("extra_read")
    if any(_required_present(call, docs) for call in calls):
        kinds.append("missing_required")
    if any(call.arguments for call in calls):
        kinds.append("wrong_value")
    if len(calls) > 1:
        kinds.append("skipped_call")
    return sorted(kinds, key=FAULT_TYPES.index)


def _required_present(call: ToolCall, docs: dict[str, dict[str, Any]]) -> list[str]:
    required = docs.get(call.name, {}).get("parameters", {}).get("required", [])
    return [name for name in required if name in call.arguments]


def _changed_value(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "_changed" if value else "changed"
    if isinstance(value, list):
        return value[:-1] if value else ["changed"]
    if isinstance(value, dict):
        return {}
    return "changed"


def _malformed(calls: Sequence[ToolCall], fmt: CallFormat) -> str | dict[str, Any]:
    """The calls rendered with their markup broken so that the format cannot parse them."""
    text = fmt.render(calls)
    if fmt.name == "native":  # structured calls whose arguments are not JSON
        return {**text, "tool_calls": [{**c, "function": {**c["function"], "arguments": "{"}} for c in text["tool_calls"]]}
    if fmt.name == "hermes":
        return text.replace("}\n</tool_call>", "\n</tool_call>", 1)
    return text[:-1]  # pythonic loses its closing bracket, json its closing brace/bracket


def faulty_turn(
    kind: str,
    turn: int,
    calls: Sequence[ToolCall],
    later_calls: Sequence[ToolCall],
    available: Sequence[str],
    docs: dict[str, dict[str, Any]],
    fmt: CallFormat,
    rng: random.Random,
) -> tuple[list[str], Fault]:
    """The assistant messages of one turn with fault ``kind`` injected, and the fault record."""
    calls = list(calls)
    if kind == "call_on_abstain":
        candidates = [c for c in later_calls if c.name in available] or [ToolCall(rng.choice(list(available)), {})]
        call = candidates[0]
        return [fmt.render([call]), ABSTAIN], Fault(turn, kind, {"call": call.name})
    if kind == "plain_text":
        return [PLAIN_TEXT_ANSWER], Fault(turn, kind)
    if kind == "malformed_call":
        return [_malformed(calls, fmt), TURN_DONE], Fault(turn, kind)
    if kind == "retry_after_error":  # one call first fails with an argument error, then the whole turn is right
        index = rng.randrange(len(calls))
        failing = ToolCall(calls[index].name, {**copy.deepcopy(calls[index].arguments), UNKNOWN_ARGUMENT: True})
        return [fmt.render([failing]), fmt.render(calls), TURN_DONE], Fault(turn, kind, {"call": failing.name, "index": index})
    if kind == "wrong_tool_then_right":  # another tool, called without its required arguments: it fails
        names = {call.name for call in calls}
        wrong = rng.choice(sorted(n for n in available if n not in names and docs[n].get("parameters", {}).get("required")))
        return [fmt.render([ToolCall(wrong, {})]), fmt.render(calls), TURN_DONE], Fault(turn, kind, {"call": wrong})
    if kind == "extra_read":
        read = rng.choice([name for name in READ_ONLY_TOOLS if name in available])
        return [fmt.render(calls), fmt.render([ToolCall(read, {})]), TURN_DONE], Fault(turn, kind, {"call": read})
    if kind == "skipped_call":
        index = rng.randrange(len(calls))
        skipped = calls.pop(index)
        return [fmt.render(calls), TURN_DONE], Fault(turn, kind, {"call": skipped.name, "index": index})

    if kind == "missing_required":
        indices = [i for i, c in enumerate(calls) if _required_present(c, docs)]
    elif kind == "wrong_value":
        indices = [i for i, c in enumerate(calls) if c.arguments]
    else:
        indices = list(range(len(calls)))
    index = rng.choice(indices)
    call = calls[index]
    arguments = copy.deepcopy(call.arguments)
    detail: dict[str, Any] = {"call": call.name, "index": index}
    if kind == "unknown_tool":
        name = call.name + "_v2"
        while name in docs:
            name += "_v2"
        calls[index] = ToolCall(name, arguments)
        detail["replaced_by"] = name
    elif kind == "missing_required":
        argument = rng.choice(_required_present(call, docs))
        del arguments[argument]
        calls[index] = ToolCall(call.name, arguments)
        detail["argument"] = argument
    elif kind == "unknown_argument":
        arguments[UNKNOWN_ARGUMENT] = True
        calls[index] = ToolCall(call.name, arguments)
        detail["argument"] = UNKNOWN_ARGUMENT
    elif kind == "wrong_value":
        argument = rng.choice(list(arguments))
        arguments[argument] = _changed_value(arguments[argument], rng)
        calls[index] = ToolCall(call.name, arguments)
        detail.update(argument=argument, value=arguments[argument])
    else:
        raise ValueError(f"unknown fault type {kind!r}; expected one of {', '.join(FAULT_TYPES)}")
    return [fmt.render(calls), TURN_DONE], Fault(turn, kind, detail)


def oracle_transcript(
    task: Task,
    ground_truth: Sequence[Sequence[ToolCall]],
    fmt: CallFormat,
    fault_rate: float = 0.0,
    seed: int = 0,
    *,
    kinds: Sequence[str] | None = None,
    turn: int | None = None,
) -> tuple[list[str], list[Fault]]:
    """The oracle's assistant messages for a task, with faults injected at rate ``fault_rate``.

    Without faults: per turn, one message with all ground-truth calls then one that ends the turn
    (abstain turns: only the abstaining message). ``kinds``: draw only these fault types (a turn
    where none applies stays correct); ``turn``: inject faults only into this user turn.
    """
    unknown = sorted(set(kinds or ()) - set(FAULT_TYPES))
    if unknown:
        raise ValueError(f"unknown fault type(s) {unknown}; expected some of {', '.join(FAULT_TYPES)}")
    rng = random.Random(f"{seed}:{task.id}")
    docs = _docs_by_name(task)
    available = [doc["name"] for doc in task.functions]
    target = None if turn is None else turn % len(ground_truth)
    messages: list[str] = []
    faults: list[Fault] = []
    for index, calls in enumerate(ground_truth):
        available += [doc["name"] for doc in task.held_out.get(index, ())]
        drawn = rng.random() < fault_rate
        choices = [k for k in applicable_faults(calls, docs, available) if kinds is None or k in kinds]
        if drawn and choices and target in (None, index):
            kind = rng.choice(choices)
            later = [c for later_turn in ground_truth[index + 1:] for c in later_turn]
            turn_messages, fault = faulty_turn(kind, index, calls, later, available, docs, fmt, rng)
            messages += turn_messages
            faults.append(fault)
        elif calls and fmt.name == "native":  # one structured call per message: gpt-oss and Llama 3.1 write no parallel calls
            messages += [fmt.render([call]) for call in calls] + [TURN_DONE]
        elif calls:
            messages += [fmt.render(list(calls)), TURN_DONE]
        else:
            messages.append(ABSTAIN)
    return messages, faults


def precision_recall(pairs: Sequence[tuple[str, str]]) -> dict[str, tuple[float, float, int]]:
    """Per label: (precision, recall, expected count) over (expected, given) label pairs.

    Precision: of the turns given the label, the share expected to have it (wrong labels count
    against it); recall: of the turns expected to have it, the share given it.
    """
    labels = sorted({label for pair in pairs for label in pair})
    scores = {}
    for label in labels:
        given = sum(1 for _, g in pairs if g == label)
        expected = sum(1 for e, _ in pairs if e == label)
        hits = sum(1 for e, g in pairs if e == g == label)
        scores[label] = (hits / given if given else 1.0, hits / expected if expected else 1.0, expected)
    return scores


def determined(faults: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The faults of an episode whose turn label :data:`EXPECTED_LABEL` determines.

    Faults that leave a right turn (expected ``pass``) determine it only when they are the
    episode's first fault: after an earlier faulted turn its state may differ through no fault of
    its own (an inherited failure).
    """
    first = min((f["turn"] for f in faults), default=None)
    return [f for f in faults if f["type"] in EXPECTED_LABEL and (EXPECTED_LABEL[f["type"]] != "pass" or f["turn"] == first)]


def expected_label(fault: dict[str, Any], record: dict[str, Any]) -> str | None:
    """The label Ψ must give a determined fault's turn: :data:`EXPECTED_LABEL`, or ``pass`` when the
    official check passes the turn anyway (e.g. an erroring read whose output was already shown);
    None when the turn fails only through what an earlier faulted turn left behind (an inherited
    failure: the fault then determines nothing)."""
    turn = record["verdict"]["turns"][fault["turn"]]
    if turn["scorable"] and turn["failure"] is None:
        return "pass"
    return None if turn.get("inherited") else EXPECTED_LABEL[fault["type"]]
