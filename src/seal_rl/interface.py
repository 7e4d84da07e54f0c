"""The interface Ω: how tools, results, errors and guidance are shown to the agent (SEAL §3.3).

    õ_i = Ω_t(o_i, F, H_t, C_t) = o_i ⊕ φ_schema(F) ⊕ φ_err(o_i, H_t) ⊕ φ_cap(C_t)      (Eq. 8–9)

The *base* interface (``o_i``) is shared by vanilla RL, SEAL and evaluation. Two prompt modes:

* ``bfcl_qwen_fc`` — the tool block BFCL's Qwen FC handler renders, byte for byte, as a system
  message: ``# Tools`` ... ``<tools>`` one BFCL doc per line (``json.dumps``) ``</tools>`` ...
  ``<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>``. Tool
  results come back as one user message of ``<tool_response>`` blocks, which is what the Qwen2.5
  chat template makes of consecutive ``tool`` messages, so the conversation renders identically
  under any chat template. Requires the ``hermes`` call format.
* ``chat_template`` — no system message; the tools go to the tokenizer's chat template as
  OpenAI-style specs (``info["tools"]``) and results come back as ``tool`` messages.

In both modes a rejected message gets a user message ``[ERROR] Invalid tool call format: ...`` (as
in the SEAL reference) and a miss_func reveal turn gets a user message listing the new functions,
then BFCL's sentence "I have updated some more functions you can choose from. What about now?".

Training-time components, each switched by the :class:`InterfaceState` (Ω_t):

* φ_schema — `` [required]``, `` Allowed values: a, b`` (and, in the ``seal`` preset, the JSON type)
  appended to parameter descriptions of the chosen tools, wherever docs are shown (system block,
  specs, miss_func reveals), plus a call-format note in the system prompt (it names the
  ``[required]`` marker only when some shown doc carries one).
* φ_err — ``[Hint]`` lines after a rejected message (call skeleton, available tools, answer in
  text if nothing fits) and ``[ToolHint]`` lines after failed calls, including BFCL's plain
  ``Error during execution: ...`` results: missing or unknown arguments, types, allowed values,
  "inspect first" for things that do not exist, "authenticate first". Every hint that suggests
  retrying also offers asking the user (:data:`ASK_USER`). Built only from the error, the tool's
  doc and the available tool names — never from the ground truth.
* φ_cap — short capability guidelines appended to the system prompt, and optionally the list of
  available tools, restated after each miss_func reveal so that it stays current.

:func:`evolve` is ``Evolve(Ω_t, C_t) -> Ω_{t+1}`` (Eq. 15): labels under pressure in the capability
profile switch components on, with hysteresis (DESIGN.md §5). In evaluation an :class:`Interface`
built with ``training=False`` renders exactly the base interface, whatever its state.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from seal_rl.errors import SealError
from seal_rl.profile import CapabilityProfile
from seal_rl.protocol import ADDITIONAL_FUNCTIONS_FC, check_protocol, reveal_text
from seal_rl.tools import FORMATS, SchemaViolation, ToolCatalog, enum_values

Message = dict[str, Any]

PROMPT_MODES: tuple[str, ...] = ("bfcl_qwen_fc", "chat_template")
PRESETS: tuple[str, ...] = ("vanilla", "paper", "seal")

ADDITIONAL_FUNCTIONS_PROMPT = ADDITIONAL_FUNCTIONS_FC

_QWEN_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_QWEN_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)

# The one system sentence of the reference's static "observation-lite" (the `paper` preset).
PAPER_NOTE = (
    "Supply every parameter marked [required] exactly as the schema describes it, and do not "
    "invent tools that are not in the schema."
)

CALL_SKELETONS: Mapping[str, str] = {
    "hermes": '<tool_call>\n{"name": <tool name>, "arguments": {<parameter>: <value>, ...}}\n</tool_call>',
    "pythonic": "[<tool name>(<parameter>=<value>, ...), ...]",
    "json": '{"name": <tool name>, "parameters": {<parameter>: <value>, ...}}',
    "native": "a tool call in your own tool-call syntax, naming the tool and its arguments",
}

GUIDELINES: Mapping[str, str] = {
    "cautious_call": "[Cautious-call] If the request cannot be done with the available tools, or lacks "
    "information a tool needs, say so in plain text instead of calling a tool.",
    "active_respond": "[Active-respond] When the available tools can do what the user asks, call them "
    "now; do not only describe what you would do.",
    "state_aware": "[State-aware] Keep track of the current state (working directory, logins, earlier "
    "results) and make sure every requested change is actually applied.",
    "scope": "[Scope] Use only the tools of the systems the request is about, and only as many calls "
    "as the request needs.",
    "format": "[Format] Retrieve the information the user asks for with the tools and report the "
    "results in your answer.",
}

# Which component answers pressure on which label (DESIGN.md §5).
GUIDELINE_FOR_LABEL: Mapping[str, str] = {
    "spurious_tool_call": "cautious_call",
    "missing_tool_call": "active_respond",
    "state_mismatch": "state_aware",
    "instance_mismatch": "scope",
    "response_mismatch": "format",
}
SCHEMA_LABEL, PARSE_LABEL, TOOL_ERROR_LABEL = "argument_mismatch", "invalid_tool_call", "recovery_failure"
PRESSURE_LABELS: tuple[str, ...] = (SCHEMA_LABEL, PARSE_LABEL, TOOL_ERROR_LABEL, *GUIDELINE_FOR_LABEL)

ALL_TOOLS = "*"

# Every φ_err hint that suggests retrying a call also offers asking the user (a miss_param turn
# is passed by asking, not by guessing). Fixed text: it never depends on what is actually missing.
ASK_USER = "if a value you need is not known, ask the user"
LOOK_UP = "if a value you need is not known, look it up with the tools"
"""what replaces :data:`ASK_USER` where nobody can be asked (τ²'s solo mode: a text message ends the episode)"""


def qwen_tools_block(lines: Sequence[str]) -> str:
    """Qwen2.5's hermes ``# Tools`` block around one JSON tool per line (its chat template's text;
    BFCL's ``QwenFCHandler`` writes the same)."""
    return _QWEN_TOOLS_HEAD + "".join(f"\n{line}" for line in lines) + _QWEN_TOOLS_TAIL


def format_note(call_format: str, *, marked: bool) -> str:
    """φ_schema's call-format note (``seal`` preset). It names the `` [required]`` marker only when
    ``marked`` (some shown doc carries it); otherwise it points at the schemas' required lists."""
    required = "[required]" if marked else "required"
    return (f"Write each tool call exactly as {CALL_SKELETONS[call_format]}, supply every {required} "
            "parameter, and call only the tools listed.")  # fmt: skip


def tool_list_note(docs: Sequence[Mapping[str, Any]]) -> str:
    """φ_cap's list of the available tools (the missing_tool_call affordance cue)."""
    return "Available tools: " + ", ".join(doc["name"] for doc in docs) + "."


@dataclass(frozen=True)
class InterfaceState:
    """Ω_t: which training-time components are on. Immutable, JSON-serialisable, diffable.

    schema_tools: tools whose docs carry φ_schema annotations (``("*",)`` = every tool).
    schema_types: φ_schema also states each parameter's JSON type.
    format_note: the system prompt states the call format (φ_schema) — or, in the ``paper``
        preset, the reference's single observation-lite sentence.
    parse_hints / tool_hints: φ_err after rejected messages / after failed calls.
    guidelines: φ_cap guideline ids (keys of :data:`GUIDELINES`), in order.
    tool_list: φ_cap also lists the available tools (the missing_tool_call affordance cue).
    pressure: labels currently under pressure (the hysteresis memory of :func:`evolve`).
    round: the training round this state was evolved for.
    """

    preset: str = "vanilla"
    schema_tools: tuple[str, ...] = ()
    schema_types: bool = False
    format_note: bool = False
    parse_hints: bool = False
    tool_hints: bool = False
    guidelines: tuple[str, ...] = ()
    tool_list: bool = False
    pressure: tuple[str, ...] = ()
    round: int = 0

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise SealError(f"Unknown interface preset {self.preset!r}; expected one of {', '.join(PRESETS)}.")
        unknown = [g for g in self.guidelines if g not in GUIDELINES]
        if unknown:
            raise SealError(f"Unknown guideline(s) {unknown}; expected some of {', '.join(GUIDELINES)}.")

    @classmethod
    def initial(cls, preset: str) -> InterfaceState:
        """Ω_0 of a preset: nothing for ``vanilla`` and ``seal``; observation-lite for ``paper``."""
        if preset == "paper":
            return cls(preset="paper", schema_tools=(ALL_TOOLS,), format_note=True)
        return cls(preset=preset)

    @property
    def active_components(self) -> list[str]:
        """Names of the components that are on, for logs and reports."""
        on = []
        if self.schema_tools:
            on.append("schema:" + ",".join(self.schema_tools))
        if self.format_note:
            on.append("format_note")
        if self.parse_hints:
            on.append("parse_hints")
        if self.tool_hints:
            on.append("tool_hints")
        on += [f"guideline:{g}" for g in self.guidelines]
        if self.tool_list:
            on.append("tool_list")
        return on

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InterfaceState:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SealError(f"Unknown interface state field(s) {sorted(unknown)}.")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def diff(self, other: InterfaceState) -> dict[str, tuple[Any, Any]]:
        """Fields that differ, as ``{field: (self value, other value)}``."""
        return {f.name: (getattr(self, f.name), getattr(other, f.name))
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)}  # fmt: skip


