"""The verifier V: BFCL's binary multi-turn reward and the per-turn checks behind it (SEAL Eq. 3).

``r(τ) = V(τ, q, E) ∈ {0, 1}`` is the verdict of the official ``multi_turn_checker`` on the calls
the episode accepted, reproduced rule for rule:

* Model calls are re-executed step by step on fresh instances, and the ground truth turn by turn
  on a second set; both sets come from one private :class:`~seal_rl.backends.BackendWorld`, as
  both namespaces of one official process share module constants. Everything is released when
  :func:`verify` returns; nothing leaks into the next verification.
* A turn whose ground truth is empty is not checked (its calls still execute and change state).
* Any other turn fails when the model had no accepted call in it (``empty_turn_model_response``),
  else when a public attribute of any instance differs from the ground truth's
  (``instance_state_mismatch``), else when some ground-truth output is missing from all model
  outputs so far, as a multiset (``execution_response_mismatch``).
* The reward is 1 iff every turn passes. Unlike the official checker we do not stop at the first
  failing turn: every turn gets a :class:`TurnCheck` (diagnosis needs them); the verdict is the same.

An episode that never reached some turn scores 0, as the official runner's "force-terminated"
rule has it (the checker alone would pass an episode cut off before a final abstain turn, as in
the four ``*_167`` tasks). Unreached turns are checked as turns without calls and marked
``reached=False``.

Bounded re-execution: with ``step_timeout_s`` (the environment passes its own), each model step is
replayed under the same wall-time limit as in the episode (:mod:`seal_rl.limits`); a call stopped
by it gets the same error output as in the episode and the rest of the step is skipped. Outputs
longer than :data:`_OUTPUT_KEY_CHARS` are compared by SHA-256 digest, so a verification holds no
more than the episode showed; equality, hence the verdict, is unchanged.
"""

from __future__ import annotations

import ast
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

from seal_rl.backends import EXECUTION_ERROR_PREFIX, BackendWorld, Backends, method_signature
from seal_rl.limits import StepTimeout, stopped_call_error, time_limit
from seal_rl.tasks import Task
from seal_rl.tools import ToolCall

_REPR_LIMIT = 300
_OUTPUT_KEY_CHARS = 1_000
_MISSING = object()


@dataclass(frozen=True)
class StateDifference:
    """One public attribute whose value differs between the model's and the ground truth's instance."""

    class_name: str
    attribute: str
    model: str
    ground_truth: str

    @property
    def key(self) -> str:
        """``Class.attribute``."""
        return f"{self.class_name}.{self.attribute}"


