"""Tool calls: the call formats a model writes, BFCL docs as JSON-schema specs, and validation.

Formats (parse model text -> calls; render calls -> text):

* ``hermes`` (default) — ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, as
  Qwen2.5 and the SEAL reference use; text outside the blocks is allowed.
* ``pythonic`` — ``[f(a=1), g(b='x')]`` as BFCL's default prompt asks; parsed with :mod:`ast`,
  keyword literals only (never evaluated).
* ``json`` — Llama-3 style: the whole message is ``{"name": ..., "parameters": {...}}`` or a list of
  such objects (an optional ``<|python_tag|>`` prefix and code fence are allowed).
* ``native`` — the model's own tool calls, as its chat template writes them (Qwen/Hermes
  ``<tool_call>``, Llama 3.1 JSON, gpt-oss harmony ``to=functions.NAME``, Gemma 4, GLM-4, ...),
  ``chat_template`` prompt mode only. The model's tokenizer parses them
  (:meth:`seal_rl.trajectory.ChatTokens.response`) into an assistant message with structured
  ``tool_calls``, which the environment reads with :func:`structured_calls`; the text itself
  holds no call.

Every parser returns a :class:`ParsedMessage`; none raises on any input. A message with no call
markup at all is plain text (it ends the user turn); markup that does not parse gives
``error`` (the environment rejects the whole message). Parsers accept only JSON values: finite
numbers, strings, booleans, null, lists and string-keyed objects, nested at most
:data:`MAX_NESTING` deep.
"""

from __future__ import annotations

import ast
import copy
import json
import keyword
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jsonschema

from seal_rl.errors import SealError

MAX_NESTING = 32
"""Deepest nesting of argument values accepted (BFCL arguments nest at most 3 deep)."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class ToolCall:
    """One function call: a tool name and JSON-valued keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class ParsedMessage:
    """What a format made of one assistant message.

    calls: the calls in order (empty for plain text or on error).
    text: the message text outside the call markup.
    error: why the call markup could not be read, or None.
    """

    calls: tuple[ToolCall, ...] = ()
    text: str = ""
    error: str | None = None


class CallFormat(Protocol):
    """Reads and writes tool calls in one textual convention."""

    name: str

    def parse(self, text: str) -> ParsedMessage: ...

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str: ...


class _MalformedCall(ValueError):
    """Raised inside parsers; turned into ``ParsedMessage.error``."""


# -- JSON value checks ------------------------------------------------------------------------


def _reject_constant(name: str) -> None:
    raise _MalformedCall(f"{name} is not valid JSON; use a finite number")


