"""The command line: ``python -m rlshell.train CONFIG [key.path=value ...] [--dry-run]``.

1. Extension modules (``RLSHELL_EXT_MODULE``) register their models, envs and
   rewards, so the config can name them.
2. The config is read, overridden and validated; every problem is printed at
   once and nothing starts (exit status 2). Without a config the usage and
   the configs in ./configs are printed (exit status 2).
3. ``--dry-run`` prints the placement plan as a table and writes
   ``config.json`` and ``placement.json`` to ``<run dir>/dry_run/`` (never
   over a run's own), for this machine or for a simulated cluster
   (``cluster.simulate=4x8``).
4. Otherwise the run directory is locked and claimed (`rlshell.rundir`: one
   holding a run is refused unless ``checkpoint.resume=auto`` continues it or
   ``--overwrite`` clears it; exit status 2), Ray starts (or attaches), the
   plan is made for the real cluster, and the runner named by
   ``runner.runner_type`` owns the loop. The first Ctrl-C lets the step
   finish, saves a checkpoint and prints the command that resumes; a second
   stops at once. Ray is shut down on the way out (exit status 130).

Exit status: 0 the run finished; 1 a worker, the cluster or a checkpoint
failed; 2 a usage or config error, found before anything started; 130
interrupted.

``--config RUN_DIR/config.json`` starts again from a resolved config that an
earlier run wrote. CONFIG may also be an RLinf Hydra YAML config, composed and
mapped onto rlstack's keys by `rlshell.config.rlinf` (a key it cannot map is
refused with the reason, exit status 2).
"""

from __future__ import annotations

import argparse
import ast
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rlshell.checkpoint import RUN_CONFIG, list_checkpoints
from rlshell.config import Config, ConfigError, write_config
from rlshell.extensions import ExtensionError, load_extensions
from rlshell.rundir import DRY_RUN_DIR, run_dir_of

if TYPE_CHECKING:
    from rlshell.runners.loop import Interrupted

__all__ = ["main", "run_dir_of"]

