"""Differential testing against the official BFCL checker.

:func:`official_check` runs the official ``multi_turn_checker`` on the calls an episode accepted,
as a fresh official process would: the backend modules are re-imported for the call, the model
name is unique, and the instances the official executor parks in its module globals are deleted
afterwards. The call strings it ``eval``s are built by :func:`seal_rl.tools.python_call_string`
from validated identifiers and JSON literals only, never from model text.

:func:`perturbed_steps` makes a plausible wrong transcript from the ground truth (dropped,
duplicated, swapped and moved calls, changed, deleted and added arguments, plain-text answers,
extra calls). Tests and ``benchmarks/differential.py`` play such transcripts through
:class:`~seal_rl.env.BfclEnv` and require our reward and first failing turn to equal the
official verdict.

One official quirk is outside the comparison: its executor prefixes every ``name(`` it finds in a
call string with an instance name, *including inside string arguments*, so an argument such as
``"ls(x)"`` reaches the backend altered. Perturbations never produce ``identifier(`` inside
strings.
"""

from __future__ import annotations

import copy
import random
import re
import sys
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from seal_rl.bfcl import BACKEND_PACKAGE, import_bfcl
from seal_rl.tasks import Task
from seal_rl.tools import ToolCall, python_call_string

Steps = list[list[list[ToolCall]]]  # per turn, per model step, the calls


@contextmanager
def fresh_official_backends() -> Iterator[None]:
    """Make the official executor import fresh backend modules, as in a new process."""
    prefix = BACKEND_PACKAGE + "."
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if name.startswith(prefix)}
    try:
        yield
    finally:
        for name in [name for name in sys.modules if name.startswith(prefix)]:
            del sys.modules[name]
        sys.modules.update(saved)


def official_check(task: Task, calls_by_turn: Sequence[Sequence[Sequence[ToolCall]]]) -> dict[str, Any]:
    """The official ``multi_turn_checker`` result for these accepted calls (``{"valid": bool, ...}``)."""
    decoded = [
        [[python_call_string(call) for call in step] for step in (calls_by_turn[t] if t < len(calls_by_turn) else ()) if step]
        for t in range(task.num_turns)
    ]
    return official_checker(task, decoded)


def official_checker(task: Task, decoded: list[list[list[str]]]) -> dict[str, Any]:
    """The official ``multi_turn_checker`` on call strings (per turn, per step), run as a fresh
    official process would: fresh backend modules, a unique model name, its instances freed after."""
    checker = import_bfcl("eval_checker.multi_turn_eval.multi_turn_checker")
    utils = sys.modules["bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"]
    model_name = f"seal_differential_{uuid.uuid4().hex}"
    with fresh_official_backends(), warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # the official executor eval()s e.g. "5()"
        try:
            result = checker.multi_turn_checker(
                decoded, [list(turn) for turn in task.ground_truth], task.bfcl_entry(),
                f"multi_turn_{task.category}", model_name,
            )  # fmt: skip
        finally:
            for name in [name for name in vars(utils) if model_name in name]:
                delattr(utils, name)  # the official executor never frees its instances
    return result


def official_failure(result: dict[str, Any]) -> tuple[int, str] | None:
    """(turn, error type without the ``multi_turn:`` prefix) of an official failure, or None."""
    if result.get("valid"):
        return None
    error_type = result["error_type"].removeprefix("multi_turn:")
    match = re.search(r"turn (\d+)", result.get("error_message", ""))
    if match:
        return int(match.group(1)), error_type
    # The state checker's message names no turn, but the result lists every turn executed so far.
    executed = result.get("execution_result") or result.get("details", {}).get("execution_result") or []
    return len(executed) - 1, error_type


# -- perturbations ----------------------------------------------------------------------------

PERTURBATIONS: tuple[str, ...] = (
    "drop_call", "duplicate_call", "swap_calls", "move_call", "change_value", "change_type",
    "delete_argument", "add_argument", "text_answer", "extra_call", "split_step",
)  # fmt: skip

