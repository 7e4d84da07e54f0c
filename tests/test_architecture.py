"""Imports point down the layers of docs/concepts/architecture.md (lazy imports inside functions included).

Each layer lists its modules bottom-up; a module may import the modules listed before it, in its
own layer or a lower one, and the modules of its own package. Every module belongs to one entry,
so a new module has to be placed before this test passes.
"""

from __future__ import annotations

import json

from .test_layout import import_graph

LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["seal_rl", "errors", "extras", "jsonl", "limits", "stats", "runlock", "bfcl", "stops", "models", "recipes", "studies", "reasoning", "families", "precision", "trajectory"]),
    ("benchmark", ["tasks", "tools", "protocol", "backends", "bfcl_results", "faults"]),
    ("seal", ["apatch", "credit", "diagnose", "profile", "interface"]),
    ("environment", ["verify", "env", "differential", "parity"]),
    ("agents", ["rollout", "policies", "generators", "budgets"]),
    ("learning", ["evaluate", "environments", "ood", "prefix_tree", "sft", "templates", "tiny", "train", "plan", "fit", "preflight", "study"]),
    ("front ends", ["report", "service", "integrations", "doctor", "cli", "__main__"]),
]
ORDER = [f"seal_rl.{name}" if name != "seal_rl" else name for _, names in LAYERS for name in names]
LAYER_OF = {f"seal_rl.{name}" if name != "seal_rl" else name: layer for layer, names in LAYERS for name in names}


def unit(module: str) -> str:
    """The entry of :data:`ORDER` a module belongs to: itself, or the package it is in."""
    if module in ORDER:
        return module
    owners = [entry for entry in ORDER if entry != "seal_rl" and module.startswith(entry + ".")]
    assert len(owners) == 1, f"{module} is in no layer of tests/test_architecture.py (and docs/concepts/architecture.md); place it"
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

    doc = (Path(__file__).resolve().parents[1] / "docs" / "concepts" / "architecture.md").read_text()
    for layer, names in LAYERS:
        line = next((line for line in doc.splitlines() if line.startswith(f"| {layer} |")), None)
        assert line is not None, f"docs/concepts/architecture.md has no row for layer {layer!r}"
        assert [n.strip("`/ ") for n in line.split("|")[2].split(",")] == names, line


def test_no_module_is_longer_than_600_lines():
    """A longer module holds more than one concept: split it by concept (issue 23). The package and
    benchmarks/ alike (issue 73)."""
    from pathlib import Path

    from .test_layout import ROOT

    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    modules = [*ROOT.rglob("*.py"), *benchmarks.rglob("*.py")]
    long = {str(p.relative_to(ROOT.parent if p.is_relative_to(ROOT) else benchmarks.parent)): n
            for p in modules if (n := len(p.read_text().splitlines())) > 600}  # fmt: skip
    assert long == {}, long


# -- start-up: commands that need no model import no model library --------------------------------

HEAVY = ("torch", "transformers", "trl", "vllm", "datasets", "accelerate", "deepspeed", "peft")
"""the libraries that cost seconds to import; only the commands that load a model may pull them in"""


def _heavy_imports(statements: str, tmp_path) -> list[str]:
    """The :data:`HEAVY` modules imported by a fresh interpreter that runs ``statements`` (seen at exit,
    after the command has run, whatever it imported lazily)."""
    import os
    import subprocess
    import sys

    code = (f"import atexit, sys\natexit.register(lambda: print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules)))\n"
            + statements)  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # as `seal` re-executes itself with (seal_rl.cli.entry)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    line = [text for text in done.stdout.splitlines() if text.startswith("HEAVY=")]
    assert line, done.stdout[-2000:] + done.stderr[-2000:]
    return [m for m in line[-1].removeprefix("HEAVY=").split(",") if m]


def test_help_and_an_oracle_evaluation_import_no_model_library(tmp_path):
    """``seal --help`` and ``seal eval --policy oracle`` start without torch & co. (they once spent 1 s of
    1.4 s importing torch through the vLLM CPU helpers); the probe itself sees torch when it is imported."""
    run = "from seal_rl.cli import main\nsys.argv = {argv!r}\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
    assert _heavy_imports(run.format(argv=["seal", "--help"]), tmp_path) == []
    oracle = ["seal", "eval", "--policy", "oracle", "--split", "train", "--tasks", "multi_turn_base_100", "--out", str(tmp_path / "run")]
    assert _heavy_imports(run.format(argv=oracle), tmp_path) == []
    assert json.loads((tmp_path / "run" / "results.jsonl").read_text())["reward"] == 1.0  # the command really ran
    seeded = "from seal_rl.generators.vllm_cpu import seeded\nwith seeded(0):\n    pass\n"
    assert _heavy_imports(seeded, tmp_path) == ["torch"]
