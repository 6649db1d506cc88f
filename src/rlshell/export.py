"""Export a checkpoint's policy as a directory that loads without rlshell's checkpoints.

    python -m rlshell.export runs/grpo/checkpoints/global_step_200 runs/grpo/hf_model
    python -m rlshell.export runs/ppo_cartpole/checkpoints/global_step_390 runs/ppo_cartpole/policy
    python -m rlshell.export CHECKPOINT OUT_DIR --config RUN_DIR/config.json key.path=value ...

The policy is rebuilt as the run built it, in this one process (no Ray, no
process group): extension modules (``RLSHELL_EXT_MODULE``) register their
models first; the run's resolved config (``<run dir>/config.json`` beside
the checkpoints, or ``--config``, with ``key.path=value`` overrides) names
the model; `rlshell.models.get_model` builds ``actor.model``, for a
reasoning run with the vocabulary size and special-token ids its runner
took from the tokenizer (`rlshell.runners.reasoning.with_tokenizer_ids`);
and the checkpoint's weights are read through its entry of
`rlshell.checkpoint.POLICY_LAYOUTS` (the actor's
``torch.distributed.checkpoint`` shards, or SAC's learner state). A run that
started from another run's checkpoint (``actor.model.checkpoint``) is built
without it: the exported checkpoint's own weights are the policy's.

What is written depends on the model:

- a transformers ``PreTrainedModel`` (``hf_causal_lm``): a Hugging Face
  directory (``save_pretrained``, with the checkpoint's tokenizer), which
  loads with ``AutoModelForCausalLM.from_pretrained(out_dir)`` and
  ``AutoTokenizer.from_pretrained(out_dir)``; trained with LoRA adapters
  (``actor.model.is_lora``), the adapters are merged into the weights first
  (W + s·BA, peft's ``merge``, `rlshell.models.lora.merge_lora`), so the
  directory is the plain model, which loads without peft;
- any other model (``mlp_policy``, ``cnn_policy``, ``tiny_vla``, an
  extension's module, with or without LoRA adapters): ``model.safetensors``
  (its state dict) and ``rlshell_model.json`` (its resolved ``ModelConfig``),
  with ``tokenizer/`` when the checkpoint holds one; `load_exported` builds
  it again with ``get_model`` and loads the weights. ``tiny_vla`` is one of
  these: it holds a transformers LM, but the policy is that LM with its
  vision tower, projector and value head, decoding actions through its own
  logits processor and de-normalisation, none of which the LM's Hugging Face
  directory would carry.

The output is written beside ``out_dir`` and renamed into place (a previous
export renamed aside first), so a reader never sees half of one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from attrs import evolve, frozen
from cattrs.errors import BaseValidationError
from torch import nn

from rlshell.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_policy_weights,
    missing_checkpoint_message,
    policy_layout,
    run_config_path,
)
from rlshell.config import CONVERTER, Config, ModelConfig, read_config
from rlshell.extensions import ENV_VAR, ExtensionError, load_extensions

__all__ = [
    "HF_EXPORT_DIR",
    "MODEL_CONFIG_FILE",
    "POLICY_EXPORT_DIR",
    "WEIGHTS_FILE",
    "CheckpointPolicy",
    "ExportError",
    "export_checkpoint",
    "export_final_policy",
    "is_hugging_face_model",
    "load_exported",
    "load_policy",
    "main",
    "run_config",
    "write_policy",
]

WEIGHTS_FILE = "model.safetensors"
MODEL_CONFIG_FILE = "rlshell_model.json"
# Where `export_final_policy` writes, under the run directory.
HF_EXPORT_DIR = "hf_model"
POLICY_EXPORT_DIR = "policy"
EXIT_FAILED = 1
EXIT_CONFIG = 2


class ExportError(RuntimeError):
    """An exported directory is incomplete, or names a model this process cannot build."""


@frozen
class CheckpointPolicy:
    """A checkpoint's policy as the run built it: the model (eval mode, the checkpoint's
    weights), the ``ModelConfig`` that built it, and the run's tokenizer (None for a run
    without one, such as an embodied run)."""

    model: nn.Module
    model_config: ModelConfig
    tokenizer: Any | None


def run_config(
    checkpoint: Path, config_path: Path | None = None, overrides: Sequence[str] = ()
) -> Config:
    """The resolved config of the run that wrote ``checkpoint``, with ``overrides`` applied.

    Read from ``config_path`` when given, else from ``<run dir>/config.json``
    (`rlshell.checkpoint.run_config_path`).
    """
    if not Path(checkpoint).is_dir():
        raise CheckpointError(missing_checkpoint_message(Path(checkpoint)))
    source = config_path if config_path is not None else run_config_path(Path(checkpoint))
    if config_path is None and not source.is_file():
        raise CheckpointError(
            f"checkpoint {checkpoint}: no run config at {source} (python -m rlshell.train "
            "writes the run's resolved config.json there; it names the model to build). "
            "Give the run's config with --config PATH"
        )
    return read_config(source, overrides)


# Runners whose checkpoints hold the tokenizer their model's vocabulary was sized from.
TOKENIZER_RUNNERS = ("reasoning", "sft")


def _model_config(checkpoint: Path, config: Config) -> ModelConfig:
    """``actor.model`` as the run's actor built it, less the checkpoint it started from
    (``actor.model.checkpoint``: ``checkpoint``'s weights replace that one's)."""
    model = evolve(config.actor.model, checkpoint=None)
    if config.runner.runner_type not in TOKENIZER_RUNNERS or model.category != "reasoning":
        return model
    # The reasoning runner fills a model_kwargs model's vocabulary size and special-token ids
    # from its tokenizer after writing config.json; the checkpoint holds that tokenizer.
    from rlshell.tokenizer import with_tokenizer_ids

    tokenizer_dir = checkpoint / "tokenizer"
    if not tokenizer_dir.is_dir():
        raise CheckpointError(
            f"checkpoint {checkpoint} has no tokenizer/ directory: a {config.runner.runner_type} "
            "run's checkpoints hold the tokenizer the run trained with"
        )
    return with_tokenizer_ids(
        evolve(config, actor=evolve(config.actor, model=model)), tokenizer_dir
    ).actor.model


def load_policy(checkpoint: Path, config: Config | None = None) -> CheckpointPolicy:
    """The checkpoint's policy, built by ``get_model`` as the run built it, with its weights.

    ``config`` is the run's resolved config (default: `run_config`).
    """
    checkpoint = Path(checkpoint)
    policy_layout(checkpoint)  # a missing checkpoint, or one without weights, fails first
    if config is None:
        config = run_config(checkpoint)
    model_config = _model_config(checkpoint, config)
    torch.manual_seed(config.actor.seed)  # as the trainer seeds before building
    model = _build(model_config)
    load_policy_weights(checkpoint, model)
    tokenizer = None
    if (tokenizer_dir := checkpoint / "tokenizer").is_dir():
        # Imported here: transformers takes seconds to import, and a policy without a
        # tokenizer (an embodied run's) is built and written without it.
        from rlshell.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer_dir)
    return CheckpointPolicy(model.eval(), model_config, tokenizer)


def is_hugging_face_model(policy: CheckpointPolicy) -> bool:
    """Whether ``policy`` is exported as a Hugging Face directory: a transformers
    ``PreTrainedModel`` (LoRA adapters are merged into it first)."""
    # A transformers model means transformers is imported; an mlp_policy need not import it.
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(policy.model, transformers.PreTrainedModel)


def write_policy(policy: CheckpointPolicy, out_dir: Path) -> Path:
    """Write ``policy`` to ``out_dir`` (replaced atomically) in the form the module doc says.

    A Hugging Face model's LoRA adapters are merged into its weights in place
    (``policy.model`` is the plain model afterwards).
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.with_name(f".{out_dir.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    if is_hugging_face_model(policy):
        from rlshell.models.lora import merge_lora

        with torch.no_grad():
            merge_lora(policy.model).save_pretrained(staging)  # type: ignore[operator]
        if policy.tokenizer is not None:
            policy.tokenizer.save_pretrained(staging)
    else:
        from safetensors.torch import save_model

        save_model(policy.model, str(staging / WEIGHTS_FILE))
        data = CONVERTER.unstructure(policy.model_config)
        (staging / MODEL_CONFIG_FILE).write_text(json.dumps(data, indent=2) + "\n")
        if policy.tokenizer is not None:
            policy.tokenizer.save_pretrained(staging / "tokenizer")
    _replace_directory(staging, out_dir)
    return out_dir


def _replace_directory(new: Path, target: Path) -> None:
    """Rename ``new`` to ``target``; a previous ``target`` is renamed aside first, then removed,
    so ``target`` is always the old directory or the new one, complete."""
    if not target.exists():
        os.replace(new, target)
        return
    previous = target.with_name(f".{target.name}.previous")
    if previous.exists():
        shutil.rmtree(previous)
    os.replace(target, previous)
    os.replace(new, target)
    shutil.rmtree(previous)


def export_checkpoint(checkpoint: Path, out_dir: Path, config: Config | None = None) -> Path:
    """Write the checkpoint's policy to ``out_dir``; ``config`` as in `load_policy`."""
    return write_policy(load_policy(checkpoint, config), out_dir)


def export_final_policy(config: Config, run_dir: Path) -> Path | None:
    """``checkpoint.export_hf``: the run's newest checkpoint exported at the end of the run.

    To ``<run dir>/hf_model`` for a Hugging Face model, ``<run dir>/policy``
    for any other; None (nothing written) when ``export_hf`` is off or the
    run saves no checkpoints.
    """
    if not (config.checkpoint.interval and config.checkpoint.export_hf):
        return None
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        return None
    policy = load_policy(checkpoints[-1][1], config)
    name = HF_EXPORT_DIR if is_hugging_face_model(policy) else POLICY_EXPORT_DIR
    return write_policy(policy, run_dir / name)


def load_exported(directory: Path) -> nn.Module:
    """The model an export that is not a Hugging Face directory holds, in eval mode.

    Built with ``get_model`` from its ``rlshell_model.json`` (after the
    extension modules ``RLSHELL_EXT_MODULE`` names have registered their
    models), then its ``model.safetensors`` loaded, every key required.
    """
    from safetensors.torch import load_model

    directory = Path(directory)
    config_file = directory / MODEL_CONFIG_FILE
    if not config_file.is_file():
        hint = (
            ": a Hugging Face export; load it with AutoModelForCausalLM.from_pretrained"
            if (directory / "config.json").is_file()
            else ""
        )
        raise ExportError(f"{directory} has no {MODEL_CONFIG_FILE}{hint}")
    if not (directory / WEIGHTS_FILE).is_file():
        raise ExportError(f"{directory} has no {WEIGHTS_FILE}: the export is incomplete")
    load_extensions(where="load_exported")
    try:
        model_config = CONVERTER.structure(json.loads(config_file.read_text()), ModelConfig)
    except (BaseValidationError, json.JSONDecodeError) as error:
        raise ExportError(f"{config_file}: not a ModelConfig ({error})") from None
    model = _build(model_config, where=str(config_file))
    load_model(model, directory / WEIGHTS_FILE, strict=True)
    return model.eval()


def _build(model_config: ModelConfig, where: str = "actor.model") -> nn.Module:
    """``get_model(model_config)``; an unknown model type names the extension variable."""
    from rlshell.models import MODELS, get_model

    if model_config.model_type not in MODELS:
        raise ExportError(
            f"{where}: {MODELS.unknown_message(model_config.model_type)}. A model an "
            f"extension registers is known once {ENV_VAR} names the extension's module "
            "(from Python: pass it to rlshell.api's load_policy, export or evaluate as models=)"
        )
    return get_model(model_config)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlshell.export",
        description=(
            "Write a checkpoint's policy to a directory: a Hugging Face model (with the "
            "tokenizer) for a transformers model, else model.safetensors and "
            "rlshell_model.json, which rlshell.export.load_exported loads."
        ),
    )
    parser.add_argument("checkpoint", type=Path, help="run_dir/checkpoints/global_step_N")
    parser.add_argument("out_dir", type=Path, help="where to write the exported policy")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value")
    parser.add_argument(
        "--config",
        type=Path,
        help="the run's config.json or config file (default: RUN_DIR/config.json)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_intermixed_args(argv)
    try:
        load_extensions(where="export")
        config = run_config(args.checkpoint, args.config, args.overrides)
        out = export_checkpoint(args.checkpoint, args.out_dir, config)
    except (ExtensionError, ValueError) as error:  # ConfigError, and builders' bad model_kwargs
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except (CheckpointError, ExportError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"exported {args.checkpoint} to {out}")
    return 0


if __name__ == "__main__":
    from rlshell.process import exit_process

    exit_process(main())