_SAFE_STRING = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*\(")


def _value_pool(task: Task, ground_truth: Sequence[Sequence[ToolCall]]) -> list[Any]:
    """Plausible argument values: everything the ground truth passes, plus a few oddities."""
    pool: list[Any] = [
        copy.deepcopy(value) for turn in ground_truth for call in turn for value in call.arguments.values()
    ]
    pool += ["", "..", "temp", "nonexistent.txt", 0, -1, 3.5, True, False, None, [], {}]
    return pool


def _mutated(value: Any, rng: random.Random, pool: Sequence[Any]) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([-1, 1, 10])
    if isinstance(value, float):
        return round(value * rng.choice([0.5, 1.1, 2.0]), 2)
    if isinstance(value, str):
        options = [v for v in pool if isinstance(v, str) and v != value] or ["x"]
        return rng.choice(options + [value + "_x", value.upper()])
    if isinstance(value, list):
        return value[::-1] if len(value) > 1 and rng.random() < 0.5 else value[:-1]
    return copy.deepcopy(rng.choice(pool))


def _random_call(rng: random.Random, docs: Sequence[dict[str, Any]], pool: Sequence[Any]) -> ToolCall:
    doc = rng.choice(list(docs))
    properties = doc["parameters"]["properties"]
    arguments = {}
    for name in properties:
        if name in doc["parameters"].get("required", []) or rng.random() < 0.3:
            arguments[name] = copy.deepcopy(rng.choice(list(pool)))
    return ToolCall(doc["name"], arguments)


def perturbed_steps(
    task: Task,
    ground_truth: Sequence[Sequence[ToolCall]],
    rng: random.Random,
    num_perturbations: int | None = None,
) -> Steps:
    """A wrong (or occasionally still right) transcript: per turn, the calls of each model step.

    Starts from the ground truth (one step per turn) and applies 1–3 random perturbations from
    :data:`PERTURBATIONS`.
    """
    steps: Steps = [[list(turn)] if turn else [] for turn in ground_truth]
    pool = [v for v in _value_pool(task, ground_truth) if not (isinstance(v, str) and _SAFE_STRING.search(v))]
    docs = list(task.all_functions())
    for _ in range(num_perturbations or rng.randint(1, 3)):
        kind = rng.choice(PERTURBATIONS)
        turn = rng.randrange(len(steps))
        calls = [c for step in steps[turn] for c in step]
        if kind == "text_answer":
            steps[turn] = []
            continue
        if kind == "extra_call":
            steps[turn].append([_random_call(rng, docs, pool)])
            continue
        if not calls:
            continue
        index = rng.randrange(len(calls))
        call = calls[index]
        if kind == "drop_call":
            del calls[index]
        elif kind == "duplicate_call":
            calls.insert(index, call)
        elif kind == "swap_calls" and len(calls) > 1:
            j = rng.randrange(len(calls))
            calls[index], calls[j] = calls[j], calls[index]
        elif kind == "move_call":
            del calls[index]
            target = rng.randrange(len(steps))
            steps[target].append([call])
        elif kind in ("change_value", "change_type", "delete_argument") and call.arguments:
            key = rng.choice(list(call.arguments))
            arguments = dict(call.arguments)
            if kind == "delete_argument":
                del arguments[key]
            elif kind == "change_type":
                arguments[key] = str(arguments[key]) if not isinstance(arguments[key], str) else 7
            else:
                arguments[key] = _mutated(arguments[key], rng, pool)
            calls[index] = ToolCall(call.name, arguments)
        elif kind == "add_argument":
            key = rng.choice(["extra", "verbose", "path", "file_name", "limit"])
            calls[index] = ToolCall(call.name, {**call.arguments, key: copy.deepcopy(rng.choice(pool))})
        elif kind == "split_step" and len(calls) > 1:
            cut = rng.randrange(1, len(calls))
            steps[turn] = [calls[:cut], calls[cut:]]
            continue
        steps[turn] = [calls] if calls else []
    return steps
