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
staging directories are removed when the next run starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import Factory, asdict, frozen

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "POLICY_LAYOUTS",
    "QUEUE_FILE",
    "RUN_CONFIG",
    "TRAINER_STATE",
    "CheckpointError",
    "PolicyLayout",
    "TrainerState",
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
    "write_trainer_state",
]

_NAME = re.compile(r"^global_step_(\d+)$")
TRAINER_STATE = "trainer_state.json"
RUN_CONFIG = "config.json"
# runner.mode='async': the rollouts generated ahead of a checkpoint's step, saved with it.
QUEUE_FILE = "rollout_queue.pt"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not belong to this run."""


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
    """Rename a fully written staging directory to ``global_step_N`` (atomic on one filesystem)."""
    if not (staging / TRAINER_STATE).is_file():
        raise CheckpointError(f"{staging} has no {TRAINER_STATE}: refusing to commit it")
    final = checkpoint_dir(run_dir, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    return final


def write_trainer_state(directory: Path, state: TrainerState) -> None:
    temporary = directory / (TRAINER_STATE + ".tmp")
    temporary.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(temporary, directory / TRAINER_STATE)


def read_trainer_state(directory: Path) -> TrainerState:
    path = directory / TRAINER_STATE
    if not path.is_file():
        raise CheckpointError(
            f"{directory} is not a complete rlshell checkpoint (no {TRAINER_STATE})"
        )
    return TrainerState(**json.loads(path.read_text()))


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
    """The checkpoint to resume from: none, the newest (``"auto"``), or a given path."""
    if resume is None:
        return None
    if resume == "auto":
        checkpoints = list_checkpoints(run_dir)
        return checkpoints[-1][1] if checkpoints else None
    path = Path(resume)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint.resume: {path} does not exist")
    read_trainer_state(path)
    return path


def prune(run_dir: Path, keep_last: int | None) -> list[Path]:
    """Remove all but the newest ``keep_last`` checkpoints; returns what was removed."""
    if keep_last is None:
        return []
    checkpoints = list_checkpoints(run_dir)
    removed = [path for _, path in checkpoints[: max(0, len(checkpoints) - keep_last)]]
    for path in removed:
        shutil.rmtree(path)
    return removed


def clean_partials(run_dir: Path) -> list[Path]:
    """Remove staging directories an interrupted save left behind."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    stale = [path for path in root.iterdir() if path.name.endswith(".partial")]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


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
        dcp_load(state, checkpoint_id=str(checkpoint / "actor"), no_dist=True)
    policy.load_state_dict(state["model"], strict=not frozen)  # the keys are its own


def _load_sac_learner(checkpoint: Path, policy: nn.Module) -> None:
    """The SAC runner: ``sac_learner.pt`` holds the learner's state, the policy's under "policy"."""
    import torch

    state = torch.load(checkpoint / "sac_learner.pt", map_location="cpu", weights_only=False)
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

    Weights that do not fit ``policy`` raise a `CheckpointError` naming the
    first mismatch. `rlshell.export` reads every runner's checkpoints with it.
    """
    from torch.distributed.checkpoint.api import CheckpointException as DCPCheckpointException

    layout = policy_layout(checkpoint)
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
