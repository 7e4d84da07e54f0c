"""The inference protocols an episode can be played under: ``bfcl`` and ``seal``.

* ``bfcl`` — the loop of the official ``bfcl generate`` (``BaseHandler.inference_multi_turn_*`` in
  ``bfcl_eval/model_handler/base_handler.py``, pinned ``bfcl-eval==2026.3.23``): at most
  :data:`MAXIMUM_STEP_LIMIT` executing steps per user turn, then the episode is force-terminated;
  a message the handler cannot decode, or that decodes to no call, ends the turn with no
  observation; held-out functions arrive as the Python ``repr`` of their docs followed by BFCL's
  sentence; every call is executed by method name on the task's instances, as the official
  executor does (so held-out and undocumented public methods run too). Numbers under this
  protocol line up with the leaderboard.
* ``seal`` — the released SEAL code's protocol (SEAL_METHOD.md §5): at most 20 model calls per
  episode; an undecodable message gets an ``[ERROR] Invalid tool call format`` observation and
  the turn goes on; calls to tools not available now are rejected; held-out functions arrive as
  one JSON document per line. The paper trained under it.

The decoders here restate the official handlers' ``decode_execute`` so that the calls seal-rl
executes are exactly those the official executor would run, without ever evaluating model text:

* :func:`decode_hermes` — ``QwenFCHandler.decode_execute`` (``<tool_call>`` blocks; the
  OSS FC handlers and the ``bfcl_qwen_fc`` prompt mode);
* :func:`decode_fc` — ``convert_to_function_call`` (API FC handlers; a step is a list of
  ``{name: arguments}`` objects);
* :func:`decode_pythonic` — ``default_decode_execute_prompting`` (prompting handlers;
  ``[f(a=1), g()]``).

Where the official decoder would ``eval`` model text (arithmetic or lambdas in arguments, keyword
calls nested in arguments) or produce values JSON cannot hold (bytes, complex numbers), seal-rl
declines: the step counts as undecodable. :data:`DECLINED` names these cases.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from seal_rl.errors import SealError
from seal_rl.tools import ToolCall

PROTOCOLS: tuple[str, ...] = ("bfcl", "seal")

MAXIMUM_STEP_LIMIT = 20
"""``bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT``: the loop force-quits once a turn's
executing steps exceed it (so the 21st executing step is the last)."""

# bfcl_eval.constants.default_prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC / _PROMPTING
ADDITIONAL_FUNCTIONS_FC = "I have updated some more functions you can choose from. What about now?"
ADDITIONAL_FUNCTIONS_PROMPTING = "{functions}\n" + ADDITIONAL_FUNCTIONS_FC

DECLINED = (
    "arithmetic (BinOp) and lambdas in pythonic arguments, which the official decoder eval()s",
    "calls with keyword arguments nested inside pythonic arguments, which the official executor runs",
    "bytes and complex literals in pythonic arguments, which JSON cannot hold",
    "pythonic dict arguments whose values are all dicts (the official executor runs them as calls) "
    "or whose keys do not survive its '{key}' quoting",
)

_OPEN, _CLOSE = "<tool_call>\n", "\n</tool_call>"


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise SealError(f"Unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}.")
    return protocol


@dataclass(frozen=True)
class Decoded:
    """What the official handler's ``decode_execute`` makes of one step.

    calls: the calls it would execute, in order. error: why decoding raised (the official loop then
    ends the turn and the checker skips the step); None when it decoded (possibly to no call).
    """

    calls: tuple[ToolCall, ...] = ()
    error: str | None = None

    @property
    def ends_turn(self) -> bool:
        """The official loop breaks here: the step raised or decoded to nothing
        (``is_empty_execute_response``)."""
        return self.error is not None or not self.calls


def _call(name: Any, arguments: Any) -> ToolCall:
    """``convert_to_function_call``'s view of one ``{name: arguments}`` pair."""
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):  # the official code calls arguments.items()
        raise ValueError(f"arguments of {name!r} are {type(arguments).__name__}, not an object")
    return ToolCall(name if isinstance(name, str) else str(name), arguments)


def decode_fc(step: Any) -> Decoded:
    """``convert_to_function_call`` (the API FC handlers' ``decode_execute``) on one FC step: a
    list of ``{name: arguments}`` objects (arguments as a JSON string or an object); a single
    object counts as a one-element list."""
    if isinstance(step, dict):
        step = [step]
    if not isinstance(step, list):
        return Decoded(error=f"an FC step must be a list of {{name: arguments}} objects, got {type(step).__name__}")
    try:
        calls = []
        for item in step:
            if not isinstance(item, dict):
                raise ValueError(f"{type(item).__name__} is not a {{name: arguments}} object")
            calls += [_call(name, arguments) for name, arguments in item.items()]
    except (ValueError, RecursionError) as exc:
        return Decoded(error=str(exc))
    return Decoded(tuple(calls))


def tool_call_blocks(text: str) -> list[str]:
    """``re.findall(r"<tool_call>\\n(.*?)\\n</tool_call>", text, re.DOTALL)`` in linear time."""
    blocks, at = [], 0
    while True:
        start = text.find(_OPEN, at)
        if start < 0:
            return blocks
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            return blocks
        blocks.append(text[start + len(_OPEN):end])
        at = end + len(_CLOSE)


