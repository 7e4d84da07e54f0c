"""The reference pages generated from the code: every recipe key, and every ``seal`` command's help.

:func:`recipe_reference` walks the recipe's dataclasses from :class:`~seal_rl.train.recipe.SealRecipe`
down (nested blocks, ``model.lora``, the ``warm_start.data`` items, and the free-form sections that
validation builds into their own config classes, :func:`recipe_sections`) and writes one table per
block from the fields' attribute docstrings, so every option is described once, in the code.
:func:`cli_reference` collects ``seal COMMAND --help`` for every command at a fixed width.

``make reference`` (``python -m seal_rl.cli.reference``) writes both pages into docs/reference/;
tests/test_docs_reference.py fails when a committed page differs from what this module generates
or a recipe key has no docstring.

Not here: the site's build (``make docs``, mkdocs.yml).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import sys
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECIPE_COMMAND = "make reference"
"""the command that regenerates the pages (said at the top of each)"""
HELP_WIDTH = 100
"""terminal columns the CLI reference's help text is laid out for (fixed, so the page is deterministic)"""
TOP_LEVEL = "Top-level keys"
"""the heading of the recipe's own keys (every other block's heading is its dotted path)"""
A_BLOCK = object()
"""the default shown for a key that opens a block of its own (its keys have the defaults)"""
REQUIRED = "???"
"""OmegaConf's mark of a key the recipe must set (``MISSING``)"""
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def recipe_sections() -> dict[str, type]:
    """The recipe's free-form sections and the config class each is built into on load
    (:func:`seal_rl.train.recipe.validate`)."""
    from seal_rl.apatch import ApatchConfig
    from seal_rl.env import EnvConfig
    from seal_rl.generators.vllm_server import ServerConfig
    from seal_rl.interface import InterfaceConfig
    from seal_rl.rollout import Budgets

    return {"env": EnvConfig, "budgets": Budgets, "interface": InterfaceConfig, "apatch": ApatchConfig, "server": ServerConfig}


@dataclass(frozen=True)
class Key:
    """One key of a block: its name, type as written in the code, default, and attribute docstring."""

    name: str
    type: str
    default: Any
    doc: str | None
    block: str | None = None
    """the dotted path of the block this key opens, if it is one"""


@dataclass(frozen=True)
class Block:
    """One block of the recipe (a dataclass), at its dotted path ('' for the recipe itself)."""

    path: str
    keys: tuple[Key, ...]
    doc: str | None
    """the block's own description: its field's docstring in the parent, else its class docstring"""
    items: bool = False
    """a list whose every item takes these keys (``warm_start.data``)"""


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a class and its bases: the string literal right after each field."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):  # fmt: skip
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _default(f: dataclasses.Field) -> Any:
    """A field's default value (its factory's result), or :data:`dataclasses.MISSING`."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _nested(hint: Any) -> tuple[type | None, bool]:
    """The dataclass a type hint holds (``X``, ``X | None``, ``list[X]``) and whether it is a list's item."""
    if dataclasses.is_dataclass(hint):
        return hint, False
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list and args and dataclasses.is_dataclass(args[0]):
        return args[0], True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            return inner[0], False
    return None, False


def blocks(cls: type, sections: dict[str, type] | None = None, path: str = "", doc: str | None = None,
           items: bool = False, defaults: dict[str, Any] | None = None) -> list[Block]:  # fmt: skip
    """Every block under ``cls`` in reading order, ``cls`` first. ``sections``: dotted paths of
    ``dict`` fields that are built into a config class (their keys are that class's fields, their
    defaults the field's default dict over the class's)."""
    sections = sections or {}
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    keys, below = [], []
    for f in dataclasses.fields(cls):
        dotted = f"{path}.{f.name}" if path else f.name
        default = (defaults or {}).get(f.name, _default(f))
        nested, is_list = _nested(hints[f.name])
        section = sections.get(dotted)
        if nested is not None or section is not None:
            below += blocks(nested or section, sections, dotted, docs.get(f.name), is_list,
                            default if section is not None else None)  # fmt: skip
            default = default if is_list or default is None else A_BLOCK  # a list's items, or model.lora's null
            keys.append(Key(f.name, str(f.type), default, docs.get(f.name), dotted))
        else:
            keys.append(Key(f.name, str(f.type), default, docs.get(f.name)))
    about = " ".join(dict.fromkeys(d.rstrip(".") + "." for d in (doc, _class_doc(cls)) if d))
    return [Block(path, tuple(keys), (about[:1].upper() + about[1:]) or None, items), *below]


def _class_doc(cls: type) -> str | None:
    """A class's own docstring (not the signature ``dataclass`` writes when it has none)."""
    doc = vars(cls).get("__doc__")
    return None if not doc or doc.startswith(cls.__name__ + "(") else inspect.cleandoc(doc)


def missing_docstrings(cls: type, sections: dict[str, type] | None = None) -> list[str]:
    """The dotted paths of the keys under ``cls`` that have no attribute docstring."""
    return [f"{b.path}.{k.name}" if b.path else k.name for b in blocks(cls, sections) for k in b.keys if not k.doc]