@dataclass(frozen=True)
class TurnCheck:
    """The official checks of one user turn, all computed even after an earlier turn failed.

    scorable: the ground truth of this turn is non-empty (the official checker skips other turns).
    has_calls: the model had at least one accepted call in this turn.
    state_ok / state_differences: the state check, over every involved instance.
    instances_ok: the model and ground truth have the same set of instances (the official assert).
    response_ok / missing_responses: every ground-truth output of this turn appears among all model
        outputs so far (multiset).
    ground_truth_errors: ground-truth calls of this turn that raised when executed.
    reached: the agent acted in this turn (answered its question at least once) before the end.

    For diagnosis only (never part of the reward):
    ground_truth_tools: the names of this turn's ground-truth calls, in order.
    missing_calls: the names of the ground-truth calls whose outputs are missing (as
        ``missing_responses``, one entry per missing output).
    tool_classes: (tool, class) for every tool the model or the ground truth called in this turn:
        the backend class whose instance answers it.
    inherited: the turn fails, an earlier scorable turn failed, and the model's own calls of this
        turn, replayed on the ground truth's state before the turn, leave no state difference and
        no missing output: every difference is carried over.
    carried_over: the differing attributes (``Class.attribute``) that the same replay does not
        produce: differences an earlier failed turn left behind (computed after a failed turn only).
    carried_over_calls: likewise, the ``missing_calls`` whose outputs the replay does produce.
    """

    turn: int
    scorable: bool
    has_calls: bool
    reached: bool = True
    state_ok: bool = True
    state_differences: tuple[StateDifference, ...] = ()
    instances_ok: bool = True
    response_ok: bool = True
    missing_responses: tuple[str, ...] = ()
    ground_truth_errors: tuple[str, ...] = ()
    ground_truth_tools: tuple[str, ...] = ()
    missing_calls: tuple[str, ...] = ()
    tool_classes: tuple[tuple[str, str], ...] = ()
    inherited: bool = False
    carried_over: tuple[str, ...] = ()
    carried_over_calls: tuple[str, ...] = ()

    @property
    def failure(self) -> str | None:
        """The official error type this turn fails with, or None when it passes or is not scored."""
        if not self.scorable:
            return None
        if not self.has_calls:
            return "empty_turn_model_response"
        if not self.instances_ok:
            return "instance_mismatch"
        if not self.state_ok:
            return "instance_state_mismatch"
        if not self.response_ok:
            return "execution_response_mismatch"
        return None

    @property
    def passed(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class Verdict:
    """The verifier's reward and the per-turn evidence for it."""

    reward: float
    turns: tuple[TurnCheck, ...]
    checker_error: str | None = None
    """Set when the episode could not be scored at all (then ``turns`` is empty and reward 0)."""

    @classmethod
    def unscorable(cls, message: str) -> Verdict:
        return cls(reward=0.0, turns=(), checker_error=message)

    @property
    def complete(self) -> bool:
        """Every turn was reached."""
        return all(turn.reached for turn in self.turns)

    @property
    def progress(self) -> float:
        """Environment Tuning's progress reward (arXiv 2510.10197): the share of scorable user turns
        that were reached and pass the official per-turn checks (state, instances, execution
        results), so an episode that solves 2 of 4 turns scores 0.5 where the binary reward gives 0.
        An episode with no scorable turn scores its binary reward; an unscorable one 0.

        Unlike the diagnosis's descriptive ``progress`` (:func:`seal_rl.diagnose.diagnose`), which
        leaves unreached turns out, a turn the episode never reached counts as failed here: as a
        reward, ending an episode early must never pay."""
        scored = [turn for turn in self.turns if turn.scorable]
        if not scored:
            return self.reward
        return sum(turn.reached and turn.passed for turn in scored) / len(scored)

    @property
    def first_failure(self) -> TurnCheck | None:
        return next((turn for turn in self.turns if not turn.passed), None)

    @property
    def error_type(self) -> str | None:
        """Why the reward is 0: the first failing turn's official error type, or ``force_terminated``."""
        if self.checker_error is not None:
            return "checker_error"
        first = self.first_failure
        if first is not None:
            return first.failure
        return None if self.complete else "force_terminated"

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "reward": self.reward,
            "progress": self.progress,
            "complete": self.complete,
            "error_type": self.error_type,
            "first_failure": None if first is None else {"turn": first.turn, "error_type": first.failure},
            "checker_error": self.checker_error,
            "turns": [{**asdict(turn), "failure": turn.failure} for turn in self.turns],
        }