def _loads(text: str) -> Any:
    """Strict JSON: no NaN/Infinity; all errors (including over-long integers) become _MalformedCall."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except _MalformedCall:
        raise
    except RecursionError:
        raise _MalformedCall(f"value nested deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:  # JSONDecodeError, and int() digit limits
        raise _MalformedCall(f"invalid JSON ({exc})") from None


def check_json_value(value: Any, where: str) -> Any:
    """Return ``value`` if it is a finite, string-keyed JSON value nested at most MAX_NESTING deep.

    Tuples (pythonic format) become lists. Iterative, so hostile depth cannot overflow the stack.
    """
    root = [value]
    stack: list[tuple[Any, Any, int]] = [(root, 0, 0)]
    while stack:
        parent, key, depth = stack.pop()
        item = parent[key]
        if depth > MAX_NESTING:
            raise _MalformedCall(f"{where}: value nested deeper than {MAX_NESTING} levels")
        if item is None or isinstance(item, (bool, str, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise _MalformedCall(f"{where}: non-finite number {item!r}")
            continue
        if isinstance(item, tuple):
            item = parent[key] = list(item)
        if isinstance(item, list):
            stack.extend((item, i, depth + 1) for i in range(len(item)))
        elif isinstance(item, dict):
            for k in item:
                if not isinstance(k, str):
                    raise _MalformedCall(f"{where}: object keys must be strings, got {k!r}")
            stack.extend((item, k, depth + 1) for k in item)
        else:
            raise _MalformedCall(f"{where}: {type(item).__name__} values are not allowed")
    return root[0]


def _call_from_object(obj: Any, args_key: str, where: str) -> ToolCall:
    if not isinstance(obj, dict):
        raise _MalformedCall(f"{where}: expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise _MalformedCall(f'{where}: missing "name" (a non-empty string)')
    keys = (args_key, "arguments", "parameters")
    present = [key for key in keys if key in obj]
    arguments = obj[present[0]] if present else {}
    if isinstance(arguments, str):  # some models JSON-encode the arguments object
        arguments = _loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise _MalformedCall(f'{where}: "{present[0]}" must be an object, got {type(arguments).__name__}')
    return ToolCall(name, check_json_value(arguments, where))


_FENCE = "```"
_FENCE_LANGUAGE = re.compile(r"[A-Za-z0-9_-]*")


def _strip_fence(text: str) -> str:
    r"""Remove one surrounding Markdown code fence (```lang ... ```), if present, and strip the rest.

    Linear time. The same result as ``re.fullmatch(r"```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```", text,
    re.DOTALL).group(1).strip()``, which backtracks quadratically on a fence followed by letters
    (98 s on 100 KB): the language tag cannot contain a backtick, so it is the longest run of tag
    characters after the opening fence, and the body is everything up to the closing fence.
    """
    if len(text) < 2 * len(_FENCE) or not (text.startswith(_FENCE) and text.endswith(_FENCE)):
        return text
    inner = text[len(_FENCE) : -len(_FENCE)]
    return inner[_FENCE_LANGUAGE.match(inner).end() :].strip()


# -- hermes -----------------------------------------------------------------------------------

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def _hermes_blocks(text: str) -> list[tuple[int, int]]:
    """(start, end) spans of ``<tool_call>…</tool_call>`` blocks, leftmost-shortest, in linear time.

    The spans ``re.finditer(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)`` finds; the regex
    rescans to the end of the text from every opening tag that has no closing tag after it
    (quadratic in the number of such tags).
    """
    spans = []
    position = 0
    while (start := text.find(_OPEN, position)) != -1:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end == -1:
            break  # no later opening tag has a closing tag after it either
        position = end + len(_CLOSE)
        spans.append((start, position))
    return spans


class HermesFormat:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5, SEAL reference)."""

    name = "hermes"

    def parse(self, text: str) -> ParsedMessage:
        opens, closes = text.count(_OPEN), text.count(_CLOSE)
        if opens == 0 and closes == 0:
            return ParsedMessage(text=text.strip())
        try:
            if opens != closes:
                raise _MalformedCall(f"{opens} <tool_call> tag(s) but {closes} </tool_call> tag(s)")
            spans = _hermes_blocks(text)
            if len(spans) != opens:
                raise _MalformedCall("nested or misordered <tool_call> tags")
            calls = tuple(
                _call_from_object(_loads(text[start + len(_OPEN) : end - len(_CLOSE)].strip()), "arguments", f"tool call {i + 1}")
                for i, (start, end) in enumerate(spans)
            )
        except _MalformedCall as exc:
            return ParsedMessage(error=str(exc))
        outside = [text[end:start] for end, start in zip([0] + [e for _, e in spans], [s for s, _ in spans] + [len(text)])]
        return ParsedMessage(calls=calls, text="".join(outside).strip())

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        blocks = ["<tool_call>\n" + self._body(c) + "\n</tool_call>" for c in calls]
        return "\n".join(([text] if text else []) + blocks)

    @staticmethod
    def _body(call: ToolCall) -> str:
        body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        # A tag inside a string would end the block early; \u003c is the same "<" to a JSON reader.
        return body.replace("<tool_call>", "\\u003ctool_call>").replace("</tool_call>", "\\u003c/tool_call>")


# -- pythonic ---------------------------------------------------------------------------------

