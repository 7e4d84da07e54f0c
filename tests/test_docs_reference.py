"""The generated reference pages cannot drift: every recipe key has a docstring, docs/reference/recipe.md
and docs/reference/cli.md are what the code generates (the latter what ``seal COMMAND --help`` prints),
and every key the shipped recipes set is on the recipe page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from seal_rl.cli.reference import (
    HELP_WIDTH,
    TOP_LEVEL,
    blocks,
    cli_reference,
    missing_docstrings,
    recipe_reference,
    recipe_sections,
)
from seal_rl.train.recipe import SealRecipe

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
REGENERATE = "regenerate it with `make reference` (python -m seal_rl.cli.reference) and commit it"


@dataclass
class _Options:
    """A free-form section's keys."""

    z: int = 1
    """documented"""
    y: str = "a"


@dataclass
class _Inner:
    a: int = 1
    """documented"""
    b: int = 2


@dataclass
class _Outer:
    inner: _Inner = field(default_factory=_Inner)
    """a nested block"""
    options: dict = field(default_factory=lambda: {"z": 5})
    """a section built into _Options"""
    c: str = "x"
    """documented"""
    d: float = 0.5


def test_a_key_without_a_docstring_is_reported():
    assert missing_docstrings(_Outer) == ["d", "inner.b"]


def test_a_free_form_sections_keys_are_walked_with_the_sections_defaults():
    assert missing_docstrings(_Outer, {"options": _Options}) == ["d", "inner.b", "options.y"]
    options = next(b for b in blocks(_Outer, {"options": _Options}) if b.path == "options")
    assert {k.name: k.default for k in options.keys} == {"z": 5, "y": "a"}


def test_every_recipe_key_has_a_docstring():
    missing = missing_docstrings(SealRecipe, recipe_sections())
    assert missing == [], f"recipe keys without a docstring (the string right after the field): {missing}"


def test_the_recipe_reference_is_generated_from_the_code():
    committed = (REFERENCE / "recipe.md").read_text()
    assert committed == recipe_reference(), f"docs/reference/recipe.md differs from the recipe's dataclasses: {REGENERATE}"


def test_the_cli_reference_is_what_help_prints():
    committed = (REFERENCE / "cli.md").read_text()
    assert committed == cli_reference(), f"docs/reference/cli.md differs from `seal COMMAND --help`: {REGENERATE}"


def _help_blocks(page: str) -> dict[str, str]:
    """The CLI page's help text by command (``seal train``)."""
    return dict(re.findall(r"^## (seal[^\n]*)\n\n```text\n(.*?)\n```$", page, flags=re.S | re.M))


@pytest.mark.parametrize("args", [[], ["train"], ["models", "pull"]])
def test_the_cli_reference_matches_the_installed_command(args):
    """The real ``seal`` process at the page's width, not the generator: its help is on the page verbatim,
    also when ``seal`` re-executes itself as ``python -m seal_rl`` to fix the hash seed (its usage
    line still says ``seal``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS", "TERMINAL_WIDTH")}
    env.update(COLUMNS=str(HELP_WIDTH), NO_COLOR="1", TERM="dumb", PYTHONPATH=str(ROOT / "src"))
    env.pop("PYTHONHASHSEED", None)
    seal = Path(sys.executable).parent / "seal"  # the console script `make install` puts beside the interpreter
    run = subprocess.run([str(seal), *args, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    printed = "\n".join(re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).rstrip() for line in run.stdout.strip("\n").splitlines())
    page = _help_blocks((REFERENCE / "cli.md").read_text())
    assert page[" ".join(["seal", *args])] == printed


def _page_keys(page: str) -> dict[str, set[str]]:
    """The recipe page's keys by block path ('' for the top level), read from its headings and tables."""
    found: dict[str, set[str]] = {}
    block = None
    for line in page.splitlines():
        if line.startswith("## "):
            block = "" if line[3:] == TOP_LEVEL else line[3:]
            found[block] = set()
        elif block is not None and (key := re.match(r"\| `([^`]+)` \|", line)):
            found[block].add(key.group(1))
    return found


def _set_keys(values: dict, page: dict[str, set[str]], path: str = "") -> list[str]:
    """Every dotted key a recipe sets that its block on the page lacks (free-form values are not walked)."""
    missing = []
    for key, value in values.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in page.get(path, set()):
            missing.append(dotted)
        elif dotted in page and isinstance(value, dict):
            missing += _set_keys(value, page, dotted)
        elif dotted in page and isinstance(value, list):
            for item in value:
                missing += _set_keys(item, page, dotted) if isinstance(item, dict) else []
    return missing


RECIPES = sorted([*ROOT.glob("configs/*.yaml"), *(ROOT / "src" / "seal_rl" / "recipes").glob("*.yaml")])


def test_the_recipe_page_has_its_blocks():
    page = _page_keys((REFERENCE / "recipe.md").read_text())
    assert {"", "model", "model.lora", "grpo", "apatch", "interface", "env", "budgets", "warm_start.data", "eval"} <= set(page)
    assert {"beta", "w_min", "w_max", "dynamic"} <= page["apatch"]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_key_a_shipped_recipe_sets_is_on_the_page(recipe):
    page = _page_keys((REFERENCE / "recipe.md").read_text())
    missing = _set_keys(yaml.safe_load(recipe.read_text()) or {}, page)
    assert missing == [], f"{recipe.name} sets keys docs/reference/recipe.md does not list: {missing}"
