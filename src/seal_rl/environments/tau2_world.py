"""τ²'s environments for training episodes, built without re-parsing the domain database.

τ²'s environment constructors (``tau2.registry.get_env_constructor(domain)``) load the domain's
database from its JSON file on every call: once per episode, and twice more per score, since
``evaluate_simulation`` builds a predicted and a gold environment. :func:`environment_constructor`
returns a constructor with the same signature and result that hands τ²'s own constructor a fresh
copy of the database instead (``db=``, and ``user_db=`` for telecom, the keywords τ²'s
constructors take). :func:`scoring_domain` registers that constructor in τ²'s registry under
``seal-fast-<domain>``, so that ``evaluate_simulation(domain=scoring_domain(tau2, domain), ...)``
runs τ²'s own evaluators unchanged and only builds its environments faster.

What is cached, per domain and per process (``lru_cache``; ``_fast_constructor.cache_clear()``
resets it): the ``model_dump()`` of the database(s) of one environment built by τ²'s own
constructor (airline ~12 MiB, retail ~6 MiB, telecom and mock tiny). Each call re-validates that
dict into a new database model: τ²'s ``DB.load`` is ``model_validate`` of the parsed file, so this
skips only the JSON parse. Why it is exact: the copy dumps equal to τ²'s freshly loaded database
(same ``get_db_hash``), and no database field is ``Any``-typed, so validation builds new models,
lists and dicts all the way down: a write in one episode's environment reaches neither the cache
nor another episode (tests/test_tau2_world.py checks all of it). Per copy of airline's 7 MB
database on 2 cores (best of several; the cyclic GC adds as much again on average): re-validating
the dict ~60 ms, ``model_validate_json`` ~100 ms, pickle ~80 ms, τ²'s load ~105 ms,
``copy.deepcopy`` and ``model_copy(deep=True)`` ~170 ms.

Per-episode environment time, scripted gold episodes (``make bench-env-tau2``: reset + tool steps
+ scoring, ms per episode, 2 cores, against τ²'s ``AgentGymEnv`` as shipped): telecom solo
~5000 -> ~90 (55x; mostly the task file that AgentGymEnv re-reads and re-validates ~7 times an
episode, where an episode here has its task at hand), mock solo 40 -> 15, airline ~2100 -> ~760
and retail ~1200 -> ~420 (~3x; their scoring hashes the whole database four times, τ²'s own
cost); rewards and ``reward_info`` identical on every task.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

_DATABASES = ("db", "user_db")
"""the keywords of τ²'s domain constructors that take a database, and where the environment keeps it"""
_REGISTERING = threading.Lock()


@functools.lru_cache(maxsize=None)
def _fast_constructor(registry: Any, domain: str) -> Callable[..., Any]:
    original = registry.get_env_constructor(domain)
    signature = inspect.signature(original)
    pristine = original()  # parses the database(s) once
    kits = {"db": pristine.tools, "user_db": pristine.user_tools}
    cached = {name: (type(kits[name].db), kits[name].db.model_dump())
              for name in _DATABASES if name in signature.parameters and kits[name] is not None}  # fmt: skip

    @functools.wraps(original)
    def construct(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        for name, (model, data) in cached.items():
            if bound.arguments.get(name) is None:
                bound.arguments[name] = model.model_validate(data)
        return original(*bound.args, **bound.kwargs)

    return construct


def environment_constructor(tau2: SimpleNamespace, domain: str) -> Callable[..., Any]:
    """``tau2.registry.get_env_constructor(domain)`` whose every call gets its own copy of the
    database, parsed once per process (the first call for ``domain`` parses it)."""
    return _fast_constructor(tau2.registry, domain)


def scoring_domain(tau2: SimpleNamespace, domain: str) -> str:
    """``seal-fast-<domain>``, registered (once) in τ²'s registry with
    :func:`environment_constructor`'s constructor: pass it as ``evaluate_simulation(domain=...)``."""
    name = f"seal-fast-{domain}"
    with _REGISTERING:
        if name not in tau2.registry.get_domains():
            tau2.registry.register_domain(environment_constructor(tau2, domain), name)
    return name