def parse_ground_truth_call(source: str, involved_classes: tuple[str, ...]) -> ToolCall:
    """A ground-truth call string (``"sort('report.pdf')"``) as a keyword-only :class:`ToolCall`.

    Parsed with ``ast`` (the ground truth is literals only); positional arguments are bound to
    parameter names with the backend method's own signature, as ``eval`` would bind them.
    """
    node = ast.parse(source, mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise ValueError(f"ground truth {source!r} is not a plain call")
    args = [ast.literal_eval(arg) for arg in node.args]
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    signature = method_signature(involved_classes, node.func.id)
    if signature is not None:
        return ToolCall(node.func.id, dict(signature.bind_partial(*args, **kwargs).arguments))
    if args:
        raise ValueError(f"ground truth {source!r} calls unknown {node.func.id!r} with positional arguments")
    return ToolCall(node.func.id, kwargs)


@lru_cache(maxsize=2048)
def _parsed_ground_truth(ground_truth: tuple[tuple[str, ...], ...], involved_classes: tuple[str, ...]) -> str:
    turns = [[parse_ground_truth_call(s, involved_classes).to_json() for s in turn] for turn in ground_truth]
    return json.dumps(turns)  # immutable; every caller gets fresh ToolCall objects from it


def ground_truth_calls(task: Task) -> tuple[tuple[ToolCall, ...], ...]:
    """The task's ground truth as keyword-only calls, per turn (fresh objects on every call)."""
    turns = json.loads(_parsed_ground_truth(task.ground_truth, task.involved_classes))
    return tuple(tuple(ToolCall(c["name"], c["arguments"]) for c in turn) for turn in turns)


def _short_repr(value: Any) -> str:
    if value is _MISSING:
        return "<missing>"
    text = repr(value)
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def _state_differences(model: Backends, truth: Backends) -> tuple[StateDifference, ...]:
    """The official ``state_checker``: every public attribute of every ground-truth instance."""
    differences = []
    for class_name, truth_instance in truth.instances.items():
        model_instance = model.instances[class_name]
        for attribute in vars(truth_instance):
            if attribute.startswith("_"):
                continue
            model_value = getattr(model_instance, attribute, _MISSING)
            truth_value = getattr(truth_instance, attribute)
            if model_value is _MISSING or _differs(model_value, truth_value):
                differences.append(
                    StateDifference(class_name, attribute, _short_repr(model_value), _short_repr(truth_value))
                )
    return tuple(differences)


def _differs(model_value: Any, truth_value: Any) -> bool:
    try:
        return bool(model_value != truth_value)
    except Exception:  # e.g. RecursionError on a pathological structure: not equal
        return True


def _output_key(output: str) -> str | tuple[int, bytes]:
    """An output as compared: itself, or (length, SHA-256) when long; equal keys iff equal outputs
    (up to hash collisions)."""
    if len(output) <= _OUTPUT_KEY_CHARS:
        return output
    return len(output), hashlib.sha256(output.encode("utf-8", errors="surrogatepass")).digest()


def _replay(model: Backends, step: Sequence[ToolCall], step_timeout_s: float | None) -> list[str | tuple[int, bytes]]:
    """The output keys of one model step re-executed, within ``step_timeout_s`` as in the episode."""
    if step_timeout_s is None:
        return [_output_key(model.execute(call).output) for call in step]
    deadline = time.monotonic() + step_timeout_s
    outputs = []
    for call in step:
        try:
            with time_limit(deadline - time.monotonic()):
                outputs.append(_output_key(model.execute(call).output))
        except StepTimeout:
            outputs.append(_output_key(EXECUTION_ERROR_PREFIX + stopped_call_error(step_timeout_s)))
            break
    return outputs


def _missing_indices(outputs: Sequence[str | tuple[int, bytes]], expected: Sequence[str]) -> list[int]:
    """Indices of the items of ``expected`` not found in ``outputs`` (output keys), counting
    duplicates (the official response_checker)."""
    pool = list(outputs)
    missing = []
    for index, item in enumerate(expected):
        try:
            pool.remove(_output_key(item))
        except ValueError:
            missing.append(index)
    return missing


def _turn_steps(calls_by_turn: Sequence[Sequence[Sequence[ToolCall]]], turn: int) -> list[Sequence[ToolCall]]:
    """The model steps of ``turn`` that made calls (missing trailing turns have none)."""
    return [step for step in (calls_by_turn[turn] if turn < len(calls_by_turn) else ()) if step]


def _own_outcome(task: Task, world: BackendWorld, expected_calls, turn: int, steps, earlier_outputs: Sequence[str | tuple[int, bytes]],
                 truth: Backends, truth_outputs: Sequence[str], step_timeout_s: float | None) -> tuple[set[str], list[str]]:  # fmt: skip
    """What this turn's own calls get wrong: the model's accepted calls of ``turn`` replayed on a
    ground-truth replay of the turns before it, compared with the ground truth after it (``truth``,
    ``truth_outputs``). Returns the differing attributes (``Class.attribute``) and the ground-truth
    calls whose outputs are missing."""
    before = Backends(task, world)
    for calls in expected_calls[:turn]:
        for call in calls:
            before.execute(call)
    own_outputs = [output for step in steps for output in _replay(before, step, step_timeout_s)]
    differences = {d.key for d in _state_differences(before, truth)}
    missing = _missing_indices([*earlier_outputs, *own_outputs], truth_outputs)
    return differences, [expected_calls[turn][i].name for i in missing]


def verify(
    task: Task,
    calls_by_turn: Sequence[Sequence[Sequence[ToolCall]]],
    *,
    turns_reached: int | None = None,
    step_timeout_s: float | None = None,
) -> Verdict:
    """Score the calls an episode accepted.

    Args:
        task: the task played.
        calls_by_turn: per user turn, per model step, the calls accepted in that step. Missing
            trailing turns count as turns without calls; empty steps are ignored.
        turns_reached: how many turns the agent acted in before the episode ended (default: all).
        step_timeout_s: replay each model step within this wall time, as the episode did
            (default: no limit).

    Returns:
        The :class:`Verdict`: reward 1.0 iff every turn was reached and the official checker
        accepts the calls.
    """
    reached = task.num_turns if turns_reached is None else turns_reached
    world = BackendWorld(long_context=task.long_context)
    truth = Backends(task, world)
    expected_calls = ground_truth_calls(task)
    model: Backends | None = None
    model_outputs: list[str | tuple[int, bytes]] = []
    checks = []
    for turn, expected in enumerate(expected_calls):
        steps = _turn_steps(calls_by_turn, turn)
        earlier_outputs = list(model_outputs)
        for step in steps:
            if model is None:
                model = Backends(task, world)
            model_outputs.extend(_replay(model, step, step_timeout_s))
        truth_outcomes = [truth.execute(call) for call in expected]
        truth_errors = tuple(o.output for o in truth_outcomes if o.raised)
        if not expected:
            checks.append(
                TurnCheck(turn, scorable=False, has_calls=bool(steps), reached=turn < reached, ground_truth_errors=truth_errors)
            )
            continue
        if model is None:  # compared for diagnosis only; the turn already fails for lack of calls
            model = Backends(task, world)
        differences = _state_differences(model, truth)
        truth_outputs = [o.output for o in truth_outcomes]
        missing_at = _missing_indices(model_outputs, truth_outputs)
        names = {call.name for step in steps for call in step} | {call.name for call in expected}
        check = TurnCheck(
            turn,
            scorable=True,
            has_calls=bool(steps),
            reached=turn < reached,
            state_ok=not differences,
            state_differences=differences,
            instances_ok=set(model.instances) == set(truth.instances),
            response_ok=not missing_at,
            missing_responses=tuple(truth_outcomes[i].output for i in missing_at),
            ground_truth_errors=truth_errors,
            ground_truth_tools=tuple(call.name for call in expected),
            missing_calls=tuple(expected[i].name for i in missing_at),
            tool_classes=tuple(sorted((name, model.owner(name)) for name in names if model.owner(name) is not None)),
        )
        if check.failure is not None and check.has_calls and any(c.scorable and c.failure for c in checks):
            own, own_missing = _own_outcome(task, world, expected_calls, turn, steps, earlier_outputs, truth, truth_outputs,
                                            step_timeout_s)  # fmt: skip
            carried = tuple(d.key for d in differences if d.key not in own)
            carried_calls = tuple(name for name in check.missing_calls if name not in own_missing)
            check = replace(check, inherited=not own and not own_missing, carried_over=carried, carried_over_calls=carried_calls)
        checks.append(check)
    turns = tuple(checks)
    return Verdict(reward=float(reached >= task.num_turns and all(turn.passed for turn in turns)), turns=turns)


def turn_local_passes(
    task: Task, calls_by_turn: Sequence[Sequence[Sequence[ToolCall]]], *, step_timeout_s: float | None = None
) -> tuple[bool | None, ...]:
    """Per user turn, whether its own calls were right *where the model stood*: BFCL's per-turn rules
    (calls made, same instances, same state, every ground-truth output among the model's outputs so
    far) with the ground truth's calls of turn k executed on the state the model's own calls left
    before turn k, instead of on the ground truth's history. None for a turn with no ground truth.

    Not a reward and not the official check (:func:`verify`): a counterfactual for analysis. The
    official check compares the whole state with the ground truth's, so after one failed turn every
    later turn inherits its differences; this one tells whether the later turns were right on their
    own (docs/results/real-study.md). Where the turns before k are the ground truth's, the two agree.
    """
    world = BackendWorld(long_context=task.long_context)
    model = Backends(task, world)  # the model's calls, executed turn by turn as in the episode
    outputs: list[str | tuple[int, bytes]] = []
    passes: list[bool | None] = []
    for turn, expected in enumerate(ground_truth_calls(task)):
        steps = _turn_steps(calls_by_turn, turn)
        for step in steps:
            outputs.extend(_replay(model, step, step_timeout_s))
        if not expected or not steps:
            passes.append(None if not expected else False)
            continue
        truth = Backends(task, world)  # where the model stood before this turn, then the ground truth's calls
        for earlier in range(turn):
            for step in _turn_steps(calls_by_turn, earlier):
                _replay(truth, step, step_timeout_s)
        truth_outputs = [truth.execute(call).output for call in expected]
        passes.append(set(model.instances) == set(truth.instances) and not _state_differences(model, truth)
                      and not _missing_indices(outputs, truth_outputs))  # fmt: skip
    return tuple(passes)
