"""Installed, not only checked out: a wheel of seal-rl in a fresh virtual environment outside the
checkout runs the CLI, evaluation and a shipped training recipe by name (issue 15)."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_wheel_works_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)], tmp_path, env)
    (wheel,) = wheels.glob("seal_rl-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    # The dependencies come from this environment's site-packages (a path, not a site dir: its .pth
    # files, among them the checkout's editable install, are not run); seal-rl only from the wheel.
    target = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    dependencies = [p for p in {sysconfig.get_paths()["purelib"], *site.getsitepackages()} if Path(p).is_dir()]
    (target / "seal_dependencies.pth").write_text("\n".join(dependencies) + "\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], tmp_path, env)
    work = tmp_path / "elsewhere"
    work.mkdir()
    seal = str(venv / "bin" / "seal")
    where = _run([str(python), "-c", "import seal_rl; print(seal_rl.__file__)"], work, env).stdout.strip()
    assert where.startswith(str(target)), where  # the installed copy, not the checkout

    listed = _run([seal, "tasks", "list", "--split", "test", "--json"], work, env)
    assert len(json.loads(listed.stdout)) == 400  # the split ships in the package
    _run([seal, "eval", "--policy", "oracle", "--tasks", "multi_turn_base_0,multi_turn_miss_func_0", "--out", "eval"], work, env)
    assert json.loads((work / "eval" / "summary.json").read_text())["successes"] == 2
    names = _run([seal, "train", "--list-configs"], work, env).stdout
    assert "smoke-cpu" in names and "paper-qwen2.5-7b" in names
    _run([seal, "train", "--config", "smoke-cpu", "--out", "train"], work, env)
    assert (work / "train" / "model" / "config.json").exists()
    assert not (ROOT / "train").exists() and not (ROOT / "eval").exists()


# A GPU image's own builds (docs/gpu.md: the lent H100/H200 machines run torch 2.11.0+cu130 and
# transformers 5.17.0), in range for the `train` extra but not the lock's versions.
BESIDE = {"torch": "2.11.0", "transformers": "5.17.0"}


@pytest.mark.slow
def test_installing_the_train_extra_keeps_the_torch_and_transformers_already_there(tmp_path):
    """`pip install 'seal-rl[train]'` on a machine that has its own torch and transformers in range
    keeps them (pyproject.toml declares ranges; exact pins live in the lock).

    The two are installed in a fresh venv as their published metadata only (a CUDA torch is GBs):
    pip's resolver reads no more than that of an installed distribution. The metadata comes from
    the package index (PEP 658, no wheel downloaded); then pip resolves seal-rl's train extra into
    that venv (`--dry-run`: nothing is installed) and its report must not list them."""
    from tests.test_gpu_extra import NETWORK_ERRORS, _pip

    published = tmp_path / "published.json"
    pins = [f"{name}=={version}" for name, version in BESIDE.items()]
    run = _pip("install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet", "--timeout", "60",
               "--report", str(published), *pins, timeout=300)  # fmt: skip
    if run.returncode != 0 and NETWORK_ERRORS.search(run.stdout + run.stderr):
        pytest.skip(f"package index unreachable: {(run.stdout + run.stderr).strip()[-300:]}")
    assert run.returncode == 0, run.stdout + run.stderr

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_packages = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    for item in json.loads(published.read_text())["install"]:
        meta = item["metadata"]
        info = site_packages / f"{meta['name']}-{meta['version']}.dist-info"
        info.mkdir()
        lines = ["Metadata-Version: 2.1", f"Name: {meta['name']}", f"Version: {meta['version']}"]
        lines += [f"Requires-Python: {meta['requires_python']}"] if meta.get("requires_python") else []
        lines += [f"Requires-Dist: {r}" for r in meta.get("requires_dist", [])]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    listed = _run([str(python), "-c", "import importlib.metadata as m; print({d.metadata['Name']: d.version for d in m.distributions()})"], tmp_path, os.environ.copy())
    assert all(f"'{name}': '{version}'" in listed.stdout for name, version in BESIDE.items()), listed.stdout

    report = tmp_path / "report.json"
    run = _pip("--python", str(python), "install", "--dry-run", "--quiet", "--timeout", "60", "--report", str(report),
               f"{ROOT}[train]", timeout=600)  # fmt: skip
    if run.returncode != 0 and NETWORK_ERRORS.search(run.stdout + run.stderr) and "ResolutionImpossible" not in run.stdout + run.stderr:
        pytest.skip(f"package index unreachable during resolution: {(run.stdout + run.stderr).strip()[-300:]}")
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    resolved = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert "seal-rl" in resolved and resolved["trl"].startswith("1.16.")
    assert not set(BESIDE) & set(resolved), {name: resolved[name] for name in set(BESIDE) & set(resolved)}
