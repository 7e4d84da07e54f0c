"""BFCL result files in and out: score ``bfcl generate`` output with seal, hand a seal run to
``bfcl evaluate``.

A result file (``BFCL_v3_multi_turn_<category>_result.json`` or ``BFCL_v4_...``, one JSON object a
line) holds per entry ``{"id": "multi_turn_base_0", "result": [turn, ...], ...}`` where a turn is
the list of the model's outputs, one per step, as the official loop recorded them:

* FC handlers: a step is a list of ``{name: arguments-json}`` objects; ``[]`` is a text answer.
* Prompting handlers: a step is the model's text (``<tool_call>`` blocks for the Qwen-style FC
  handlers, ``[f(a=1)]`` for the others).
* ``result`` a string: inference failed for that entry (``"Error during inference: ..."``).

:class:`seal_rl.policies.BfclResultPolicy` replays every step through :class:`~seal_rl.env.BfclEnv` under the
``bfcl`` protocol with the recorded turn boundaries (``env.step(end_turn=...)``), so a turn may end
on an undecodable step, and the rest of the pipeline (diagnosis, summary, report, compare) applies.
:func:`export_run` writes a ``seal eval`` run back as result files in the prompting shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seal_rl.errors import SealError
from seal_rl.tasks import CATEGORIES

RESULT_FILE = re.compile(r"BFCL_v[34]_multi_turn_(?P<category>[a-z_]+)_result\.json\Z")
DECODERS = ("fc", "hermes", "pythonic")
EXPORT_VERSION = "v4"
_ID = re.compile(r"multi_turn_(?P<category>[a-z_]+)_(?P<number>\d+)\Z")


def fc_step_text(step: Any) -> str:
    """An FC step as ``<tool_call>`` blocks that :func:`seal_rl.protocol.decode_hermes` decodes
    exactly as ``convert_to_function_call`` decodes the step (ASCII JSON, so no text can close a
    block early and lone surrogates survive as escapes)."""
    if isinstance(step, dict):
        step = [step]
    if not isinstance(step, list):
        return ""  # the official decoder raises on it; an empty message ends the turn the same way
    blocks = []
    for item in step:
        if isinstance(item, dict):
            blocks += [json.dumps({"name": name, "arguments": arguments}) for name, arguments in item.items()]
        else:
            blocks.append(json.dumps(item))
    return "\n".join(f"<tool_call>\n{block}\n</tool_call>" for block in blocks)


@dataclass(frozen=True)
class ResultEntry:
    """One parsed line of a result file."""

    file: Path
    line: int
    id: str
    result: list[list[Any]] | str


def result_files(path: Path) -> list[Path]:
    """The result files at ``path``: the file itself, or every ``BFCL_v[34]_multi_turn_*_result.json``
    below a directory (``bfcl generate`` writes ``result/<model>/multi_turn/...``)."""
    if path.is_file():
        return [path]
    if not path.exists():
        raise SealError(f"bfcl-result: {path} does not exist; give a BFCL result file or a directory of them.")
    files = sorted(p for p in path.rglob("*.json") if RESULT_FILE.match(p.name))
    if not files:
        raise SealError(f"bfcl-result: no BFCL_v3/v4_multi_turn_*_result.json file under {path}.")
    return files


def _shape_error(result: Any) -> str | None:
    """Why ``result`` is not a list of turns of steps, or None."""
    if not isinstance(result, list):
        return f'"result" must be a list of turns or an inference-error string, got {type(result).__name__}'
    for t, turn in enumerate(result):
        if not isinstance(turn, list):
            return f'turn {t} of "result" must be a list of steps, got {type(turn).__name__}'
        for s, step in enumerate(turn):
            if not isinstance(step, (str, list, dict)):
                return f"turn {t} step {s} must be text or a list of {{name: arguments}} objects, got {type(step).__name__}"
    return None


def read_result_file(path: Path) -> list[ResultEntry]:
    """The entries of one result file; a line that is not an entry raises :class:`SealError`
    naming the file and line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SealError(f"{path}: cannot read it ({exc.strerror}).") from None
    entries = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            entry = json.loads(raw)
        except UnicodeDecodeError:
            raise SealError(f"{where}: not UTF-8 text.") from None
        except (ValueError, RecursionError) as exc:
            raise SealError(f"{where}: not a JSON line ({str(exc)[:120]}); a BFCL result file has one JSON object a line.") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or "result" not in entry:
            raise SealError(f'{where}: expected an object with "id" (a task id) and "result", as `bfcl generate` writes.')
        match = _ID.match(entry["id"])
        if match is None or match["category"] not in CATEGORIES:
            raise SealError(
                f"{where}: {entry['id'][:80]!r} is not a BFCL multi-turn task of a known category "
                f"({', '.join(CATEGORIES)})."
            )
        result = entry["result"]
        if not isinstance(result, str):
            problem = _shape_error(result)
            if problem:
                raise SealError(f"{where}: {problem}.")
        entries.append(ResultEntry(path, number, entry["id"], result))
    return entries


