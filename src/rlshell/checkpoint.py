"""Checkpoint directories: layout, atomic commit, ``resume``, pruning.

A checkpoint of step N is ``<run dir>/checkpoints/global_step_N/``:

- ``actor/``: the actor's model and optimizer shards (torch.distributed.checkpoint,
  one file per rank) and each rank's scheduler and RNG states;
- ``hf_config/``: a Hugging Face model's config, ``tokenizer/``: a reasoning
  run's tokenizer (`rlshell.export` writes it beside the exported model);
- ``trainer_state.json``: the step, the prompt sampler's position and what
  else the driver needs to continue exactly; written last.

The run's resolved config, which names the model the checkpoint's weights
belong to, is ``<run dir>/config.json`` (`run_config_path`).

`load_policy_weights` reads a checkpoint's policy weights into a model the
run's ``actor.model`` builds, whichever runner wrote it (`POLICY_LAYOUTS`: a
marker file that identifies each runner's layout and the function that loads
it): export, evaluation and a run that starts from another run's policy
(``actor.model.checkpoint``) all read them through it.

Everything is written under a hidden staging name
(``.global_step_N.partial``) and renamed when complete, so a crash or Ctrl-C
mid-save never leaves a directory that looks like a checkpoint; stale
staging directories are removed when the next run starts. Before the rename
the driver writes ``manifest.json`` (every file's size and SHA-256, each file
flushed to disk as it is read), then ``trainer_state.json``. A resume
(`resolve_resume`) verifies a checkpoint against its manifest before it is
used: ``resume=auto`` skips, newest first, every checkpoint that fails (a
truncated or corrupted file, one missing, no manifest) and names what it
skipped and why. Pruned and replaced checkpoints are renamed aside
(``.global_step_N.deleting``) before they are deleted, so a crash mid-delete
leaves nothing that looks like a checkpoint either.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import Factory, asdict, frozen

from rlshell.signing import SigningError, check_signature, load_key, signature_for

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "MANIFEST",
    "POLICY_LAYOUTS",
    "QUEUE_FILE",
    "RUN_CONFIG",
    "TRAINER_STATE",
    "CheckpointError",
    "PolicyLayout",
    "TrainerState",
    "UnsignedCheckpointError",
    "checkpoint_dir",
    "clean_partials",
    "commit",
    "list_checkpoints",
    "load_policy_weights",
    "missing_checkpoint_message",
    "policy_layout",
    "prune",
    "read_trainer_state",
    "resolve_resume",
    "run_config_path",
    "staging_dir",
    "verify_checkpoint",
    "write_manifest",
    "write_trainer_state",
]

_NAME = re.compile(r"^global_step_(\d+)$")
TRAINER_STATE = "trainer_state.json"
MANIFEST = "manifest.json"
_ASIDE = ".deleting"  # suffix of a checkpoint renamed aside to be deleted
_CHUNK = 1 << 20
RUN_CONFIG = "config.json"
# runner.mode='async': the rollouts generated ahead of a checkpoint's step, saved with it.
QUEUE_FILE = "rollout_queue.pt"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not belong to this run."""


class UnsignedCheckpointError(CheckpointError):
    """With a signing key (`rlshell.signing`), a checkpoint not signed with it: unsigned,
    signed with another key, or its file list changed after signing."""


@frozen
class TrainerState:
    """What the driver needs, beside the workers' shards, to continue a run exactly."""

    step: int
    experiment_name: str
    sampler_epoch: int = 0  # the reasoning runner's prompt sampler; 0 for the others
    sampler_position: int = 0
    extra: dict[str, Any] = Factory(dict)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"global_step_{step}"


def run_config_path(checkpoint: Path) -> Path:
    """Where the run of ``<run dir>/checkpoints/global_step_N`` wrote its resolved config."""
    return checkpoint.parent.parent / RUN_CONFIG


