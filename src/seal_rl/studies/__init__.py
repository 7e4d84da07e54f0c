"""The shipped study designs (``seal study NAME``), by name, as :mod:`seal_rl.recipes` ships recipes.

A study file names a training recipe, the rounds, the arms (each a shipped recipe whose interface and
A-Patch sections it takes, its seeds and ``set`` overrides), the held-out tasks measured every round
and the test tasks measured at the end (docs/guides/preflight-and-studies.md). ``seal study --list`` lists them; a path to a
YAML file still works.
"""

from __future__ import annotations

from pathlib import Path

from seal_rl.errors import SealError
from seal_rl.recipes import opening_sentence, shipped_names, shipped_path


def names() -> list[str]:
    """The shipped study names, sorted."""
    return shipped_names(__name__)


def describe(name: str) -> str:
    """The first sentence of a study's opening comment (what it asks)."""
    return opening_sentence(__name__, name)


def resolve(study: str | Path) -> Path:
    """A study file: ``study`` itself when it is a file, else the shipped study of that name (with or
    without ``.yaml``); otherwise one error naming the shipped studies."""
    path = shipped_path(__name__, study)
    if path is None:
        raise SealError(f"Study {study} is neither a file nor a shipped study; shipped: {', '.join(names())} (`seal study --list`).")
    return path
