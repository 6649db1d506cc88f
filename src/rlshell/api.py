"""The Python API: what ``python -m rlshell.train`` does, as functions a notebook calls.

    from rlshell.api import load_config, train

    config = load_config("configs/grpo.py", ["runner.max_steps=5"])
    result = train(config)
    result.run_dir, result.metrics["reward/mean"], result.checkpoint

The command line is a thin wrapper over these functions (`rlshell.train`):
the same validation, the same run directory, the same run loop. Where the
command line prints an error and exits with a status, these raise:
`rlshell.config.ConfigError` for everything found before start (a run
directory that holds a run or is in use: `rlshell.rundir.RunDirError`), and
the worker, checkpoint and cluster errors for a run that failed. The first
Ctrl-C finishes the step, saves a checkpoint and raises
`rlshell.runners.loop.Interrupted`, a KeyboardInterrupt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlshell.config import Config, ConfigError, read_config, write_config
from rlshell.runners.loop import TrainResult
from rlshell.runners.validation import load_config as _load_config
from rlshell.runners.validation import validate

if TYPE_CHECKING:
    from rlshell.cluster.placement import ClusterSpec
    from rlshell.cluster.ray_cluster import Cluster

__all__ = ["TrainResult", "load_config", "run_dir_of", "train", "train_validated"]


def run_dir_of(config: Config) -> Path:
    """Where a run writes: ``runner.output_dir / runner.experiment_name``."""
    return Path(config.runner.output_dir) / config.runner.experiment_name


def load_config(
    source: Config | Mapping[str, Any] | str | Path,
    overrides: Sequence[str] = (),
    *,
    for_run: bool = True,
) -> Config:
    """A validated config from a config file, a resolved ``config.json``, a `Config` or a
    plain mapping, with ``key.path=value`` overrides applied; `ConfigError` lists every
    problem. ``for_run=False`` leaves out the checks that only matter when the run
    starts (files on disk, installed backends), as ``--dry-run`` does."""
    if isinstance(source, str | Path):
        return _load_config(source, overrides, for_run=for_run)
    return read_config(source, overrides, check=lambda config: validate(config, for_run=for_run))


def train(
    config: Config | Mapping[str, Any] | str | Path,
    overrides: Sequence[str] = (),
    *,
    overwrite: bool = False,
) -> TrainResult:
    """Train as ``config`` says and return what the run left (`TrainResult`).

    Validates first (`ConfigError` before anything starts), then locks and
    claims the run directory (`rlshell.rundir`: one that holds a run is
    refused unless ``checkpoint.resume`` continues it or ``overwrite`` clears
    it first), then starts Ray (or attaches to ``cluster.address``), plans the
    placement, writes the resolved ``config.json`` and ``placement.json`` to
    the run directory and runs the loop. Ray is shut down and the lock
    released on the way out, also on error and Ctrl-C.
    """
    return train_validated(load_config(config, overrides), overwrite=overwrite)


def train_validated(config: Config, *, overwrite: bool = False) -> TrainResult:
    """`train` for a config that `load_config` has just validated (the command line's path)."""
    from rlshell.cluster.placement import PlacementError, render_table, write_plan
    from rlshell.cluster.ray_cluster import Cluster
    from rlshell.rundir import claimed_run_dir
    from rlshell.runners import run
    from rlshell.runners.spec import resolve_spec
    from rlshell.runners.validation import cluster_spec_for, plan_for

    run_dir = run_dir_of(config)
    spec = resolve_spec(config)
    embedded = config.cluster.address is None
    resume = config.checkpoint.resume
    with (
        claimed_run_dir(run_dir, resume=resume, overwrite=overwrite),
        Cluster(
            address=config.cluster.address,
            num_cpus=config.cluster.num_cpus if embedded else None,
            runtime_env_vars=config.cluster.worker_env_vars,
        ) as cluster,
    ):
        spec_of_nodes = wait_for_nodes(cluster, config)
        try:
            plan = plan_for(config, spec_of_nodes)
        except PlacementError as error:
            raise ConfigError([f"cluster.component_placement: {error}"]) from None
        if cluster_spec_for(config) is None and spec.trainer is not None:
            # An attached cluster is planned only now: the trainer's rules on the plan.
            problems = spec.trainer.problems(config, plan)
            if problems:
                raise ConfigError(problems)
        print(render_table(plan), flush=True)
        write_config(config, run_dir / "config.json")
        write_plan(plan, run_dir / "placement.json")
        return run(spec, cluster, plan, run_dir)


def wait_for_nodes(cluster: Cluster, config: Config) -> ClusterSpec:
    """The attached cluster's spec once ``cluster.num_nodes`` nodes are alive."""
    import time

    deadline = time.monotonic() + config.cluster.startup_timeout_s
    while True:
        try:
            spec = cluster.spec(config.cluster.node_groups or None)
        except ValueError as error:  # node groups that do not fit the cluster's nodes
            raise ConfigError([f"cluster.node_groups: {error}"]) from None
        if len(spec.nodes) >= config.cluster.num_nodes or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if len(spec.nodes) < config.cluster.num_nodes:
        raise TimeoutError(
            f"cluster.num_nodes: expected {config.cluster.num_nodes} nodes, but the Ray cluster "
            f"at '{config.cluster.address}' has {len(spec.nodes)} after "
            f"{config.cluster.startup_timeout_s:g} s (cluster.startup_timeout_s)"
        )
    return spec