def detect_decoder(entries: Sequence[ResultEntry]) -> str:
    """``fc`` when steps are lists; else ``hermes`` when any step holds ``<tool_call>``, else
    ``pythonic``. One decoder per import, as one model wrote the files."""
    steps = [step for e in entries if isinstance(e.result, list) for turn in e.result for step in turn]
    if any(isinstance(step, (list, dict)) for step in steps):
        if any(isinstance(step, str) for step in steps):
            raise SealError("bfcl-result: the files mix FC steps (lists) and prompting steps (text); import one model at a time.")
        return "fc"
    return "hermes" if any("<tool_call>" in step for step in steps) else "pythonic"


def turns_of(record: dict[str, Any]) -> list[list[str]]:
    """A seal episode record's model outputs as BFCL's per-turn, per-step lists (prompting shape).

    The turn of each step comes from ``record["steps"]``; a turn the episode never reached is
    absent, as in a force-terminated ``bfcl generate`` entry."""
    texts = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    turns: list[list[str]] = []
    for text, step in zip(texts, record.get("steps", ())):
        while len(turns) <= step["turn"]:
            turns.append([])
        turns[step["turn"]].append(text)
    return turns


EXPORT_MODELS = {"hermes": "Qwen/Qwen3-8B-FC", "pythonic": "Qwen/Qwen3-8B"}
"""The BFCL model whose handler decodes each call format as seal does (``QwenFCHandler``:
``<tool_call>`` blocks; ``QwenHandler``: the pythonic prompting format)."""


def export_model(call_format: str, model_name: str | None = None) -> str:
    """The BFCL model whose handler decodes ``call_format`` in the prompting shape: ``model_name``
    when given, else the default for hermes and pythonic runs (:data:`EXPORT_MODELS`)."""
    if model_name is not None:
        return model_name
    if call_format not in EXPORT_MODELS:
        raise SealError(f"No BFCL handler reads the {call_format!r} call format; export hermes or pythonic runs.")
    return EXPORT_MODELS[call_format]


def result_line(record: dict[str, Any]) -> dict[str, Any]:
    """One result-file line for an episode record: its turns, or bfcl's inference-error string when
    the episode ended in a generation error."""
    if record.get("error"):
        return {"id": record["task_id"], "result": f"Error during inference: {record['error']}"}
    return {"id": record["task_id"], "result": turns_of(record)}


def write_result_files(files: dict[Path, list[dict[str, Any]]]) -> list[Path]:
    """Write each file's lines (one JSON object a line) whole under a temporary name first, then
    move them all into place, so a failure leaves no half file."""
    written = []
    for target, lines in sorted(files.items()):
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SealError(f"Cannot write {target.parent}: {exc.strerror}.") from None
        partial = target.with_name(target.name + ".partial")
        partial.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        written.append((partial, target))
    for partial, target in written:
        partial.replace(target)
    return [target for _, target in written]


def export_run(
    records: Sequence[dict[str, Any]], out: Path, *, call_format: str, model_name: str | None = None
) -> list[Path]:
    """Write episode records as ``BFCL_v4_multi_turn_<category>_result.json`` files under
    ``out/<model>/multi_turn/`` (``/`` in the model name becomes ``_``: the layout
    ``bfcl evaluate --result-dir out`` reads), one line per task in BFCL id order. Generation
    errors become inference-error strings; of several samples of a task, sample 0 is written."""
    model_name = export_model(call_format, model_name)
    by_category: dict[str, dict[str, Any]] = {}
    for record in records:
        if not record.get("sample", 0):
            by_category.setdefault(record["category"], {})[record["task_id"]] = result_line(record)
    if not by_category:
        raise SealError("Nothing to export: the run has no episodes.")
    folder = out / model_name.replace("/", "_") / "multi_turn"
    return write_result_files({
        folder / f"BFCL_{EXPORT_VERSION}_multi_turn_{category}_result.json":
            sorted(lines.values(), key=lambda line: int(_ID.match(line["id"])["number"]))
        for category, lines in by_category.items()
    })  # fmt: skip
