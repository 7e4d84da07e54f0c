"""A recipe's ``family:`` resolved to a family object, and the protocol check with one-line errors.

``bfcl`` (the default), ``tau2-DOMAIN`` (:mod:`seal_rl.environments.tau2`), or an import path
``package.module:Class`` / ``path/to/file.py:Class`` for your own (:class:`~seal_rl.environments.family.Family`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seal_rl.environments.family import BfclFamily, Family, FamilyTask
from seal_rl.errors import SealError

BUILT_IN: tuple[str, ...] = ("bfcl", "tau2-airline", "tau2-retail", "tau2-telecom", "tau2-mock")


REQUIRED: Mapping[str, str] = {
    "tasks": "tasks() -> a list of FamilyTask",
    "tools": "tools(task) -> a list of JSON-schema function docs",
    "start": "start(task) -> a fresh per-episode state",
    "call": "call(state, name, arguments) -> str",
    "verify": "verify(task, state, transcript) -> Outcome",
}


def check_family(family: Any, spec: str = "") -> Any:
    """``family`` if it keeps the protocol, else one :class:`SealError` line naming the broken part
    and what was expected: every required method overridden, ``tasks()`` well formed, ``tools()`` of
    the first task function docs. (``start``, ``call`` and ``verify`` are first run by an episode.)"""
    what = spec or type(family).__name__
    if isinstance(family, BfclFamily) or (hasattr(family, "make_env") and hasattr(family, "task_set")
                                          and not isinstance(family, Family)):  # fmt: skip
        return family  # a family that builds its own episodes (BFCL, τ²) is checked by its tests
    if not isinstance(family, Family):
        raise SealError(f"family {what}: expected a seal_rl.environments.Family subclass (or an object with "
                        f"task_set() and make_env()), got {type(family).__name__}.")  # fmt: skip
    for method, expected in REQUIRED.items():
        if getattr(type(family), method) is getattr(Family, method):
            raise SealError(f"family {what}: missing method {method} (expected {expected}).")
    tasks = list(family.tasks())
    if not tasks:
        raise SealError(f"family {what}: tasks() returned no task.")
    bad = next((t for t in tasks if not isinstance(t, FamilyTask)), None)
    if bad is not None:
        raise SealError(f"family {what}: tasks() must return FamilyTask values, got {type(bad).__name__}.")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise SealError(f"family {what}: task ids must be unique; repeated: {sorted({i for i in ids if ids.count(i) > 1})[:5]}.")
    wrong_split = next((t for t in tasks if t.split not in ("train", "test")), None)
    if wrong_split is not None:
        raise SealError(f"family {what}: task {wrong_split.id!r} has split {wrong_split.split!r}; expected train or test.")
    task = tasks[0]
    docs = family.tools(task)
    if not isinstance(docs, list) or not all(_is_doc(d) for d in docs):
        raise SealError(f"family {what}: tools(task) must return a list of function docs with name, description and "
                        "parameters {type: object, properties: {...}}; got " + _shape(docs) + ".")  # fmt: skip
    return family


def _is_doc(doc: Any) -> bool:
    return (isinstance(doc, Mapping) and isinstance(doc.get("name"), str) and isinstance(doc.get("parameters"), Mapping)
            and isinstance(doc["parameters"].get("properties", {}), Mapping))  # fmt: skip


def _shape(value: Any) -> str:
    if isinstance(value, list) and value:
        return f"a list whose first item is {type(value[0]).__name__} {str(value[0])[:80]!r}"
    return f"{type(value).__name__} {str(value)[:80]!r}"


def load_family(spec: str = "bfcl", **settings: Any) -> Any:
    """The family a recipe names: ``bfcl``, ``tau2-DOMAIN`` or ``module:Class`` / ``file.py:Class``
    (a class is instantiated with ``settings``; a ready object is taken as it is). Bad names are one line."""
    spec = (spec or "bfcl").strip()
    if spec == "bfcl":
        if settings:
            raise SealError(f"family bfcl takes no family settings; got {', '.join(sorted(settings))}.")
        return BfclFamily()
    if spec.startswith("tau2-"):
        from seal_rl.environments.tau2 import Tau2Family

        return Tau2Family(spec.removeprefix("tau2-"), **settings)
    if ":" not in spec:
        raise SealError(f"Unknown family {spec!r}: expected one of {', '.join(BUILT_IN)}, or an import path "
                        "'package.module:Class' or 'path/to/file.py:Class' (docs/guides/your-environment.md).")  # fmt: skip
    where, _, attribute = spec.rpartition(":")
    module = _import(where, spec)
    target = getattr(module, attribute, None)
    if target is None:
        raise SealError(f"family {spec}: {where} has no attribute {attribute!r}.")
    family = target(**settings) if inspect.isclass(target) else target
    return check_family(family, spec)


def _import(where: str, spec: str) -> Any:
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_file():
            raise SealError(f"family {spec}: no file {path}.")
        name = f"seal_family_{path.stem}"
        loaded = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loaded)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            loaded.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise SealError(f"family {spec}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
        return module
    try:
        return importlib.import_module(where)
    except ImportError as exc:
        raise SealError(f"family {spec}: cannot import {where!r} ({exc}).") from exc