PAPER_MIN_COUNT = 8
"""the SEAL reference's count: a label needs 8 turns to drive a guideline (SEAL_METHOD.md §5)"""
PAPER_EPISODES_PER_WINDOW = 256
"""...in a profile window of one round of 32 tasks x 8 rollouts (the paper's recipe, §6)"""


def auto_min_count(episodes_per_window: int) -> int:
    """``min_count: auto``: the paper's count (8 turns per 256 episodes) scaled to the episodes a
    profile window holds, rounded half up, at least 1: 8 at the paper's scale, 1 up to 47 episodes."""
    return max(1, math.floor(PAPER_MIN_COUNT * episodes_per_window / PAPER_EPISODES_PER_WINDOW + 0.5))


@dataclass(frozen=True)
class InterfaceConfig:
    """When labels count as under pressure (DESIGN.md §5; defaults from the SEAL reference)."""

    preset: str = "seal"
    """``vanilla`` (base only), ``paper`` (static observation-lite) or ``seal`` (label-driven)"""
    min_count: int | str = "auto"
    """a label needs at least this many turns in the profile window to be under pressure; ``auto``:
    the paper's 8 at 256 episodes a window, scaled to the run's (:func:`auto_min_count`)"""
    prevalence_on: float = 0.10
    """...and at least this share of the window's countable turns to switch its component on"""
    prevalence_off: float = 0.05
    """an active component stays on until the label's share falls below this (hysteresis)"""
    max_reward: float = 0.6
    """...and the mean reward of trajectories carrying the label must be below this"""
    max_guidelines: int = 3
    """φ_cap shows at most this many guidelines, by prevalence × (1 − mean reward)"""

    def __post_init__(self) -> None:
        InterfaceState.initial(self.preset)
        if not 0.0 <= self.prevalence_off <= self.prevalence_on <= 1.0:
            raise SealError(
                f"Need 0 <= prevalence_off <= prevalence_on <= 1, got {self.prevalence_off} and {self.prevalence_on}."
            )
        count = self.min_count
        if count != "auto" and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise SealError(f"interface.min_count must be an integer >= 1 or auto, got {count!r}.")
        if self.max_guidelines < 0:
            raise SealError("interface.max_guidelines must be >= 0.")

    def resolved(self, episodes_per_window: int) -> InterfaceConfig:
        """This config with ``min_count: auto`` made a number for windows of ``episodes_per_window``."""
        return self if self.min_count != "auto" else replace(self, min_count=auto_min_count(episodes_per_window))


