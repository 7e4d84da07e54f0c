"""Build ``wheelhouse/``: the wheels the GPU node lacks, so that the GPU check (`seal doctor --gpu`) runs there offline.

The node (``benchmarks/gpu_node.txt``: its packages and where that is known from) has torch,
transformers, accelerate and most of the scientific stack, but not TRL, datasets or half of
seal-rl's core. Starting from seal-rl's ``dependencies`` and its ``train`` extra (pyproject.toml),
this walks every wheel's requirements (for CPython 3.12 on Linux x86_64), skips what the node has,
takes each version from ``requirements/lock.txt`` unless :data:`PINS` says why not (and carries
:data:`CARRIED` although the node has them), and downloads
the cp312 manylinux x86_64 wheels with ``--no-deps`` (one version of each); bfcl-eval comes without
its dependencies, as ``make install`` installs it.

It fails when a requirement has no version here, when a chosen version or a node version that is
known breaks a requirement, or when the folder exceeds 50 MiB (the GPU window carries 64 MiB with
the working tree). Requirements on node packages whose version is not known are listed as assumed.

Usage: python benchmarks/gpu_wheelhouse.py --bfcl bfcl-eval==VERSION [--out wheelhouse]   (``make gpu-wheelhouse``)
On the node: python3 -m pip install --no-index --no-deps --target /tmp/site wheelhouse/*.whl (docs/guides/gpu.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
NODE_FILE = ROOT / "benchmarks" / "gpu_node.txt"
LOCK_FILE = ROOT / "requirements" / "lock.txt"
LIMIT_MIB = 50
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
MARKER_ENVIRONMENT = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "x86_64", "os_name": "posix",
}  # fmt: skip
"""the node's interpreter, for the requirements' environment markers"""
PINS = {
    # The lock's datasets 5.2.0 needs pyarrow>=24, and the node's pyarrow version was never read. 5.0.0 is the
    # newest release that asks for no more than TRL 1.16 does itself (pyarrow>=21), wants huggingface-hub<2
    # (the node has 1.33.0) and lies in the train extra's range (datasets>=4.7).
    "datasets": "5.0.0",
}
CARRIED = {
    # pydantic 2.14 and pydantic-core 2.50 need typing-extensions>=4.16 (2026), which the node's may predate
    # (its version was never read); typing_extensions only ever adds, so a newer one shadowing it is safe.
    "typing-extensions",
}
"""packages the node has that the wheelhouse carries anyway, at the lock's version"""


def node_packages() -> dict[str, str | None]:
    """Canonical name -> version (None where only the name is known)."""
    found = {}
    for line in NODE_FILE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            found[canonicalize_name(name)] = version or None
    return found


def lock_versions() -> dict[str, str]:
    found = {}
    for line in LOCK_FILE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split(";", 1)[0].split("==")
            found[canonicalize_name(name)] = version.strip()
    return found


def applies(requirement: Requirement, extras: set[str] = frozenset()) -> bool:
    """Whether a requirement holds on the node (for a package installed with ``extras``)."""
    marker = requirement.marker
    return marker is None or any(marker.evaluate({**MARKER_ENVIRONMENT, "extra": e}) for e in {*extras, ""})


def roots() -> list[Requirement]:
    """seal-rl's core dependencies and its train extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [r for r in map(Requirement, project["dependencies"] + project["optional-dependencies"]["train"]) if applies(r)]


def download(specs: list[str], out: Path) -> None:
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", PYTHON, "--implementation", "cp", *platforms, "--dest", str(out), *specs],
                   check=True)  # fmt: skip


def requirements_of(wheel: Path, extras: set[str]) -> list[Requirement]:
    """The wheel's Requires-Dist that apply on the node (with the requested extras)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode())
    return [r for r in map(Requirement, metadata.get_all("Requires-Dist") or []) if applies(r, extras)]


def build(out: Path, bfcl: str) -> int:
    node, lock = node_packages(), lock_versions()
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.whl"):  # two versions of a package stop the install on the node
        stale.unlink()
    chosen: dict[str, tuple[str, set[str]]] = {}  # name -> (version, extras walked)
    wheels: dict[str, Path] = {}
    assumed: dict[str, list[str]] = {}
    problems: list[str] = []
    wanted: list[tuple[Requirement, str]] = [(r, "seal-rl") for r in roots()]
    while wanted:  # one level of the requirement graph per pass: one pip download for its new wheels
        level, wanted, walk = wanted, [], {}
        for requirement, by in level:
            name = canonicalize_name(requirement.name)
            if name in node and name not in CARRIED:
                if node[name] is None:
                    if str(requirement.specifier):
                        assumed.setdefault(name, []).append(f"{requirement.specifier} ({by})")
                elif not requirement.specifier.contains(node[name], prereleases=True):
                    problems.append(f"{by} needs {requirement}, the node has {name} {node[name]}")
                continue
            version = chosen[name][0] if name in chosen else PINS.get(name) or lock.get(name)
            if version is None:
                problems.append(f"{by} needs {requirement}, which neither the node nor requirements/lock.txt has")
                continue
            if not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{by} needs {requirement}, the wheelhouse has {name} {version}")
            walked = chosen.get(name, (version, set()))[1]
            extras = set(requirement.extras) - walked
            if name not in chosen or extras:
                walk.setdefault(name, set()).update(extras)
                chosen[name] = (version, walked | extras)
        missing = [n for n in walk if n not in wheels]
        if missing:
            download([f"{n}=={chosen[n][0]}" for n in missing], out)
            present = {canonicalize_name(parse_wheel_filename(w.name)[0]): w for w in out.glob("*.whl")}
            wheels.update((n, present[n]) for n in missing)
        for name, extras in walk.items():  # a new wheel's requirements, or those of extras asked for later
            wanted += [(r, name) for r in requirements_of(wheels[name], extras)]
    download([bfcl], out)  # without its dependencies (~6 GB of vendor SDKs seal-rl never imports)

    for name, specifiers in sorted(assumed.items()):
        print(f"assumed on the node (version not read): {name} {'; '.join(specifiers)}")
    total = 0
    for wheel in sorted(out.glob("*.whl")):
        size = wheel.stat().st_size
        total += size
        print(f"{size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{total / 2**20:7.2f} MiB  in {out} ({len(list(out.glob('*.whl')))} wheels; limit {LIMIT_MIB} MiB)")
    if total > LIMIT_MIB * 2**20:
        problems.append(f"the wheelhouse holds {total / 2**20:.1f} MiB, more than {LIMIT_MIB} MiB")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "wheelhouse")
    parser.add_argument("--bfcl", required=True, help="bfcl-eval's requirement, e.g. bfcl-eval==2026.3.23 (the Makefile's BFCL)")
    args = parser.parse_args()
    return build(args.out, args.bfcl)


if __name__ == "__main__":
    sys.exit(main())
