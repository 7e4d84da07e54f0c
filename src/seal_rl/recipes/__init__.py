"""The shipped training recipes (``configs/*.yaml`` in a checkout links here), by name.

``seal train --config paper-qwen2.5-7b`` names one; a path to a YAML file still works.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from seal_rl.errors import SealError


def shipped_names(package: str) -> list[str]:
    """The YAML files shipped in ``package`` (the recipes here, :mod:`seal_rl.studies`), by name, sorted."""
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(package).iterdir() if p.name.endswith(".yaml"))


def opening_sentence(package: str, name: str) -> str:
    """The first sentence of the opening comment of ``package``'s file ``name`` (what it is for)."""
    text = resources.files(package).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    comment = []
    for line in text.split("\n"):
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    sentence = " ".join(comment).split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= 100 else sentence[:99] + "…"


def shipped_path(package: str, given: str | Path) -> Path | None:
    """``given`` itself when it is a file, else ``package``'s shipped file of that name (with or without
    ``.yaml``), else None."""
    path = Path(given)
    if path.is_file():
        return path
    name = path.name.removesuffix(".yaml")
    if path.parent == Path(".") and name in shipped_names(package):
        return Path(str(resources.files(package).joinpath(f"{name}.yaml")))
    return None


def names() -> list[str]:
    """The shipped recipe names, sorted."""
    return shipped_names(__name__)


def describe(name: str) -> str:
    """The first sentence of a recipe's opening comment (what it is for)."""
    return opening_sentence(__name__, name)


def resolve(config: str | Path) -> Path:
    """A recipe file: ``config`` itself when it is a file, else the shipped recipe of that name
    (with or without ``.yaml``); otherwise one error naming the shipped recipes."""
    path = shipped_path(__name__, config)
    if path is None:
        raise SealError(f"Recipe {config} is neither a file nor a shipped recipe; shipped: {', '.join(names())} "
                        "(`seal train --list-configs`).")  # fmt: skip
    return path
