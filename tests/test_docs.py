"""The documented commands stay true to the code: seal options exist, and the OOD recipe only uses
categories, model entries, options and variables that the pinned bfcl_eval has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import bfcl_eval

ROOT = Path(__file__).resolve().parents[1]
BFCL = Path(bfcl_eval.__file__).resolve().parent


def _commands(text: str, program: str) -> list[str]:
    """Shell commands in fenced blocks that run ``program`` (continuation lines joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    joined = "\n".join(block.replace("\\\n", " ") for block in blocks)
    commands = []
    for line in joined.splitlines():
        words = [w for w in line.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]  # leading VAR=value
        if words and words[0].rsplit("/", 1)[-1] == program:
            commands.append(" ".join([program, *words[1:]]))
    return commands


def test_the_ood_recipe_matches_the_pinned_bfcl():
    from bfcl_eval.utils import parse_test_category_argument

    commands = _commands((ROOT / "docs" / "guides" / "ood.md").read_text(), "bfcl")
    assert len(commands) >= 4
    cli = (BFCL / "__main__.py").read_text()
    models = (BFCL / "constants" / "model_config.py").read_text()
    for command in commands:
        subcommand = re.search(r"bfcl (\w+)", command).group(1)
        assert f"def {subcommand}(" in cli, command
        for flag in re.findall(r"\s(--[a-z-]+)", command):
            assert f'"{flag}"' in cli or re.search(rf"\b{flag[2:].replace('-', '_')}:", cli), (flag, command)
        for categories in re.findall(r"--test-category (\S+)", command):
            assert parse_test_category_argument(categories.split(",")), categories  # bfcl's own parser: raises on a bad name
        for model in re.findall(r"--model (\S+)", command):
            entry = re.search(rf'"{re.escape(model)}": ModelConfig\((.*?)\n    \),', models, flags=re.S)
            assert entry is not None, model
            assert "model_handler=QwenFCHandler" in entry.group(1) and "is_fc_model=True" in entry.group(1)
    source = "\n".join(p.read_text(errors="replace") for p in BFCL.rglob("*.py"))
    for variable in ("SERPAPI_API_KEY", "LOCAL_SERVER_ENDPOINT", "LOCAL_SERVER_PORT", "BFCL_PROJECT_ROOT"):
        assert variable in source, variable


@pytest.mark.parametrize("doc", [
    "README.md", "docs/quickstart.md", "docs/guides/commands.md", "docs/guides/evaluate.md", "docs/guides/train.md",
    "docs/guides/gpu-training.md", "docs/guides/servers.md", "docs/guides/lora.md", "docs/guides/service.md",
    "docs/guides/planning.md", "docs/guides/integrations.md", "docs/guides/ood.md", "docs/guides/preflight-and-studies.md",
    "docs/guides/your-environment.md",
])
def test_documented_seal_options_exist(doc):
    from typer.main import get_command

    from seal_rl.cli import app

    root = get_command(app)
    commands = _commands((ROOT / doc).read_text(), "seal")
    assert commands
    for command in commands:
        words = command.split()[1:]
        group = root
        while words and hasattr(group, "commands") and words[0] in group.commands:
            group = group.commands[words.pop(0)]
        assert group is not root, command
        known = {opt for param in group.params for opt in (*param.opts, *param.secondary_opts)}
        for word in words:
            if word.startswith("--"):
                assert word.split("=")[0] in known, (word, command)


_PATH = re.compile(r"`((?:configs|benchmarks|tests|src|docs|requirements)/[\w./-]+?\.(?:py|yaml|md|txt|json))`")


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))])
def test_every_path_the_docs_name_exists(doc):
    named = set(_PATH.findall((ROOT / doc).read_text()))
    missing = [path for path in sorted(named) if not (ROOT / path).exists()]
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_the_run_directory_tables_name_files_the_code_writes():
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "seal_rl").rglob("*.py"))
    for doc in ("docs/guides/train.md", "docs/guides/evaluate.md"):
        text = (ROOT / doc).read_text()
        for name in re.findall(r"^\| `([\w.]+(?:\.jsonl?|\.yaml|\.lock|/))", text, flags=re.M):
            stem = name.rstrip("/")
            assert stem in source or stem.split(".")[0] in source, (doc, name)


def test_stated_defaults_match_the_code():
    from seal_rl.env import EnvConfig
    from seal_rl.protocol import MAXIMUM_STEP_LIMIT

    environment = (ROOT / "docs" / "concepts" / "environment.md").read_text()
    assert EnvConfig().protocol == "seal" and "it is `EnvConfig`'s default" in environment
    assert EnvConfig().max_steps_per_turn == MAXIMUM_STEP_LIMIT == 20 and EnvConfig().max_model_calls == 20
    from typer.main import get_command

    from seal_rl.cli import app

    eval_command = get_command(app).commands["eval"]
    protocol = next(p for p in eval_command.params if p.name == "protocol")
    assert protocol.default == "bfcl" and "**`seal eval` uses it by default.**" in environment
    commands = (ROOT / "docs" / "guides" / "commands.md").read_text()
    assert "`--protocol bfcl|seal` (default `bfcl`" in commands
    assert "next release" not in (ROOT / "docs" / "concepts" / "diagnosis.md").read_text()


PAGE_LINES = 300  # issue 73: a page a newcomer reads in one sitting
README_LINES = 160
_PAGES = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))


def _nav_pages(entries) -> set[str]:
    """The page paths named anywhere in mkdocs.yml's nav (nested sections included)."""
    pages: set[str] = set()
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


@pytest.mark.parametrize("page", [p for p in _PAGES if not p.startswith("reference/")])
def test_every_page_reads_in_one_sitting(page):
    """The generated reference (docs/reference/) is looked up, not read through, so it is exempt."""
    lines = len((ROOT / "docs" / page).read_text().splitlines())
    assert lines <= PAGE_LINES, f"docs/{page} has {lines} lines; split it (at most {PAGE_LINES})"


def test_the_readme_is_a_front_page():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {README_LINES})"


def test_every_page_is_in_the_nav():
    import yaml

    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert "index.md" in nav and "reference/recipe.md" in nav
    missing = [page for page in _PAGES if page not in nav]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"


_DOC_PAGE = re.compile(r"docs/[\w/-]+\.md")


def test_every_docs_page_the_code_names_exists():
    """Docstrings, help texts, recipe comments, make targets and benchmarks name docs pages by path;
    a page that moves or goes must take those mentions with it."""
    files = [ROOT / "Makefile", ROOT / ".ci" / "run", ROOT / "pyproject.toml",
             *(p for folder in ("src", "configs", "benchmarks", "examples", "tests") for p in (ROOT / folder).rglob("*")
               if p.suffix in {".py", ".yaml", ".toml", ".md"} and p.is_file())]  # fmt: skip
    missing = {f"{path.relative_to(ROOT)}: {page}" for path in files for page in _DOC_PAGE.findall(path.read_text(errors="replace"))
               if not (ROOT / page).exists()}  # fmt: skip
    assert not missing, sorted(missing)