def evolve(state: InterfaceState, profile: CapabilityProfile, config: InterfaceConfig) -> InterfaceState:
    """Evolve(Ω_t, C_t) -> Ω_{t+1} (SEAL Eq. 15). Pure; ``vanilla`` and ``paper`` never change.

    A label is under pressure when its count in the profile window is at least ``min_count``, its
    prevalence at least ``prevalence_on`` (``prevalence_off`` if it already was) and the mean
    reward of trajectories carrying it below ``max_reward``. Pressure switches on: φ_schema on the
    tools involved (argument_mismatch), φ_err parse hints (invalid_tool_call), φ_err tool hints
    (recovery_failure) and guidelines for the other labels, the top ``max_guidelines`` by
    prevalence × (1 − mean reward).
    """
    if state.preset != "seal":
        return replace(state, round=profile.round)
    if config.min_count == "auto":
        raise SealError("evolve needs a number for min_count: resolve `auto` with InterfaceConfig.resolved(episodes per window).")
    stats = profile.label_stats()
    pressure = []
    for label in PRESSURE_LABELS:
        s = stats.get(label)
        if s is None:
            continue
        threshold = config.prevalence_off if label in state.pressure else config.prevalence_on
        if s.turns >= config.min_count and s.prevalence >= threshold and s.mean_reward < config.max_reward:
            pressure.append(label)
    ranked = sorted(
        (label for label in pressure if label in GUIDELINE_FOR_LABEL),
        key=lambda label: (-stats[label].prevalence * (1 - stats[label].mean_reward), label),
    )[: config.max_guidelines]
    schema_tools = tuple(sorted(profile.tools_with(SCHEMA_LABEL))) if SCHEMA_LABEL in pressure else ()
    return replace(
        state,
        schema_tools=schema_tools,
        schema_types=bool(schema_tools),
        format_note=bool(schema_tools) or PARSE_LABEL in pressure,
        parse_hints=PARSE_LABEL in pressure,
        tool_hints=TOOL_ERROR_LABEL in pressure,
        guidelines=tuple(GUIDELINE_FOR_LABEL[label] for label in ranked),
        tool_list="missing_tool_call" in ranked,
        pressure=tuple(pressure),
        round=profile.round,
    )


