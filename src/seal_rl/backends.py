"""The executable BFCL tool backends: isolated instances and safe dispatch by method name.

The official executor (``execute_multi_turn_func_call``) builds a Python string per call and
``eval``s it, keeps instances in module globals keyed by model name + entry id (never freed), and
shares the backend modules' constants (long-context credit cards, booking records, weather...) by
reference across every instance in the process. This module reproduces its *results* exactly,
without any of that:

* A :class:`BackendWorld` is a private copy of whatever module-level state instances can reach:
  for long-context tasks the backend modules' code objects are executed into fresh namespaces
  and the names they import from ``long_context`` are rebound to a private copy of that module.
  Nothing mutable is shared between worlds.
* :class:`Backends` holds one instance per involved class, created and loaded exactly as the
  official executor does (``_load_scenario(deepcopy(config), long_context=...)``).
* :meth:`Backends.execute` looks a validated method name up among the instances' public methods
  (last class wins, as the official mapping does) and calls it with keyword arguments. Model text
  never reaches ``eval`` or ``exec``. The result string is formatted as the official executor
  formats it; an exception becomes ``"Error during execution: <message>"``.

Departures (both only for input the official executor cannot survive):

* :func:`resource_guard` refuses the calls that make C code run for minutes or hours on hostile
  numbers, looking at every operand: an integer argument longer than Python's own int/str limit
  (4,300 digits; only a pythonic hex literal can carry one), ``MathAPI.power`` whose integer result
  would have more than 100,000 digits, ``round_number`` to more than 10,000 places, and
  ``logarithm``/``square_root`` with precision above 10,000.
* ``mpmath.mp.dps`` and the ``decimal`` context precision are restored after every call, so a tool
  call cannot change the precision of other code in the process (e.g. sympy inside torch).

Worlds are not thread-safe (BFCL backends are not); use processes for parallelism.
"""

from __future__ import annotations

import copy
import decimal
import importlib
import importlib.util
import inspect
import json
import math
import pickle
import types
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import mpmath

from seal_rl.bfcl import BACKEND_PACKAGE, import_bfcl
from seal_rl.protocol import non_finite
from seal_rl.tasks import Task
from seal_rl.tools import ToolCall

EXECUTION_ERROR_PREFIX = "Error during execution: "

# Limits of resource_guard; the ground truth stays far below them (largest precision: 10, no power calls).
MAX_INTEGER_DIGITS = 4_300
"""Longest integer argument (decimal digits): Python's default int/str conversion limit, so no
decimal literal and no ``repr`` the official executor could build is longer."""
_INTEGER_BOUND = 10**MAX_INTEGER_DIGITS
MAX_RESULT_DIGITS = 100_000
"""Largest integer ``MathAPI.power`` may compute (about 10 ms); longer results cannot be printed anyway."""
MAX_PRECISION = 10_000
"""Largest ``precision`` of ``logarithm``/``square_root`` and ``|decimal_places|`` of ``round_number``."""


@lru_cache(maxsize=None)
def _module_code(module: str) -> types.CodeType:
    """The compiled code of a backend module (from its installed .pyc); immutable, so cached."""
    name = f"{BACKEND_PACKAGE}.{module}"
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"backend module {name} not found")
    return spec.loader.get_code(name)


@lru_cache(maxsize=None)
def class_modules() -> Mapping[str, str]:
    """Backend class name -> module short name, from the official mapping."""
    mapping = import_bfcl("constants.executable_backend_config").CLASS_FILE_PATH_MAPPING
    return types.MappingProxyType({cls: path.rsplit(".", 1)[1] for cls, path in mapping.items()})


@lru_cache(maxsize=None)
def stateless_classes() -> frozenset[str]:
    return frozenset(import_bfcl("constants.executable_backend_config").STATELESS_CLASSES)


@lru_cache(maxsize=None)
def _constant_snapshot(name: str) -> bytes:
    """A long_context constant as it is after import, pickled once; worlds unpickle private copies
    (plain data: a few times faster than deepcopy)."""
    return pickle.dumps(getattr(importlib.import_module(f"{BACKEND_PACKAGE}.long_context"), name))


def _fresh_module(module: str) -> types.ModuleType:
    name = f"{BACKEND_PACKAGE}.{module}"
    namespace = types.ModuleType(name)
    namespace.__dict__["__package__"] = BACKEND_PACKAGE
    exec(_module_code(module), namespace.__dict__)  # trusted package code, never model text
    return namespace


