"""Installed, not only checked out: a wheel of seal-rl in a fresh virtual environment outside the
checkout runs the CLI, evaluation and a shipped training recipe by name (issue 15)."""

from __future__ import annotations

import email
import io
import json
import os
import site
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

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


# A GPU image's own builds (docs/guides/gpu.md: the lent H100/H200 machines run torch 2.11.0+cu130 and
# transformers 5.17.0), in range for the `train` extra but not the lock's versions.
BESIDE = {"torch": "2.11.0", "transformers": "5.17.0"}
INDEX = "https://pypi.org/simple"


class _RangeReader(io.RawIOBase):
    """A remote file read with HTTP range requests, seekable, so that `zipfile` reads a wheel's
    central directory and one member without the rest (torch's wheel is 530 MB)."""

    def __init__(self, url: str):
        self.url, self.position = url, 0
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=0-0"}), timeout=60) as r:
            assert r.status == 206, f"{url} answers a range request with {r.status}, not 206 Partial Content"
            self.size = int(r.headers["Content-Range"].rpartition("/")[2])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence] + offset
        return self.position

    def readinto(self, buffer) -> int:
        end = min(self.position + len(buffer), self.size)
        if end <= self.position:
            return 0
        ranged = urllib.request.Request(self.url, headers={"Range": f"bytes={self.position}-{end - 1}"})
        with urllib.request.urlopen(ranged, timeout=60) as r:
            assert r.status == 206, f"{self.url} answers a range request with {r.status}, not 206 Partial Content"
            data = r.read()
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def published_metadata(name: str, wanted: str) -> tuple[str, bytes]:
    """The newest version of `name` in `wanted` (a specifier, `==2.11.0`) with a wheel for this
    interpreter, and that wheel's METADATA file as the package index publishes it: read out of the
    wheel by range requests (the index serves no PEP 658 metadata file for torch 2.11.0, and pip
    23.2 then downloads the whole wheel, which once filled CI's disk)."""
    listing = urllib.request.Request(f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(listing, timeout=60) as r:
        files = json.load(r)["files"]
    supported, specifier = list(sys_tags()), SpecifierSet(wanted)
    wheels = []
    for f in files:
        if f["filename"].endswith(".whl"):
            _, version, _, tags = parse_wheel_filename(f["filename"])
            if specifier.contains(version, prereleases=True) and tags & set(supported):
                wheels.append((version, -min(supported.index(t) for t in tags if t in supported), f["url"]))
    assert wheels, f"the index has no wheel of {name}{wanted} for this interpreter"
    version, _, url = max(wheels)  # the newest version, then the wheel that fits this interpreter best
    with zipfile.ZipFile(io.BufferedReader(_RangeReader(url), buffer_size=1 << 16)) as wheel:
        (member,) = [m for m in wheel.namelist() if m.endswith(".dist-info/METADATA") and m.count("/") == 1]
        return str(version), wheel.read(member)


def exact_pins(metadata: bytes) -> dict[str, tuple[str, bytes]]:
    """What a distribution pins with `==` for this machine, its extras' pins included, and theirs in
    turn, each with its published METADATA: torch's CUDA libraries, installed beside it on a GPU image."""
    found: dict[str, tuple[str, bytes]] = {}
    todo, seen = [(metadata, frozenset({""}))], set()
    while todo:
        metadata, extras = todo.pop()
        for line in email.message_from_bytes(metadata).get_all("Requires-Dist") or []:
            r = Requirement(line)
            specs = list(r.specifier)
            if len(specs) != 1 or specs[0].operator != "==":
                continue
            if r.marker is not None and not any(r.marker.evaluate({"extra": e}) for e in extras):
                continue
            name = canonicalize_name(r.name)
            if name not in found:
                found[name] = published_metadata(name, str(r.specifier))
            if (name, frozenset(r.extras)) not in seen:
                seen.add((name, frozenset(r.extras)))
                todo.append((found[name][1], frozenset({"", *r.extras})))
    return found


@pytest.mark.slow
def test_installing_the_train_extra_keeps_the_torch_and_transformers_already_there(tmp_path):
    """`pip install 'seal-rl[train]'` on a machine that has its own torch and transformers in range
    keeps them (pyproject.toml declares ranges; exact pins live in the lock).

    The two are installed in a fresh venv as their published METADATA only (a CUDA torch is GBs):
    pip's resolver reads no more than that of an installed distribution. So are the CUDA libraries
    torch pins exactly, which a GPU image has beside it (the index serves no PEP 658 metadata for
    them either, and pip 23.2 would download 1.3 GB of their wheels to read it). Then pip resolves
    seal-rl's train extra into that venv (`--dry-run`: nothing is installed) and its report must
    not list any of them."""
    from tests.test_gpu_extra import NETWORK_ERRORS, _pip

    try:
        installed = {name: published_metadata(name, f"=={version}") for name, version in BESIDE.items()}
        installed |= exact_pins(installed["torch"][1])
    except urllib.error.HTTPError:
        raise  # the index answered: a missing file is a failure, not an unreachable index
    except OSError as error:  # urllib's URLError and socket timeouts
        pytest.skip(f"package index unreachable: {error}")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site_packages = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    for name, (version, metadata) in installed.items():
        info = site_packages / f"{canonicalize_name(name).replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_bytes(metadata)
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
    resolved = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"] for item in json.loads(report.read_text())["install"]}
    assert "seal-rl" in resolved and resolved["trl"].startswith("1.16.")
    kept = {canonicalize_name(name) for name in installed}
    assert not kept & set(resolved), {name: resolved[name] for name in kept & set(resolved)}
