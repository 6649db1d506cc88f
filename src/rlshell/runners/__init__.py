"""Runners own the loops; the run spec (`rlshell.runners.spec`) picks what runs.

- `rlshell.runners.loop.run`: the one run loop (run directory, resume,
  metrics, evaluation and checkpoint cadence, learning curve, export) around
  a `rlshell.runners.trainer.Trainer`;
- the trainers: `rlshell.runners.reasoning.ReasoningTrainer` (GRPO and its
  relatives on a language model), `rlshell.runners.sft.SFTTrainer` (supervised
  fine-tuning on demonstrations), `rlshell.runners.embodied_ppo.CollocatedPPOTrainer`
  and `rlshell.runners.embodied_pipeline.PipelinedPPOTrainer` (embodied PPO
  and GRPO), `rlshell.runners.sac.SACTrainer` (asynchronous SAC);
- `rlshell.runners.probe.run`: the cluster health check
  (``runner.runner_type=probe``), which trains nothing;
- `rlshell.runners.validation`: every check a config passes before anything
  starts, the trainer's own rules included.

Runners import workers; no worker imports a runner (tests/test_architecture.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlshell.cluster.placement import PlacementPlan
    from rlshell.cluster.ray_cluster import Cluster
    from rlshell.runners.loop import TrainResult
    from rlshell.runners.spec import RunSpec

__all__ = ["run"]


def run(spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> TrainResult:
    """Run what ``spec`` names on ``cluster`` as ``plan`` places it, writing to ``run_dir``."""
    from rlshell.runners import loop

    if spec.trainer is None:
        from rlshell.runners import probe

        probe.run(spec, cluster, plan, run_dir)
        return loop.TrainResult(run_dir, spec.config.runner.max_steps, {}, None, None)
    return loop.run(spec, cluster, plan, run_dir)