class BackendWorld:
    """A private copy of the BFCL backend modules, including their module-level constants.

    Instances built from one world may share module constants with each other, exactly as all
    instances in one official process do; instances from different worlds share nothing.

    ``long_context``: the only mutable module-level objects an instance can reach are the
    ``long_context`` constants (credit cards, booking records, weather...), and only
    long-context scenarios reach them (every use sits behind ``if self.long_context``). Such
    worlds get fresh copies of the backend modules bound to private deep copies of the constants
    those modules import.
    Other worlds use the installed modules as they are: their only other module-level data,
    ``DEFAULT_STATE``, is deep-copied by every ``_load_scenario`` and never written.
    """

    def __init__(self, *, long_context: bool = True) -> None:
        class_modules()  # imports bfcl_eval once, with a safe BFCL_PROJECT_ROOT
        self._long_context = long_context
        self._constants: dict[str, Any] = {}  # this world's private copies of long_context constants
        self._modules: dict[str, types.ModuleType] = {}
        self._methods: dict[type, tuple[str, ...]] = {}

    def backend_class(self, class_name: str) -> type:
        module = class_modules()[class_name]
        if module not in self._modules:
            self._modules[module] = self._load(module)
        return getattr(self._modules[module], class_name)

    def public_methods(self, instance: Any) -> tuple[str, ...]:
        """Names of an instance's public bound methods, as the official executor maps them."""
        cls = type(instance)
        if cls not in self._methods:
            members = inspect.getmembers(instance, predicate=inspect.ismethod)
            self._methods[cls] = tuple(name for name, _ in members if not name.startswith("_"))
        return self._methods[cls]

    def _load(self, module: str) -> types.ModuleType:
        if not self._long_context:
            return importlib.import_module(f"{BACKEND_PACKAGE}.{module}")
        namespace = _fresh_module(module)
        shared = importlib.import_module(f"{BACKEND_PACKAGE}.long_context").__dict__
        for key, value in list(namespace.__dict__.items()):
            if key in shared and value is shared[key] and not key.startswith("__"):
                if key not in self._constants:  # one copy per world, shared by its modules
                    self._constants[key] = pickle.loads(_constant_snapshot(key))
                namespace.__dict__[key] = self._constants[key]
        return namespace


@lru_cache(maxsize=None)
def method_signature(involved_classes: tuple[str, ...], method: str) -> inspect.Signature | None:
    """The signature (without ``self``) of the method a call to ``method`` reaches, or None."""
    owner = None
    for class_name in involved_classes:  # the last class with the method wins, as in the official mapping
        cls = getattr(importlib.import_module(f"{BACKEND_PACKAGE}.{class_modules()[class_name]}"), class_name)
        if not method.startswith("_") and inspect.isfunction(getattr(cls, method, None)):
            owner = cls
    if owner is None:
        return None
    signature = inspect.signature(getattr(owner, method))
    return signature.replace(parameters=list(signature.parameters.values())[1:])


@dataclass(frozen=True)
class CallOutcome:
    """What one executed call returned.

    output: the result string exactly as the official executor would produce it.
    error: the error message when the call raised or the backend answered ``{"error": ...}``.
    raised: True when the call raised (``output`` starts with ``"Error during execution: "``).
    """

    output: str
    error: str | None = None
    raised: bool = False


