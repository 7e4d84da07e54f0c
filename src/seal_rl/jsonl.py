"""JSON Lines that survive anything a model writes and any crash: one writer and one reader for
every ``.jsonl`` file seal-rl keeps (results, trajectories, metrics).

* :func:`dumps` never raises on a Python string: lone surrogates (half an emoji, common when
  generation is cut off) are written as ``\\udXXX`` escapes, which :func:`json.loads` reads back
  to the same string; everything else is written as UTF-8 (``ensure_ascii=False``).
* :func:`read` splits on ``\\n`` only — U+2028, U+0085 and friends are legal inside JSON strings
  and this module writes them raw — and never lets one bad line hide the ones after it: a torn
  last line (a kill mid-write) is dropped, a corrupt line elsewhere is skipped, and both are
  reported with file and line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any) -> str:
    """One JSON line (without the newline) for any JSON-able value, whatever its strings hold."""
    text = json.dumps(value, ensure_ascii=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)  # only inside strings: valid JSON


def append(handle: IO[str], value: Any) -> None:
    """Write one whole line and flush it (a crash loses at most the line being written)."""
    handle.write(dumps(value) + "\n")
    handle.flush()


def rewrite(path: Path, values: Iterable[Any]) -> None:
    """Replace ``path`` with these lines atomically: a crash leaves the old file or the new one."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        handle.writelines(dumps(v) + "\n" for v in values)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


@dataclass
class Lines:
    """What :func:`read` found: the good lines, their line numbers, and what was wrong elsewhere."""

    values: list[Any] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """``"FILE:LINE: why"`` for every line left out"""
    torn: int = 0
    """bytes of a last line cut short by a crash (0: the file ends cleanly)"""


def read(path: Path) -> Lines:
    """The JSON lines of ``path`` (``\\n``-separated; blank lines ignored)."""
    data = Path(path).read_bytes()
    chunks = data.split(b"\n")
    lines = Lines()
    for number, raw in enumerate(chunks[:-1], start=1):
        if not raw.strip():
            continue
        try:
            lines.values.append(json.loads(raw))
        except (ValueError, RecursionError) as exc:
            lines.problems.append(f"{path}:{number}: not valid JSON ({str(exc)[:80]}); left out")
            continue
        lines.numbers.append(number)
    if chunks[-1].strip():
        lines.torn = len(chunks[-1])
        lines.problems.append(f"{path}:{len(chunks)}: the last line is cut short (a crash while writing it); left out")
    return lines


def truncate_torn(path: Path, lines: Lines) -> None:
    """Cut a torn last line off ``path`` so that appending starts on a fresh line."""
    if lines.torn:
        with open(path, "r+b") as handle:
            handle.truncate(Path(path).stat().st_size - lines.torn)
