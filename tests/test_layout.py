"""The package's import graph has no cycles (lazy imports inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

import seal_rl

ROOT = Path(seal_rl.__file__).parent


def _module_name(path: Path) -> str:
    parts = ["seal_rl", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    return skipped


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the seal_rl modules it imports; ``type_checking``: also those imported only for annotations."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped = set() if type_checking else _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("seal_rl"):
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name.startswith("seal_rl")]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    graph = import_graph()
    assert "seal_rl.generators.hf" in graph["seal_rl.generators"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_driver_does_not_know_the_generators():
    assert not any(m.startswith("seal_rl.generators") or m == "seal_rl.policies" for m in import_graph()["seal_rl.rollout"])


def test_the_learning_layer_has_no_circle_even_through_annotations():
    """train/: loop and trainer once imported each other (issue 32); annotations count here too."""
    graph = {k: {t for t in v if t.startswith("seal_rl.train.")} for k, v in import_graph(type_checking=True).items()
             if k.startswith("seal_rl.train.")}  # fmt: skip
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