def format_result(value: Any) -> str:
    """Format a backend's return value as the official executor does."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:
            return str(value)
    return str(value)


def _oversized_integer(arguments: Mapping[str, Any]) -> str | None:
    """The name of an argument holding (at any depth) an integer longer than MAX_INTEGER_DIGITS."""
    stack: list[tuple[str, Any]] = list(arguments.items())
    while stack:
        name, value = stack.pop()
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INTEGER_BOUND:
            return name
        if isinstance(value, (list, tuple)):
            stack.extend((name, item) for item in value)
        elif isinstance(value, dict):
            stack.extend((name, item) for item in value.values())
    return None


def resource_guard(class_name: str, method: str, arguments: Mapping[str, Any]) -> str | None:
    """Why a call must not run (it would hang the process in C code), or None.

    Every operand is looked at, so each call that does run finishes in milliseconds (C code cannot
    be interrupted by the step time limit): an integer longer than Python's own int/str limit is
    refused in any call; ``MathAPI.power`` is refused when its integer result would exceed
    MAX_RESULT_DIGITS, ``round_number`` when ``|decimal_places|`` exceeds MAX_PRECISION (an integer
    rounded to -10**8 places computes 10**10**8), and ``logarithm``/``square_root`` when the
    precision exceeds MAX_PRECISION. The official executor would compute ``10 ** 10**9`` or a
    million-digit logarithm for as long as it takes; no result exists to be faithful to, so we
    return an execution error instead.
    """
    oversized = _oversized_integer(arguments)
    if oversized is not None:
        return f"integer argument {oversized!r} has more than {MAX_INTEGER_DIGITS} digits (too large)"
    if class_name != "MathAPI":
        return None
    if method == "power":
        base, exponent = arguments.get("base"), arguments.get("exponent")
        if (
            isinstance(base, int) and isinstance(exponent, int)
            and abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > MAX_RESULT_DIGITS
        ):  # fmt: skip
            return f"power result would have more than {MAX_RESULT_DIGITS} digits (too large)"
    if method == "round_number":
        places = arguments.get("decimal_places")
        if isinstance(places, int) and abs(places) > MAX_PRECISION:
            return f"decimal_places {places} is too large (limit {MAX_PRECISION})"
    if method in ("logarithm", "square_root"):
        precision = arguments.get("precision")
        if isinstance(precision, int) and precision > MAX_PRECISION:
            return f"precision {precision} is too large (limit {MAX_PRECISION})"
    return None


@contextmanager
def _numeric_context():
    """Restore the process-wide mpmath and decimal precision a backend call may change."""
    dps, prec = mpmath.mp.dps, decimal.getcontext().prec
    try:
        yield
    finally:
        mpmath.mp.dps, decimal.getcontext().prec = dps, prec


def backend_error(output: str) -> str | None:
    """The error message a backend reported as ``{"error": "..."}``, if that is what ``output`` is."""
    if not output.startswith('{"error": '):
        return None
    try:
        value = json.loads(output)
    except ValueError:
        return None
    return str(value["error"]) if isinstance(value, dict) and len(value) == 1 else None


class Backends:
    """The live API instances of one episode (or of one side of one verification)."""

    def __init__(self, task: Task, world: BackendWorld | None = None) -> None:
        self.world = world if world is not None else BackendWorld(long_context=task.long_context)
        config = task.initial_config()  # already a private copy: the official deepcopy is implied
        self.instances: dict[str, Any] = {}
        self._owner: dict[str, str] = {}
        for class_name in task.involved_classes:
            instance = self.world.backend_class(class_name)()
            if class_name not in stateless_classes():
                instance._load_scenario(config.get(class_name, {}), long_context=task.long_context)
            self.instances[class_name] = instance
            for name in self.world.public_methods(instance):
                self._owner[name] = class_name  # a later class wins, as in the official mapping

    def owner(self, method: str) -> str | None:
        """The class whose instance answers calls to ``method``, or None."""
        return self._owner.get(method)

    def execute(self, call: ToolCall) -> CallOutcome:
        """Run one call by method name with keyword arguments; never raises for any call."""
        owner = self._owner.get(call.name)
        if owner is None:  # what eval() of an unknown name would have said
            message = f"name '{call.name}' is not defined"
            return CallOutcome(EXECUTION_ERROR_PREFIX + message, message, raised=True)
        infinite = non_finite(call.arguments)
        if infinite is not None:  # the official executor eval()s repr(argument): `nan` is undefined
            message = f"name '{infinite!r}' is not defined"
            return CallOutcome(EXECUTION_ERROR_PREFIX + message, message, raised=True)
        refusal = resource_guard(owner, call.name, call.arguments)
        if refusal is not None:
            return CallOutcome(EXECUTION_ERROR_PREFIX + refusal, refusal, raised=True)
        method = getattr(self.instances[owner], call.name)
        try:
            with _numeric_context():
                output = format_result(method(**copy.deepcopy(call.arguments)))
        except Exception as exc:  # the official executor turns every exception into a result
            return CallOutcome(EXECUTION_ERROR_PREFIX + str(exc), str(exc), raised=True)
        return CallOutcome(output, backend_error(output))

    def public_state(self, class_name: str) -> dict[str, Any]:
        """The attributes the official state checker compares (those not starting with ``_``)."""
        return {k: v for k, v in vars(self.instances[class_name]).items() if not k.startswith("_")}