_BARE_CALL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\s*\(")


class PythonicFormat:
    """``[f(a=1), g(b='x')]`` (BFCL's default prompting format), parsed with ``ast``, never evaluated.

    A message is a call attempt when, after stripping whitespace and one code fence, it starts with
    ``[`` or looks like a bare call ``name(``; anything else is plain text. ``[]`` is "no calls".
    """

    name = "pythonic"

    def parse(self, text: str) -> ParsedMessage:
        body = _strip_fence(text.strip())
        if not (body.startswith("[") or _BARE_CALL.match(body)):
            return ParsedMessage(text=text.strip())
        source = body if body.startswith("[") else f"[{body}]"
        try:
            try:
                with warnings.catch_warnings():  # e.g. "invalid escape sequence" from model text
                    warnings.simplefilter("ignore")
                    tree = ast.parse(source, mode="eval")
            except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
                raise _MalformedCall(f"not a Python list of calls ({type(exc).__name__}: {exc})") from None
            if not isinstance(tree.body, ast.List):
                raise _MalformedCall("expected a list of calls like [f(a=1), g(b='x')]")
            calls = tuple(self._call(node, i) for i, node in enumerate(tree.body.elts))
        except _MalformedCall as exc:
            return ParsedMessage(error=str(exc))
        return ParsedMessage(calls=calls)

    @staticmethod
    def _call(node: ast.expr, index: int) -> ToolCall:
        where = f"call {index + 1}"
        if not isinstance(node, ast.Call):
            raise _MalformedCall(f"{where}: expected name(arg=value, ...)")
        if not isinstance(node.func, ast.Name):
            raise _MalformedCall(f"{where}: the function must be a plain name like f(...)")
        if node.args:
            raise _MalformedCall(f"{where}: positional arguments are not supported; write {node.func.id}(name=value)")
        arguments: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise _MalformedCall(f"{where}: **kwargs is not supported")
            try:
                value = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                raise _MalformedCall(f"{where}: argument {kw.arg!r} is not a literal value") from None
            arguments[kw.arg] = check_json_value(value, f"{where}, argument {kw.arg!r}")
        return ToolCall(node.func.id, arguments)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        if not calls:
            return text
        return "[" + ", ".join(python_call_string(call) for call in calls) + "]"


def _is_identifier(name: object) -> bool:
    """An ASCII Python identifier that is not a keyword (``[as()]`` would not parse)."""
    return isinstance(name, str) and bool(_IDENTIFIER.match(name)) and not keyword.iskeyword(name)


def python_call_string(call: ToolCall) -> str:
    """``name(k=<python literal>, ...)``: the call as Python source made of literals only.

    The name and keys must be identifiers (``repr`` of JSON values is always a literal), so the
    result can be parsed back with ``ast.literal_eval`` per argument; this is also the only way
    seal-rl ever builds strings for the official BFCL executor.
    """
    if not _is_identifier(call.name):
        raise ValueError(f"{call.name!r} is not a Python identifier")
    for key in call.arguments:
        if not _is_identifier(key):
            raise ValueError(f"argument name {key!r} is not a Python identifier")
    check_json_value(copy.deepcopy(call.arguments), call.name)
    args = ", ".join(f"{key}={value!r}" for key, value in call.arguments.items())
    return f"{call.name}({args})"


# -- json (llama-3) ---------------------------------------------------------------------------

_PYTHON_TAG = "<|python_tag|>"


class JsonFormat:
    """Llama-3 style JSON calls: the message is one call object or a list of them."""

    name = "json"

    def parse(self, text: str) -> ParsedMessage:
        body = text.strip()
        if body.startswith(_PYTHON_TAG):
            body = body[len(_PYTHON_TAG):].strip()
        body = _strip_fence(body)
        if not (body.startswith("{") or re.match(r"\[\s*(\{|\])", body)):
            return ParsedMessage(text=text.strip())
        try:
            value = _loads(body)
            objects = value if isinstance(value, list) else [value]
            calls = tuple(_call_from_object(obj, "parameters", f"call {i + 1}") for i, obj in enumerate(objects))
        except _MalformedCall as exc:
            return ParsedMessage(error=str(exc))
        return ParsedMessage(calls=calls)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        objects = [{"name": c.name, "parameters": c.arguments} for c in calls]
        if not objects:
            return text
        return json.dumps(objects[0] if len(objects) == 1 else objects, ensure_ascii=False)


# -- native (structured tool_calls) -----------------------------------------------------------


class NativeFormat:
    """Calls as structured ``tool_calls`` of an assistant message (OpenAI's shape), the form chat
    templates render natively and tokenizers' response parsers produce. Text is never a call."""

    name = "native"

    def parse(self, text: str | Mapping[str, Any]) -> ParsedMessage:
        """Plain text: no call; a structured message: its ``tool_calls`` (:func:`structured_calls`)."""
        if isinstance(text, Mapping):
            parsed = structured_calls(text.get("tool_calls"))
            content = text.get("content")
            return ParsedMessage(parsed.calls, content.strip() if isinstance(content, str) and not parsed.error else "", parsed.error)
        return ParsedMessage(text=text.strip())

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str | dict[str, Any]:
        """The assistant message that makes ``calls``: a message dict with ``tool_calls`` (ids
        ``call_0``, ``call_1``, ...), or the text alone when there is no call."""
        if not calls:
            return text
        return {"role": "assistant", "content": text, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)]}  # fmt: skip