def staging_dir(run_dir: Path, step: int) -> Path:
    """Where step ``step`` is written before `commit` renames it into place."""
    path = run_dir / "checkpoints" / f".global_step_{step}.partial"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def commit(staging: Path, run_dir: Path, step: int) -> Path:
    """Rename a fully written staging directory to ``global_step_N`` (atomic on one filesystem).

    A checkpoint of the same step already there is renamed aside first and
    deleted after: at every moment one complete ``global_step_N`` or none is
    visible, never a half-deleted one.
    """
    for name in (MANIFEST, TRAINER_STATE):
        if not (staging / name).is_file():
            raise CheckpointError(f"{staging} has no {name}: refusing to commit it")
    final = checkpoint_dir(run_dir, step)
    aside = _set_aside(final) if final.exists() else None
    os.replace(staging, final)
    _fsync_directory(final.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return final


def write_trainer_state(directory: Path, state: TrainerState) -> None:
    """``trainer_state.json``, flushed to disk; `commit` needs it, and `write_manifest`
    covers it when written after it."""
    temporary = directory / (TRAINER_STATE + ".tmp")
    with temporary.open("w") as file:
        file.write(json.dumps(asdict(state), indent=2) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / TRAINER_STATE)


def read_trainer_state(directory: Path) -> TrainerState:
    path = directory / TRAINER_STATE
    if not path.is_file():
        raise CheckpointError(
            f"{directory} is not a complete rlshell checkpoint (no {TRAINER_STATE})"
        )
    try:
        return TrainerState(**json.loads(path.read_text()))
    except (ValueError, TypeError) as error:  # JSONDecodeError is a ValueError
        raise CheckpointError(
            f"{path} is not a trainer state rlshell wrote ({type(error).__name__}: {error})"
        ) from error


def _digest(path: Path) -> str:
    """SHA-256 of ``path``'s bytes; the file is flushed to disk on the way."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
        os.fsync(file.fileno())
    return digest.hexdigest()


def _files(directory: Path) -> list[str]:
    return sorted(
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and path.name != MANIFEST
    )


def write_manifest(directory: Path) -> dict[str, dict[str, int | str]]:
    """``manifest.json``: the size and SHA-256 of every file under ``directory`` (the
    workers' shards included), each flushed to disk as it is read, signed with the key
    ``RLSHELL_SIGNING_KEY`` names if it is set (`rlshell.signing`); returns its entries."""
    key = load_key()
    entries: dict[str, dict[str, int | str]] = {
        name: {"size": (directory / name).stat().st_size, "sha256": _digest(directory / name)}
        for name in _files(directory)
    }
    manifest: dict[str, Any] = {"files": entries}
    if key is not None:
        manifest["signature"] = signature_for(key, entries)
    temporary = directory / (MANIFEST + ".tmp")
    with temporary.open("w") as file:
        file.write(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / MANIFEST)
    _fsync_directory(directory)
    return entries


def verify_checkpoint(directory: Path, *, digests: bool = True) -> None:
    """Check every file ``directory``'s manifest lists: present, of its size and SHA-256
    (``digests=False``: present and of its size, which reads no file's bytes).

    CheckpointError names the first that is not, or a file the manifest does
    not list, or a missing or unreadable manifest. With a signing key
    (``RLSHELL_SIGNING_KEY``), the manifest's signature is checked first, before any
    file (`UnsignedCheckpointError`); a key that cannot be used raises
    `rlshell.signing.SigningError`.
    """
    key = load_key()
    path = directory / MANIFEST
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no {MANIFEST}: it was not written by a complete rlshell save"
        )
    try:
        manifest = json.loads(path.read_text())
        entries = manifest["files"]
        expected = {str(name): (int(e["size"]), str(e["sha256"])) for name, e in entries.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise CheckpointError(f"{path} is unreadable ({type(error).__name__}: {error})") from error
    if key is not None:
        try:
            check_signature(manifest, key, directory)
        except SigningError as error:
            raise UnsignedCheckpointError(str(error)) from None
    for name, (size, sha256) in sorted(expected.items()):
        file = directory / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing (the manifest lists it)")
        actual = file.stat().st_size
        if actual != size:
            raise CheckpointError(
                f"{file} has {actual} bytes, the manifest says {size} (truncated or overwritten)"
            )
        if digests and _digest(file) != sha256:
            raise CheckpointError(f"{file} does not match its SHA-256 in the manifest (corrupted)")
    unlisted = [name for name in _files(directory) if name not in expected]
    if unlisted:
        raise CheckpointError(
            f"{directory} holds {unlisted[0]}, which its manifest does not list "
            f"({len(unlisted)} such file(s))"
        )


def _fsync_directory(directory: Path) -> None:
    """Make a rename or new entry in ``directory`` durable (a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _set_aside(path: Path) -> Path:
    """Rename ``path`` to a hidden name no listing takes for a checkpoint; returns it."""
    aside = path.with_name(f".{path.name}{_ASIDE}")
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(path, aside)
    return aside


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if match and (path / TRAINER_STATE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def queue_problem(checkpoint: Path, mode: str) -> str | None:
    """Why ``checkpoint`` cannot be resumed in ``runner.mode`` ``mode`` (None: it can).

    A ``runner.mode='async'`` run saves the rollouts it generated ahead of a
    checkpoint's step with it (`QUEUE_FILE`, `rlshell.runners.async_rollout`);
    a synchronous run would skip them, since the prompt sampler is past their
    prompts.
    """
    if mode == "async" or not (checkpoint / QUEUE_FILE).is_file():
        return None
    return (
        f"checkpoint.resume: {checkpoint} holds rollouts generated ahead by a "
        "runner.mode='async' run (its prompt sampler is past their prompts); resume it with "
        "runner.mode=async, or they would be skipped"
    )


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: none, the newest that verifies (``"auto"``), or a
    given path, which must verify (`verify_checkpoint`).

    ``auto`` prints each newer checkpoint it skipped, with why, to stderr; when
    the run has checkpoints and none verifies, CheckpointError lists them all
    (starting afresh would replace the run's metrics).
    """
    if resume is None:
        return None
    if resume == "auto":
        skipped: list[str] = []
        for _, path in reversed(list_checkpoints(run_dir)):
            try:
                verify_checkpoint(path)
                read_trainer_state(path)
            except CheckpointError as error:
                skipped.append(f"{path.name}: {error}")
                what = (
                    "not signed with your key"
                    if isinstance(error, UnsignedCheckpointError)
                    else "damaged"
                )
                print(
                    f"checkpoint.resume=auto: skipped {path.name}, which is {what}: {error}",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            return path
        if skipped:
            raise CheckpointError(
                "checkpoint.resume=auto: no checkpoint of the run verifies against its "
                "manifest:\n  " + "\n  ".join(skipped)
            )
        return None
    path = Path(resume)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint.resume: {path} does not exist")
    try:
        verify_checkpoint(path)
    except CheckpointError as error:
        raise CheckpointError(f"checkpoint.resume: {error}") from error
    read_trainer_state(path)
    return path


def prune(run_dir: Path, keep_last: int | None) -> list[Path]:
    """Remove all but the newest ``keep_last`` checkpoints; returns what was removed.

    Each is renamed aside before it is deleted (`clean_partials` finishes a
    deletion a crash interrupted).
    """
    if keep_last is None:
        return []
    checkpoints = list_checkpoints(run_dir)
    removed = [path for _, path in checkpoints[: max(0, len(checkpoints) - keep_last)]]
    for path in removed:
        shutil.rmtree(_set_aside(path), ignore_errors=True)
    return removed


def clean_partials(run_dir: Path) -> list[Path]:
    """Remove staging directories an interrupted save left behind, and checkpoints an
    interrupted prune or replacement had renamed aside."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    stale = [path for path in root.iterdir() if path.name.endswith((".partial", _ASIDE))]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


# ---------------------------------------------------------------------------
# DCP's .metadata, read without running code

# What torch.distributed.checkpoint's .metadata pickle holds (its records, torch's sizes,
# dtypes and layouts, a path): the classes its reader may build. Anything else in that
# pickle is a checkpoint altered to run code when read.
_DCP_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


def read_dcp_metadata(path: Path) -> Any:
    """DCP's ``.metadata`` at ``path``, unpickled with only `_DCP_METADATA_CLASSES` and
    torch's dtypes allowed: a `CheckpointError` naming the class for anything else, before
    it is built (its code never runs)."""
    import pickle

    import torch

    class _Allowed(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
            if (module, name) not in _DCP_METADATA_CLASSES and not dtype:
                raise CheckpointError(
                    f"{path}: refused to read it: its pickle asks for {module}.{name}, which "
                    "torch.distributed.checkpoint's metadata never holds (a checkpoint "
                    "altered to run code when loaded)"
                )
            return super().find_class(module, name)

    with path.open("rb") as stream:
        return _Allowed(stream).load()


def dcp_reader(directory: Path) -> Any:
    """A ``FileSystemReader`` for the DCP checkpoint in ``directory`` whose ``.metadata`` is
    read by `read_dcp_metadata`; pass it to ``dcp.load(..., storage_reader=...)``."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _VerifiedReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")
            metadata = read_dcp_metadata(Path(self._get_metadata_path(rank)))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return _VerifiedReader(str(directory))


# ---------------------------------------------------------------------------
# A checkpoint's policy weights


def _load_fsdp_actor(checkpoint: Path, policy: nn.Module) -> None:
    """The actor (reasoning, sft and embodied PPO runners): ``actor/`` is
    `FSDPModelManager.save_checkpoint`'s DCP shards (the Megatron backend writes the whole
    Hugging Face state dict there in the same format). A policy with frozen parameters (LoRA's
    base) reads only the rest: the checkpoint holds only those, and the frozen ones are as
    ``get_model`` built them, as the run built them."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    frozen = {
        name
        for name, param in policy.named_parameters(remove_duplicate=False)
        if not param.requires_grad
    }
    state = {"model": {k: v for k, v in policy.state_dict().items() if k not in frozen}}
    with warnings.catch_warnings():
        # Reading shards in one process without a process group is the intent here.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        actor = checkpoint / "actor"
        dcp_load(state, checkpoint_id=str(actor), storage_reader=dcp_reader(actor), no_dist=True)
    policy.load_state_dict(state["model"], strict=not frozen)  # the keys are its own


def _load_sac_learner(checkpoint: Path, policy: nn.Module) -> None:
    """The SAC runner: ``sac_learner.pt`` holds the learner's state, the policy's under "policy"."""
    import torch

    state = torch.load(checkpoint / "sac_learner.pt", map_location="cpu", weights_only=True)
    policy.load_state_dict(state["learner"]["policy"])


@frozen
class PolicyLayout:
    """Where one runner's checkpoints keep the policy: a file that marks it, and its loader."""

    marker: str
    description: str
    load: Callable[[Path, nn.Module], None]


# The first layout whose marker exists in the checkpoint directory is used.
POLICY_LAYOUTS: tuple[PolicyLayout, ...] = (
    PolicyLayout(
        "actor/.metadata",
        "the actor's shards (reasoning, sft and PPO runners, FSDP or Megatron)",
        _load_fsdp_actor,
    ),
    PolicyLayout("sac_learner.pt", "the SAC runner's learner state", _load_sac_learner),
)


def missing_checkpoint_message(checkpoint: Path) -> str:
    """``checkpoint`` does not exist; the run's checkpoints when its parent holds any."""
    message = f"checkpoint {checkpoint} does not exist"
    if checkpoint.parent.name == "checkpoints":
        found = [path.name for _, path in list_checkpoints(checkpoint.parent.parent)]
        message += f"; the run has {', '.join(found)}" if found else "; the run has none yet"
    return message


def _first_failure(error: BaseException) -> BaseException:
    """What went wrong inside a torch.distributed.checkpoint load (it wraps each rank's error)."""
    from torch.distributed.checkpoint.api import CheckpointException as DCPCheckpointException

    if isinstance(error, DCPCheckpointException) and error.failures:
        failure: Any = next(iter(error.failures.values()))
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, BaseException):
            return inner
    return error


def policy_layout(checkpoint: Path) -> PolicyLayout:
    """The first entry of `POLICY_LAYOUTS` whose marker ``checkpoint`` holds."""
    if not checkpoint.is_dir():
        raise CheckpointError(missing_checkpoint_message(checkpoint))
    layout = next((lay for lay in POLICY_LAYOUTS if (checkpoint / lay.marker).exists()), None)
    if layout is None:
        expected = " or ".join(f"{lay.marker} ({lay.description})" for lay in POLICY_LAYOUTS)
        raise CheckpointError(
            f"checkpoint {checkpoint} holds no policy weights: expected {expected}"
        )
    return layout


def load_policy_weights(checkpoint: Path, policy: nn.Module) -> None:
    """Put the checkpoint's policy weights (its `policy_layout`) into ``policy``.

    The checkpoint is verified against its manifest first (`verify_checkpoint`: every
    file's size and SHA-256), before any of its bytes is deserialised: a damaged or
    altered file is refused naming it. Weights that do not fit ``policy`` raise a
    `CheckpointError` naming the first mismatch. `rlshell.export`, evaluation and
    ``actor.model.checkpoint`` read every runner's checkpoints with it.
    """
    from torch.distributed.checkpoint.api import CheckpointException as DCPCheckpointException

    layout = policy_layout(checkpoint)
    verify_checkpoint(checkpoint)
    try:
        layout.load(checkpoint, policy)
    except (RuntimeError, KeyError, ValueError, OSError, DCPCheckpointException) as error:
        cause = _first_failure(error)
        text = str(cause).strip()
        detail = f"{type(cause).__name__}: {text.splitlines()[0] if text else repr(cause)}"
        raise CheckpointError(
            f"checkpoint {checkpoint}: {layout.marker} does not fit the {type(policy).__name__} "
            f"that actor.model builds ({detail})"
        ) from error


def main(argv: list[str] | None = None) -> int:
    """``python -m rlshell.checkpoint verify CHECKPOINT``: its files against its manifest,
    and its signature with the key ``RLSHELL_SIGNING_KEY`` names, if set."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rlshell.checkpoint")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("verify", help="check a checkpoint").add_argument("checkpoint", type=Path)
    args = parser.parse_args(argv)
    try:
        key = load_key()
        verify_checkpoint(args.checkpoint)
    except (SigningError, CheckpointError) as error:
        print(error, file=sys.stderr)
        return 1
    signed = "and its signature with your key" if key is not None else "(no signing key set)"
    print(f"{args.checkpoint}: every file matches its manifest {signed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
