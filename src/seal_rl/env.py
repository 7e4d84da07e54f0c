"""The executable BFCL multi-turn episode, in the spirit of Gymnasium's ``Env``.

One :class:`BfclEnv` plays one episode at a time: ``reset(task)`` opens it, ``step(text)`` feeds
one raw assistant message and returns what the agent sees next. Two protocols
(:mod:`seal_rl.protocol`): ``bfcl``, the official ``bfcl generate`` loop, and ``seal``, the SEAL
reference's (SEAL_METHOD.md §5); see the :class:`BfclEnv` docstring.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seal_rl.backends import EXECUTION_ERROR_PREFIX, Backends, CallOutcome
from seal_rl.errors import SealError
from seal_rl.interface import Interface, Message, Rejection, ToolResult
from seal_rl.limits import STOPPED_CALL, StepTimeout, stopped_call_error, time_limit, truncate_result
from seal_rl.protocol import Decoded, check_protocol, decode
from seal_rl.reasoning import REASONING_FIELDS, answer
from seal_rl.tasks import Task
from seal_rl.tools import ParsedMessage, SchemaViolation, ToolCall, ToolCatalog, get_format, structured_calls
from seal_rl.verify import Verdict, verify

ERROR_KINDS: tuple[str, ...] = ("parse", "unknown_tool", "schema", "execution")


@dataclass(frozen=True)
class EnvConfig:
    """How an episode is played."""

    protocol: str = "seal"
    """``seal`` (the SEAL reference's loop; training) or ``bfcl`` (the official ``bfcl generate``
    loop; what ``seal eval`` uses by default) — see :mod:`seal_rl.protocol`"""
    call_format: str = "hermes"
    """how the agent writes tool calls: ``hermes`` | ``pythonic`` | ``json`` | ``native`` (the model's own,
    ``chat_template`` mode only; see seal_rl.tools)"""
    prompt_mode: str = "bfcl_qwen_fc"
    """``bfcl_qwen_fc`` (tools in a Qwen-style system block) or ``chat_template`` (see seal_rl.interface)"""
    max_model_calls: int = 20
    """``seal`` protocol: model messages per episode; the episode is truncated when they run out
    (reference: 20)"""
    max_steps_per_turn: int = 20
    """``bfcl`` protocol: executing steps per user turn; the episode is force-terminated once a
    turn exceeds it (BFCL's ``MAXIMUM_STEP_LIMIT``)"""
    max_message_chars: int = 100_000
    """longer assistant messages are rejected unparsed (a 4096-token response is ~16k chars)"""
    max_calls_per_message: int = 64
    """messages with more calls are rejected whole, nothing executed (BFCL ground truth: at most 34 per turn)"""
    max_result_chars: int = 50_000
    """longer tool results are cut, with a ``... [truncated: N more characters]`` marker (largest
    official result: 31,706)"""
    observation_budget_chars: int = 1_000_000
    """tool-result characters shown per episode; the episode is truncated (``observation_budget``)
    after the step that exceeds it (largest ground-truth episode: 70,719)"""
    step_timeout_s: float = 10.0
    """wall time of one step's calls; the episode is truncated (``step_timeout``) when it runs out
    (see seal_rl.limits for the guarantee; largest ground-truth step: 6 ms)"""

    def __post_init__(self) -> None:
        check_protocol(self.protocol)
        Interface(self.prompt_mode, call_format=self.call_format, protocol=self.protocol)
        if self.protocol == "bfcl" and self.call_format == "json":
            raise SealError("The bfcl protocol decodes the hermes and pythonic call formats (and takes native calls "
                            "structured); use one of them.")
        if self.prompt_mode == "bfcl_qwen_fc" and self.call_format != "hermes":
            raise SealError(
                f"Prompt mode 'bfcl_qwen_fc' asks for <tool_call> blocks (the hermes format), but "
                f"call_format={self.call_format!r}. Use call_format='hermes' or prompt_mode='chat_template'."
            )
        if self.max_model_calls < 1:
            raise SealError(f"max_model_calls must be at least 1, got {self.max_model_calls}.")
        if self.max_steps_per_turn < 1:
            raise SealError(f"max_steps_per_turn must be at least 1, got {self.max_steps_per_turn}.")
        for name in ("max_message_chars", "max_calls_per_message", "max_result_chars", "observation_budget_chars"):
            if getattr(self, name) < 1:
                raise SealError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if not self.step_timeout_s > 0:
            raise SealError(f"step_timeout_s must be a positive number of seconds, got {self.step_timeout_s}.")


@dataclass(frozen=True)
class TraceEntry:
    """One call (or one unreadable message) in the execution trace.

    turn, step: the user turn and the episode-wide model-call index it came from.
    name, arguments: the call (None for a message that could not be parsed).
    accepted: the message was accepted and this call executed.
    result: the output string the agent saw for this call (None when not executed).
    error_kind: None, or one of ``parse`` | ``unknown_tool`` | ``schema`` | ``execution``.
    error: the parse error, the execution error or the schema violations, as text.
    schema_violations: how the call broke its tool's schema (it still executed).
    truncated: how many characters of the result were cut (``max_result_chars``); 0 for none.
    """

    turn: int
    step: int
    name: str | None
    arguments: dict[str, Any] | None
    accepted: bool
    result: str | None = None
    error_kind: str | None = None
    error: str | None = None
    schema_violations: tuple[SchemaViolation, ...] = field(default=())
    truncated: int = 0


def _clean_text(action: str | bytes) -> str:
    """Any str or bytes as valid UTF-8 text (undecodable bytes and lone surrogates become U+FFFD)."""
    if isinstance(action, bytes):
        return action.decode("utf-8", errors="replace")
    if not isinstance(action, str):
        raise TypeError(f"step() takes the assistant message as str or bytes, got {type(action).__name__}")
    try:
        action.encode("utf-8")
        return action
    except UnicodeEncodeError:
        return action.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace")


class BfclEnv:
    """A BFCL multi-turn task as an executable, multi-turn tool-use episode.

    ## Description
    The agent serves a user across the task's turns with the BFCL backends (file system, trading,
    travel, ...). Backends are fresh per episode and private to it.

    ## Action Space
    One raw assistant message (``str`` or ``bytes``), in the configured call format; with the
    ``native`` format, an assistant message dict whose calls are structured ``tool_calls``.

    ## Observation Space
    A list of new chat messages (``{"role", "content"}`` dicts): after ``reset``, the opening
    messages; after a message with calls, the tool results; after a message without calls, the next
    question (or, on a miss_func reveal turn, the new functions); ``[]`` once the task is over.
    Under the ``seal`` protocol a message that cannot be read gets an ``[ERROR] Invalid tool call
    format: ...`` message; under ``bfcl`` it ends the turn like a text answer. ``env.messages``
    holds the whole conversation.

    ## Rewards
    0.0 until the episode ends, then the verifier's binary reward (:func:`seal_rl.verify.verify`).

    ## Starting State
    Backends loaded with the task's initial configuration; the task's initial tools available.

    ## Episode End
    ``terminated`` when the agent ends the last turn (replies without calls); ``truncated`` when
    the step budget ran out first (``seal``: ``max_model_calls`` messages per episode; ``bfcl``:
    more than ``max_steps_per_turn`` executing steps in one turn), or when the driver calls
    :meth:`truncate` (e.g. its context budget ran out).

    ``seal`` protocol: a message that cannot be parsed, or that names a tool not available now, is
    rejected whole: nothing executes and it still costs a model call. ``bfcl`` protocol: the
    message is decoded as the official handler does (:func:`seal_rl.protocol.decode`) and every
    decoded call is executed by name, as the official executor does, held-out tools included. In
    both, every call executes on its own, in order; a bad argument gives that call an error result
    and the others still run.

    ## Arguments
    ``config`` (:class:`EnvConfig`), ``interface`` (default: the base interface of
    ``config.prompt_mode``) and ``catalog`` (a :class:`~seal_rl.tools.ToolCatalog` to share tool
    specs and validators between environments; one is made if not given).

    ## Version History
    * v0: protocol of the SEAL reference, BFCL ``2026.3.23`` backends and checker.
    * v1: the ``bfcl`` protocol (``EnvConfig.protocol``); ``seal`` unchanged.
    """

    def __init__(
        self,
        config: EnvConfig | None = None,
        interface: Interface | None = None,
        *,
        catalog: ToolCatalog | None = None,
    ) -> None:
        self.config = config if config is not None else EnvConfig()
        self._catalog = catalog if catalog is not None else ToolCatalog()
        self.interface = interface if interface is not None else Interface(
            self.config.prompt_mode, call_format=self.config.call_format, catalog=self._catalog,
            protocol=self.config.protocol,
        )  # fmt: skip
        shown = (self.interface.prompt_mode, self.interface.call_format, self.interface.protocol)
        if shown != (self.config.prompt_mode, self.config.call_format, self.config.protocol):
            raise SealError(
                f"The interface renders prompt mode {shown[0]!r} with format {shown[1]!r} under the "
                f"{shown[2]!r} protocol but the environment uses {self.config.prompt_mode!r} with "
                f"{self.config.call_format!r} under {self.config.protocol!r}; build both from the same settings."
            )
        self.format = get_format(self.config.call_format)
        self.task: Task | None = None

    # -- episode state ----------------------------------------------------------------------

    def reset(self, task: Task, *, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode of ``task``.

        ``seed`` is accepted for API symmetry; BFCL backends seed themselves from the task.

        Returns:
            observation (list[dict]): the system message (``bfcl_qwen_fc`` mode) and the first question.
            info (dict): ``turn`` (0), ``tools`` (OpenAI-style specs of the tools available now).
        """
        self.task = task
        self.messages: list[Message] = []
        self.trace: list[TraceEntry] = []
        self.calls_by_turn: list[list[list[ToolCall]]] = [[] for _ in range(task.num_turns)]
        self.steps: list[dict[str, Any]] = []
        self.turn = 0
        self.model_calls = 0
        self.turn_steps = 0
        self.verdict: Verdict | None = None
        self.end_reason: str | None = None
        self.observation_chars = 0  # tool-result characters shown so far (observation_budget_chars)
        self._limit_reached: str | None = None  # a per-step cap that ends the episode after this step
        self._backends = self._open_backends(task)
        self._docs = {doc["name"]: doc for doc in task.functions}
        self._schemas = {doc["name"]: self._catalog.schema(doc) for doc in task.functions}
        observation = self.interface.system(task.functions) + self._open_turn(0)
        self.messages.extend(observation)
        return observation, {"turn": 0, "tools": self.tools}

    @property
    def tools(self) -> list[dict[str, Any]]:
        """OpenAI-style specs of the tools the agent may call now."""
        return self.interface.tool_specs(list(self._docs.values()))

    @property
    def turns_reached(self) -> int:
        """How many user turns the agent has acted in (a question shown but never answered does
        not count: an episode cut off right after asking cannot have abstained)."""
        if self.task is None:
            return 0
        if self.end_reason == "completed":  # checked first: the ending step is logged after scoring
            return self.task.num_turns
        return self.steps[-1]["turn"] + 1 if self.steps else 0

    @property
    def done(self) -> bool:
        return self.end_reason is not None

    def step(
        self, action: str | bytes | Mapping[str, Any], *, end_turn: bool | None = None
    ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Feed one assistant message: its text, or (``native`` call format) a structured assistant
        message with ``tool_calls``, as a tokenizer's response parser gives it.

        ``end_turn`` (``bfcl`` protocol only) replays a recorded turn boundary, as
        ``seal eval --policy bfcl-result:`` does: True ends the user turn after this message
        (after executing its calls), False keeps the turn open even if the message ends it under
        the protocol; either way the step limit is the recording's, not re-applied. None (the
        default) lets the protocol decide.

        Returns:
            observation (list[dict]): the new messages the agent sees, e.g. one
                ``<tool_response>`` user message; ``[]`` once the task is over.
            reward (float): 0.0 until the episode ends, then the verifier's score (0.0 or 1.0).
            terminated (bool): the agent ended the last turn.
            truncated (bool): the step budget ran out first.
            info (dict): ``turn``, ``step``, ``event`` (``tool_results`` | ``rejected`` |
                ``next_turn`` | ``skipped`` | ``end``), ``tools`` when the available tools changed,
                and at the end ``verdict`` (:class:`~seal_rl.verify.Verdict`) and ``end_reason``.
        """
        if self.task is None or self.done:
            raise RuntimeError("step() called outside an episode; call env.reset(task) first.")
        if end_turn is not None and self.config.protocol != "bfcl":
            raise ValueError("end_turn replays recorded turn boundaries; it needs the bfcl protocol.")
        step = self.model_calls
        self.model_calls += 1
        message, parsed = self._read(action, step)
        self.messages.append(message)
        info: dict[str, Any] = {"turn": self.turn, "step": step}
        ids = [call["id"] for call in message.get("tool_calls", ())]
        if self.config.protocol == "bfcl":
            observation, info["event"], ending = self._bfcl_step(parsed, ids, step, info, end_turn)
        else:
            observation, info["event"], ending = self._seal_step(parsed, ids, step, info)
        self.steps.append({"turn": info["turn"], "event": info["event"]})
        self.messages.extend(observation)
        if not self.done and self._limit_reached is not None:
            ending = self._limit_reached
        if ending is not None and not self.done:
            self._finish(ending)
        reward = 0.0
        if self.done:
            info.update(event="end", verdict=self.verdict, end_reason=self.end_reason)
            reward = self.verdict.reward
        terminated = self.end_reason == "completed"
        return observation, reward, terminated, self.done and not terminated, info

    def _seal_step(self, parsed: ParsedMessage | Decoded, ids: list[str], step: int,
                   info: dict[str, Any]) -> tuple[list[Message], str, str | None]:  # fmt: skip
        """The SEAL reference's step: unreadable messages and unavailable tools are rejected with an
        error observation; 20 model calls per episode."""
        unavailable = [c.name for c in parsed.calls if c.name not in self._schemas]
        if parsed.error is not None:
            self.trace.append(TraceEntry(self.turn, step, None, None, False, error_kind="parse", error=parsed.error))
            rejection = Rejection(f"{parsed.error}. Nothing was executed.")
            observation, event = self.interface.rejection(rejection, list(self._docs.values())), "rejected"
        elif unavailable:
            observation, event = self._reject_unavailable(step, parsed.calls, unavailable), "rejected"
        elif parsed.calls:
            observation, event = self._execute(step, parsed.calls, ids), "tool_results"
        else:
            observation, event = self._end_turn(info)
        out_of_calls = not self.done and self.model_calls >= self.config.max_model_calls
        return observation, event, "max_model_calls" if out_of_calls else None

    def _bfcl_step(
        self, decoded: ParsedMessage | Decoded, ids: list[str], step: int, info: dict[str, Any], end_turn: bool | None
    ) -> tuple[list[Message], str, str | None]:
        """The official loop's step (``inference_multi_turn_prompting``): decode; no call or an
        error ends the turn silently; calls execute by name; more than ``max_steps_per_turn``
        executing steps in a turn force-terminate the episode."""
        if decoded.error is not None:
            self.trace.append(TraceEntry(self.turn, step, None, None, False, error_kind="parse", error=decoded.error))
        if decoded.calls:
            observation = self._execute(step, decoded.calls, ids)
            self.turn_steps += 1
            if end_turn:
                following, event = self._end_turn(info)
                return observation + following, event, None
            if end_turn is None and self.turn_steps > self.config.max_steps_per_turn:
                return observation, "tool_results", "max_steps_per_turn"
            return observation, "tool_results", None
        if end_turn is False:
            return [], "skipped", None
        observation, event = self._end_turn(info)
        return observation, event, None

    def truncate(self, reason: str) -> tuple[float, dict[str, Any]]:
        """End the episode now (the driver's budget ran out, the policy has nothing more to say).

        Returns the verifier's reward and ``{"verdict", "end_reason"}``.
        """
        if self.task is None:
            raise RuntimeError("truncate() called before reset(); call env.reset(task) first.")
        if not self.done:
            self._finish(reason)
        return self.verdict.reward, {"verdict": self.verdict, "end_reason": self.end_reason}

    def record(self) -> dict[str, Any]:
        """The finished episode as plain JSON-able data (see :func:`episode_record`)."""
        return episode_record(self)

    # -- internals ---------------------------------------------------------------------------

    def _open_backends(self, task: Task) -> Any:
        """What executes the episode's calls (``execute(call) -> CallOutcome``): fresh BFCL backends.
        An environment family's episode (:mod:`seal_rl.environments.episode`) puts its own here."""
        return Backends(task)

    def _open_turn(self, turn: int) -> list[Message]:
        self.turn_steps = 0
        revealed = self.task.held_out.get(turn, ())
        if revealed:
            self._docs.update((doc["name"], doc) for doc in revealed)
            self._schemas.update((doc["name"], self._catalog.schema(doc)) for doc in revealed)
            reveal = self.interface.reveal(revealed, list(self._docs.values()))
            return reveal + self.interface.question(self.task.questions[turn])
        return self.interface.question(self.task.questions[turn])

    def _end_turn(self, info: dict[str, Any]) -> tuple[list[Message], str]:
        self.turn += 1
        if self.turn >= self.task.num_turns:
            self.turn = self.task.num_turns - 1
            self._finish("completed")
            return [], "end"
        observation = self._open_turn(self.turn)
        if self.turn in self.task.held_out:
            info["tools"] = self.tools
        return observation, "next_turn"

    def _reject_unavailable(self, step: int, calls: Sequence[ToolCall], unavailable: list[str]) -> list[Message]:
        for call in calls:
            bad = call.name in unavailable
            self.trace.append(
                TraceEntry(
                    self.turn, step, call.name, call.arguments, False,
                    error_kind="unknown_tool" if bad else None,
                    error=f"tool {call.name!r} is not available" if bad else None,
                )
            )  # fmt: skip
        names = tuple(dict.fromkeys(unavailable))
        reason = f"no tool named {', '.join(repr(n) for n in names)} is available. Nothing was executed."
        return self.interface.rejection(Rejection(reason, names), list(self._docs.values()))

    def _read(self, action: str | bytes | Mapping[str, Any], step: int) -> tuple[Message, ParsedMessage | Decoded]:
        """The assistant message as the conversation keeps it, and its calls under the protocol.

        A structured message (``native`` format: ``content``, optional ``reasoning_content`` /
        ``thinking``, ``tool_calls``) keeps its valid calls as ``tool_calls`` (each with an id, for
        the ``tool`` messages that answer it); its text is read in the call format like a plain
        message. Both protocols take structured calls as BFCL's FC handlers do (calls by name,
        arguments an object or a JSON string)."""
        if not isinstance(action, Mapping):
            text = _clean_text(action)
            return {"role": "assistant", "content": text}, self._parse(text)
        text = _clean_text(action["content"]) if isinstance(action.get("content"), (str, bytes)) else ""
        message: Message = {"role": "assistant", "content": text}
        for key in REASONING_FIELDS:
            if isinstance(action.get(key), (str, bytes)):
                message[key] = _clean_text(action[key])
        tool_calls = action.get("tool_calls")
        if tool_calls is None:
            return message, self._parse(text)
        try:
            size = len(text) + len(json.dumps(tool_calls, ensure_ascii=False, default=str))
        except (ValueError, TypeError, RecursionError):
            size = self.config.max_message_chars + 1
        if size > self.config.max_message_chars:
            return message, ParsedMessage(error=f"message of {size} characters exceeds the limit of {self.config.max_message_chars}")
        parsed = structured_calls(tool_calls)
        if len(parsed.calls) > self.config.max_calls_per_message:
            return message, ParsedMessage(error=f"message with {len(parsed.calls)} tool calls exceeds the limit of "
                                                f"{self.config.max_calls_per_message} calls per message")  # fmt: skip
        if parsed.calls:
            given = [c.get("id") if isinstance(c, dict) else None for c in tool_calls]
            message["tool_calls"] = [{"id": _clean_text(i)[:64] if isinstance(i, str) and i else f"call_{step}_{n}",
                                      "type": "function", "function": call.to_json()}
                                     for n, (call, i) in enumerate(zip(parsed.calls, given))]  # fmt: skip
        return message, parsed

    def _parse(self, text: str) -> ParsedMessage | Decoded:
        """The message's calls under the protocol (seal-rl's parser, or the official decoder for
        ``bfcl``), or why it is refused whole: too long, unreadable, or too many calls. Reasoning
        (a ``<think>`` block) is not parsed (:mod:`seal_rl.reasoning`)."""
        if len(text) > self.config.max_message_chars:
            return ParsedMessage(error=f"message of {len(text)} characters exceeds the limit of {self.config.max_message_chars}")
        text = answer(text)
        official = self.config.protocol == "bfcl" and self.config.call_format != "native"  # FC: calls come structured
        parsed = decode(text, self.config.call_format) if official else self.format.parse(text)
        if len(parsed.calls) > self.config.max_calls_per_message:
            return ParsedMessage(error=f"message with {len(parsed.calls)} tool calls exceeds the limit of "
                                       f"{self.config.max_calls_per_message} calls per message")  # fmt: skip
        return parsed

    def _execute(self, step: int, calls: Sequence[ToolCall], ids: Sequence[str] = ()) -> list[Message]:
        """Run the calls in order within the step's wall time (``step_timeout_s``), cutting each
        result to ``max_result_chars`` and counting them against ``observation_budget_chars``.

        A call interrupted by the time limit gets an execution error and counts as not made (the
        verifier does not replay it); later calls do not run; the episode then ends with
        ``step_timeout``. See seal_rl.limits for what the limit guarantees.
        """
        config = self.config
        deadline = time.monotonic() + config.step_timeout_s
        results, completed = [], []
        for index, call in enumerate(calls):
            schema = self._schemas.get(call.name)  # bfcl protocol: any public method runs
            violations = schema.validate(call) if schema is not None else ()
            try:
                with time_limit(deadline - time.monotonic()):
                    outcome = self._backends.execute(call)
            except StepTimeout:
                self._limit_reached = "step_timeout"
                message = stopped_call_error(config.step_timeout_s)
                outcome = CallOutcome(EXECUTION_ERROR_PREFIX + message, message, raised=True)
            else:
                completed.append(call)
            if violations:
                kind, error = "schema", "; ".join(v.message for v in violations)
                if outcome.error:
                    error += f"; execution: {outcome.error}"
            elif outcome.error is not None:
                kind, error = "execution", outcome.error
            else:
                kind, error = None, None
            output, cut = truncate_result(outcome.output, config.max_result_chars)
            error = None if error is None else truncate_result(error, config.max_result_chars)[0]
            backend_error = None if outcome.error is None else truncate_result(outcome.error, config.max_result_chars)[0]
            self.observation_chars += len(output)
            self.trace.append(TraceEntry(self.turn, step, call.name, call.arguments, True, output, kind, error, violations, cut))
            results.append(ToolResult(call.name, output, call.arguments, backend_error, violations))
            if self._limit_reached is None and time.monotonic() >= deadline:
                self._limit_reached = "step_timeout"  # measured: an uninterruptible call used the rest
            if self._limit_reached is not None:
                for skipped in calls[index + 1 :]:
                    self.trace.append(TraceEntry(self.turn, step, skipped.name, skipped.arguments, False, None, "execution",
                                                 "not executed: the step ran out of time"))  # fmt: skip
                break
        if self._limit_reached is None and self.observation_chars > config.observation_budget_chars:
            self._limit_reached = "observation_budget"
        self.calls_by_turn[self.turn].append(completed)
        return self.interface.tool_results(results, list(self._docs.values()), ids)

    def _finish(self, reason: str) -> None:
        self.end_reason = reason
        try:
            self.verdict = verify(self.task, self.calls_by_turn, turns_reached=self.turns_reached,
                                  step_timeout_s=self.config.step_timeout_s)  # fmt: skip
        except Exception as exc:  # a scorer failure must not crash the driver; diagnosis labels it
            self.verdict = Verdict.unscorable(f"{type(exc).__name__}: {exc}")
        self._backends = None  # release the episode's instances


def episode_record(env: BfclEnv) -> dict[str, Any]:
    """A finished episode as plain JSON-able data (transcript, trace, verdict)."""
    if env.task is None or env.verdict is None:
        raise RuntimeError("episode_record() needs a finished episode.")
    return {
        "task_id": env.task.id,
        "category": env.task.category,
        "reward": env.verdict.reward,
        "progress": env.verdict.progress,
        "end_reason": env.end_reason,
        "turns_reached": env.turns_reached,
        "num_turns": env.task.num_turns,
        "model_calls": env.model_calls,
        "observation_chars": env.observation_chars,
        "messages": env.messages,
        "steps": env.steps,
        "trace": [_trace_json(entry) for entry in env.trace],
        "verdict": env.verdict.to_json(),
    }


def accepted_calls(trace: Sequence[Mapping[str, Any]], num_turns: int) -> list[list[list[ToolCall]]]:
    """What an episode record's ``trace`` says the environment executed: per user turn, per model
    step, the calls (``BfclEnv.calls_by_turn``, which :func:`verify` scored). A call stopped by the
    step time limit did not count there and is left out here too."""
    steps: dict[tuple[int, int], list[ToolCall]] = {}
    for entry in trace:
        if entry["accepted"] and not STOPPED_CALL.search(entry["error"] or ""):
            steps.setdefault((entry["turn"], entry["step"]), []).append(ToolCall(entry["name"], entry["arguments"] or {}))
    calls: list[list[list[ToolCall]]] = [[] for _ in range(num_turns)]
    for (turn, _step), step_calls in steps.items():
        calls[turn].append(step_calls)
    return calls


def _trace_json(entry: TraceEntry) -> Mapping[str, Any]:
    return {
        "turn": entry.turn, "step": entry.step, "name": entry.name, "arguments": entry.arguments,
        "accepted": entry.accepted, "result": entry.result, "error_kind": entry.error_kind,
        "error": entry.error, "truncated": entry.truncated,
        "schema_violations": [{"kind": v.kind, "argument": v.argument, "message": v.message} for v in entry.schema_violations],
    }  # fmt: skip