def decode_hermes(text: str) -> Decoded:
    """``QwenFCHandler.decode_execute``: every ``<tool_call>`` block whose body is JSON (others are
    skipped silently); each must be an object with ``name`` and ``arguments``."""
    objects = []
    for body in tool_call_blocks(text):
        try:
            objects.append(json.loads(body))
        except (ValueError, RecursionError):
            continue
    try:
        if any(not isinstance(item, dict) for item in objects):
            raise ValueError("model did not return a list of function calls")
        calls = []
        for item in objects:
            name = item["name"]
            hash(name)  # the official code makes it a dict key
            calls.append(_call(name, item["arguments"]))
    except KeyError as exc:
        return Decoded(error=f"a tool call has no {exc.args[0]!r}")
    except (TypeError, ValueError, RecursionError) as exc:
        return Decoded(error=str(exc) or type(exc).__name__)
    return Decoded(tuple(calls))


class _Declined(Exception):
    """The official decoder would eval() this, or JSON cannot hold it (:data:`DECLINED`)."""


_Missing = object()


def _value(node: ast.AST) -> Any:
    """``resolve_ast_by_type`` without its two ``eval`` s."""
    if isinstance(node, ast.Constant):
        if node.value is Ellipsis:
            return "..."
        if isinstance(node.value, (bytes, complex)):
            raise _Declined(f"{type(node.value).__name__} literal")
        return node.value
    if isinstance(node, ast.UnaryOp):  # the official code negates whatever the operator
        operand = getattr(node.operand, "value", _Missing)
        if operand is _Missing:
            raise ValueError("unsupported unary operand")
        if isinstance(operand, (bytes, complex)):
            raise _Declined(f"{type(operand).__name__} literal")
        return -operand
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("unsupported ** in a dict")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.BinOp, ast.Lambda)):
        raise _Declined("arithmetic or lambda in an argument")
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        if node.keywords:
            raise _Declined("a call with keyword arguments inside an argument")
        return ast.unparse(node)
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise ValueError(f"Unsupported AST type: {type(node)}")


def _official_value(value: Any) -> Any:
    """What ``parse_nested_value`` + ``eval`` make of a decoded argument: a dict whose values are
    all dicts is written as a nested call (declined), and dict keys are written as ``'{k}'``."""
    if not isinstance(value, dict):
        return value
    if all(isinstance(v, dict) for v in value.values()):
        raise _Declined("a dict the official executor would run as a nested call")
    out = {}
    for key, item in value.items():
        try:
            literal = ast.literal_eval(f"'{key}'")
        except (SyntaxError, ValueError) as exc:
            raise _Declined(f"a dict key the official executor cannot write ({exc})") from None
        out[literal] = _official_value(item)
    return out


def _resolve_call(node: ast.Call) -> ToolCall:
    """``resolve_ast_call``: dotted function name, keyword arguments only."""
    parts, func = [], node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    arguments = {}
    for keyword in node.keywords:
        arguments[keyword.arg] = _official_value(_value(keyword.value))  # a ** argument: key None
    return ToolCall(".".join(reversed(parts)), arguments)


def decode_pythonic(text: str) -> Decoded:
    """``default_decode_execute_prompting`` (``[f(a=1), g()]``), parsed with :mod:`ast`, never
    evaluated; see :data:`DECLINED` for what seal-rl refuses to decode."""
    body = text.strip("`\n ")
    if not body.startswith("["):
        body = "[" + body
    if not body.endswith("]"):
        body = body + "]"
    try:
        tree = ast.parse(body.strip().strip("'"), mode="eval")
        if isinstance(tree.body, ast.Call):
            nodes = [tree.body]
        else:
            elts = getattr(tree.body, "elts", None)
            if elts is None:
                raise ValueError(f"{type(tree.body).__name__} is not a list of calls")
            nodes = list(elts)
        if any(not isinstance(node, ast.Call) for node in nodes):
            raise ValueError("an element is not a call")
        calls = tuple(_resolve_call(node) for node in nodes)
    except _Declined as exc:
        return Decoded(error=f"declined: {exc}")
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        return Decoded(error=f"{type(exc).__name__}: {exc}")
    return Decoded(calls)


DECODERS = {"hermes": decode_hermes, "pythonic": decode_pythonic}


def decode(text: str, call_format: str) -> Decoded:
    """The official decoding of one assistant message in ``call_format`` (hermes or pythonic)."""
    try:
        decoder = DECODERS[call_format]
    except KeyError:
        raise SealError(
            f"The bfcl protocol decodes the hermes and pythonic call formats, not {call_format!r}."
        ) from None
    return decoder(text)


def non_finite(value: Any) -> float | None:
    """A NaN or infinity inside ``value``, if any: the official executor ``repr`` s arguments into
    source and ``eval`` s it, where ``nan`` and ``inf`` are undefined names."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return item
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


def reveal_text(docs: Sequence[Mapping[str, Any]], prompt_mode: str) -> str:
    """The user message of a miss_func turn under the bfcl protocol: prompting handlers (the
    ``bfcl_qwen_fc`` prompt) send the ``repr`` of the held-out docs and BFCL's sentence; FC
    handlers (tools passed natively) send the sentence alone and update the tool list."""
    if prompt_mode == "chat_template":
        return ADDITIONAL_FUNCTIONS_FC
    return ADDITIONAL_FUNCTIONS_PROMPTING.format(functions=list(docs))
