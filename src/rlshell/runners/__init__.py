"""Runners own the training loop; ``runner.runner_type`` picks one.

A runner is ``run(config, cluster, plan, run_dir) -> None``: the CLI has
validated the config, started (or attached to) Ray and planned the
placement; the runner launches its worker groups from the plan and loops.
Each lives in ``rlshell.runners.<runner_type>``:

- ``probe``: launches one probe worker per planned process, checks that each
  sees the rank, node and devices the plan gave it, forms every component's
  process group and times group calls and all-reduces for
  ``runner.max_steps`` rounds. A health check for a new cluster.
- ``reasoning``: GRPO and its relatives on a language model (FSDP2 actor, HF
  rollout, reward processes, weight sync, checkpoints), `rlshell.runners.reasoning`.
- ``embodied``: PPO (GAE or group-normalised episode returns) on vectorised
  environments, with env, rollout and actor in the same processes or on
  workers of their own (pipelined), and asynchronous SAC
  (``algorithm.loss_type='sac'``), `rlshell.runners.embodied`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from rlshell.cluster.placement import PlacementPlan
    from rlshell.cluster.ray_cluster import Cluster
    from rlshell.config import Config

__all__ = ["Runner", "RunnerUnavailableError", "available_runners", "get_runner"]

Runner = Callable[["Config", "Cluster", "PlacementPlan", Path], None]


class RunnerUnavailableError(RuntimeError):
    """The runner a config names is not part of this installation."""


def available_runners() -> list[str]:
    """The runner modules this installation ships."""
    import pkgutil

    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.ispkg)


def get_runner(runner_type: str) -> Runner:
    """The ``run`` function of ``rlshell.runners.<runner_type>``."""
    module_name = f"{__name__}.{runner_type}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        raise RunnerUnavailableError(
            f"runner.runner_type: the '{runner_type}' runner ({module_name}) is not in this "
            f"installation of rlshell; available: {', '.join(available_runners())}"
        ) from None
    return cast(Runner, module.run)
