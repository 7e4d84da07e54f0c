"""The ``gpu`` extra (pyproject.toml) is pinned exactly and installs together with requirements/lock.txt.

The fast tests read the files only. The slow one asks pip to resolve the lock and the extra's pins
together (``pip install --dry-run``: nothing is installed) and needs the package index; it skips
only when the index cannot be reached at all. A resolution conflict fails. ``make gpu-extra-check`` runs
this file.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"


def gpu_requirements() -> list[Requirement]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [Requirement(r) for r in extras["gpu"]]


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def pinned_version(requirement: Requirement) -> str:
    (spec,) = requirement.specifier
    return spec.version


def test_gpu_extra_pins_are_exact():
    requirements = gpu_requirements()
    assert requirements
    for r in requirements:
        specs = list(r.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{r}: the gpu extra pins with == only"
        assert "*" not in specs[0].version and not r.extras and r.marker is None and r.url is None, str(r)
    names = [canonicalize_name(r.name) for r in requirements]
    assert len(names) == len(set(names)), names


def test_gpu_extra_agrees_with_the_lock():
    lock = lock_pins()
    for r in gpu_requirements():
        name = canonicalize_name(r.name)
        if name in lock:
            assert pinned_version(r) == lock[name], f"{r.name}: gpu extra {pinned_version(r)}, lock {lock[name]}"


def test_gpu_extra_is_in_the_ranges_trl_and_transformers_declare():
    """TRL's `deepspeed`/`liger`/`vllm` extras and transformers' `deepspeed` extra accept our pins."""
    lock = lock_pins()
    versions = {**lock, **{canonicalize_name(r.name): pinned_version(r) for r in gpu_requirements()}}
    for dist, extras in (("trl", ("deepspeed", "liger", "vllm")), ("transformers", ("deepspeed",))):
        assert importlib.metadata.version(dist) == lock[dist]
        for line in importlib.metadata.requires(dist) or []:
            r = Requirement(line)
            name = canonicalize_name(r.name)
            if r.marker is None or name not in versions:
                continue
            if any(r.marker.evaluate({"extra": e}) for e in extras):
                assert r.specifier.contains(versions[name], prereleases=True), (
                    f"{dist} wants {r}, we pin {versions[name]}")


NETWORK_ERRORS = re.compile(
    r"NewConnectionError|ConnectTimeout|ReadTimeout|Max retries exceeded|Temporary failure in name resolution"
    r"|Name or service not known|Network is unreachable|Connection refused|Could not fetch URL|ProxyError",
)


def _pip(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                    reason="the gpu extra targets Linux x86_64 (triton has wheels for Linux only)")
def test_gpu_extra_resolves_against_the_lock(tmp_path):
    """`pip install --dry-run -r lock.txt <gpu pins>`: every locked package and every pin, together.

    `-r` (not `-c`) so that the whole lock is part of the same resolution, torch and trl included:
    a pin that needed another torch, transformers, numpy... fails here. pip fetches only metadata
    where the index serves it (PEP 658); deepspeed is an sdist, so its metadata is built locally.
    """
    probe = _pip("index", "versions", "trl", "--timeout", "20", "--retries", "1", timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"package index unreachable: {(probe.stderr or probe.stdout).strip()[-300:]}")
    report = tmp_path / "report.json"
    pins = [str(r) for r in gpu_requirements()]
    try:
        run = _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--timeout", "60",
                   "--report", str(report), "-r", str(LOCK), *pins, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail("pip did not resolve the lock and the gpu extra within 10 minutes")
    output = run.stdout + run.stderr
    if run.returncode != 0 and NETWORK_ERRORS.search(output) and "ResolutionImpossible" not in output:
        pytest.skip(f"package index unreachable during resolution: {output.strip()[-300:]}")
    assert run.returncode == 0, f"the gpu extra does not install with the lock:\n{output[-4000:]}"

    resolved = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    lock = lock_pins()
    # A local build (torch 2.13.0+cpu from a wheel directory) is the same release as the lock's pin.
    public = {name: Version(Version(v).public) for name, v in resolved.items()}
    assert public["torch"] == Version(lock["torch"])
    assert public["trl"] == Version(lock["trl"])
    assert {n: public.get(n) for n in lock} == {n: Version(v) for n, v in lock.items()}
    for r in gpu_requirements():
        assert public[canonicalize_name(r.name)] == Version(pinned_version(r)), r
