"""Export a checkpoint's policy as a Hugging Face directory.

    python -m rlshell.export runs/grpo/checkpoints/global_step_200 runs/grpo/hf_model

The output loads with ``AutoModelForCausalLM.from_pretrained(out_dir)`` and
``AutoTokenizer.from_pretrained(out_dir)``. The sharded weights are read with
``torch.distributed.checkpoint`` in this one process (no process group).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from rlshell.checkpoint import CheckpointError, read_trainer_state

__all__ = ["export_checkpoint", "load_policy", "main"]


def load_policy(checkpoint: Path) -> tuple[nn.Module, object]:
    """The policy of a checkpoint (full weights, eval mode) and its tokenizer."""
    import transformers
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise CheckpointError(f"checkpoint {checkpoint} does not exist")
    read_trainer_state(checkpoint)
    for part in ("hf_config", "tokenizer", "actor"):
        if not (checkpoint / part).is_dir():
            raise CheckpointError(f"checkpoint {checkpoint} has no {part}/ directory")
    config = transformers.AutoConfig.from_pretrained(
        checkpoint / "hf_config", local_files_only=True
    )
    model: nn.Module = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        # Reading shards in one process without a process group is the intent here.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(state, checkpoint_id=str(checkpoint / "actor"), no_dist=True)
    model.load_state_dict(state["model"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        checkpoint / "tokenizer", local_files_only=True
    )
    return model.eval(), tokenizer


def export_checkpoint(checkpoint: Path, out_dir: Path) -> Path:
    """Write the checkpoint's model and tokenizer to ``out_dir`` (replaced atomically)."""
    model, tokenizer = load_policy(checkpoint)
    out_dir = Path(out_dir)
    staging = out_dir.with_name(f".{out_dir.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    with torch.no_grad():
        model.save_pretrained(staging)  # type: ignore[operator]
    tokenizer.save_pretrained(staging)  # type: ignore[attr-defined]
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(staging, out_dir)
    return out_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlshell.export",
        description="Write a checkpoint's policy and tokenizer as a Hugging Face directory.",
    )
    parser.add_argument("checkpoint", type=Path, help="run_dir/checkpoints/global_step_N")
    parser.add_argument("out_dir", type=Path, help="where to write the Hugging Face directory")
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir)
    except (CheckpointError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"exported {args.checkpoint} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