def _text(doc: str) -> str:
    """A docstring as one Markdown line: roles (``:mod:`x```) as code, pipes escaped."""
    return _cell(_ROLE.sub(r"``\1``", " ".join(doc.split())))


def _cell(text: str) -> str:
    """Text made safe for a Markdown table cell."""
    return text.replace("|", r"\|")


def _value(value: Any) -> str:
    """A default as it is written in YAML, as a Markdown table cell."""
    if value is A_BLOCK:
        return "(a block)"
    if value == REQUIRED:
        return "required"
    if value is None or isinstance(value, bool):
        text = {None: "null", True: "true", False: "false"}[value]
    elif isinstance(value, str):
        text = value or '""'
    else:
        text = json.dumps(value, ensure_ascii=False)
    return "``" + text + "``"


def _anchor(path: str) -> str:
    """The anchor Python-Markdown's toc gives the heading of a block."""
    return re.sub(r"[^\w\- ]", "", path).strip().lower().replace(" ", "-")


def _block_page(block: Block) -> list[str]:
    """One block's heading (its dotted path), description and table of keys."""
    title = block.path or TOP_LEVEL
    lines = [f"## {title}", ""]
    if block.doc:
        lines += [_text(block.doc), ""]
    if block.items:
        lines += [f"`{block.path}` is a list; each item takes these keys.", ""]
    lines += ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for key in block.keys:
        doc = _text(key.doc) if key.doc else ""
        if key.block:
            doc = f"{doc.rstrip('.')}: see [{key.block}](#{_anchor(key.block)})."
        lines.append(f"| `{key.name}` | `{key.type}` | {_value(key.default)} | {doc.strip()} |")
    return lines + [""]


def recipe_reference() -> str:
    """docs/reference/recipe.md: every recipe key, one table per block."""
    from seal_rl.train.recipe import SealRecipe

    found = blocks(SealRecipe, recipe_sections())
    lines = [
        "# Recipe reference",
        "",
        f"Generated by `{RECIPE_COMMAND}` from the recipe's dataclasses (`seal_rl.train.recipe.SealRecipe` and the "
        "blocks under it) and their fields' docstrings: do not edit it by hand, edit the docstring and run the "
        "command again (tests/test_docs_reference.py fails when this page and the code disagree).",
        "",
        "A recipe is YAML with these keys; `seal train --config FILE --set key.path=value` overrides any of them. "
        "Every key is optional except those whose default says *required*.",
        "",
        "Blocks: " + ", ".join(f"[{b.path or TOP_LEVEL.lower()}](#{_anchor(b.path or TOP_LEVEL)})" for b in found) + ".",
        "",
    ]
    for block in found:
        lines += _block_page(block)
    return "\n".join(lines).rstrip() + "\n"


def commands() -> list[list[str]]:
    """Every ``seal`` command and subcommand as its arguments (``[]`` is ``seal`` itself), in help order."""
    import typer

    from seal_rl.cli import app

    def walk(command: Any, args: list[str]) -> list[list[str]]:
        found = [args]
        if hasattr(command, "list_commands"):  # a group (typer's own click, not necessarily the installed one)
            ctx = command.context_class(command, info_name=args[-1] if args else "seal")
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    found += walk(sub, [*args, name])
        return found

    return walk(typer.main.get_command(app), [])


def command_help(args: list[str]) -> str:
    """``seal ARGS --help`` as a user sees it at :data:`HELP_WIDTH` columns, without colour or trailing blanks."""
    from typer.testing import CliRunner

    from seal_rl.cli import app

    env = {"COLUMNS": str(HELP_WIDTH), "NO_COLOR": "1", "TERM": "dumb"}
    result = CliRunner().invoke(app, [*args, "--help"], prog_name="seal", env=env)
    if result.exit_code != 0:
        raise RuntimeError(f"seal {' '.join(args)} --help exited {result.exit_code}: {result.output}")
    return "\n".join(_ANSI.sub("", line).rstrip() for line in result.output.strip("\n").splitlines())


def cli_reference() -> str:
    """docs/reference/cli.md: every command's ``--help``."""
    lines = [
        "# CLI reference",
        "",
        f"Generated by `{RECIPE_COMMAND}` from `seal COMMAND --help` at {HELP_WIDTH} columns: do not edit it by "
        "hand (tests/test_docs_reference.py fails when this page and `--help` disagree).",
        "",
    ]
    for args in commands():
        lines += [f"## seal {' '.join(args)}".rstrip(), "", "```text", command_help(args), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


PAGES = {"recipe.md": recipe_reference, "cli.md": cli_reference}
"""the generated pages under docs/reference/ and what writes each"""


def main(argv: list[str] | None = None) -> None:
    """Write the pages into the directory given (default docs/reference) and say which changed."""
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "docs/reference")
    out.mkdir(parents=True, exist_ok=True)
    for name, generate in PAGES.items():
        path, text = out / name, generate()
        changed = not path.exists() or path.read_text() != text
        path.write_text(text)
        print(f"{path}: {'written' if changed else 'unchanged'}")


if __name__ == "__main__":
    main()