def structured_calls(tool_calls: Any) -> ParsedMessage:
    """The calls of an assistant message's structured ``tool_calls``: a list of
    ``{"type": "function", "function": {"name", "arguments"}}`` (or flat ``{"name", "arguments"}``)
    objects, arguments as an object or a JSON string. Hostile input gives ``error``, never raises."""
    if tool_calls is None:
        return ParsedMessage()
    if not isinstance(tool_calls, list):
        return ParsedMessage(error=f"tool_calls must be a list, got {type(tool_calls).__name__}")
    try:
        calls = []
        for i, item in enumerate(tool_calls):
            function = item.get("function", item) if isinstance(item, dict) else item
            calls.append(_call_from_object(function, "arguments", f"tool call {i + 1}"))
    except _MalformedCall as exc:
        return ParsedMessage(error=str(exc))
    return ParsedMessage(calls=tuple(calls))


FORMATS: Mapping[str, CallFormat] = {f.name: f for f in (HermesFormat(), PythonicFormat(), JsonFormat(), NativeFormat())}


def get_format(name: str) -> CallFormat:
    """The call format called ``name``; unknown names raise :class:`SealError` with the choices."""
    try:
        return FORMATS[name]
    except KeyError:
        raise SealError(f"Unknown tool-call format {name!r}; expected one of {', '.join(FORMATS)}.") from None


# -- BFCL docs -> JSON-schema tool specs ------------------------------------------------------

# BFCL type names -> JSON-schema/OpenAPI types (bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI).
BFCL_TO_JSON_TYPE: Mapping[str, str] = {
    "integer": "integer", "number": "number", "float": "number", "string": "string",
    "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "dict": "object",
    "object": "object", "tuple": "array", "any": "string", "byte": "integer", "short": "integer",
    "long": "integer", "double": "number", "char": "string", "ArrayList": "array", "Array": "array",
    "HashMap": "object", "Hashtable": "object", "Queue": "array", "Stack": "array", "Any": "string",
    "String": "string", "Bigint": "integer",
}  # fmt: skip