# -- rendering --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolResult:
    """One executed call as the interface sees it.

    name/arguments: the call. output: the result string the executor produced.
    error: the exception message or backend-reported error, if any. violations: schema violations.
    """

    name: str
    output: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    violations: tuple[SchemaViolation, ...] = ()


@dataclass(frozen=True)
class Rejection:
    """A message rejected whole: why, and the names it used that are not available (if any)."""

    reason: str
    unavailable: tuple[str, ...] = ()


_NOT_FOUND = re.compile(r"no such|not found|does not exist|doesn't exist|not exist|cannot find|unknown", re.I)
_AUTH = re.compile(r"authenticat|log ?in|logged in|not authorized|unauthori[sz]ed|token", re.I)
_MISSING_ARGUMENT = re.compile(r"missing \d+ required (?:positional|keyword-only) arguments?: (.+)$")
_UNEXPECTED_ARGUMENT = re.compile(r"got an unexpected keyword argument '([^']+)'")
_INSPECT_TOOLS = ("ls", "pwd", "find", "list_all_airports", "get_watchlist", "get_order_history", "view_messages_sent")


class Interface:
    """Ω: renders environment events as chat messages under an :class:`InterfaceState`.

    ``training=False`` (evaluation) renders the base interface whatever the state, so every
    preset produces byte-identical prompts and observations to ``vanilla``.
    """

    def __init__(
        self,
        prompt_mode: str = "bfcl_qwen_fc",
        state: InterfaceState | None = None,
        *,
        call_format: str = "hermes",
        training: bool = True,
        catalog: ToolCatalog | None = None,
        protocol: str = "seal",
        inspect_tools: Sequence[str] | None = None,
        user: bool = True,
    ) -> None:
        """``inspect_tools``: the tools φ_err's "inspect the current state first" hint names (an
        environment family's affordance; default BFCL's listing tools). ``user``: whether the agent can
        write to a user at all (False in τ²'s solo mode): hints then never suggest asking or answering in text."""
        check_protocol(protocol)
        if prompt_mode not in PROMPT_MODES:
            raise SealError(f"Unknown prompt mode {prompt_mode!r}; expected one of {', '.join(PROMPT_MODES)}.")
        if call_format not in FORMATS:
            raise SealError(f"Unknown tool-call format {call_format!r}; expected one of {', '.join(FORMATS)}.")
        self.prompt_mode = prompt_mode
        self.call_format = call_format
        self.protocol = protocol
        self.training = training
        self.state = state if state is not None else InterfaceState()
        self._active = self.state if training else InterfaceState()
        self._catalog = catalog if catalog is not None else ToolCatalog()
        self.inspect_tools = tuple(inspect_tools) if inspect_tools is not None else _INSPECT_TOOLS
        self.user = user

    # φ_schema -------------------------------------------------------------------------------

    def _extras(self, doc: Mapping[str, Any]) -> dict[str, str]:
        """φ_schema text to append to each parameter description of this tool ({} if not chosen)."""
        tools = self._active.schema_tools
        if not (ALL_TOOLS in tools or doc["name"] in tools):
            return {}
        required = set(doc["parameters"].get("required", []))
        extras = {}
        for name, prop in doc["parameters"]["properties"].items():
            extra = " [required]" if name in required else ""
            allowed = enum_values(prop)
            if allowed:
                extra += " Allowed values: " + ", ".join(str(v) for v in allowed)
            if self._active.schema_types and "type" in prop:
                extra += f" Type: {prop['type']}."
            if extra:
                extras[name] = extra
        return extras

    @staticmethod
    def _appended(function: dict[str, Any], extras: Mapping[str, str]) -> dict[str, Any]:
        shown = copy.deepcopy(function)
        for name, extra in extras.items():
            prop = shown["parameters"]["properties"][name]
            prop["description"] = prop.get("description", "") + extra
        return shown

    def annotate(self, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        """A BFCL doc as shown: with φ_schema annotations if its tool is chosen, else unchanged."""
        extras = self._extras(doc)
        return self._appended(dict(doc), extras) if extras else doc

    def tool_specs(self, docs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """OpenAI-style specs of the tools as shown, for ``apply_chat_template(tools=...)``.

        φ_schema text is appended after the converted description, so every annotation is a
        suffix of the base description in both the doc and the spec form."""
        specs = []
        for doc in docs:
            spec = self._catalog.schema(doc).spec()
            extras = self._extras(doc)
            if extras:
                spec["function"] = self._appended(spec["function"], extras)
            specs.append(spec)
        return specs

    def _system_notes(self, docs: Sequence[Mapping[str, Any]]) -> list[str]:
        state, notes = self._active, []
        if state.format_note:
            if state.preset == "paper":
                notes.append(PAPER_NOTE)
            else:
                notes.append(format_note(self.call_format, marked=self._marks_required(docs)))
        notes += [GUIDELINES[g] for g in state.guidelines]
        if state.tool_list and docs:
            notes.append(tool_list_note(docs))
        return notes

    def _marks_required(self, docs: Sequence[Mapping[str, Any]]) -> bool:
        """Whether φ_schema shows a `` [required]`` marker in any of these docs."""
        return any(extra.startswith(" [required]") for doc in docs for extra in self._extras(doc).values())

    # base events ----------------------------------------------------------------------------

    def system(self, docs: Sequence[Mapping[str, Any]]) -> list[Message]:
        """The messages that open an episode before the first question."""
        notes = self._system_notes(docs)
        if self.prompt_mode == "chat_template":
            return [{"role": "system", "content": "\n".join(notes)}] if notes else []
        block = qwen_tools_block([json.dumps(self.annotate(doc)) for doc in docs])
        return [{"role": "system", "content": block + "".join(f"\n\n{note}" for note in notes)}]

    def question(self, messages: Sequence[Mapping[str, Any]]) -> list[Message]:
        """A user turn's question, as BFCL gives it."""
        return [dict(message) for message in messages]

    def reveal(self, docs: Sequence[Mapping[str, Any]], available: Sequence[Mapping[str, Any]] = ()) -> list[Message]:
        """The miss_func turn that makes held-out functions available (annotated like the others).

        ``available``: every tool available from now on, the revealed ones included. When φ_cap
        lists the tools (``tool_list``), the list is restated after the reveal so that it stays
        current; the one in the system prompt was fixed when the episode opened.

        Under the ``bfcl`` protocol the message is BFCL's own (:func:`seal_rl.protocol.reveal_text`):
        the ``repr`` of the docs, or in ``chat_template`` mode the sentence alone."""
        if self.protocol == "bfcl":
            content = reveal_text([self.annotate(doc) for doc in docs], self.prompt_mode)
        elif self.prompt_mode == "chat_template":
            content = "\n".join(json.dumps(spec) for spec in self.tool_specs(docs)) + f"\n{ADDITIONAL_FUNCTIONS_PROMPT}"
        else:
            content = "\n".join(json.dumps(self.annotate(doc)) for doc in docs) + f"\n{ADDITIONAL_FUNCTIONS_PROMPT}"
        if self._active.tool_list and available:
            content += "\n\n" + tool_list_note(available)
        return [{"role": "user", "content": content}]

    def tool_results(self, results: Sequence[ToolResult], available: Sequence[Mapping[str, Any]] = (),
                     call_ids: Sequence[str] = ()) -> list[Message]:  # fmt: skip
        """The observation after an accepted message: one result per call, in call order.
        ``call_ids``: the ids of structured ``tool_calls`` (``native`` format), given back as each
        ``tool`` message's ``tool_call_id``, the field chat templates pair results with calls by."""
        outputs = [r.output + self._tool_hints(r, available) for r in results]
        if self.prompt_mode == "chat_template":
            ids = list(call_ids) + [None] * len(results)
            return [{"role": "tool", "name": r.name, "content": out, **({"tool_call_id": i} if i else {})}
                    for r, out, i in zip(results, outputs, ids)]  # fmt: skip
        blocks = "\n".join(f"<tool_response>\n{out}\n</tool_response>" for out in outputs)
        return [{"role": "user", "content": blocks}]

    def rejection(self, rejected: Rejection, available: Sequence[Mapping[str, Any]] = ()) -> list[Message]:
        """The observation after a message that was rejected whole (nothing executed)."""
        content = f"[ERROR] Invalid tool call format: {rejected.reason}"
        if self._active.parse_hints:
            names = ", ".join(doc["name"] for doc in available)
            content += f"\n[Hint] Write each tool call exactly as {CALL_SKELETONS[self.call_format]}"
            if rejected.unavailable or names:
                content += f"\n[Hint] Available tools: {names}."
            if self.user:
                content += "\n[Hint] If no available tool fits the request, answer in plain text without a tool call."
        return [{"role": "user", "content": content}]

    # φ_err ----------------------------------------------------------------------------------

    def _tool_hints(self, result: ToolResult, available: Sequence[Mapping[str, Any]]) -> str:
        if not self._active.tool_hints or (result.error is None and not result.violations):
            return ""
        ask = ASK_USER if self.user else LOOK_UP
        docs = {doc["name"]: doc for doc in available}
        doc = docs.get(result.name)
        params = doc["parameters"]["properties"] if doc else {}
        required = set(doc["parameters"].get("required", [])) if doc else set()
        signature = ", ".join(f"{p}{' (required)' if p in required else ''}" for p in params) or "none"
        hints = []
        error = result.error or ""
        missing = [v.argument for v in result.violations if v.kind == "missing_required"]
        # `(.+)$` can only match on the last line; searching the whole error text backtracks
        # quadratically over model text such as a hostile file name (2 s on 96 KB).
        match = _MISSING_ARGUMENT.search(error.removesuffix("\n").rpartition("\n")[2])
        if match and not missing:
            missing = re.findall(r"'([^']+)'", match.group(1))
        unknown = [v.argument for v in result.violations if v.kind == "unknown_argument"]
        match = _UNEXPECTED_ARGUMENT.search(error)
        if match and not unknown:
            unknown = [match.group(1)]
        if missing:
            hints.append(f"{result.name} needs the argument(s) {', '.join(missing)}; its parameters are: {signature}. "
                         f"Supply them and retry; {ask}.")  # fmt: skip
        if unknown:
            hints.append(f"{result.name} has no parameter {', '.join(unknown)}; its parameters are: {signature}.")
        for violation in result.violations:
            prop = params.get(violation.argument, {})
            if violation.kind == "wrong_type" and "type" in prop:
                hints.append(f"Argument {violation.argument} of {result.name} must be of type {prop['type']}.")
            elif violation.kind == "not_in_enum" and enum_values(prop):
                values = ", ".join(str(v) for v in enum_values(prop))
                hints.append(f"Argument {violation.argument} of {result.name} must be one of: {values}.")
        if not hints and error:
            if _AUTH.search(error):
                auth = [n for n in docs if "login" in n or "authenticate" in n]
                hints.append("Authenticate first" + (f" (e.g. with {', '.join(auth)})" if auth else "") + f", then retry; {ask}.")
            elif _NOT_FOUND.search(error):
                inspect = [n for n in self.inspect_tools if n in docs]
                hints.append("Something the call refers to does not exist here; inspect the current state first"
                             + (f" (e.g. with {', '.join(inspect)})" if inspect else "") + f", then retry; {ask}.")  # fmt: skip
            elif result.output.startswith("Error during execution"):
                hints.append(f"The call to {result.name} failed; check its arguments against its parameters ({signature}) and the current state, then retry; {ask}.")
            else:
                hints.append(f"{result.name} reported an error; fix its cause and retry" + (", or tell the user why it cannot be done" if self.user else "") + f"; {ask}.")
        return "".join(f"\n[ToolHint] {hint}" for hint in hints)
