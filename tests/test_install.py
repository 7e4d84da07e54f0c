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
