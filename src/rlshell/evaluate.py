"""Evaluate a policy: greedy decoding on the held-out split, scored by the run's reward.

    python -m rlshell.evaluate runs/grpo/checkpoints/global_step_200
    python -m rlshell.evaluate runs/grpo/hf_model --config runs/grpo/config.json

PATH is a checkpoint directory or an exported Hugging Face directory. The
data and reward come from the run's resolved config (found beside a
checkpoint, or given with ``--config``; ``key.path=value`` overrides apply),
so the accuracy is the ``eval/accuracy`` the training run logs. It runs in
this process: no Ray, no workers. One JSON object is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlshell.checkpoint import TRAINER_STATE, CheckpointError
from rlshell.config import Config
from rlshell.config_loading import ConfigError, load_config

__all__ = ["evaluate", "main"]

DEFAULT_CONFIG = Path("configs/grpo.py")


def _load(path: Path) -> tuple[torch.nn.Module, Any]:
    if (path / TRAINER_STATE).is_file():
        from rlshell.export import load_policy

        return load_policy(path)
    if (path / "config.json").is_file():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        return model.eval(), AutoTokenizer.from_pretrained(path, local_files_only=True)
    raise CheckpointError(
        f"{path} is neither a checkpoint (no {TRAINER_STATE}) nor a Hugging Face model "
        "directory (no config.json)"
    )


def _config_beside(path: Path) -> Path:
    """A checkpoint's run config: ``<run dir>/config.json`` two levels up."""
    candidate = path.parent.parent / "config.json"
    return candidate if candidate.is_file() else DEFAULT_CONFIG


def evaluate(
    path: Path, config: Config, *, limit: int | None = None, batch_size: int = 64
) -> dict[str, float]:
    """Greedy accuracy of the policy at ``path`` on ``config``'s held-out split."""
    from rlshell.data import load_dataset
    from rlshell.rewards.pool import RewardPool
    from rlshell.rollout import SamplingParams
    from rlshell.rollout.hf import HFRolloutEngine
    from rlshell.runners.reasoning import arithmetic_task_of

    model, tokenizer = _load(path)
    examples = load_dataset(config.data, "val", arithmetic_task_of(config.data))
    if limit is not None:
        examples = examples[:limit]
    if not examples:
        raise ConfigError(["data: the held-out split is empty (set data.val_path or data.num_val)"])
    engine = HFRolloutEngine(model, tokenizer, torch.device("cpu"))
    params = SamplingParams(n=1, max_new_tokens=config.rollout.max_new_tokens, greedy=True)
    started = time.perf_counter()
    texts: list[str] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        texts.extend(engine.generate([e.prompt for e in chunk], params).response_texts)
    reward = config.reward
    with RewardPool(
        reward.reward_type, timeout_s=reward.timeout_s, num_processes=reward.num_processes
    ) as pool:
        result = pool.score(texts, [e.answer for e in examples])
    return {
        "eval/accuracy": sum(result.scores) / len(result.scores),
        "eval/examples": float(len(examples)),
        "reward/timeouts": float(result.timeouts),
        "reward/errors": float(result.errors),
        "time/eval": time.perf_counter() - started,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlshell.evaluate",
        description="Greedy accuracy of a checkpoint or exported model on the held-out split.",
    )
    parser.add_argument("path", type=Path, help="a checkpoint or Hugging Face model directory")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value")
    parser.add_argument("--config", type=Path, help="the run's config.json or a config file")
    parser.add_argument("--limit", type=int, help="evaluate the first N held-out examples")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        source = args.config or _config_beside(args.path)
        config = load_config(source, args.overrides)
        metrics = evaluate(args.path, config, limit=args.limit)
    except (ConfigError, CheckpointError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"path": str(args.path), **metrics}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