def _convert_properties(properties: dict[str, Any]) -> dict[str, Any]:
    """BFCL parameter properties -> JSON schema, exactly as BFCL's ``_cast_to_openai_type``."""
    for spec in properties.values():
        bfcl_type = spec.get("type")
        if bfcl_type is None:
            spec["type"] = "string"
            continue
        if bfcl_type == "float":
            spec["format"] = "float"
            spec["description"] += " This is a float type value."
        spec["type"] = BFCL_TO_JSON_TYPE.get(bfcl_type, "string")
        if spec["type"] in ("array", "object"):
            if "properties" in spec:
                spec["properties"] = _convert_properties(spec["properties"])
            elif "items" in spec:
                items = spec["items"]
                items["type"] = BFCL_TO_JSON_TYPE[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = BFCL_TO_JSON_TYPE[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _convert_properties(items["properties"])
    return properties


def tool_spec(doc: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI-style tool spec for a BFCL doc (``{"type": "function", "function": {...}}``).

    Identical to ``bfcl_eval.model_handler.utils.convert_to_tool(..., GORILLA_TO_OPENAPI,
    ModelStyle.OPENAI_COMPLETIONS)`` — the conversion the SEAL reference uses: ``dict`` becomes
    ``object``, ``float`` becomes ``number`` with ``format: float`` and a note in the
    description, and the ``response`` schema is kept.
    """
    function = copy.deepcopy(dict(doc))
    function["name"] = function["name"].replace(".", "_")
    function["parameters"]["type"] = "object"
    function["parameters"]["properties"] = _convert_properties(function["parameters"]["properties"])
    return {"type": "function", "function": function}


# -- schema validation ------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemaViolation:
    """One way a call breaks its tool's schema.

    kind: ``missing_required`` | ``unknown_argument`` | ``wrong_type`` | ``not_in_enum`` |
        ``invalid_value``.
    argument: the top-level argument concerned.
    message: a human-readable explanation.
    """

    kind: str
    argument: str
    message: str


def _is_strict_integer(checker: Any, instance: Any) -> bool:
    # Python backends receive 1.0 as a float, so it is not an integer here (JSON schema says it is).
    return isinstance(instance, int) and not isinstance(instance, bool)


_TYPE_CHECKER = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer)
_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=_TYPE_CHECKER)


_ENUM_IN_DESCRIPTION = re.compile(r"\[Enum\]:\s*(.+?)\s*$", re.DOTALL)


def enum_values(prop: Mapping[str, Any]) -> list[Any] | None:
    """The allowed values of a parameter: its ``enum``, or the ``[Enum]: ...`` its description ends with.

    BFCL's multi-turn docs never use ``enum`` keys; they write ``[Enum]: ["on", "off"]`` or
    ``[Enum]: USD, EUR`` at the end of the description. The ground truth respects every one.
    """
    if isinstance(prop.get("enum"), list):
        return list(prop["enum"])
    match = _ENUM_IN_DESCRIPTION.search(str(prop.get("description", "")))
    if not match:
        return None
    text = match.group(1)
    if text.startswith("["):
        try:
            values = json.loads(text)
        except ValueError:
            return None
        return values if isinstance(values, list) else None
    return [item.strip().rstrip(".") for item in text.split(",") if item.strip()]


def _compile_validator(parameters: Mapping[str, Any]) -> jsonschema.protocols.Validator:
    properties = copy.deepcopy(dict(parameters.get("properties", {})))
    for prop in properties.values():
        allowed = enum_values(prop)
        if allowed is not None and "enum" not in prop:
            target = prop.setdefault("items", {}) if prop.get("type") == "array" else prop
            target["enum"] = allowed
    schema = {
        "type": "object",
        "properties": properties,
        "required": list(parameters.get("required", [])),
        "additionalProperties": False,
    }
    return _Validator(schema)


def _violations(validator: jsonschema.protocols.Validator, call: ToolCall) -> tuple[SchemaViolation, ...]:
    known = validator.schema["properties"]
    violations = []
    for error in sorted(validator.iter_errors(call.arguments), key=lambda e: list(e.path)):
        if error.validator == "required":
            for name in error.validator_value:
                if name not in call.arguments:
                    violations.append(SchemaViolation("missing_required", name, f"missing required argument {name!r}"))
        elif error.validator == "additionalProperties":
            for name in call.arguments:
                if name not in known:
                    violations.append(SchemaViolation("unknown_argument", name, f"unknown argument {name!r}"))
        else:
            argument = str(error.path[0]) if error.path else ""
            kind = {"type": "wrong_type", "enum": "not_in_enum"}.get(str(error.validator), "invalid_value")
            violations.append(SchemaViolation(kind, argument, f"argument {argument!r}: {error.message[:300]}"))
    return tuple(violations)


def validate_call(call: ToolCall, spec: Mapping[str, Any]) -> tuple[SchemaViolation, ...]:
    """Check a call's arguments against its tool spec (from :func:`tool_spec`).

    Reports missing required arguments, unknown arguments, wrong JSON types (integers are strict:
    ``1.0`` is not an integer; numbers accept integers), values outside the allowed values
    (:func:`enum_values`) and other violations of nested schemas. Never raises for any call.
    """
    return _violations(_compile_validator(spec["function"]["parameters"]), call)


@dataclass(frozen=True)
class ToolSchema:
    """A BFCL doc with its spec and compiled validator (built once by a :class:`ToolCatalog`)."""

    doc: Mapping[str, Any]
    spec_json: str
    validator: Any = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.doc["name"]

    def spec(self) -> dict[str, Any]:
        """A fresh copy of the OpenAI-style spec (callers may change it freely)."""
        return json.loads(self.spec_json)

    def validate(self, call: ToolCall) -> tuple[SchemaViolation, ...]:
        """Same as :func:`validate_call` with this tool's spec."""
        return _violations(self.validator, call)


class ToolCatalog:
    """Specs and validators for BFCL docs, computed once per distinct doc.

    The 800 tasks repeat the same ~160 docs; converting and compiling them on every episode
    would cost more than playing it. A catalog is an ordinary object (no global cache).
    """

    def __init__(self) -> None:
        self._by_name: dict[str, list[ToolSchema]] = {}

    def schema(self, doc: Mapping[str, Any]) -> ToolSchema:
        for known in self._by_name.get(doc["name"], ()):
            if known.doc == doc:
                return known
        spec = tool_spec(doc)
        made = ToolSchema(copy.deepcopy(dict(doc)), json.dumps(spec), _compile_validator(spec["function"]["parameters"]))
        self._by_name.setdefault(doc["name"], []).append(made)
        return made
