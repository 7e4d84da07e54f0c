"""Imports point down the layers of docs/architecture.md (lazy imports inside functions included).

Each layer lists its modules bottom-up; a module may import the modules listed before it, in its
own layer or a lower one, and the modules of its own package. Every module belongs to one entry,
so a new module has to be placed before this test passes.
"""

from __future__ import annotations

from .test_layout import import_graph

LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["seal_rl", "errors", "jsonl", "limits", "stats", "runlock", "bfcl", "stops", "models", "recipes", "reasoning", "families", "trajectory"]),
    ("benchmark", ["tasks", "tools", "protocol", "backends", "bfcl_results", "faults"]),
    ("seal", ["apatch", "diagnose", "profile", "interface"]),
    ("environment", ["verify", "env", "differential", "parity"]),
    ("agents", ["rollout", "policies", "generators", "budgets"]),
    ("learning", ["evaluate", "sft", "templates", "tiny", "train", "plan", "fit"]),
    ("front ends", ["report", "service", "cli", "__main__"]),
]
ORDER = [f"seal_rl.{name}" if name != "seal_rl" else name for _, names in LAYERS for name in names]
LAYER_OF = {f"seal_rl.{name}" if name != "seal_rl" else name: layer for layer, names in LAYERS for name in names}


def unit(module: str) -> str:
    """The entry of :data:`ORDER` a module belongs to: itself, or the package it is in."""
    if module in ORDER:
        return module
    owners = [entry for entry in ORDER if entry != "seal_rl" and module.startswith(entry + ".")]
    assert len(owners) == 1, f"{module} is in no layer of tests/test_architecture.py (and docs/architecture.md); place it"
    return owners[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module listed after the importer, as ``a -> b (layer -> layer)``."""
    found = []
    for importer, imported in sorted(graph.items()):
        for target in sorted(imported):
            a, b = unit(importer), unit(target)
            if a != b and ORDER.index(b) > ORDER.index(a):
                found.append(f"{importer} -> {target} ({LAYER_OF[a]} -> {LAYER_OF[b]})")
    return found


def test_upward_imports_are_seen():
    graph = {"seal_rl.tasks": {"seal_rl.train.recipe"}, "seal_rl.train.recipe": {"seal_rl.tasks"}}
    assert upward_imports(graph) == ["seal_rl.tasks -> seal_rl.train.recipe (benchmark -> learning)"]


def test_every_module_has_a_layer():
    for module in import_graph():
        unit(module)


def test_imports_point_down_the_layers():
    assert upward_imports(import_graph()) == []


def test_the_layers_are_the_documented_ones():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    for layer, names in LAYERS:
        line = next((line for line in doc.splitlines() if line.startswith(f"| {layer} |")), None)
        assert line is not None, f"docs/architecture.md has no row for layer {layer!r}"
        assert [n.strip("`/ ") for n in line.split("|")[2].split(",")] == names, line


def test_no_module_is_longer_than_600_lines():
    """A longer module holds more than one concept: split it by concept (issue 23)."""
    from .test_layout import ROOT

    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}, long
