"""The shipped training recipes (``configs/*.yaml`` in a checkout links here), by name.

``seal train --config paper-qwen2.5-7b`` names one; a path to a YAML file still works.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from seal_rl.errors import SealError


def names() -> list[str]:
    """The shipped recipe names, sorted."""
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def describe(name: str) -> str:
    """The first sentence of a recipe's opening comment (what it is for)."""
    text = resources.files(__name__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    comment = []
    for line in text.split("\n"):
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    sentence = " ".join(comment).split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= 100 else sentence[:99] + "…"


def resolve(config: str | Path) -> Path:
    """A recipe file: ``config`` itself when it is a file, else the shipped recipe of that name
    (with or without ``.yaml``); otherwise one error naming the shipped recipes."""
    path = Path(config)
    if path.is_file():
        return path
    name = path.name.removesuffix(".yaml")
    if path.parent == Path(".") and name in names():
        return Path(str(resources.files(__name__).joinpath(f"{name}.yaml")))
    raise SealError(f"Recipe {config} is neither a file nor a shipped recipe; shipped: {', '.join(names())} "
                    "(`seal train --list-configs`).")  # fmt: skip
