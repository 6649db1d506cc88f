"""Runners own the training loop; ``runner.runner_type`` picks one.

A runner is ``run(config, cluster, plan, run_dir) -> None``: the CLI has
validated the config, started (or attached to) Ray and planned the
placement; the runner launches its worker groups from the plan and loops.
Each lives in ``rlshell.runners.<runner_type>``:

- ``probe``: launches one probe worker per planned process, checks that each
  sees the rank, node and devices the plan gave it, forms every component's
  process group and times group calls and all-reduces for
  ``runner.max_steps`` rounds. A health check for a new cluster.
- ``reasoning`` (GRPO, PPO, ... on language models) and ``embodied`` (PPO and
  SAC on environments) are built on this foundation in their own modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from rlshell.cluster import Cluster
    from rlshell.config import Config
    from rlshell.placement import PlacementPlan

__all__ = ["Runner", "RunnerUnavailableError", "get_runner"]

Runner = Callable[["Config", "Cluster", "PlacementPlan", Path], None]


class RunnerUnavailableError(RuntimeError):
    """The runner a config names is not part of this installation."""


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
            "installation of rlshell; available: probe"
        ) from None
    return cast(Runner, module.run)