EXIT_CONFIG = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def _listen_for_ctrl_c() -> None:
    """Make Ctrl-C raise KeyboardInterrupt here, whatever this process inherited.

    A process started by one that ignores or blocks SIGINT (some test runners,
    job launchers, ``nohup``) inherits that, and Python then leaves Ctrl-C
    ignored; the clean shutdown below depends on receiving it.
    """
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def main(argv: Sequence[str] | None = None) -> int:
    _listen_for_ctrl_c()
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    try:
        source, overrides = _split_positionals(args.positionals, args.config)
    except ValueError as error:
        parser.error(str(error))
    if source is None:
        parser.print_help(sys.stderr)
        print(
            "\nerror: no config given: name one of the configs above (or a run's config.json "
            "with --config)",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    if args.dry_run and args.overwrite:
        parser.error("--overwrite: a dry run writes nothing into the run directory to clear")
    try:
        load_extensions(where="driver")
    except ExtensionError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    # Validation's imports (torch, the runners) only once there is a config to check:
    # --help and a usage error answer without them.
    from rlshell.runners.validation import load_config

    try:
        config = load_config(source, overrides, for_run=not args.dry_run)
    except ConfigError as error:
        print(f"error: {source}: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if args.dry_run:
        return _dry_run(config, source)
    return _run(config, overwrite=args.overwrite)


def _dry_run(config: Config, source: Path) -> int:
    from rlshell.cluster.placement import PlacementError, render_table, write_plan
    from rlshell.runners.validation import cluster_spec_for, plan_for

    spec = cluster_spec_for(config)
    if spec is None:  # attaching to a running cluster: read its nodes, start nothing on it
        from rlshell.cluster.ray_cluster import Cluster

        try:
            with Cluster(address=config.cluster.address) as cluster:
                spec = cluster.spec(config.cluster.node_groups or None)
        except ConnectionError as error:
            print(f"error: cluster.address={config.cluster.address}: {error}", file=sys.stderr)
            return EXIT_FAILED
        except ValueError as error:  # node groups that do not fit the cluster's nodes
            print(f"error: {source}: cluster.node_groups: {error}", file=sys.stderr)
            return EXIT_CONFIG
    try:
        plan = plan_for(config, spec)
    except PlacementError as error:
        print(f"error: {source}: cluster.component_placement: {error}", file=sys.stderr)
        return EXIT_CONFIG
    # A dry run never writes over a run's own config.json and placement.json.
    plan_dir = run_dir_of(config) / DRY_RUN_DIR
    print(f"dry run of {source}: nothing was started")
    print(render_table(plan))
    print(f"config:    {write_config(config, plan_dir / 'config.json')}")
    print(f"placement: {write_plan(plan, plan_dir / 'placement.json')}")
    return 0


def _run(config: Config, *, overwrite: bool) -> int:
    from rlshell.api import train_validated
    from rlshell.checkpoint import CheckpointError
    from rlshell.cluster.errors import WorkerError
    from rlshell.cluster.ray_cluster import ReservationError
    from rlshell.runners.loop import Interrupted
    from rlshell.runners.probe import PlacementMismatchError

    try:
        train_validated(config, overwrite=overwrite)
    except Interrupted as interrupted:
        print(_interrupted_message(config, interrupted), file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # the second Ctrl-C, or one before the steps began
        lines = ["interrupted: Ray was shut down, workers stopped", *_resume_line(config)]
        print("\n".join(lines), file=sys.stderr)
        return EXIT_INTERRUPTED
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except ConnectionError as error:  # no Ray cluster at cluster.address
        print(f"error: cluster.address={config.cluster.address}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except (
        WorkerError,
        TimeoutError,
        ReservationError,
        PlacementMismatchError,
        CheckpointError,
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _interrupted_message(config: Config, interrupted: Interrupted) -> str:
    """What Ctrl-C left, and the command that continues the run."""
    if interrupted.checkpoint is None:
        saved = f"no checkpoint was written ({interrupted.why_not})"
    else:
        saved = f"saved {interrupted.checkpoint}"
    lines = [
        f"interrupted after step {interrupted.step}: {saved}; Ray was shut down, workers stopped",
        *_resume_line(config),
    ]
    return "\n".join(lines)


def _resume_line(config: Config) -> list[str]:
    """The command that continues the run from its newest checkpoint (none: no line)."""
    run_dir = run_dir_of(config)
    if not list_checkpoints(run_dir):
        return []
    command = ["python", "-m", "rlshell.train", "--config", str(run_dir / RUN_CONFIG)]
    return [f"resume with: {shlex.join([*command, 'checkpoint.resume=auto'])}"]


def _split_positionals(
    positionals: Sequence[str], config: str | None
) -> tuple[Path | None, list[str]]:
    overrides = [item for item in positionals if "=" in item]
    paths = [item for item in positionals if "=" not in item]
    if config is not None:
        paths.insert(0, config)
    if len(paths) > 1:
        raise ValueError(f"expected one config file, got {len(paths)}: {', '.join(paths)}")
    return (Path(paths[0]) if paths else None), overrides


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlshell.train",
        description="Train with rlstack. CONFIG is a Python config file defining `config`, "
        "a run's resolved config.json or an RLinf Hydra YAML config (mapped key by key, "
        "docs/from_rlinf.md); key.path=value overrides any field. Exit status: "
        "0 done, 1 a worker or the cluster failed, 2 a usage or config error (nothing "
        "started), 130 interrupted.",
        epilog=_help_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "positionals",
        nargs="*",
        metavar="CONFIG [key.path=value ...]",
        help="the config file, then overrides such as actor.optim.lr=1e-4",
    )
    parser.add_argument(
        "--config",
        metavar="RUN_DIR/config.json",
        help="start from the resolved config an earlier run wrote",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate, print the placement plan and write config.json and placement.json "
        "to RUN_DIR/dry_run/; start nothing",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="clear a run that RUN_DIR already holds (checkpoints, metrics, TensorBoard "
        "events, exports) and start afresh",
    )
    return parser


def _help_epilog() -> str:
    lines = ["configs (in ./configs):"]
    configs = sorted(Path("configs").glob("*.py"))
    width = max((len(str(path)) for path in configs), default=0)
    for path in configs:
        lines.append(f"  {path!s:<{width}}  {_first_docstring_line(path)}")
    if not configs:
        lines.append("  (none found in ./configs)")
    lines.append("")
    lines.append("top-level keys:")
    for name, section in _sections():
        lines.append(f"  {name:<10}  {section}")
    return "\n".join(lines)


def _sections() -> list[tuple[str, str]]:
    import typing

    import attrs

    hints = typing.get_type_hints(Config)
    sections = []
    for field in attrs.fields(Config):
        doc = (getattr(hints[field.name], "__doc__", "") or "").strip().splitlines()
        sections.append((field.name, doc[0] if doc else ""))
    return sections


def _first_docstring_line(path: Path) -> str:
    try:
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (OSError, SyntaxError):
        return ""
    return docstring.strip().splitlines()[0] if docstring else ""


if __name__ == "__main__":
    from rlshell.process import exit_process

    exit_process(main())
