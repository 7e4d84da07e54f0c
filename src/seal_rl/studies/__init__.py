"""The shipped study designs (``seal study NAME``), by name, as :mod:`seal_rl.recipes` ships recipes.

A study file names a training recipe, the rounds, the arms (each a shipped recipe whose interface and
A-Patch sections it takes, its seeds and ``set`` overrides), the held-out tasks measured every round
and the test tasks measured at the end (docs/study.md). ``seal study --list`` lists them; a path to a
YAML file still works.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from seal_rl.errors import SealError


def names() -> list[str]:
    """The shipped study names, sorted."""
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def describe(name: str) -> str:
    """The first sentence of a study's opening comment (what it asks)."""
    text = resources.files(__name__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    comment = []
    for line in text.split("\n"):
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    sentence = " ".join(comment).split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= 100 else sentence[:99] + "…"


def resolve(study: str | Path) -> Path:
    """A study file: ``study`` itself when it is a file, else the shipped study of that name (with or
    without ``.yaml``); otherwise one error naming the shipped studies."""
    path = Path(study)
    if path.is_file():
        return path
    name = path.name.removesuffix(".yaml")
    if path.parent == Path(".") and name in names():
        return Path(str(resources.files(__name__).joinpath(f"{name}.yaml")))
    raise SealError(f"Study {study} is neither a file nor a shipped study; shipped: {', '.join(names())} (`seal study --list`).")
